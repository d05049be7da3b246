//! Cluster-wide limits in a plugin manifest: `limits.rate` and
//! `[limits.per_key]`. Parsing and validation only: the Redis side, which
//! enforces them across every process sharing the Redis, is
//! `runner::limiter` (a plugin module never touches Redis).
//!
//! ```toml
//! [limits]
//! concurrency = 10          # per PROCESS (see `limits`), unrelated to what follows
//! rate = "100/s"            # starts of this plugin's jobs, all processes together
//!
//! [limits.per_key]          # one bucket per value found at `key` in each job
//! key = "args.0"            # a path into the payload: `args.0`, `args.0.user_id`, `tenant`...
//! rate = "10/min"           # starts per key value, all processes together
//! concurrency = 2           # jobs of one key value running at once, all processes together
//! ```
//!
//! A rate is `N/UNIT` or `N/XUNIT` with UNIT `s`, `min` or `h` (`"100/s"`,
//! `"10/min"`, `"500/15min"`, `"3/2h"`): at most N starts in ANY window of
//! that length (a sliding window, not clock-aligned buckets). N is 1 to
//! [`MAX_RATE_COUNT`], the window 1 s to 24 h. Per-key concurrency is 1 to
//! [`MAX_KEY_CONCURRENCY`]. `per_key` needs a `key` and at least one of
//! `rate` and `concurrency`.
//!
//! The names say where a limit applies: `limits.concurrency` is this
//! process's slots for the plugin (unchanged), `limits.per_key.concurrency`
//! is cluster-wide per key value. `docs/limits.md` has the whole story.

use std::ops::Range;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use toml::Spanned;

/// Most starts a rate may allow per window (each start is a ZSET member
/// kept for one window).
pub const MAX_RATE_COUNT: u64 = 100_000;
/// Shortest rate window.
pub const MIN_RATE_PERIOD: Duration = Duration::from_secs(1);
/// Longest rate window.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// Most jobs of one key value running at once.
pub const MAX_KEY_CONCURRENCY: u32 = 10_000;
/// Most segments in a key path.
pub const MAX_KEY_SEGMENTS: usize = 8;
/// Longest segment of a key path, bytes.
pub const MAX_KEY_SEGMENT_LEN: usize = 64;

/// The cluster-wide limits of a plugin; the default is none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterLimits {
    /// `limits.rate`: starts of the plugin's jobs, every process together.
    pub rate: Option<Rate>,
    /// `[limits.per_key]`.
    pub per_key: Option<PerKey>,
}

impl ClusterLimits {
    /// Whether any cluster limit is set (if not, no job of the plugin
    /// costs a Redis call for limits).
    pub fn any(&self) -> bool {
        self.rate.is_some() || self.per_key.is_some()
    }
}

/// At most `count` starts in any window of `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Starts allowed per window.
    pub count: u64,
    /// The window.
    pub period: Duration,
}

impl Rate {
    /// The window in whole milliseconds.
    pub fn period_ms(&self) -> u64 {
        self.period.as_millis() as u64
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}s", self.count, self.period.as_secs())
    }
}

/// `[limits.per_key]`: limits per value found at `key` in each job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerKey {
    /// Where the key value is in the payload.
    pub key: KeyPath,
    /// Starts per key value.
    pub rate: Option<Rate>,
    /// Jobs of one key value running at once.
    pub concurrency: Option<u32>,
}

/// A path into the job payload: a top-level field, then object fields or
/// array indexes (`args.0.user_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath {
    segments: Vec<String>,
}

impl KeyPath {
    /// Parses `args.0.user_id`: 1 to [`MAX_KEY_SEGMENTS`] segments of 1 to
    /// [`MAX_KEY_SEGMENT_LEN`] letters, digits, `_` or `-`.
    pub fn parse(text: &str) -> Result<Self> {
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.len() > MAX_KEY_SEGMENTS {
            bail!("{text:?} has more than {MAX_KEY_SEGMENTS} segments");
        }
        for segment in &segments {
            let valid = !segment.is_empty()
                && segment.len() <= MAX_KEY_SEGMENT_LEN
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                bail!(
                    "{:?} is not a key path (segments of 1-{MAX_KEY_SEGMENT_LEN} letters, digits, '_' or '-' separated by '.', e.g. \"args.0\" or \"args.0.user_id\")",
                    crate::job::preview(text)
                );
            }
        }
        Ok(Self { segments })
    }

    /// The segments, first the top-level payload field.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }
}

