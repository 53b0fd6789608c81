//! Durations as operators write them: `500ms`, `2s`, `1.5s`, `1m`, `1h`.

use std::time::Duration;

/// The longest duration accepted: far beyond any sensible setting, and small enough that
/// adding it to an `Instant` (as the drain does with its grace at every failover) cannot
/// overflow.
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; the number may have a fraction.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("{text:?} is not a duration (write it like 500ms, 2s, 1m)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (write it like 500ms, 2s, 1m)"))?;
    Duration::try_from_secs_f64(value * scale)
        .ok()
        .filter(|d| *d <= MAX)
        .ok_or_else(|| format!("{text:?} is out of range (at most 365 days)"))
}

/// The short form `parse` accepts, for messages and summaries.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in ["", "2", "s", "2 weeks", "-1s", "1.2.3s", "ms500"] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_beyond_a_year_are_out_of_range() {
        assert_eq!(parse("8760h"), Ok(MAX));
        for bad in ["8761h", "5000000000000h", "18446744073709551615s"] {
            assert!(parse(bad).is_err_and(|e| e.contains("out of range")), "{bad:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for d in [Duration::from_millis(250), Duration::from_secs(30)] {
            assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
