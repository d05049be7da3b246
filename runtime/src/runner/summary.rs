//! The run summary: what one `wasmjobs run` did, printed at exit as a table
//! in the style of the seed benchmark reports (jobs, wall time, jobs/s,
//! start / peak / finish RSS, %CPU, and per class p50 / p99 queue latency
//! and execution time), and written as JSON with `--summary-json FILE`.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::metrics::Metrics;
use crate::metrics::exposition::ClassReport;

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Jobs whose outcome was recorded.
    pub processed: u64,
    /// Of those, failures.
    pub failed: u64,
    /// Failures scheduled for retry.
    pub retried: u64,
    /// Jobs sent to the dead set.
    pub dead: u64,
    /// Jobs discarded by their guest.
    pub discarded: u64,
    /// Jobs pushed back to their queue at shutdown.
    pub requeued: u64,
    /// How long the process ran, seconds.
    #[serde(rename = "wall_secs", serialize_with = "secs")]
    pub wall: Duration,
    /// Jobs per second over the whole run.
    pub jobs_per_sec: f64,
    /// RSS when the runner was ready, KiB.
    pub start_rss_kb: u64,
    /// Highest RSS, KiB.
    pub peak_rss_kb: u64,
    /// RSS at exit, KiB.
    pub finish_rss_kb: u64,
    /// user + system CPU over wall time (100 = one core).
    pub cpu_percent: f64,
    /// Per job class (every plugin version merged).
    pub classes: Vec<ClassReport>,
}

fn secs<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

impl RunSummary {
    /// Fills the figures that come from the recorder (RSS, CPU, classes).
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        metrics.process.sample_memory_and_cpu();
        let process = metrics.process.snapshot();
        let wall = self.wall.as_secs_f64().max(1e-9);
        self.jobs_per_sec = self.processed as f64 / wall;
        self.start_rss_kb = process.start_rss_kb;
        self.peak_rss_kb = process.peak_rss_kb;
        self.finish_rss_kb = process.rss_kb;
        self.cpu_percent = process.cpu_seconds / wall * 100.0;
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
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>6}",
            "Jobs", "Time", "Jobs/s", "Start RSS", "Peak RSS", "Finish RSS", "%CPU"
        );
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>9.0} {:>12} {:>12} {:>12} {:>6.1}",
            group(self.processed),
            format!("{:.2} sec", self.wall.as_secs_f64()),
            self.jobs_per_sec,
            format!("{} kb", group(self.start_rss_kb)),
            format!("{} kb", group(self.peak_rss_kb)),
            format!("{} kb", group(self.finish_rss_kb)),
            self.cpu_percent
        );
        let _ = writeln!(
            out,
            "failed {} (retry {}, dead {}), discarded {}, requeued {}",
            self.failed, self.retried, self.dead, self.discarded, self.requeued
        );
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
                group(class.processed),
                group(class.failed),
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
    fn the_table_reads_like_the_seed_reports() {
        let metrics = Metrics::new(true);
        metrics.record(&JobRecord {
            class: "NoopJob",
            version: "v",
            outcome: Counted::Success,
            queue_latency: Some(Duration::from_micros(180)),
            execution: Some(Duration::from_micros(9)),
        });
        let summary = RunSummary {
            processed: 1_234_567,
            wall: Duration::from_secs(10),
            ..RunSummary::default()
        }
        .with_metrics(&metrics);
        let table = summary.table();
        assert!(table.contains("1_234_567"), "{table}");
        assert!(table.contains("10.00 sec"), "{table}");
        assert!(table.contains("123457"), "{table}");
        assert!(table.contains("NoopJob"), "{table}");
        assert!(table.contains("0.180 ms"), "{table}");
        let json = serde_json::to_value(&summary).expect("json");
        assert_eq!(json["processed"], 1_234_567);
        assert_eq!(json["wall_secs"], 10.0);
        assert_eq!(json["classes"][0]["class"], "NoopJob");
    }
}
