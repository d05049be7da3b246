//! The latency histograms in Redis: written by each heartbeat
//! ([`publish`]), read back merged over the last hour ([`last_hour`]).
//! The format, buckets and percentiles are `metrics::published`'s; this
//! module only moves the counts in and out of the per-minute hashes.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use serde::Serialize;

use super::bounded::{self, Read};
use super::keys;
use crate::metrics::published::{Buckets, Delta, KEEP_SECS, Kind, Summary, WINDOW_MINUTES, field, parse_field};

/// The UTC minute of the epoch time `secs`.
pub fn minute_of(secs: f64) -> u64 {
    (secs.max(0.0) / 60.0) as u64
}

/// Adds the commands that write `delta` into the hash of `minute` to
/// `pipe` (their replies ignored): one `HINCRBY` per count, then the
/// expiry. Nothing when `delta` is empty.
pub fn publish(pipe: &mut redis::Pipeline, minute: u64, delta: &Delta) {
    if delta.is_empty() {
        return;
    }
    let key = keys::latency(minute);
    for ((kind, bucket, class), count) in delta {
        pipe.cmd("HINCRBY")
            .arg(&key)
            .arg(field(*kind, *bucket, class))
            .arg(*count)
            .ignore();
    }
    pipe.cmd("EXPIRE").arg(&key).arg(KEEP_SECS).ignore();
}

/// One class's latencies over the last hour, every process merged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClassLatency {
    /// Execution time (instantiate + perform), ms.
    pub execution: Summary,
    /// Queue latency (enqueued → started), ms.
    pub queue: Summary,
}

/// Most fields read of one minute's hash (a field per class, kind and
/// bucket in use); a minute with more is skipped.
const MAX_FIELDS: usize = 100_000;
/// Longest count read (a decimal `u64`).
const MAX_COUNT_BYTES: usize = 32;

/// Per class, the percentiles of the [`WINDOW_MINUTES`] minutes up to the
/// one of `now` (epoch seconds): one round trip ([`bounded::hash_all`]).
/// Fields and counts that are not ours are skipped, and so is a minute's
/// key of another type or with more than 100,000 fields.
pub async fn last_hour<C>(conn: &mut C, now: f64) -> Result<BTreeMap<String, ClassLatency>>
where
    C: ConnectionLike + Send,
{
    let current = minute_of(now);
    let minutes: Vec<String> = (current.saturating_sub(WINDOW_MINUTES - 1)..=current)
        .map(keys::latency)
        .collect();
    let read = bounded::hash_all(conn, &minutes, MAX_COUNT_BYTES, MAX_FIELDS, (0, 0))
        .await
        .context("cannot read the latency histograms from Redis")?;
    let hashes = minutes
        .iter()
        .zip(read)
        .filter_map(|(key, hash)| match hash {
            Read::Found(pairs) => Some(
                pairs
                    .into_iter()
                    .filter_map(|(name, count)| Some((name.whole()?.to_vec(), count.whole()?.to_vec())))
                    .collect(),
            ),
            Read::Missing => None,
            other => {
                tracing::debug!(key = %key, "latency histogram skipped: {other:?}");
                None
            }
        })
        .collect();
    Ok(merge(hashes))
}

/// Merges the minutes' hashes into per-class summaries.
fn merge(hashes: Vec<HashMap<Vec<u8>, Vec<u8>>>) -> BTreeMap<String, ClassLatency> {
    let mut buckets: BTreeMap<String, (Buckets, Buckets)> = BTreeMap::new();
    for (name, count) in hashes.into_iter().flatten() {
        let (Ok(name), Some(count)) = (
            std::str::from_utf8(&name),
            std::str::from_utf8(&count).ok().and_then(|c| c.parse::<u64>().ok()),
        ) else {
            continue;
        };
        let Some((kind, bucket, class)) = parse_field(name) else {
            continue;
        };
        let entry = buckets.entry(class.to_owned()).or_default();
        let target = match kind {
            Kind::Execution => &mut entry.0,
            Kind::Queue => &mut entry.1,
        };
        let slot = target.entry(bucket).or_default();
        *slot = slot.saturating_add(count);
    }
    buckets
        .into_iter()
        .map(|(class, (execution, queue))| {
            (
                class,
                ClassLatency {
                    execution: Summary::of(&execution),
                    queue: Summary::of(&queue),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::published::bucket_of;

    fn entry(name: &str, count: &str) -> (Vec<u8>, Vec<u8>) {
        (name.as_bytes().to_vec(), count.as_bytes().to_vec())
    }

    #[test]
    fn minutes_merge_and_foreign_fields_are_skipped() {
        let ten_ms = bucket_of(10_000);
        let one_s = bucket_of(1_000_000);
        let minute_a = HashMap::from([
            entry(&format!("e:{ten_ms}:A"), "90"),
            entry(&format!("q:{one_s}:A"), "100"),
            entry("garbage", "5"),
        ]);
        let minute_b = HashMap::from([entry(&format!("e:{one_s}:A"), "10"), (vec![0xff, b':'], b"1".to_vec())]);
        let minute_c = HashMap::from([entry(&format!("e:{ten_ms}:A"), "not a number")]);
        let merged = merge(vec![minute_a, minute_b, minute_c]);
        assert_eq!(merged.len(), 1);
        let a = merged["A"];
        assert_eq!(a.execution.count, 100);
        assert!((9.0..11.0).contains(&a.execution.p50), "{a:?}");
        assert!((900.0..1100.0).contains(&a.execution.p95), "{a:?}");
        assert_eq!(a.queue.count, 100);
    }

    #[test]
    fn minutes_are_utc_minutes_of_the_epoch() {
        assert_eq!(minute_of(0.0), 0);
        assert_eq!(minute_of(119.9), 1);
        assert_eq!(minute_of(-5.0), 0);
    }
}
