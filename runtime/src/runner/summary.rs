//! The run summary: what one `wasmjobs run` did, printed at exit for a
//! person (jobs and their rate over the busy window, memory in MiB, CPU,
//! and per class p50 / p99 queue latency and execution time), and written
//! as JSON with `--summary-json FILE` in the seed benchmark reports' terms
//! (wall time, jobs/s, RSS in kB) for tools.
//!
//! The clock ([`Clock`]) starts when the runner starts fetching, not when
//! the process starts: connecting to Redis and loading the plugins (which
//! compiles any not in the cache, seconds per Python or JS component) is
//! start-up, reported on a line of its own (`startup_secs`). Time, jobs/s
//! and %CPU cover only the fetching phase, so a first run that compiled
//! its plugins does not report a fraction of the rate it ran at. The busy
//! window (`busy_secs`, `busy_jobs_per_sec`) is narrower still: from the
//! first job taken to the last outcome written, leaving out the waits for
//! work before and after, e.g. while the jobs of a run that starts on an
//! empty queue are being pushed, or until someone stops it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::metrics::exposition::ClassReport;
use crate::metrics::{Metrics, Tally};

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// How the jobs whose outcome was recorded ended.
    #[serde(flatten)]
    pub jobs: Tally,
    /// Jobs pushed back to their queue at shutdown.
    pub requeued: u64,
    /// Jobs over a cluster limit, rescheduled without running
    /// (`docs/limits.md`; not in `processed`).
    pub rescheduled: u64,
    /// Start-up: from the process's start until it began fetching jobs
    /// (connect, load and compile plugins, register), seconds.
    #[serde(rename = "startup_secs", serialize_with = "secs")]
    pub startup: Duration,
    /// CPU time spent on start-up, seconds (not in `cpu_percent`).
    pub startup_cpu_secs: f64,
    /// From the start of fetching until the runner stopped, seconds.
    #[serde(rename = "wall_secs", serialize_with = "secs")]
    pub wall: Duration,
    /// Jobs per second while fetching (over `wall_secs`).
    pub jobs_per_sec: f64,
    /// From the first job taken to the last outcome written, seconds
    /// (`null` if no job went through).
    #[serde(rename = "busy_secs", serialize_with = "maybe_secs")]
    pub busy: Option<Duration>,
    /// Jobs per second over `busy_secs` (0 if no job went through).
    pub busy_jobs_per_sec: f64,
    /// RSS when the runner was ready, KiB.
    pub start_rss_kb: u64,
    /// Highest RSS, KiB.
    pub peak_rss_kb: u64,
    /// RSS at exit, KiB.
    pub finish_rss_kb: u64,
    /// user + system CPU while fetching, over `wall_secs` (100 = one core).
    pub cpu_percent: f64,
    /// Per job class (every plugin version merged).
    pub classes: Vec<ClassReport>,
}

fn secs<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

fn maybe_secs<S: serde::Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serializer.serialize_some(&duration.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}

/// The run's clock: when the process started and when it began fetching.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    process: Instant,
    /// When fetching began, and the CPU seconds spent by then.
    fetching: Option<(Instant, f64)>,
}

impl Clock {
    /// Starts the clock at process start.
    pub(crate) fn start() -> Self {
        Self {
            process: Instant::now(),
            fetching: None,
        }
    }

    /// Marks the end of start-up: the fetch loop starts now. Returns the
    /// start-up time.
    pub(crate) fn fetching(&mut self) -> Duration {
        let cpu = crate::metrics::process::cpu_ticks() as f64 / 100.0;
        let now = Instant::now();
        self.fetching = Some((now, cpu));
        now - self.process
    }
}

impl RunSummary {
    /// Splits the run's time at the start of fetching (everything is
    /// start-up if fetching never began).
    pub(crate) fn with_clock(mut self, clock: &Clock) -> Self {
        match clock.fetching {
            Some((since, cpu)) => {
                self.startup = since - clock.process;
                self.startup_cpu_secs = cpu;
                self.wall = since.elapsed();
            }
            None => self.startup = clock.process.elapsed(),
        }
        self
    }

