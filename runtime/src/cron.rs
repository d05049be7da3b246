//! Cron expressions: parsing, time zones, and the ticks they name.
//!
//! One type, [`CronExpr`], shared by the manifest (`[[schedule]]`, checked
//! when a plugin loads), the cron poller (which tick is due) and
//! `wasmjobs schedule` (the next run). Parsing is the `croner` crate's:
//! 5 fields (`min hour dom month dow`) or 6 with seconds first, names
//! (`MON`, `JAN`), ranges, steps, lists, `L`, `W`, `#` and the `@hourly`
//! family; day-of-month and day-of-week combine with OR, as in Vixie cron
//! and sidekiq-cron's parser (fugit). Times are evaluated in an IANA time
//! zone (`chrono-tz`, UTC by default), so `0 9 * * *` in `Europe/Berlin`
//! follows daylight saving time.
//!
//! Ticks are whole epoch seconds: a tick's identity (the claim in Redis) is
//! its UTC time to the second, as sidekiq-cron writes it
//! ([`iso8601`]). sidekiq-cron keeps the time zone inside its `cron` field
//! (`"0 9 * * * Europe/Berlin"`, fugit's syntax), so [`CronExpr::sidekiq_field`]
//! and [`CronExpr::parse_sidekiq`] write and read it that way.
//!
//! Pure functions only: no Redis, no clock of its own.

use std::str::FromStr;

use anyhow::{Result, anyhow, bail};
use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Longest cron expression accepted, in bytes (with its time zone).
pub const MAX_EXPRESSION_LEN: usize = 200;

/// A parsed cron expression and the zone it is evaluated in.
#[derive(Debug, Clone)]
pub struct CronExpr {
    expression: String,
    zone: Tz,
    cron: Cron,
}

impl CronExpr {
    /// Parses `expression` (5 fields, or 6 with seconds first, or an
    /// `@nickname`) evaluated in `zone` (an IANA name; UTC when `None`).
    pub fn parse(expression: &str, zone: Option<&str>) -> Result<Self> {
        let expression = expression.trim();
        if expression.len() > MAX_EXPRESSION_LEN {
            bail!("cron expression is longer than {MAX_EXPRESSION_LEN} bytes");
        }
        let fields = expression.split_whitespace().count();
        if !expression.starts_with('@') && !(5..=6).contains(&fields) {
            bail!(
                "cron expression {expression:?} has {fields} fields; expected 5 (minute hour day month weekday) or 6 (seconds first)"
            );
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expression)
            .map_err(|e| anyhow!("cron expression {expression:?} is not valid: {e}"))?;
        let zone = match zone {
            None => Tz::UTC,
            Some(name) => parse_zone(name)?,
        };
        let expr = Self {
            expression: expression.split_whitespace().collect::<Vec<_>>().join(" "),
            zone,
            cron,
        };
        // A pattern that never matches (`0 0 31 2 *`) is refused here
        // rather than found idle later.
        if expr.next_after(Utc::now().timestamp()).is_none() {
            bail!("cron expression {expression:?} never matches a time");
        }
        Ok(expr)
    }

    /// Parses sidekiq-cron's `cron` field: an expression, optionally
    /// followed by a time zone name (`"0 9 * * * Europe/Berlin"`).
    pub fn parse_sidekiq(field: &str) -> Result<Self> {
        let field = field.trim();
        if field.len() > MAX_EXPRESSION_LEN {
            bail!("cron field is longer than {MAX_EXPRESSION_LEN} bytes");
        }
        if let Some((expression, last)) = field.rsplit_once(char::is_whitespace)
            && last.chars().any(|c| c.is_ascii_alphabetic())
            && let Ok(zone) = Tz::from_str(last)
        {
            return Self::parse(expression, Some(zone.name()));
        }
        Self::parse(field, None)
    }

    /// The expression as written (whitespace normalised), without its zone.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The IANA name of the zone it is evaluated in (`UTC` by default).
    pub fn zone(&self) -> &'static str {
        self.zone.name()
    }

    /// sidekiq-cron's `cron` field: the expression, plus the zone unless UTC.
    pub fn sidekiq_field(&self) -> String {
        if self.zone == Tz::UTC {
            self.expression.clone()
        } else {
            format!("{} {}", self.expression, self.zone.name())
        }
    }

    /// The first tick strictly after epoch second `after`, if any.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        let start = self.zone.from_utc_datetime(&utc(after)?.naive_utc());
        self.cron
            .find_next_occurrence(&start, false)
            .ok()
            .map(|t| t.timestamp())
    }

    /// The last tick at or before epoch second `at`, if any.
    pub fn latest_at_or_before(&self, at: i64) -> Option<i64> {
        let start = self.zone.from_utc_datetime(&utc(at)?.naive_utc());
        self.cron
            .find_previous_occurrence(&start, true)
            .ok()
            .map(|t| t.timestamp())
    }
}

/// An IANA time zone by name, with a clear error.
fn parse_zone(name: &str) -> Result<Tz> {
    let name = name.trim();
    if name.is_empty() || name.len() > 64 {
        bail!("time zone {name:?} is not an IANA time zone name");
    }
    Tz::from_str(name)
        .map_err(|_| anyhow!("unknown time zone {name:?} (expected an IANA name such as \"Europe/Berlin\")"))
}

fn utc(epoch_secs: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_opt(epoch_secs, 0).single()
}