impl std::fmt::Display for KeyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.segments.join("."))
    }
}

/// Parses a rate: `N/s`, `N/min`, `N/h`, or with a multiple of the unit
/// (`N/15min`, `N/2h`, `N/10s`).
pub fn parse_rate(text: &str) -> Result<Rate> {
    let shown = crate::job::preview(text);
    let hint = "e.g. \"100/s\", \"10/min\", \"500/15min\"";
    let (count, per) = text
        .trim()
        .split_once('/')
        .ok_or_else(|| anyhow!("{shown:?} is not a rate ({hint})"))?;
    let count: u64 = count
        .trim()
        .parse()
        .ok()
        .filter(|&n| (1..=MAX_RATE_COUNT).contains(&n))
        .ok_or_else(|| anyhow!("{shown:?}: the count must be a whole number from 1 to {MAX_RATE_COUNT} ({hint})"))?;
    let per = per.trim();
    let split = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
    let (multiple, unit) = per.split_at(split);
    let multiple: u64 = if multiple.is_empty() {
        1
    } else {
        multiple
            .parse()
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| anyhow!("{shown:?}: the window must be a whole number ≥ 1 of s, min or h ({hint})"))?
    };
    let unit_secs = match unit {
        "s" | "sec" => 1,
        "min" | "m" => 60,
        "h" => 3600,
        _ => bail!("{shown:?}: the unit must be s, min or h ({hint})"),
    };
    let period = multiple
        .checked_mul(unit_secs)
        .map(Duration::from_secs)
        .filter(|p| (MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(p))
        .ok_or_else(|| anyhow!("{shown:?}: the window must be from 1 s to 24 h"))?;
    Ok(Rate { count, period })
}

/// The cluster-limit keys of `[limits]`, read by `limits::RawLimits`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPerKey {
    key: Spanned<String>,
    rate: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
}

