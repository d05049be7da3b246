//! What every job costs, recorded by the host and read without locks on the
//! hot path.
//!
//! | module | role |
//! |---|---|
//! | (this) [`Metrics`] | per class × plugin version: outcome counts and HDR histograms of queue latency and execution time |
//! | [`limited`] | jobs rescheduled by a cluster limit, per plugin and reason |
//! | [`published`] | the latency histograms each heartbeat publishes to Redis, merged cluster-wide for `stats` and `web` |
//! | [`process`] | per process: RSS now and peak, %CPU sampled every second, and the gauges the runner reports |
//! | [`exposition`] | the Prometheus text format (`/metrics`) and the JSON document (`/stats`) |
//! | [`server`] | the HTTP endpoint of `wasmjobs run --metrics-addr` |
//!
//! Recording is sharded: each thread records into its own shard (a mutex no
//! other thread normally touches), and readers merge the shards. Workers
//! never contend on one shared structure per job (the noop benchmark runs
//! within noise with recording on or off; see `docs/observability.md`).

pub mod exposition;
pub mod limited;
pub mod process;
pub mod published;
pub mod redis_shards;
pub mod server;
pub mod tally;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

pub use process::{ProcessGauges, ProcessSampler};
pub use tally::{Counted, Tally};

/// Largest value a histogram holds, in microseconds (one hour); longer
/// values are recorded as one hour.
const MAX_MICROS: u64 = 3_600_000_000;
/// Significant decimal digits kept: 1% resolution, ~32 KB per histogram.
const SIGFIG: u8 = 2;

/// One finished job, as recorded.
#[derive(Debug, Clone, Copy)]
pub struct JobRecord<'a> {
    /// Its class.
    pub class: &'a str,
    /// The plugin version that ran it ("" when no plugin did).
    pub version: &'a str,
    /// How it ended.
    pub outcome: Counted,
    /// From `enqueued_at` to its start, if the payload said when it was enqueued.
    pub queue_latency: Option<Duration>,
    /// From instantiation to the end of `perform`, if it ran.
    pub execution: Option<Duration>,
}

/// Counts and histograms of one class × version.
#[derive(Debug, Clone)]
pub struct ClassStats {
    /// How its jobs ended.
    pub jobs: Tally,
    /// Queue latency, microseconds.
    pub queue_latency: Histogram<u64>,
    /// Sum of the queue latencies, microseconds (for Prometheus `_sum`).
    pub queue_latency_sum: u64,
    /// Execution time, microseconds.
    pub execution: Histogram<u64>,
    /// Sum of the execution times, microseconds.
    pub execution_sum: u64,
}

impl ClassStats {
    fn new() -> Self {
        Self {
            jobs: Tally::default(),
            queue_latency: histogram(),
            queue_latency_sum: 0,
            execution: histogram(),
            execution_sum: 0,
        }
    }

    fn record(&mut self, job: &JobRecord<'_>) {
        self.jobs.count(job.outcome);
        if let Some(latency) = job.queue_latency {
            let us = micros(latency);
            self.queue_latency.saturating_record(us);
            self.queue_latency_sum = self.queue_latency_sum.saturating_add(us);
        }
        if let Some(execution) = job.execution {
            let us = micros(execution);
            self.execution.saturating_record(us);
            self.execution_sum = self.execution_sum.saturating_add(us);
        }
    }

    fn merge(&mut self, other: &ClassStats) {
        self.jobs.merge(&other.jobs);
        // Same bounds on both sides: adding cannot fail.
        let _ = self.queue_latency.add(&other.queue_latency);
        let _ = self.execution.add(&other.execution);
        self.queue_latency_sum = self.queue_latency_sum.saturating_add(other.queue_latency_sum);
        self.execution_sum = self.execution_sum.saturating_add(other.execution_sum);
    }

    /// p50 / p90 / p99 / max of a histogram, in milliseconds.
    pub fn percentiles_ms(histogram: &Histogram<u64>) -> Percentiles {
        let at = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        Percentiles {
            count: histogram.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: histogram.max() as f64 / 1000.0,
        }
    }
}

/// Summary of a latency histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