/// A tick's identity, as sidekiq-cron writes it into `…:enqueued` (Ruby's
/// `Time#iso8601` in UTC): `2026-12-02T03:04:05Z`.
pub fn iso8601(epoch_secs: i64) -> String {
    utc(epoch_secs)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// sidekiq-cron's `last_enqueue_time` (`%Y-%m-%d %H:%M:%S %z`, UTC):
/// `2026-12-02 03:04:05 +0000`.
pub fn last_enqueue_time(epoch_secs: f64) -> String {
    utc(epoch_secs.floor() as i64)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S %z").to_string())
        .unwrap_or_default()
}

/// Reads a `last_enqueue_time` back (that format, or RFC 3339 as older
/// versions wrote), as epoch seconds.
pub fn parse_last_enqueue_time(text: &str) -> Option<f64> {
    let text = text.trim();
    DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S %z")
        .or_else(|_| DateTime::parse_from_rfc3339(text))
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S UTC"))
        .ok()
        .map(|t| t.timestamp() as f64)
        .or_else(|| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S UTC")
                .ok()
                .map(|t| t.and_utc().timestamp() as f64)
        })
}

/// How Ruby prints a UTC `Time` (`Time#to_s`), as sidekiq-cron's
/// `jid_history` entries hold it: `2026-12-02 03:04:05 UTC`.
pub fn ruby_time(epoch_secs: f64) -> String {
    utc(epoch_secs.floor() as i64)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// A UTC time for people: `2026-12-02 03:04:05Z`.
pub fn display(epoch_secs: i64) -> String {
    utc(epoch_secs)
        .map(|t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-02T03:04:05Z.
    const T: i64 = 1_796_180_645;

    #[test]
    fn five_fields_tick_on_the_minute() {
        let every5 = CronExpr::parse("*/5 * * * *", None).unwrap();
        assert_eq!(every5.zone(), "UTC");
        assert_eq!(iso8601(every5.next_after(T).unwrap()), "2026-12-02T03:05:00Z");
        assert_eq!(iso8601(every5.latest_at_or_before(T).unwrap()), "2026-12-02T03:00:00Z");
        // At a tick: it is the latest, and the next is the one after.
        let at = every5.next_after(T).unwrap();
        assert_eq!(every5.latest_at_or_before(at), Some(at));
        assert_eq!(every5.next_after(at), Some(at + 300));
    }

    #[test]
    fn six_fields_have_seconds_first() {
        let every_second = CronExpr::parse("*/1 * * * * *", None).unwrap();
        assert_eq!(every_second.next_after(T), Some(T + 1));
        assert_eq!(every_second.latest_at_or_before(T), Some(T));
        let at_30 = CronExpr::parse("30 * * * * *", None).unwrap();
        assert_eq!(iso8601(at_30.next_after(T).unwrap()), "2026-12-02T03:04:30Z");
    }

    #[test]
    fn zones_follow_local_time() {
        let nine = CronExpr::parse("0 9 * * *", Some("Europe/Berlin")).unwrap();
        // December: Berlin is UTC+1.
        assert_eq!(iso8601(nine.next_after(T).unwrap()), "2026-12-02T08:00:00Z");
        assert_eq!(nine.sidekiq_field(), "0 9 * * * Europe/Berlin");
        // July: UTC+2.
        let july = 1_783_296_000; // 2026-07-06T00:00:00Z
        assert_eq!(iso8601(nine.next_after(july).unwrap()), "2026-07-06T07:00:00Z");
    }

    #[test]
    fn sidekiq_fields_carry_their_zone() {
        let expr = CronExpr::parse_sidekiq("0 9 * * *  America/New_York").unwrap();
        assert_eq!((expr.expression(), expr.zone()), ("0 9 * * *", "America/New_York"));
        let expr = CronExpr::parse_sidekiq("*/5 * * * *").unwrap();
        assert_eq!((expr.expression(), expr.zone()), ("*/5 * * * *", "UTC"));
        assert_eq!(expr.sidekiq_field(), "*/5 * * * *");
        assert!(CronExpr::parse_sidekiq("every day at noon").is_err());
    }

    #[test]
    fn bad_expressions_and_zones_are_refused() {
        for bad in [
            "",
            "* * * *",
            "* * * * * * *",
            "61 * * * *",
            "*/0 * * * *",
            "a b c d e",
            "0 0 31 2 *",
            &"* ".repeat(150),
        ] {
            assert!(CronExpr::parse(bad, None).is_err(), "{bad:?}");
        }
        let err = CronExpr::parse("* * * * *", Some("Mars/Olympus"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown time zone"), "{err}");
        assert!(CronExpr::parse("@hourly", None).is_ok());
        assert!(CronExpr::parse("0 12 * * MON-FRI", Some("Asia/Tokyo")).is_ok());
    }

    #[test]
    fn times_are_written_as_sidekiq_cron_writes_them() {
        assert_eq!(iso8601(T), "2026-12-02T03:04:05Z");
        assert_eq!(last_enqueue_time(T as f64 + 0.7), "2026-12-02 03:04:05 +0000");
        assert_eq!(ruby_time(T as f64), "2026-12-02 03:04:05 UTC");
        assert_eq!(parse_last_enqueue_time("2026-12-02 03:04:05 +0000"), Some(T as f64));
        assert_eq!(parse_last_enqueue_time("2026-12-02 04:04:05 +0100"), Some(T as f64));
        assert_eq!(parse_last_enqueue_time("2026-12-02T03:04:05Z"), Some(T as f64));
        assert_eq!(parse_last_enqueue_time("2026-12-02 03:04:05 UTC"), Some(T as f64));
        assert_eq!(parse_last_enqueue_time("yesterday"), None);
    }
}
