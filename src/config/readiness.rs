//! `readiness:`: how polestar judges whether a master can fail over now (see
//! [`crate::readiness`]).

use std::time::Duration;

use serde_yaml::Value;

use super::walk::{Problems, Section};
use super::{Readiness, duration, size};

/// A replica lagging more than this many bytes is not counted as promotable, by default.
pub const DEFAULT_MAX_LAG: u64 = 1 << 20;
/// A replica entry `s_down` this long is a stale entry, by default.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60);
/// How often the Sentinels and nodes are asked, by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// The slowest poll accepted: a verdict older than this is no warning.
const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// The fastest poll accepted: each round asks every Sentinel several commands.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

impl Default for Readiness {
    fn default() -> Self {
        Self {
            max_lag: DEFAULT_MAX_LAG,
            stale_after: DEFAULT_STALE_AFTER,
            interval: DEFAULT_INTERVAL,
        }
    }
}

pub(super) fn parse(value: Value, p: &mut Problems) -> Readiness {
    let mut s = Section::new("readiness", value, p);
    let max_lag = s.take_with("max_lag", p, size_value);
    let stale_after = s.take_with("stale_after", p, |t: String| {
        let d = duration::parse(&t)?;
        if d.is_zero() { Err("must be > 0".to_string()) } else { Ok(d) }
    });
    let interval = s.take_with("interval", p, |t: String| {
        let d = duration::parse(&t)?;
        if d < MIN_INTERVAL || d > MAX_INTERVAL {
            Err(format!("must be between {MIN_INTERVAL:?} and {MAX_INTERVAL:?}"))
        } else {
            Ok(d)
        }
    });
    s.finish(p);
    Readiness {
        max_lag: max_lag.unwrap_or(DEFAULT_MAX_LAG),
        stale_after: stale_after.unwrap_or(DEFAULT_STALE_AFTER),
        interval: interval.unwrap_or(DEFAULT_INTERVAL),
    }
}

/// A size as YAML gives it: a plain number of bytes or a string such as `1MB`.
pub(super) fn size_value(value: Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("{n} is not a size in bytes")),
        Value::String(text) => size::parse(&text),
        other => Err(format!("{other:?} is not a size (write it like 1048576, 512KB, 1MB)")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{Config, ParseError};

    const BASE: &str = "sentinels:\n  addresses: [\"127.0.0.1:26379\"]\n";

    #[test]
    fn readiness_has_defaults_and_takes_sizes_as_numbers_or_text() {
        let config = Config::parse(BASE, Path::new(".")).expect("valid");
        assert_eq!(config.readiness, Readiness::default());
        let text =
            format!("{BASE}readiness:\n  max_lag: 512KB\n  stale_after: 5m\n  interval: 250ms\n");
        let config = Config::parse(&text, Path::new(".")).expect("valid");
        let want = Readiness {
            max_lag: 512 << 10,
            stale_after: Duration::from_secs(300),
            interval: Duration::from_millis(250),
        };
        assert_eq!(config.readiness, want);
        let text = format!("{BASE}readiness:\n  max_lag: 4096\n");
        assert_eq!(Config::parse(&text, Path::new(".")).expect("valid").readiness.max_lag, 4096);
    }

    #[test]
    fn every_bad_readiness_key_is_named() {
        let text = format!(
            "{BASE}readiness:\n  max_lag: -1\n  stale_after: 0s\n  interval: 1h\n  extra: 1\n"
        );
        let Err(ParseError::Invalid(problems)) = Config::parse(&text, Path::new(".")) else {
            panic!("accepted");
        };
        for path in
            ["readiness.max_lag", "readiness.stale_after", "readiness.interval", "readiness.extra"]
        {
            assert!(problems.iter().any(|p| p.starts_with(path)), "{path} in {problems:?}");
        }
    }
}
