//! Sizes as operators write them (`1MB`, `512KB`, `1048576`): replication lag limits.

/// Parses bytes, or a number with `B`, `KB`, `MB` or `GB` (binary: `1KB` is 1024 bytes, as
/// in `redis.conf`'s `1kb`; `KiB`, `MiB`, `GiB` are accepted too), in any case.
pub fn parse(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a size (write it like 1048576, 512KB, 1MB)");
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "kib" | "k" => 1 << 10,
        "mb" | "mib" | "m" => 1 << 20,
        "gb" | "gib" | "g" => 1 << 30,
        _ => return Err(bad()),
    };
    let value: u64 = number.parse().map_err(|_| bad())?;
    value.checked_mul(scale).ok_or_else(|| format!("{text:?} is out of range"))
}

/// The short form `parse` accepts, for messages.
pub fn format(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}MB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}KB", b >> 10),
        b => format!("{b}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse("1048576"), Ok(1 << 20));
        assert_eq!(parse("1MB"), Ok(1 << 20));
        assert_eq!(parse("512KB"), Ok(512 << 10));
        assert_eq!(parse("512kb"), Ok(512 << 10));
        assert_eq!(parse("2 GiB"), Ok(2 << 30));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("10B"), Ok(10));
    }

    #[test]
    fn bad_sizes_are_named() {
        for bad in ["", "MB", "1.5MB", "-1", "1TB", "lots", "1 M B"] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
        assert!(parse("99999999999999999999GB").is_err());
        assert!(parse("18446744073709551615GB").is_err(), "overflow is an error, not a wrap");
    }

    #[test]
    fn formatting_round_trips() {
        for bytes in [0, 1, 1000, 1024, 512 << 10, 1 << 20, 3 << 20, (1 << 20) + 1] {
            assert_eq!(parse(&format(bytes)), Ok(bytes));
        }
    }
}
