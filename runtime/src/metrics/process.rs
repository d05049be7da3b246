//! Per-process figures: memory and CPU sampled once a second while jobs run
//! (every 10 s while idle),
//! and the gauges other parts of the runner keep current (jobs in flight,
//! live instances, Redis round trip, reloads, outcome writes failed and
//! pending).
//!
//! Everything is an atomic: writers (the sampler, the heartbeat, the
//! reloader) store, readers (`/metrics`, `/stats`, the run summary) load;
//! nothing here is on a job's path.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often RSS and CPU are sampled while jobs run.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often while the process is idle (no job in flight): an idle runner
/// should not wake up every second (peak RSS is the kernel's high-water
/// mark, so nothing is missed).
pub const SAMPLE_IDLE: Duration = Duration::from_secs(10);

/// The process's gauges and counters.
#[derive(Debug, Default)]
pub struct ProcessGauges {
    /// Resident set size now, KiB.
    pub rss_kb: AtomicU64,
    /// Highest resident set size so far (`VmHWM`), KiB.
    pub peak_rss_kb: AtomicU64,
    /// RSS when the runner started, KiB.
    pub start_rss_kb: AtomicU64,
    /// user + system CPU time so far, clock ticks (1/100 s).
    pub cpu_ticks: AtomicU64,
    /// %CPU over the last sample interval, × 100 (so 12.5% is 1250).
    pub cpu_percent_x100: AtomicU64,
    /// Jobs in flight (taken from Redis, outcome not yet written).
    pub in_flight: AtomicU64,
    /// The configured concurrency.
    pub concurrency: AtomicU64,
    /// Wasm instances alive now.
    pub live_instances: AtomicU64,
    /// Warm instances idle now (plugins with `[instances] reuse`).
    pub idle_instances: AtomicU64,
    /// Instances created so far.
    pub instances_created: AtomicU64,
    /// Jobs served by a warm instance so far.
    pub instances_reused: AtomicU64,
    /// Idle warm instances dropped after their idle timeout so far.
    pub instances_expired: AtomicU64,
    /// Last Redis round trip measured by the heartbeat, microseconds.
    pub redis_rtt_us: AtomicU64,
    /// Plugins added by hot reload.
    pub reloads_added: AtomicU64,
    /// Plugins replaced by a new version.
    pub reloads_replaced: AtomicU64,
    /// Plugins removed.
    pub reloads_removed: AtomicU64,
    /// New versions refused (the old one kept serving).
    pub reloads_rejected: AtomicU64,
    /// Start time, epoch seconds × 1000.
    pub started_at_ms: AtomicU64,
    /// Attempts to write a batch of job outcomes that Redis refused or
    /// never answered (each is retried until it succeeds).
    pub outcome_write_failures: AtomicU64,
    /// Job outcomes decided but not written to Redis yet (the batch being
    /// written and those queued behind it).
    pub outcomes_pending: AtomicU64,
    /// Queues of this process that are paused now.
    pub paused_queues: AtomicU64,
    /// Cron ticks this process claimed and enqueued.
    pub cron_enqueued: AtomicU64,
    /// Cron ticks another process (or sidekiq-cron) claimed first.
    pub cron_lost: AtomicU64,
    /// Unique-job locks this process released (see `docs/unique-jobs.md`).
    pub unique_locks_released: AtomicU64,
    /// When the heartbeat was last written, epoch seconds × 1000 (0: not yet).
    pub heartbeat_at_ms: AtomicU64,
    /// Heartbeats Redis refused or never answered.
    pub heartbeat_failures: AtomicU64,
    /// Restarts of background services after a panic or an early end,
    /// by service (`runner::supervise`).
    pub service_restarts: Mutex<BTreeMap<&'static str, u64>>,
    /// This process's queues that live Ruby Sidekiq processes also fetch,
    /// with how many (`runner::neighbours`).
    pub shared_queues: Mutex<BTreeMap<String, u64>>,
    /// Jobs of a class no plugin serves handed back, untouched, to a Ruby
    /// Sidekiq process sharing their queue.
    pub handed_back: AtomicU64,
}

impl ProcessGauges {
    /// Counts a restart of the background service `name`.
    pub fn service_restarted(&self, name: &'static str) {
        let mut restarts = self
            .service_restarts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *restarts.entry(name).or_default() += 1;
    }

    /// Sets, among `queues`, those shared with Ruby Sidekiq processes
    /// (`shared`); the other queues' entries stay, so each shard's copy
    /// sets its own queues.
    pub fn set_shared_queues(&self, queues: &[String], shared: BTreeMap<String, u64>) {
        let mut all = self
            .shared_queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|queue, _| !queues.contains(queue));
        all.extend(shared);
    }
}

