//! wasmjobs ÷ native: each noop and HTTP case against its native twin
//! from the same run (`wasmjobs-native`, the same fetch protocol and work
//! without Wasm), so every figure reads as a share of what this design can
//! do on this machine, and where the CPU goes for each (the worker, Redis,
//! the HTTP server, per job).

use std::fmt::Write as _;

use serde::Serialize;

use crate::measure::{CpuPerJob, Row};
use crate::plan::{Fetch, Processor, Workload};
use wasmjobs::runner::summary::group;

/// A figure for wasmjobs and for the native baseline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Both<T> {
    /// Through `wasmjobs run`.
    pub wasmjobs: T,
    /// Through `wasmjobs-native`.
    pub native: T,
}

impl Both<f64> {
    /// wasmjobs ÷ native; `None` when native measured nothing.
    pub fn ratio(&self) -> Option<f64> {
        (self.native > 0.0 && self.native.is_finite() && self.wasmjobs.is_finite()).then(|| self.wasmjobs / self.native)
    }
}

/// One case, both ways.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The workload.
    pub workload: Workload,
    /// `--fetch`.
    pub fetch: Fetch,
    /// `--concurrency`.
    pub concurrency: u32,
    /// Jobs drained.
    pub jobs: u64,
    /// Jobs per second.
    pub jobs_per_sec: Both<f64>,
    /// wasmjobs ÷ native throughput.
    pub throughput_ratio: Option<f64>,
    /// IO efficiency (floor / wall), for IO workloads.
    pub efficiency: Option<Both<f64>>,
    /// wasmjobs ÷ native efficiency.
    pub efficiency_ratio: Option<f64>,
    /// CPU per job by process, µs.
    pub cpu_per_job: Option<Both<CpuPerJob>>,
    /// Peak RSS of the worker, KiB.
    pub peak_rss_kb: Both<u64>,
    /// HTTP workloads: connections the server accepted.
    pub http_connections: Option<Both<u64>>,
    /// Whether either run lost or failed jobs (its figures then mean little).
    pub problems: bool,
}

/// Every wasmjobs row that has a native twin (same workload, fetch,
/// concurrency and job count), in the rows' order.
pub fn comparisons(rows: &[Row]) -> Vec<Comparison> {
    let same =
        |a: &Row, b: &Row| (a.workload, a.fetch, a.concurrency, a.jobs) == (b.workload, b.fetch, b.concurrency, b.jobs);
    rows.iter()
        // The memory cases have a section of their own.
        .filter(|r| r.processor == Processor::Wasmjobs && !r.workload.held())
        .filter_map(|wasm| {
            let native = rows
                .iter()
                .find(|r| r.processor == Processor::Native && same(r, wasm))?;
            let jobs_per_sec = Both {
                wasmjobs: wasm.jobs_per_sec,
                native: native.jobs_per_sec,
            };
            let efficiency = wasm
                .efficiency
                .zip(native.efficiency)
                .map(|(wasmjobs, native)| Both { wasmjobs, native });
            Some(Comparison {
                workload: wasm.workload,
                fetch: wasm.fetch,
                concurrency: wasm.concurrency,
                jobs: wasm.jobs,
                jobs_per_sec,
                throughput_ratio: jobs_per_sec.ratio(),
                efficiency,
                efficiency_ratio: efficiency.and_then(|e| e.ratio()),
                cpu_per_job: wasm
                    .cpu_per_job
                    .zip(native.cpu_per_job)
                    .map(|(wasmjobs, native)| Both { wasmjobs, native }),
                peak_rss_kb: Both {
                    wasmjobs: wasm.peak_rss_kb,
                    native: native.peak_rss_kb,
                },
                http_connections: wasm
                    .http_connections
                    .zip(native.http_connections)
                    .map(|(wasmjobs, native)| Both { wasmjobs, native }),
                problems: !wasm.problems.is_empty() || !native.problems.is_empty(),
            })
        })
        .collect()
}

