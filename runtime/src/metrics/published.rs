//! Latency histograms every process publishes to Redis with its heartbeat,
//! so that `wasmjobs stats` and `wasmjobs web` can show execution time and
//! queue latency percentiles per class over the last hour, cluster-wide.
//!
//! **Format.** One hash per UTC minute, `wasmjobs:latency:<unix minute>`
//! ([`crate::redis::keys::latency`]); each field is
//! `<kind>:<bucket>:<class>` → count, `kind` being `e` (execution) or `q`
//! (queue latency). Every process `HINCRBY`s the counts it recorded since
//! its previous beat into the hash of the current minute, so the hashes
//! are merged by construction: no process owns a key, and N processes cost
//! no more keys than one. Each hash expires [`KEEP_SECS`] after its last
//! write; the fields of one minute are bounded by classes × 2 × the
//! buckets used (a job class is one a plugin serves: the recorder never
//! keys on an arbitrary name, see [`super::Metrics::record`]).
//!
//! **Buckets** are log-linear: 8 per power of two of microseconds
//! ([`bucket_of`]), so a bucket is at most 12.5% wide and a percentile read
//! back is within ~6% of the recorded value. The process keeps exact HDR
//! histograms ([`super::ClassStats`]); what it publishes is the difference
//! between two snapshots of them ([`Published::delta`]), computed at each
//! beat, so nothing is added to a job's own path.
//!
//! **Reading** ([`crate::redis::latency`]) merges the last 60 minutes'
//! hashes and asks [`quantile`] for p50 / p95 / p99.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{ClassStats, Metrics};

/// How long a minute's hash is kept after its last write: the hour the
/// readers look at, plus a margin for clocks that disagree.
pub const KEEP_SECS: i64 = 2 * 3600;
/// Minutes the readers merge.
pub const WINDOW_MINUTES: u64 = 60;

/// Histogram buckets by index (see [`bucket_of`]) → count.
pub type Buckets = BTreeMap<u16, u64>;

/// Which latency a bucket count is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// From instantiation to the end of `perform`.
    Execution,
    /// From `enqueued_at` to the start.
    Queue,
}

impl Kind {
    /// Its letter in a field name.
    pub fn letter(self) -> char {
        match self {
            Kind::Execution => 'e',
            Kind::Queue => 'q',
        }
    }
}

/// The bucket of a value of `us` microseconds: values below 8 have one
/// bucket each; above, each power of two is split in 8.
pub fn bucket_of(us: u64) -> u16 {
    if us < 8 {
        return us as u16;
    }
    let exp = 63 - us.leading_zeros(); // ≥ 3
    let sub = (us >> (exp - 3)) & 7;
    ((exp - 2) * 8 + sub as u32) as u16
}

/// The smallest value of bucket `bucket`, and the first value past it,
/// in microseconds (saturating for buckets past `u64`).
pub fn bucket_bounds(bucket: u16) -> (u64, u64) {
    if bucket < 8 {
        return (u64::from(bucket), u64::from(bucket) + 1);
    }
    let exp = u32::from(bucket / 8) + 2;
    let sub = u64::from(bucket % 8);
    let unit = 1u64.checked_shl(exp - 3).unwrap_or(u64::MAX);
    let low = (8 + sub).saturating_mul(unit);
    let high = (9 + sub).saturating_mul(unit);
    (low, high)
}

/// The field name of a count: `<kind>:<bucket>:<class>` (the class last,
/// so it may contain anything, `:` included).
pub fn field(kind: Kind, bucket: u16, class: &str) -> String {
    format!("{}:{bucket}:{class}", kind.letter())
}

/// Parses a field name written by [`field`]; `None` for anything else
/// (anyone with Redis access can write into these hashes).
pub fn parse_field(field: &str) -> Option<(Kind, u16, &str)> {
    let (kind, rest) = field.split_once(':')?;
    let (bucket, class) = rest.split_once(':')?;
    let kind = match kind {
        "e" => Kind::Execution,
        "q" => Kind::Queue,
        _ => return None,
    };
    let bucket: u16 = bucket.parse().ok()?;
    (!class.is_empty()).then_some((kind, bucket, class))
}

/// The value below which a share `q` (0..=1) of the counts lie, in
/// milliseconds: the middle of the bucket where that rank falls; `None`
/// with no counts.
pub fn quantile(buckets: &Buckets, q: f64) -> Option<f64> {
    let total: u64 = buckets.values().sum();
    if total == 0 {
        return None;
    }
    // The rank of the q-quantile, 1-based, as HDR histograms count it.
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (&bucket, &count) in buckets {
        seen = seen.saturating_add(count);
        if seen >= rank {
            let (low, high) = bucket_bounds(bucket);
            let middle = if high - low <= 1 {
                low as f64
            } else {
                (low as f64 + high as f64) / 2.0
            };
            return Some(middle / 1000.0);
        }
    }
    None
}

/// A latency in milliseconds, short, as `stats` and the dashboard show
/// it: `0.012ms`, `4.2ms`, `1.3s`, `2.0m`.
pub fn short_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3}ms")
    } else if ms < 1_000.0 {
        format!("{ms:.1}ms")
    } else if ms < 60_000.0 {
        format!("{:.1}s", ms / 1_000.0)
    } else {
        format!("{:.1}m", ms / 60_000.0)
    }
}

/// p50 / p95 / p99 of a class's latency over the window, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Jobs counted.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// The summary of `buckets`.
    pub fn of(buckets: &Buckets) -> Self {
        Self {
            count: buckets.values().sum(),
            p50: quantile(buckets, 0.50).unwrap_or_default(),
            p95: quantile(buckets, 0.95).unwrap_or_default(),
            p99: quantile(buckets, 0.99).unwrap_or_default(),
        }
    }
}