/// Validates `limits.rate` and `[limits.per_key]`; `at` turns a span into
/// `file:line`.
pub(super) fn resolve(
    rate: Option<&Spanned<String>>,
    per_key: Option<&Spanned<RawPerKey>>,
    at: &dyn Fn(Range<usize>) -> String,
) -> Result<ClusterLimits> {
    let rate_at = |value: &Spanned<String>, name: &str| {
        parse_rate(value.get_ref()).map_err(|e| anyhow!("{}: {name}: {e}", at(value.span())))
    };
    let rate = rate.map(|r| rate_at(r, "limits.rate")).transpose()?;
    let per_key = match per_key {
        None => None,
        Some(spanned) => {
            let raw = spanned.get_ref();
            let key = KeyPath::parse(raw.key.get_ref())
                .map_err(|e| anyhow!("{}: limits.per_key.key: {e}", at(raw.key.span())))?;
            let rate = raw
                .rate
                .as_ref()
                .map(|r| rate_at(r, "limits.per_key.rate"))
                .transpose()?;
            let concurrency = match &raw.concurrency {
                None => None,
                Some(c) => Some(
                    u32::try_from(*c.get_ref())
                        .ok()
                        .filter(|n| (1..=MAX_KEY_CONCURRENCY).contains(n))
                        .ok_or_else(|| {
                            anyhow!(
                                "{}: limits.per_key.concurrency must be a whole number from 1 to {MAX_KEY_CONCURRENCY}",
                                at(c.span())
                            )
                        })?,
                ),
            };
            if rate.is_none() && concurrency.is_none() {
                bail!(
                    "{}: limits.per_key: set `rate`, `concurrency` or both (a key alone limits nothing)",
                    at(spanned.span())
                );
            }
            Some(PerKey { key, rate, concurrency })
        }
    };
    Ok(ClusterLimits { rate, per_key })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(text: &str) -> Result<ClusterLimits> {
        #[derive(Deserialize)]
        struct Raw {
            rate: Option<Spanned<String>>,
            per_key: Option<Spanned<RawPerKey>>,
        }
        let raw: Raw = toml::from_str(text)?;
        resolve(raw.rate.as_ref(), raw.per_key.as_ref(), &|span| {
            format!("at {}", span.start)
        })
    }

    #[test]
    fn rates_parse_with_units_and_multiples() {
        let rate = |text| parse_rate(text).map(|r| (r.count, r.period.as_secs())).ok();
        assert_eq!(rate("100/s"), Some((100, 1)));
        assert_eq!(rate(" 10 / min "), Some((10, 60)));
        assert_eq!(rate("10/ s"), Some((10, 1)));
        assert_eq!(rate("500/15min"), Some((500, 900)));
        assert_eq!(rate("3/2h"), Some((3, 7200)));
        assert_eq!(rate("7/10s"), Some((7, 10)));
        assert_eq!(rate("1/24h"), Some((1, 86_400)));
        assert_eq!(rate("100000/s"), Some((100_000, 1)));
        for bad in [
            "",
            "100",
            "/s",
            "0/s",
            "-1/s",
            "1.5/s",
            "100001/s",
            "10/0s",
            "10/25h",
            "10/ms",
            "10/day",
            "10/s/s",
            "x/s",
            "10/1e3s",
            "99999999999999999999/s",
            "1/18446744073709551615h",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn key_paths_are_bounded_names() {
        assert_eq!(KeyPath::parse("args.0").unwrap().segments(), ["args", "0"]);
        assert_eq!(KeyPath::parse("args.0.user_id").unwrap().to_string(), "args.0.user_id");
        for bad in [
            "",
            ".",
            "args.",
            ".args",
            "args..0",
            "a b",
            "args.0;DEL",
            "a.b.c.d.e.f.g.h.i",
            "é",
        ] {
            assert!(KeyPath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(KeyPath::parse(&"a".repeat(65)).is_err());
        assert!(KeyPath::parse(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn per_key_needs_a_limit_and_bounds_concurrency() {
        let l = limits("rate = \"50/s\"\nper_key = { key = \"args.0\", rate = \"10/min\", concurrency = 2 }").unwrap();
        assert_eq!(l.rate.map(|r| r.count), Some(50));
        let per_key = l.per_key.unwrap();
        assert_eq!(per_key.key.to_string(), "args.0");
        assert_eq!(per_key.concurrency, Some(2));
        assert_eq!(per_key.rate.map(|r| r.period.as_secs()), Some(60));
        assert!(!limits("").unwrap().any());
        assert!(limits("rate = \"1/s\"").unwrap().any());
        for bad in [
            "per_key = { key = \"args.0\" }",
            "per_key = { key = \"args.0\", concurrency = 0 }",
            "per_key = { key = \"args.0\", concurrency = 10001 }",
            "per_key = { key = \"args.0\", concurrency = -1 }",
            "per_key = { key = \"args..0\", concurrency = 1 }",
            "per_key = { concurrency = 1 }",
            "per_key = { key = \"args.0\", concurrency = 1, lease = 3 }",
            "per_key = { key = \"args.0\", rate = \"fast\" }",
            "rate = \"100\"",
        ] {
            assert!(limits(bad).is_err(), "{bad} accepted");
        }
        let err = limits("per_key = { key = \"args.0\", concurrency = 0 }")
            .unwrap_err()
            .to_string();
        assert!(err.contains("limits.per_key.concurrency"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(crate::proptest_config::config(500))]

        /// Whatever the text, parsing a rate or a key path never panics,
        /// and what it accepts is within the bounds.
        #[test]
        fn hostile_rates_and_paths_never_panic(text in ".{0,40}", n in 0u64..200_000, unit in "(s|min|h|ms|d|[0-9]{1,6}(s|min|h))") {
            for candidate in [text.clone(), format!("{n}/{unit}")] {
                if let Ok(rate) = parse_rate(&candidate) {
                    proptest::prop_assert!((1..=MAX_RATE_COUNT).contains(&rate.count));
                    proptest::prop_assert!((MIN_RATE_PERIOD..=MAX_RATE_PERIOD).contains(&rate.period));
                }
            }
            if let Ok(path) = KeyPath::parse(&text) {
                proptest::prop_assert!(path.segments().len() <= MAX_KEY_SEGMENTS);
                proptest::prop_assert!(path.segments().iter().all(|s| s.len() <= MAX_KEY_SEGMENT_LEN && !s.is_empty()));
            }
        }
    }
}