/// The report's section: one table, then how to read it.
pub fn markdown(md: &mut String, comparisons: &[Comparison]) -> std::fmt::Result {
    if comparisons.is_empty() {
        return Ok(());
    }
    writeln!(md, "\n## wasmjobs ÷ native baseline (same run)\n")?;
    writeln!(
        md,
        "| workload | fetch | C | N | jobs/s wasmjobs / native | ÷ | efficiency wasmjobs / native | ÷ | \
         CPU µs/job: runner | Redis | HTTP server | peak RSS wasmjobs / native | HTTP connections |"
    )?;
    writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")?;
    for c in comparisons {
        let cpu = c.cpu_per_job;
        let us = |pick: fn(&CpuPerJob) -> Option<f64>| {
            cpu.map_or("".into(), |cpu| {
                format!("{} / {}", micros(pick(&cpu.wasmjobs)), micros(pick(&cpu.native)))
            })
        };
        writeln!(
            md,
            "| {}{} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
            c.workload.name(),
            if c.problems { " (**LOSS**)" } else { "" },
            c.fetch.flag(),
            group(u64::from(c.concurrency)),
            group(c.jobs),
            group(c.jobs_per_sec.wasmjobs.round() as u64),
            group(c.jobs_per_sec.native.round() as u64),
            times(c.throughput_ratio),
            c.efficiency
                .map_or("".into(), |e| format!("{:.2} / {:.2}", e.wasmjobs, e.native)),
            times(c.efficiency_ratio),
            us(|cpu| Some(cpu.runner)),
            us(|cpu| cpu.redis),
            us(|cpu| Some(cpu.http_server)),
            mb(c.peak_rss_kb.wasmjobs),
            mb(c.peak_rss_kb.native),
            c.http_connections
                .map_or("".into(), |n| format!("{} / {}", group(n.wasmjobs), group(n.native))),
        )?;
    }
    writeln!(
        md,
        "\nThe native baseline (`benches/native/`) takes the same jobs from the same Redis with the \
         same fetch script, slot batching and batched `MULTI` acks, and does the same work in plain \
         Rust with the same HTTP client stack (hyper-util's pooled client, HTTP/1.1 keep-alive; for \
         http2, HTTP/2 with prior knowledge, as wasmjobs for an `h2 = true` rule): no Wasm, no \
         heartbeat, no metrics. ÷ is wasmjobs ÷ native (1.00 = the design's limit on this \
         machine). CPU is user + system per job over the timed window (per-thread schedstat) of the \
         worker, `redis-server` and the HTTP server's threads, wasmjobs / native; HTTP connections \
         are those the server accepted during the case."
    )
}

fn times(ratio: Option<f64>) -> String {
    ratio.map_or("".into(), |r| format!("{r:.2}"))
}

fn micros(value: Option<f64>) -> String {
    value.map_or("?".into(), |us| format!("{us:.1}"))
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::empty_row;
    use crate::plan::{Case, cases};

    fn row(case: &Case, jobs_per_sec: f64, efficiency: Option<f64>, runner_us: f64) -> Row {
        Row {
            jobs_per_sec,
            efficiency,
            peak_rss_kb: 2048,
            cpu_per_job: Some(CpuPerJob {
                runner: runner_us,
                redis: Some(5.0),
                http_server: 20.0,
            }),
            http_connections: case.workload.http().then_some(100),
            problems: Vec::new(),
            lost: 0,
            ..empty_row(case)
        }
    }

    #[test]
    fn each_wasmjobs_row_is_divided_by_its_native_twin() {
        let plan = cases(true, &[Workload::Http]);
        let rows: Vec<Row> = plan
            .iter()
            .map(|case| match case.processor {
                Processor::Wasmjobs => row(case, 400.0, Some(0.8), 90.0),
                Processor::Native => row(case, 500.0, Some(0.9), 30.0),
            })
            .collect();
        let found = comparisons(&rows);
        assert_eq!(found.len(), plan.len() / 2);
        let first = &found[0];
        assert_eq!(first.throughput_ratio, Some(0.8));
        let efficiency = first.efficiency_ratio.unwrap();
        assert!((efficiency - 0.8 / 0.9).abs() < 1e-12);
        assert_eq!(first.cpu_per_job.unwrap().native.runner, 30.0);

        let mut md = String::new();
        markdown(&mut md, &found).unwrap();
        let line = md.lines().find(|l| l.starts_with("| http | reliable | 100 |")).unwrap();
        assert!(
            line.contains(
                "| 400 / 500 | 0.80 | 0.80 / 0.90 | 0.89 | 90.0 / 30.0 | 5.0 / 5.0 | 20.0 / 20.0 | 2.0 MB / 2.0 MB | 100 / 100 |"
            ),
            "{line}"
        );
    }

    #[test]
    fn rows_without_a_twin_or_native_figure_give_no_ratio() {
        let plan = cases(true, &[Workload::Noop]);
        // Only the wasmjobs rows: nothing to divide by.
        let lone: Vec<Row> = plan
            .iter()
            .filter(|c| c.processor == Processor::Wasmjobs)
            .map(|c| row(c, 1.0, None, 1.0))
            .collect();
        assert!(comparisons(&lone).is_empty());
        // A native run that measured nothing: no ratio, and no efficiency for noop.
        let rows: Vec<Row> = plan.iter().take(2).map(|c| row(c, 0.0, None, 1.0)).collect();
        let found = comparisons(&rows);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].throughput_ratio, None);
        assert_eq!(found[0].efficiency, None);
    }
}