    /// Sets the busy window (see [`super::inflight::InFlightTable::busy`]).
    pub(crate) fn with_busy(mut self, busy: Option<Duration>) -> Self {
        self.busy = busy;
        self.busy_jobs_per_sec = match busy {
            Some(busy) if !busy.is_zero() => self.jobs.processed as f64 / busy.as_secs_f64(),
            _ => 0.0,
        };
        self
    }

    /// Fills the figures that come from the recorder (RSS, CPU, classes).
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        metrics.process.sample_memory_and_cpu();
        let process = metrics.process.snapshot();
        let wall = self.wall.as_secs_f64().max(1e-9);
        self.jobs_per_sec = self.jobs.processed as f64 / wall;
        self.start_rss_kb = process.start_rss_kb;
        self.peak_rss_kb = process.peak_rss_kb;
        self.finish_rss_kb = process.rss_kb;
        self.cpu_percent = (process.cpu_seconds - self.startup_cpu_secs).max(0.0) / wall * 100.0;
        self.classes = metrics
            .by_class()
            .iter()
            .map(|(class, stats)| ClassReport::new(class, "", stats))
            .collect();
        self
    }

    /// The table printed at exit.
    pub fn table(&self) -> String {
        let mut out = String::new();
        // Rates only over the busy window: a run that sat idle for minutes
        // did not run at a fraction of its speed.
        let rate = match self.busy {
            Some(busy) if self.jobs.processed > 0 => format!(
                "busy {} from the first job taken to the last outcome written: {} jobs/s",
                seconds(busy),
                thousands(self.busy_jobs_per_sec.round() as u64)
            ),
            _ => "no job was taken".to_owned(),
        };
        let _ = writeln!(
            out,
            "Jobs     {} ({rate}); fetching for {}",
            thousands(self.jobs.processed),
            seconds(self.wall)
        );
        let _ = writeln!(
            out,
            "Memory   {} at start, {} at peak, {} at finish (resident)",
            mib(self.start_rss_kb),
            mib(self.peak_rss_kb),
            mib(self.finish_rss_kb)
        );
        let _ = writeln!(out, "CPU      {:.1}% of one core while fetching", self.cpu_percent);
        let _ = writeln!(
            out,
            "Start-up {} (connect, load plugins; {:.2} s CPU), not counted above",
            seconds(self.startup),
            self.startup_cpu_secs
        );
        let _ = writeln!(
            out,
            "failed {} (retry {}, dead {}), discarded {}, cancelled {}, requeued {}",
            self.jobs.failed,
            self.jobs.retried,
            self.jobs.dead,
            self.jobs.discarded,
            self.jobs.cancelled,
            self.requeued
        );
        if self.rescheduled > 0 {
            let _ = writeln!(out, "rescheduled {} (over a cluster limit, not run)", self.rescheduled);
        }
        if self.classes.is_empty() {
            return out;
        }
        let width = self.classes.iter().map(|c| c.class.len()).max().unwrap_or(5).max(5);
        let _ = writeln!(
            out,
            "\n{:<width$} {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}",
            "Class", "Jobs", "Failed", "Queue p50", "Queue p99", "Exec p50", "Exec p99"
        );
        for class in &self.classes {
            let _ = writeln!(
                out,
                "{:<width$} {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}",
                class.class,
                group(class.jobs.processed),
                group(class.jobs.failed),
                ms(class.queue_latency_ms.count, class.queue_latency_ms.p50),
                ms(class.queue_latency_ms.count, class.queue_latency_ms.p99),
                ms(class.execution_ms.count, class.execution_ms.p50),
                ms(class.execution_ms.count, class.execution_ms.p99),
            );
        }
        out
    }
}

/// A latency for the table: `0.183 ms`, `12.4 ms`, `2.31 s`, or `-`.
fn ms(count: u64, value: f64) -> String {
    match (count, value) {
        (0, _) => "-".to_owned(),
        (_, v) if v < 10.0 => format!("{v:.3} ms"),
        (_, v) if v < 1000.0 => format!("{v:.1} ms"),
        (_, v) => format!("{:.2} s", v / 1000.0),
    }
}