/// Adds the counts of HDR histogram `histogram` to `buckets`, each HDR
/// bucket by its median value.
fn add_histogram(buckets: &mut Buckets, histogram: &Histogram<u64>) {
    for value in histogram.iter_recorded() {
        let us = histogram.median_equivalent(value.value_iterated_to());
        *buckets.entry(bucket_of(us)).or_default() += value.count_since_last_iteration();
    }
}

/// What one beat publishes: (kind, bucket, class) → count.
pub type Delta = BTreeMap<(Kind, u16, String), u64>;

/// What this process has published so far: the snapshot of its histograms
/// at the last successful publication.
#[derive(Default)]
pub struct Published {
    last: Mutex<BTreeMap<String, ClassStats>>,
}

impl Published {
    /// The counts recorded since the last [`Published::commit`], and the
    /// snapshot to commit once they are written.
    pub fn delta(&self, metrics: &Metrics) -> (Delta, BTreeMap<String, ClassStats>) {
        let now = metrics.by_class();
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let mut delta = Delta::new();
        for (class, stats) in &now {
            for (kind, histogram, before) in [
                (Kind::Execution, &stats.execution, last.get(class).map(|s| &s.execution)),
                (
                    Kind::Queue,
                    &stats.queue_latency,
                    last.get(class).map(|s| &s.queue_latency),
                ),
            ] {
                let mut buckets = Buckets::new();
                add_histogram(&mut buckets, histogram);
                if let Some(before) = before {
                    let mut old = Buckets::new();
                    add_histogram(&mut old, before);
                    for (bucket, count) in old {
                        if let Some(now) = buckets.get_mut(&bucket) {
                            *now = now.saturating_sub(count);
                        }
                    }
                }
                for (bucket, count) in buckets {
                    if count > 0 {
                        delta.insert((kind, bucket, class.clone()), count);
                    }
                }
            }
        }
        (delta, now)
    }

    /// Records that the delta computed with `snapshot` was written.
    pub fn commit(&self, snapshot: BTreeMap<String, ClassStats>) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::{Counted, JobRecord};

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        let mut previous = 0;
        for us in 0..100_000u64 {
            let bucket = bucket_of(us);
            assert!(
                bucket == previous || bucket == previous + 1,
                "{us}: {previous} → {bucket}"
            );
            let (low, high) = bucket_bounds(bucket);
            assert!((low..high).contains(&us), "{us} not in bucket {bucket} = {low}..{high}");
            if us >= 8 {
                assert!((high - low) as f64 / low as f64 <= 0.125 + 1e-9);
            }
            previous = bucket;
        }
        assert_eq!(bucket_of(3_600_000_000), 237);
        assert_eq!(bucket_of(u64::MAX), 495);
        assert_eq!(bucket_bounds(495).1, u64::MAX);
    }

    #[test]
    fn fields_round_trip_and_foreign_ones_are_refused() {
        let name = field(Kind::Queue, 42, "Billing::Invoice:v2");
        assert_eq!(name, "q:42:Billing::Invoice:v2");
        assert_eq!(parse_field(&name), Some((Kind::Queue, 42, "Billing::Invoice:v2")));
        for bad in ["x:1:C", "e:-1:C", "e:70000:C", "e:1:", "e1C", "", "e::C"] {
            assert_eq!(parse_field(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quantiles_come_within_the_bucket_width() {
        // 1..=1000 ms, one job each.
        let mut buckets = Buckets::new();
        for ms in 1..=1000u64 {
            *buckets.entry(bucket_of(ms * 1000)).or_default() += 1;
        }
        for (q, exact) in [(0.5, 500.0), (0.95, 950.0), (0.99, 990.0)] {
            let got = quantile(&buckets, q).unwrap();
            assert!((got - exact).abs() / exact <= 0.07, "q{q}: {got} vs {exact}");
        }
        assert_eq!(quantile(&Buckets::new(), 0.5), None);
        let summary = Summary::of(&buckets);
        assert_eq!(summary.count, 1000);
    }

    #[test]
    fn each_beat_publishes_only_what_was_recorded_since_the_last() {
        let metrics = Metrics::new(true);
        let record = |class: &'static str, ms: u64| {
            metrics.record(&JobRecord {
                class,
                version: "v1",
                outcome: Counted::Success,
                queue_latency: Some(Duration::from_millis(1)),
                execution: Some(Duration::from_millis(ms)),
            })
        };
        let published = Published::default();
        for _ in 0..10 {
            record("A", 5);
        }
        let (delta, _) = published.delta(&metrics);
        let executions: u64 = delta
            .iter()
            .filter(|((kind, _, class), _)| *kind == Kind::Execution && class == "A")
            .map(|(_, n)| n)
            .sum();
        assert_eq!(executions, 10);
        // Not committed (the write failed): the same counts again, plus new ones.
        record("B", 100);
        let (again, snapshot) = published.delta(&metrics);
        assert_eq!(again.values().sum::<u64>(), 22);
        drop(snapshot);
        let (_, snapshot) = published.delta(&metrics);
        published.commit(snapshot);
        let (empty, _) = published.delta(&metrics);
        assert!(empty.is_empty(), "{empty:?}");
        record("B", 100);
        let (one, _) = published.delta(&metrics);
        let b_exec: Vec<_> = one
            .iter()
            .filter(|((kind, _, _), _)| *kind == Kind::Execution)
            .collect();
        assert_eq!(b_exec.len(), 1);
        let ((_, bucket, class), count) = b_exec[0];
        assert_eq!((class.as_str(), *count), ("B", 1));
        let (low, high) = bucket_bounds(*bucket);
        assert!((low..high).contains(&100_000), "{low}..{high}");
    }
}