/// A copy of the gauges, for the JSON document and the summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessSnapshot {
    /// Resident set size now, KiB.
    pub rss_kb: u64,
    /// Highest resident set size so far, KiB.
    pub peak_rss_kb: u64,
    /// RSS at start, KiB.
    pub start_rss_kb: u64,
    /// CPU time used so far, seconds.
    pub cpu_seconds: f64,
    /// %CPU over the last second (100 = one core).
    pub cpu_percent: f64,
    /// Jobs in flight.
    pub in_flight: u64,
    /// Configured concurrency.
    pub concurrency: u64,
    /// Wasm instances alive.
    pub live_instances: u64,
    /// Warm instances idle now, and instance counters.
    pub instances: InstanceCounts,
    /// Last Redis round trip, milliseconds.
    pub redis_rtt_ms: f64,
    /// Hot reloads by outcome.
    pub reloads: Reloads,
    /// Start time, epoch seconds.
    pub started_at: f64,
    /// Failed attempts to write job outcomes.
    pub outcome_write_failures: u64,
    /// Job outcomes not written to Redis yet.
    pub outcomes_pending: u64,
    /// Queues of this process paused now.
    pub paused_queues: u64,
    /// Cron ticks claimed by this process, by outcome.
    pub cron: CronTicks,
    /// Unique-job locks released.
    pub unique_locks_released: u64,
    /// When the heartbeat was last written, epoch seconds (0: not yet).
    pub heartbeat_at: f64,
    /// Heartbeats that failed.
    pub heartbeat_failures: u64,
    /// Panics of background loops, by loop.
    pub service_restarts: BTreeMap<&'static str, u64>,
    /// Queues shared with Ruby Sidekiq processes, with how many.
    pub shared_queues: BTreeMap<String, u64>,
    /// Jobs handed back to a Ruby Sidekiq process.
    pub handed_back: u64,
}

/// Cron ticks this process tried to claim, by outcome.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct CronTicks {
    /// Claimed and enqueued here.
    pub enqueued: u64,
    /// Claimed first by another process.
    pub lost: u64,
}

/// Warm instances idle now, and instance counters since start.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct InstanceCounts {
    /// Warm instances idle now.
    pub idle: u64,
    /// Instances created.
    pub created: u64,
    /// Jobs served by a warm instance.
    pub reused: u64,
    /// Idle warm instances dropped after their idle timeout.
    pub expired: u64,
}

/// Hot reload counts by outcome.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Reloads {
    /// New plugins.
    pub added: u64,
    /// New versions.
    pub replaced: u64,
    /// Plugins removed.
    pub removed: u64,
    /// Versions refused.
    pub rejected: u64,
}

impl ProcessGauges {
    /// A consistent-enough copy of every gauge.
    pub fn snapshot(&self) -> ProcessSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProcessSnapshot {
            rss_kb: get(&self.rss_kb),
            peak_rss_kb: get(&self.peak_rss_kb),
            start_rss_kb: get(&self.start_rss_kb),
            cpu_seconds: get(&self.cpu_ticks) as f64 / 100.0,
            cpu_percent: get(&self.cpu_percent_x100) as f64 / 100.0,
            in_flight: get(&self.in_flight),
            concurrency: get(&self.concurrency),
            live_instances: get(&self.live_instances),
            instances: InstanceCounts {
                idle: get(&self.idle_instances),
                created: get(&self.instances_created),
                reused: get(&self.instances_reused),
                expired: get(&self.instances_expired),
            },
            redis_rtt_ms: get(&self.redis_rtt_us) as f64 / 1000.0,
            reloads: Reloads {
                added: get(&self.reloads_added),
                replaced: get(&self.reloads_replaced),
                removed: get(&self.reloads_removed),
                rejected: get(&self.reloads_rejected),
            },
            started_at: get(&self.started_at_ms) as f64 / 1000.0,
            outcome_write_failures: get(&self.outcome_write_failures),
            outcomes_pending: get(&self.outcomes_pending),
            paused_queues: get(&self.paused_queues),
            cron: CronTicks {
                enqueued: get(&self.cron_enqueued),
                lost: get(&self.cron_lost),
            },
            unique_locks_released: get(&self.unique_locks_released),
            heartbeat_at: get(&self.heartbeat_at_ms) as f64 / 1000.0,
            heartbeat_failures: get(&self.heartbeat_failures),
            service_restarts: self
                .service_restarts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            shared_queues: self
                .shared_queues
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            handed_back: get(&self.handed_back),
        }
    }

    /// Reads RSS (`/proc/self/statm`), peak RSS and CPU time
    /// (`getrusage`) now: two cheap calls, no text to parse beyond one line,
    /// so sampling every second costs an idle process next to nothing.
    pub fn sample_memory_and_cpu(&self) {
        let rss = statm_rss_kb();
        let (cpu_ticks, peak) = rusage();
        self.rss_kb.store(rss, Ordering::Relaxed);
        self.peak_rss_kb.fetch_max(peak.max(rss), Ordering::Relaxed);
        self.cpu_ticks.store(cpu_ticks, Ordering::Relaxed);
    }
}

