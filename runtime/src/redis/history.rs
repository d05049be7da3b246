//! Throughput history, for the dashboard's charts to draw on open rather
//! than from the first second the page is watched.
//!
//! - **Per day**: Sidekiq's daily counters `stat:processed:<date>` and
//!   `stat:failed:<date>` (UTC dates, kept five years), which Sidekiq's Web
//!   UI draws its history graph from and which Ruby Sidekiq processes
//!   write too.
//! - **Per minute, over the last hour**: `wasmjobs:stat:minute:<unix
//!   minute>` hashes (`processed`, `failed`), which each runner's heartbeat
//!   adds the jobs it recorded since its last beat to ([`stage_minute`]:
//!   nothing on a job's path; a job counts in the minute of the beat after
//!   it, at most 10 s later); each expires [`MINUTE_KEEP_SECS`] after its
//!   last write. Ruby Sidekiq processes do not write them: their jobs show
//!   per day only.
//!
//! [`read`] is two commands per day and one per minute in one pipelined
//! round trip. A key another client wrote with another type reads as zero
//! and is listed in [`History::unreadable`]; a counter that is not a number
//! reads as zero, as Ruby's `to_i` would.

use anyhow::{Context, Result};
use redis::Value;
use redis::aio::ConnectionLike;
use serde::Serialize;

use super::api::counter;
use super::bounded::{self, Unreadable};
use super::{keys, utc_date};

/// Minutes [`read`] returns, the current one last.
pub const MINUTES: u64 = 60;
/// Most days [`read`] returns.
pub const MAX_DAYS: u32 = 366;
/// How long a minute's hash is kept after its last write.
pub const MINUTE_KEEP_SECS: i64 = 2 * 3600;

/// Adds jobs processed and failed to the hash of the minute of `now`
/// (epoch seconds), to `pipe` (replies ignored).
pub fn stage_minute(pipe: &mut redis::Pipeline, now: f64, processed: u64, failed: u64) {
    if processed == 0 && failed == 0 {
        return;
    }
    let key = keys::minute_stats(super::latency::minute_of(now));
    if processed > 0 {
        pipe.cmd("HINCRBY").arg(&key).arg("processed").arg(processed).ignore();
    }
    if failed > 0 {
        pipe.cmd("HINCRBY").arg(&key).arg("failed").arg(failed).ignore();
    }
    pipe.cmd("EXPIRE").arg(&key).arg(MINUTE_KEEP_SECS).ignore();
}

/// Jobs processed (failures included, as Sidekiq counts) and failed in a
/// minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// The minute's start, epoch seconds.
    pub t: u64,
    /// Jobs processed.
    pub processed: u64,
    /// Of those, failed.
    pub failed: u64,
}

/// Jobs processed and failed on a UTC date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Day {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// Jobs processed.
    pub processed: u64,
    /// Of those, failed.
    pub failed: u64,
}

/// The last [`MINUTES`] minutes and the last days, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct History {
    /// The minutes up to and including the current one (partial).
    pub minutes: Vec<Minute>,
    /// The days up to and including today (partial).
    pub days: Vec<Day>,
    /// Keys of another type, read as zero.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// Reads the last [`MINUTES`] minutes and the last `days` days (at most
/// [`MAX_DAYS`], at least one) up to `now` (epoch seconds).
pub async fn read<C>(conn: &mut C, now: f64, days: u32) -> Result<History>
where
    C: ConnectionLike + Send,
{
    let days = days.clamp(1, MAX_DAYS);
    let dates: Vec<String> = (0..days)
        .rev()
        .map(|back| utc_date(now - f64::from(back) * 86_400.0))
        .collect();
    let current = super::latency::minute_of(now);
    let minutes: Vec<u64> = (current.saturating_sub(MINUTES - 1)..=current).collect();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for date in &dates {
        pipe.get(keys::daily(keys::STAT_PROCESSED, date));
        pipe.get(keys::daily(keys::STAT_FAILED, date));
    }
    for minute in &minutes {
        pipe.cmd("HMGET")
            .arg(keys::minute_stats(*minute))
            .arg("processed")
            .arg("failed");
    }
    let replies: Vec<Value> = pipe
        .query_async(conn)
        .await
        .context("cannot read the daily and per-minute counters from Redis")?;
    let mut replies = replies.into_iter();
    let mut unreadable = Vec::new();
    let mut next = |key: String| -> Vec<Option<Vec<u8>>> {
        let value = replies.next().unwrap_or(Value::Nil);
        let read = match value {
            Value::Array(_) => bounded::reply::<Vec<Option<Vec<u8>>>>(value),
            value => bounded::reply::<Option<Vec<u8>>>(value).map(|v| vec![v]),
        };
        read.unwrap_or_else(|why| {
            unreadable.push(Unreadable::new(&key, format!("not a counter: {why}")));
            Vec::new()
        })
    };
    let mut counted = |key: String| next(key).into_iter().next().flatten();
    let days: Vec<Day> = dates
        .into_iter()
        .map(|date| {
            let processed = counter(counted(keys::daily(keys::STAT_PROCESSED, &date)));
            let failed = counter(counted(keys::daily(keys::STAT_FAILED, &date)));
            Day {
                date,
                processed,
                failed,
            }
        })
        .collect();
    let minutes = minutes
        .into_iter()
        .map(|minute| {
            let mut fields = next(keys::minute_stats(minute)).into_iter();
            let processed = counter(fields.next().flatten());
            let failed = counter(fields.next().flatten());
            Minute {
                t: minute * 60,
                processed,
                failed,
            }
        })
        .collect();
    Ok(History {
        minutes,
        days,
        unreadable,
    })
}
