//! Rendering metrics for readers: the Prometheus text format (version
//! 0.0.4) for `/metrics`, and one JSON document for `/stats`.
//!
//! Names follow Prometheus conventions: base units (seconds, bytes),
//! `_total` for counters, the standard `process_*` names where they exist.
//! Job metrics carry `class` and `version` (the plugin version id) labels;
//! latencies are `histogram`s whose buckets are read off the HDR histograms.

use std::fmt::Write as _;

use serde::Serialize;

use super::process::ProcessSnapshot;
use super::{ClassStats, Metrics, Percentiles, Tally};

/// Histogram bucket bounds, seconds: 100 µs to 5 min.
const BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0,
];

/// The Prometheus text exposition of `metrics`.
pub fn prometheus(metrics: &Metrics) -> String {
    let mut out = String::with_capacity(4096);
    let snapshot = metrics.snapshot();
    family(
        &mut out,
        "wasmjobs_jobs_total",
        "counter",
        "Jobs finished, by class, plugin version and outcome.",
    );
    for ((class, version), stats) in &snapshot {
        let jobs = &stats.jobs;
        for (outcome, count) in [
            ("success", jobs.succeeded()),
            ("retry", jobs.retried),
            ("dead", jobs.dead),
            ("discard", jobs.discarded),
            ("drop", jobs.dropped()),
            ("cancelled", jobs.cancelled),
        ] {
            let _ = writeln!(
                out,
                "wasmjobs_jobs_total{{class=\"{}\",version=\"{}\",outcome=\"{outcome}\"}} {count}",
                escape(class),
                escape(version)
            );
        }
    }
    for (name, help, pick) in [
        (
            "wasmjobs_job_queue_latency_seconds",
            "Time from a job's enqueued_at to its start.",
            Pick::Queue,
        ),
        (
            "wasmjobs_job_execution_seconds",
            "Time a job ran: instantiation to the end of perform.",
            Pick::Execution,
        ),
    ] {
        family(&mut out, name, "histogram", help);
        for ((class, version), stats) in &snapshot {
            let (histogram, sum_us) = match pick {
                Pick::Queue => (&stats.queue_latency, stats.queue_latency_sum),
                Pick::Execution => (&stats.execution, stats.execution_sum),
            };
            let labels = format!("class=\"{}\",version=\"{}\"", escape(class), escape(version));
            for le in BUCKETS {
                let count = histogram.count_between(0, (le * 1e6) as u64);
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", histogram.len());
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum_us as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", histogram.len());
        }
    }

    let p = metrics.process.snapshot();
    gauge(
        &mut out,
        "process_resident_memory_bytes",
        "Resident memory size.",
        p.rss_kb as f64 * 1024.0,
    );
    gauge(
        &mut out,
        "wasmjobs_process_resident_memory_peak_bytes",
        "Highest resident memory size since start.",
        p.peak_rss_kb as f64 * 1024.0,
    );
    family(
        &mut out,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent.",
    );
    let _ = writeln!(out, "process_cpu_seconds_total {}", p.cpu_seconds);
    gauge(
        &mut out,
        "wasmjobs_process_cpu_ratio",
        "CPU used over the last second (1 = one core).",
        p.cpu_percent / 100.0,
    );
    gauge(
        &mut out,
        "process_start_time_seconds",
        "Start time since the Unix epoch.",
        p.started_at,
    );
    gauge(
        &mut out,
        "wasmjobs_jobs_in_flight",
        "Jobs taken from Redis whose outcome is not written yet.",
        p.in_flight as f64,
    );
    gauge(
        &mut out,
        "wasmjobs_concurrency",
        "Most jobs in flight at once (--concurrency).",
        p.concurrency as f64,
    );
    gauge(
        &mut out,
        "wasmjobs_instances_live",
        "Wasm instances alive (a concurrent instance counts once, however many jobs it runs).",
        p.live_instances as f64,
    );
    gauge(
        &mut out,
        "wasmjobs_instances_idle",
        "Warm instances kept idle for plugins with [instances] reuse.",
        p.instances.idle as f64,
    );
    for (name, help, value) in [
        (
            "wasmjobs_instances_created_total",
            "Wasm instances created.",
            p.instances.created,
        ),
        (
            "wasmjobs_instances_reused_total",
            "Jobs served by an instance that already existed ([instances] reuse or concurrent).",
            p.instances.reused,
        ),
        (
            "wasmjobs_instances_idle_expired_total",
            "Idle warm instances dropped after their idle_timeout.",
            p.instances.expired,
        ),
    ] {
        family(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {value}");
    }
    gauge(
        &mut out,
        "wasmjobs_redis_rtt_seconds",
        "Redis round trip measured by the last heartbeat.",
        p.redis_rtt_ms / 1000.0,
    );
    family(
        &mut out,
        "wasmjobs_outcome_write_failures_total",
        "counter",
        "Attempts to write job outcomes to Redis that failed (each batch is retried until written).",
    );
    let _ = writeln!(
        out,
        "wasmjobs_outcome_write_failures_total {}",
        p.outcome_write_failures
    );
    gauge(
        &mut out,
        "wasmjobs_outcomes_pending",
        "Job outcomes decided but not yet written to Redis.",
        p.outcomes_pending as f64,
    );
    gauge(
        &mut out,
        "wasmjobs_queues_paused",
        "Queues this process serves that are paused (wasmjobs pause; Sidekiq Pro's paused set).",
        p.paused_queues as f64,
    );
    family(
        &mut out,
        "wasmjobs_unique_locks_released_total",
        "counter",
        "Unique-job locks released by this process: jobs carrying one that ended for good, or started with unique_until start (a lock already expired or taken by a newer job is left alone but counted).",
    );
    let _ = writeln!(out, "wasmjobs_unique_locks_released_total {}", p.unique_locks_released);
    family(
        &mut out,
        "wasmjobs_heartbeat_failures_total",
        "counter",
        "Heartbeats Redis refused or never answered; while they fail, other processes see this one as dead after 60 s.",
    );
    let _ = writeln!(out, "wasmjobs_heartbeat_failures_total {}", p.heartbeat_failures);
    if p.heartbeat_at > 0.0 {
        gauge(
            &mut out,
            "wasmjobs_heartbeat_age_seconds",
            "Seconds since this process last wrote its heartbeat (every 10 s when well; others count it dead after 60 s).",
            (crate::job::now_ms() as f64 / 1000.0 - p.heartbeat_at).max(0.0),
        );
    }
    family(
        &mut out,
        "wasmjobs_service_restarts_total",
        "counter",
        "Restarts of the runner's background services (heartbeat, pollers, reloader, dashboard, ...) after a panic or an early end, by service; each is logged as an error.",
    );
    for (service, count) in &p.service_restarts {
        let _ = writeln!(out, "wasmjobs_service_restarts_total{{service=\"{service}\"}} {count}");
    }
    family(
        &mut out,
        "wasmjobs_queue_shared_with_sidekiq",
        "gauge",
        "Live Ruby Sidekiq processes that also fetch this queue of this process (each side takes jobs the other serves: give the Wasm classes a queue of their own).",
    );
    for (queue, processes) in &p.shared_queues {
        let _ = writeln!(
            out,
            "wasmjobs_queue_shared_with_sidekiq{{queue=\"{}\"}} {processes}",
            escape(queue)
        );
    }
    family(
        &mut out,
        "wasmjobs_jobs_handed_back_total",
        "counter",
        "Jobs of a class no plugin here serves, on a queue shared with a Ruby Sidekiq process, put back untouched for it.",
    );
    let _ = writeln!(out, "wasmjobs_jobs_handed_back_total {}", p.handed_back);
    family(
        &mut out,
        "wasmjobs_plugin_reloads_total",
        "counter",
        "Hot reloads of plugins, by outcome.",
    );
    for (outcome, count) in [
        ("added", p.reloads.added),
        ("replaced", p.reloads.replaced),
        ("removed", p.reloads.removed),
        ("rejected", p.reloads.rejected),
    ] {
        let _ = writeln!(out, "wasmjobs_plugin_reloads_total{{outcome=\"{outcome}\"}} {count}");
    }
    family(
        &mut out,
        "wasmjobs_limit_rescheduled_total",
        "counter",
        "Jobs rescheduled without running because a cluster limit refused them, by plugin and reason (rate, concurrency, unavailable).",
    );
    for (plugin, reason, count) in metrics.limited.snapshot() {
        let _ = writeln!(
            out,
            "wasmjobs_limit_rescheduled_total{{plugin=\"{}\",reason=\"{reason}\"}} {count}",
            escape(&plugin)
        );
    }
    let shards = metrics.redis_shards.snapshot();
    if !shards.is_empty() {
        family(
            &mut out,
            "wasmjobs_shard_up",
            "gauge",
            "Whether each Redis shard answered this process's last heartbeat there (1) or not (0); a shard that does not answer stops only its queues.",
        );
        for (shard, up) in shards {
            let _ = writeln!(
                out,
                "wasmjobs_shard_up{{shard=\"{}\"}} {}",
                escape(&shard),
                u8::from(up)
            );
        }
    }
    family(
        &mut out,
        "wasmjobs_cron_ticks_total",
        "counter",
        "Cron ticks this process tried to claim: enqueued here, or lost to another process.",
    );
    for (outcome, count) in [("enqueued", p.cron.enqueued), ("lost", p.cron.lost)] {
        let _ = writeln!(out, "wasmjobs_cron_ticks_total{{outcome=\"{outcome}\"}} {count}");
    }
    out
}

#[derive(Clone, Copy)]
enum Pick {
    Queue,
    Execution,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    family(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One class × version in the JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    /// Job class.
    pub class: String,
    /// Plugin version id ("" when no plugin ran the jobs).
    pub version: String,
    /// How its jobs ended.
    #[serde(flatten)]
    pub jobs: Tally,
    /// Queue latency, ms.
    pub queue_latency_ms: Percentiles,
    /// Execution time, ms.
    pub execution_ms: Percentiles,
}

impl ClassReport {
    /// The report of `stats` for `class` × `version`.
    pub fn new(class: &str, version: &str, stats: &ClassStats) -> Self {
        Self {
            class: class.to_owned(),
            version: version.to_owned(),
            jobs: stats.jobs,
            queue_latency_ms: ClassStats::percentiles_ms(&stats.queue_latency),
            execution_ms: ClassStats::percentiles_ms(&stats.execution),
        }
    }
}

/// The `/stats` document.
#[derive(Debug, Clone, Serialize)]
pub struct StatsDocument {
    /// Process figures.
    pub process: ProcessSnapshot,
    /// Per class, every version merged.
    pub classes: Vec<ClassReport>,
    /// Per class and plugin version.
    pub versions: Vec<ClassReport>,
}

/// The JSON document of `/stats`.
pub fn stats_document(metrics: &Metrics) -> StatsDocument {
    let snapshot = metrics.snapshot();
    let versions = snapshot
        .iter()
        .map(|((class, version), stats)| ClassReport::new(class, version, stats))
        .collect();
    let classes = metrics
        .by_class()
        .iter()
        .map(|(class, stats)| ClassReport::new(class, "", stats))
        .collect();
    StatsDocument {
        process: metrics.process.snapshot(),
        classes,
        versions,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::{Counted, JobRecord};

    #[test]
    fn the_text_format_has_histograms_with_cumulative_buckets() {
        let metrics = Metrics::new(true);
        for ms in [1, 2, 300] {
            metrics.record(&JobRecord {
                class: "Fib\"Job",
                version: "abc",
                outcome: Counted::Success,
                queue_latency: Some(Duration::from_micros(200)),
                execution: Some(Duration::from_millis(ms)),
            });
        }
        let text = prometheus(&metrics);
        assert!(
            text.contains("# TYPE wasmjobs_job_execution_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(r#"wasmjobs_jobs_total{class="Fib\"Job",version="abc",outcome="success"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"wasmjobs_job_execution_seconds_bucket{class="Fib\"Job",version="abc",le="0.0025"} 2"#)
        );
        assert!(text.contains(r#"wasmjobs_job_execution_seconds_bucket{class="Fib\"Job",version="abc",le="+Inf"} 3"#));
        assert!(text.contains(r#"wasmjobs_job_execution_seconds_count{class="Fib\"Job",version="abc"} 3"#));
    }
}