/// A duration for a person: `0.25 s`, `12.3 s`, `6 min 22 s`.
fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    match secs {
        s if s < 10.0 => format!("{s:.2} s"),
        s if s < 60.0 => format!("{s:.1} s"),
        s if s < 3600.0 => format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64),
        s => format!("{} h {} min", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
    }
}

/// Kilobytes as a person reads memory: `101.7 MiB`, `1.2 GiB`.
fn mib(kb: u64) -> String {
    let mib = kb as f64 / 1024.0;
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    group(n).replace('_', ",")
}

/// `1234567` → `1_234_567`, as the seed reports write numbers (also the
/// benchmark suite's report).
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('_');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Counted, JobRecord};

    #[test]
    fn numbers_are_grouped_like_the_seed_report() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1_000");
        assert_eq!(group(1_000_000), "1_000_000");
        assert_eq!(group(131_068), "131_068");
    }

    #[test]
    fn the_table_reads_like_a_person_would_say_it() {
        let metrics = Metrics::new(true);
        metrics.record(&JobRecord {
            class: "NoopJob",
            version: "v",
            outcome: Counted::Success,
            queue_latency: Some(Duration::from_micros(180)),
            execution: Some(Duration::from_micros(9)),
        });
        let summary = RunSummary {
            jobs: Tally {
                processed: 1_234_567,
                ..Tally::default()
            },
            startup: Duration::from_millis(2_500),
            wall: Duration::from_secs(10),
            ..RunSummary::default()
        }
        .with_metrics(&metrics);
        let table = summary.table();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("Jobs     1,234,567 (no job was taken")),
            "{table}"
        );
        assert!(table.contains("fetching for 10.0 s"), "{table}");
        assert!(!table.contains("jobs/s"), "a rate without a busy window: {table}");
        assert!(table.contains("MiB at peak"), "{table}");
        assert!(!table.contains(" kb"), "{table}");
        assert!(table.contains("NoopJob"), "{table}");
        assert!(table.contains("0.180 ms"), "{table}");
        assert!(table.lines().any(|l| l.starts_with("Start-up 2.50 s")), "{table}");
        let busy = summary.clone().with_busy(Some(Duration::from_secs(5)));
        assert!(
            busy.table()
                .lines()
                .any(|l| l
                    .contains("(busy 5.00 s from the first job taken to the last outcome written: 246,913 jobs/s)")),
            "{}",
            busy.table()
        );
        // Idle for minutes after: the rate is still the busy one.
        let idle = RunSummary {
            wall: Duration::from_secs(382),
            ..busy.clone()
        };
        assert!(
            idle.table().contains("246,913 jobs/s); fetching for 6 min 22 s"),
            "{}",
            idle.table()
        );
        assert_eq!(mib(104_160), "101.7 MiB");
        assert_eq!(mib(3 * 1024 * 1024), "3.0 GiB");
        let busy_json = serde_json::to_value(&busy).expect("json");
        assert_eq!(busy_json["busy_secs"], 5.0);
        assert_eq!(busy_json["busy_jobs_per_sec"], 1_234_567.0 / 5.0);
        let json = serde_json::to_value(&summary).expect("json");
        assert_eq!(json["processed"], 1_234_567);
        assert_eq!(json["wall_secs"], 10.0);
        assert_eq!(json["startup_secs"], 2.5);
        assert!(json["busy_secs"].is_null(), "{json}");
        assert_eq!(json["classes"][0]["class"], "NoopJob");
    }

    #[test]
    fn the_clock_starts_when_fetching_starts() {
        // A process that started two seconds ago (compiling, say).
        let mut clock = Clock {
            process: Instant::now() - Duration::from_secs(2),
            fetching: None,
        };
        let startup = clock.fetching();
        let summary = RunSummary {
            jobs: Tally {
                processed: 10,
                ..Tally::default()
            },
            ..RunSummary::default()
        }
        .with_clock(&clock);
        assert!(startup >= Duration::from_secs(2), "{startup:?}");
        assert_eq!(summary.startup, startup);
        assert!(summary.wall < Duration::from_secs(1), "{:?}", summary.wall);
        let never = RunSummary::default().with_clock(&Clock::start());
        assert_eq!(never.wall, Duration::ZERO);
    }
}
