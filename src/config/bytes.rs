//! Sizes as Redis operators write them: `1048576`, `512kb`, `1mb`, `2gb` (powers of 1024),
//! `1k`, `1m`, `1g` (powers of 1000, as in `redis.conf`), `KiB`/`MiB`/`GiB`; any case.

/// Parses a size in bytes.
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a size (write it like 1048576, 512KB, 1MB)");
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" | "kib" => 1 << 10,
        "m" => 1_000_000,
        "mb" | "mib" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).ok_or_else(|| format!("{text:?} is out of range"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_redis_conf_writes_them() {
        assert_eq!(parse("1048576"), Ok(1_048_576));
        assert_eq!(parse("512KB"), Ok(512 * 1024));
        assert_eq!(parse("1MB"), Ok(1 << 20));
        assert_eq!(parse("1mb"), Ok(1 << 20));
        assert_eq!(parse("2MiB"), Ok(2 << 20));
        assert_eq!(parse("1m"), Ok(1_000_000));
        assert_eq!(parse(" 3gb "), Ok(3 << 30));
        assert_eq!(parse("0"), Ok(0));
    }

    #[test]
    fn what_is_not_a_size_is_refused_with_the_text() {
        for bad in ["", "MB", "1.5MB", "-1", "1 TB", "ten", "1MBx"] {
            let error = parse(bad).err().unwrap_or_default();
            assert!(error.contains("is not a size"), "{bad:?}: {error}");
        }
        assert!(parse("99999999999999999999gb").is_err());
    }
}
