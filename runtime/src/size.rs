//! Byte sizes as people write them (`64MiB`, `100MB`, `65536`), for flags
//! and manifests alike: a leaf every layer may use.

use anyhow::Result;

/// Parses a byte size such as `64MiB`, `512KiB`, `1GiB`, `100MB` or `65536`.
pub(crate) fn parse_size(text: &str) -> Result<usize> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| anyhow::anyhow!("{text:?} is not a size (expected e.g. 64MiB)"))?;
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => anyhow::bail!("{text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB or GB)"),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| anyhow::anyhow!("{text:?} is too large"))
}

/// Bytes as MiB with one decimal, for messages.
pub(crate) fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("512 KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("MiB").is_err());
        assert!(
            parse_size("12 parsecs")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
    }
}