/// Samples the gauges every [`SAMPLE_EVERY`] until `stop`.
pub struct ProcessSampler;

impl ProcessSampler {
    /// Runs the sampling loop; `refresh` updates the gauges that live
    /// elsewhere (in flight, live instances) at each tick.
    pub async fn run(
        gauges: &ProcessGauges,
        refresh: impl Fn(&ProcessGauges),
        stop: tokio_util::sync::CancellationToken,
    ) {
        // Same source as every later reading (getrusage), so the first
        // interval's %CPU is not a difference of two different clocks.
        gauges.sample_memory_and_cpu();
        let mut last = (Instant::now(), gauges.cpu_ticks.load(Ordering::Relaxed));
        loop {
            let idle = gauges.in_flight.load(Ordering::Relaxed) == 0;
            let pause = if idle { SAMPLE_IDLE } else { SAMPLE_EVERY };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => return,
            }
            gauges.sample_memory_and_cpu();
            refresh(gauges);
            let now = (Instant::now(), gauges.cpu_ticks.load(Ordering::Relaxed));
            let wall = now.0.duration_since(last.0).as_secs_f64();
            if wall > 0.0 {
                // ticks are 1/100 s: ticks / wall = percent; ×100 for storage.
                let percent = now.1.saturating_sub(last.1) as f64 / wall;
                gauges
                    .cpu_percent_x100
                    .store((percent * 100.0).round() as u64, Ordering::Relaxed);
            }
            last = now;
        }
    }
}

/// Resident set size of this process in KiB, from `/proc/self/statm`
/// (second field, in pages).
fn statm_rss_kb() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * rustix::param::page_size() as u64 / 1024
}

/// (CPU time in clock ticks, 1/100 s on Linux; peak RSS in KiB) of this
/// process, from `/proc/self/stat` and `/proc/self/status` (`VmHWM`).
fn rusage() -> (u64, u64) {
    (cpu_ticks(), memory_kb_at("/proc/self/status").1)
}

/// (VmRSS, VmHWM) of process `pid` in KiB (0 when unknown).
pub fn memory_kb_of(pid: u32) -> (u64, u64) {
    memory_kb_at(&format!("/proc/{pid}/status"))
}

fn memory_kb_at(path: &str) -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string(path) else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// utime + stime of this process, in clock ticks (1/100 s on Linux).
pub fn cpu_ticks() -> u64 {
    cpu_ticks_at("/proc/self/stat")
}

/// utime + stime of process `pid`, in clock ticks (0 when unknown).
pub fn cpu_ticks_of(pid: u32) -> u64 {
    cpu_ticks_at(&format!("/proc/{pid}/stat"))
}

fn cpu_ticks_at(path: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0;
    };
    // Fields after the command name (which may contain spaces) in parentheses.
    let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shards_shared_queues_leave_the_others_alone() {
        let gauges = ProcessGauges::default();
        let queues = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        gauges.set_shared_queues(&queues(&["a", "b"]), BTreeMap::from([("a".to_owned(), 1)]));
        gauges.set_shared_queues(&queues(&["c"]), BTreeMap::from([("c".to_owned(), 2)]));
        assert_eq!(
            gauges.snapshot().shared_queues,
            BTreeMap::from([("a".to_owned(), 1), ("c".to_owned(), 2)])
        );
        // A queue no longer shared leaves; the other shard's stays.
        gauges.set_shared_queues(&queues(&["a", "b"]), BTreeMap::new());
        assert_eq!(gauges.snapshot().shared_queues, BTreeMap::from([("c".to_owned(), 2)]));
    }

    #[test]
    fn memory_and_cpu_are_read_from_proc() {
        let gauges = ProcessGauges::default();
        // Burn CPU until the tick counter moves (10 ms resolution).
        let started = Instant::now();
        let mut x = 0u64;
        while cpu_ticks() == 0 && started.elapsed() < Duration::from_secs(5) {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
        gauges.sample_memory_and_cpu();
        let snapshot = gauges.snapshot();
        assert!(snapshot.rss_kb > 0);
        assert!(snapshot.peak_rss_kb >= snapshot.rss_kb);
        assert!(snapshot.cpu_seconds > 0.0, "{snapshot:?}");
    }
}