fn histogram() -> Histogram<u64> {
    // Constant, valid bounds: this cannot fail.
    Histogram::new_with_bounds(1, MAX_MICROS, SIGFIG).unwrap_or_else(|_| unreachable!("valid histogram bounds"))
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// The class recorded for a class name longer than [`crate::job::MAX_CLASS_LEN`].
const TOO_LONG: &str = "(too long)";

/// class → version → stats.
type Shard = HashMap<String, HashMap<String, ClassStats>>;

/// The job recorder of one process.
pub struct Metrics {
    shards: Box<[Mutex<Shard>]>,
    enabled: bool,
    /// Gauges of the process (RSS, CPU, in flight, reloads...).
    pub process: ProcessGauges,
    /// Jobs rescheduled by cluster limits, per plugin and reason.
    pub limited: limited::LimitedCounts,
    /// Whether each Redis shard answers (several shards only).
    pub redis_shards: redis_shards::RedisShards,
}

thread_local! {
    /// This thread's shard, assigned on first use.
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

impl Metrics {
    /// A recorder; with `enabled` false, [`Metrics::record`] does nothing
    /// (`wasmjobs run --no-metrics`).
    pub fn new(enabled: bool) -> Self {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (0..(threads * 4).max(8)).map(|_| Mutex::new(Shard::new())).collect();
        Self {
            shards,
            enabled,
            process: ProcessGauges::default(),
            limited: limited::LimitedCounts::default(),
            redis_shards: redis_shards::RedisShards::default(),
        }
    }

    /// Whether jobs are recorded.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Records one finished job in this thread's shard.
    pub fn record(&self, job: &JobRecord<'_>) {
        if !self.enabled {
            return;
        }
        let index = SHARD.with(|cell| {
            *cell.get().get_or_insert_with(|| {
                let index = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
                cell.set(Some(index));
                index
            })
        }) % self.shards.len();
        // Callers pass bounded class sets (served classes and a few
        // placeholders); an overlong name is still never made a key.
        let class = if job.class.len() > crate::job::MAX_CLASS_LEN {
            TOO_LONG
        } else {
            job.class
        };
        let mut shard = self.shards[index].lock().unwrap_or_else(PoisonError::into_inner);
        let versions = match shard.get_mut(class) {
            Some(versions) => versions,
            None => shard.entry(class.to_owned()).or_default(),
        };
        let stats = match versions.get_mut(job.version) {
            Some(stats) => stats,
            None => versions.entry(job.version.to_owned()).or_insert_with(ClassStats::new),
        };
        stats.record(job);
    }

    /// Every class × version, merged across shards, sorted.
    pub fn snapshot(&self) -> BTreeMap<(String, String), ClassStats> {
        let mut merged: BTreeMap<(String, String), ClassStats> = BTreeMap::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (class, versions) in shard.iter() {
                for (version, stats) in versions {
                    merged
                        .entry((class.clone(), version.clone()))
                        .or_insert_with(ClassStats::new)
                        .merge(stats);
                }
            }
        }
        merged
    }

    /// Per class, all versions merged, sorted by class.
    pub fn by_class(&self) -> BTreeMap<String, ClassStats> {
        let mut classes: BTreeMap<String, ClassStats> = BTreeMap::new();
        for ((class, _), stats) in self.snapshot() {
            classes.entry(class).or_insert_with(ClassStats::new).merge(&stats);
        }
        classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(class: &'static str, outcome: Counted, exec_ms: u64) -> JobRecord<'static> {
        JobRecord {
            class,
            version: "v1",
            outcome,
            queue_latency: Some(Duration::from_micros(500)),
            execution: Some(Duration::from_millis(exec_ms)),
        }
    }

    #[test]
    fn records_from_many_threads_merge_exactly() {
        let metrics = std::sync::Arc::new(Metrics::new(true));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let metrics = metrics.clone();
                std::thread::spawn(move || {
                    for i in 0..1_000 {
                        metrics.record(&job("Fast", Counted::Success, 1));
                        if i % 10 == 0 {
                            metrics.record(&job("Slow", Counted::Retry, 200));
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("recording thread");
        }
        let classes = metrics.by_class();
        assert_eq!(classes["Fast"].jobs.processed, 8_000);
        assert_eq!(classes["Slow"].jobs.processed, 800);
        assert_eq!(classes["Slow"].jobs.retried, 800);
        assert_eq!(classes["Slow"].jobs.failed, 800);
        let slow = ClassStats::percentiles_ms(&classes["Slow"].execution);
        assert!((198.0..=202.0).contains(&slow.p50), "{slow:?}");
        assert_eq!(slow.count, 800);
    }

    #[test]
    fn disabled_records_nothing() {
        let metrics = Metrics::new(false);
        metrics.record(&job("Fast", Counted::Success, 1));
        assert!(metrics.snapshot().is_empty());
    }
}
