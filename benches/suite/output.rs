//! The suite's report: per-workload tables in the seed report's shape
//! (Job processor, Concurrency, Jobs, Time, Start RSS, Finish RSS, %CPU,
//! then jobs/s, IO efficiency and execution p50 / p99), the targets of
//! issues 7 and 15 with the measured figure beside each, the loss checks,
//! wasmjobs ÷ the native baseline ([`crate::compare`]), and three SVG
//! charts. Written as `<stem>.md`, `<stem>.json` and `<stem>-*.svg`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::chart::{Chart, Series};
use crate::compare::{self, Comparison};
use crate::measure::Row;
use crate::plan::{Fetch, Processor, Workload};
pub use wasmjobs::runner::summary::group;

/// Sidekiq's best 50,000-job file-append time in the seed report, seconds.
const SIDEKIQ_FILE_APPEND_SECS: f64 = 17.03;

/// The machine and build a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// When the suite ran (UTC).
    pub date: String,
    /// Host name.
    pub host: String,
    /// CPU model.
    pub cpu: String,
    /// Cores available.
    pub cores: usize,
    /// `MemTotal`, MiB.
    pub memory_mib: u64,
    /// `uname -sr`.
    pub kernel: String,
    /// `redis-server --version`.
    pub redis: String,
    /// The wasmjobs version and git commit.
    pub wasmjobs: String,
    /// How the suite was started.
    pub command: String,
}

/// fib(25) computed natively, for the wasm / native ratio.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Native {
    /// Median of 100 calls, ms.
    pub fib25_ms: f64,
}

/// One issue-7 target and what this run measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// Workload and condition.
    pub what: String,
    /// The target.
    pub target: String,
    /// The measured figure.
    pub measured: String,
    /// Met, missed, or not measured in this run (`None`).
    pub met: Option<bool>,
}

/// Everything one suite run produced.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Where and what.
    pub machine: Machine,
    /// `--quick` or the full set.
    pub quick: bool,
    /// Native fib.
    pub native: Option<Native>,
    /// Targets, evaluated.
    pub targets: Vec<Target>,
    /// wasmjobs ÷ native, case by case.
    pub comparisons: Vec<Comparison>,
    /// Every case.
    pub rows: Vec<Row>,
}

impl Results {
    /// Rows with a problem (lost or failed jobs, a runner that misbehaved).
    pub fn problems(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|row| !row.problems.is_empty())
    }

    /// Writes `<dir>/<stem>.md`, `.json` and the charts; returns the Markdown path.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, chart) in charts(&self.rows) {
            let path = dir.join(format!("{stem}-{name}.svg"));
            std::fs::write(&path, chart.to_svg()).with_context(|| format!("writing {}", path.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(dir.join(format!("{stem}.json")), json)?;
        let md_path = dir.join(format!("{stem}.md"));
        std::fs::write(&md_path, self.markdown(stem)?)?;
        Ok(md_path)
    }

    /// The Markdown report.
    pub fn markdown(&self, stem: &str) -> Result<String> {
        let m = &self.machine;
        let mut md = String::new();
        let set = if self.quick { "quick set" } else { "full set" };
        writeln!(md, "# wasmjobs benchmark suite: {} on `{}` ({set})\n", m.date, m.host)?;
        writeln!(
            md,
            "{} ({} cores), {} MiB RAM, {}; {}; wasmjobs {}. Reproduce: `{}`.\n",
            m.cpu, m.cores, m.memory_mib, m.kernel, m.redis, m.wasmjobs, m.command
        )?;
        writeln!(
            md,
            "Jobs are pushed into Redis first; the clock runs from `wasmjobs run --exit-when-empty` \
             reporting \"running\" to the last job processed. Redis, PostgreSQL and the 200 ms HTTP \
             server share the cores with the runner. %CPU is the runner's (100 = one core); RSS is \
             the runner's; Exec p50/p99 is instantiate + perform per job. Noop and HTTP cases run \
             twice, through wasmjobs and through the native baseline (`wasmjobs-native`).\n"
        )?;
        writeln!(md, "## Targets\n")?;
        writeln!(md, "| workload | target | measured | |")?;
        writeln!(md, "|---|---|---|---|")?;
        for t in &self.targets {
            let verdict = match t.met {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "not run",
            };
            writeln!(md, "| {} | {} | {} | {verdict} |", t.what, t.target, t.measured)?;
        }
        compare::markdown(&mut md, &self.comparisons)?;
        let lost: Vec<&Row> = self.problems().collect();
        writeln!(md, "\n## Every job accounted for?\n")?;
        if lost.is_empty() {
            let jobs: u64 = self.rows.iter().map(|r| r.jobs).sum();
            writeln!(
                md,
                "Yes: {} jobs in {} runs, each run checked for processed = pushed, no failures, and nothing \
                 left in the queue, the retry or dead sets or an in-progress list; HTTP requests served = jobs; \
                 the appended file holds exactly the ids 0..N.",
                group(jobs),
                self.rows.len()
            )?;
        } else {
            for row in lost {
                writeln!(md, "- **{}**: {}", case_name(row), row.problems.join("; "))?;
            }
        }
        writeln!(md, "\n## Charts\n")?;
        for (name, _) in charts(&self.rows) {
            writeln!(md, "![{name}]({stem}-{name}.svg)")?;
        }
        for workload in Workload::ALL {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.workload == workload).collect();
            if rows.is_empty() {
                continue;
            }
            writeln!(md, "\n## {}\n", heading(workload))?;
            table(&mut md, workload, &rows, self.native)?;
        }
        Ok(md)
    }
}

fn heading(workload: Workload) -> &'static str {
    match workload {
        Workload::Noop => "Noop (`NoopJob`)",
        Workload::Http => "HTTP GET of a 200 ms endpoint (`HttpGetJob`), HTTP/1.1",
        Workload::Http2 => "HTTP GET of a 200 ms endpoint (`HttpGetJob`), HTTP/2 with prior knowledge",
        Workload::PgSleep => "PostgreSQL `SELECT pg_sleep(0.1)` (`PgSleepJob`)",
        Workload::FileAppend => "File append (`FileAppendJob`)",
        Workload::Fib => "CPU: fib(25) (`FibJob`)",
        Workload::Idle => "Idle",
    }
}

fn table(md: &mut String, workload: Workload, rows: &[&Row], native: Option<Native>) -> Result<()> {
    if workload == Workload::Idle {
        writeln!(
            md,
            "| Job processor | Concurrency | Time | Start RSS | Finish RSS | Peak RSS | %CPU |"
        )?;
        writeln!(md, "|---|--:|--:|--:|--:|--:|--:|")?;
        for r in rows {
            writeln!(
                md,
                "| {} | {} | {:.0} sec | {} | {} | {} | {:.2} |",
                processor(r),
                group(u64::from(r.concurrency)),
                r.time_s,
                kb(r.start_rss_kb),
                kb(r.finish_rss_kb),
                kb(r.peak_rss_kb),
                r.cpu_percent
            )?;
        }
        return Ok(());
    }
    // HTTP workloads add the connections the server accepted.
    let (conns_head, conns_rule) = if workload.http() {
        (" HTTP conns |", "--:|")
    } else {
        ("", "")
    };
    writeln!(
        md,
        "| Job processor | Concurrency | Jobs | Time | Start RSS | Finish RSS | Peak RSS | %CPU | Jobs/s | Efficiency | Exec p50 | Exec p99 |{conns_head} Check |"
    )?;
    writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|{conns_rule}---|")?;
    for r in rows {
        let conns = if workload.http() {
            format!(" {} |", r.http_connections.map_or("".into(), group))
        } else {
            String::new()
        };
        writeln!(
            md,
            "| {} | {} | {} | {:.2} sec | {} | {} | {} | {:.1} | {} | {} | {} | {} |{conns} {} |",
            processor(r),
            group(u64::from(r.concurrency)),
            group(r.jobs),
            r.time_s,
            kb(r.start_rss_kb),
            kb(r.finish_rss_kb),
            kb(r.peak_rss_kb),
            r.cpu_percent,
            group(r.jobs_per_sec.round() as u64),
            r.efficiency.map_or("".into(), |e| format!("{e:.2}")),
            r.exec_p50_ms.map_or("".into(), ms),
            r.exec_p99_ms.map_or("".into(), ms),
            if r.problems.is_empty() { "ok" } else { "**LOSS**" },
        )?;
    }
    if let (Workload::Fib, Some(native)) = (workload, native) {
        writeln!(
            md,
            "| native Rust, same source, 1 thread | 1 | 100 | {:.2} sec | | | | | {} | | {} | | |",
            native.fib25_ms * 100.0 / 1000.0,
            group((1000.0 / native.fib25_ms).round() as u64),
            ms(native.fib25_ms)
        )?;
    }
    Ok(())
}

fn processor(row: &Row) -> String {
    match row.processor {
        Processor::Wasmjobs => format!("wasmjobs {} ({})", env!("CARGO_PKG_VERSION"), row.fetch.flag()),
        Processor::Native => format!("native baseline ({})", row.fetch.flag()),
    }
}

fn case_name(row: &Row) -> String {
    format!(
        "{} {} {} C={} N={}",
        row.processor.name(),
        row.workload.name(),
        row.fetch.flag(),
        row.concurrency,
        group(row.jobs)
    )
}

/// `131_068 kb`, as the seed report writes it.
fn kb(value: u64) -> String {
    format!("{} kb", group(value))
}

fn ms(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.3} ms")
    } else {
        format!("{value:.1} ms")
    }
}

/// The three charts, by file-name suffix.
fn charts(rows: &[Row]) -> Vec<(&'static str, Chart)> {
    let wasmjobs: Vec<&Row> = rows.iter().filter(|r| r.processor == Processor::Wasmjobs).collect();
    let native: Vec<&Row> = rows.iter().filter(|r| r.processor == Processor::Native).collect();
    let series_of = |rows: &[&Row], name: String, pick: &dyn Fn(&Row) -> bool, y: &dyn Fn(&Row) -> f64| Series {
        name,
        points: rows
            .iter()
            .filter(|r| pick(r))
            .map(|r| (f64::from(r.concurrency), y(r)))
            .collect(),
    };
    let series =
        |name: String, pick: &dyn Fn(&Row) -> bool, y: &dyn Fn(&Row) -> f64| series_of(&wasmjobs, name, pick, y);
    let mut throughput = Vec::new();
    for jobs in [100_000, 1_000_000] {
        for fetch in [Fetch::Reliable, Fetch::Basic] {
            throughput.push(series(
                format!("noop {} jobs, {} fetch", short(jobs), fetch.flag()),
                &|r| r.workload == Workload::Noop && r.jobs == jobs && r.fetch == fetch,
                &|r| r.jobs_per_sec,
            ));
        }
    }
    throughput.push(series_of(
        &native,
        "noop 100k, reliable, native".into(),
        &|r| r.workload == Workload::Noop && r.jobs == 100_000 && r.fetch == Fetch::Reliable,
        &|r| r.jobs_per_sec,
    ));
    throughput.push(series(
        "file append 50k".into(),
        &|r| r.workload == Workload::FileAppend,
        &|r| r.jobs_per_sec,
    ));
    let mb = |r: &Row| r.peak_rss_kb as f64 / 1024.0;
    let mut rss = vec![series(
        "noop 100k, reliable".into(),
        &|r| r.workload == Workload::Noop && r.jobs == 100_000 && r.fetch == Fetch::Reliable,
        &mb,
    )];
    for workload in [
        Workload::Http,
        Workload::Http2,
        Workload::PgSleep,
        Workload::FileAppend,
        Workload::Idle,
    ] {
        rss.push(series(workload.name().into(), &|r| r.workload == workload, &mb));
    }
    let efficiency = vec![
        series("http (200 ms)".into(), &|r| r.workload == Workload::Http, &|r| {
            r.efficiency.unwrap_or(0.0)
        }),
        series_of(
            &native,
            "http, native".into(),
            &|r| r.workload == Workload::Http,
            &|r| r.efficiency.unwrap_or(0.0),
        ),
        series("http2 (200 ms)".into(), &|r| r.workload == Workload::Http2, &|r| {
            r.efficiency.unwrap_or(0.0)
        }),
        series_of(
            &native,
            "http2, native".into(),
            &|r| r.workload == Workload::Http2,
            &|r| r.efficiency.unwrap_or(0.0),
        ),
        series("pg-sleep (100 ms)".into(), &|r| r.workload == Workload::PgSleep, &|r| {
            r.efficiency.unwrap_or(0.0)
        }),
    ];
    let keep = |series: Vec<Series>| series.into_iter().filter(|s| !s.points.is_empty()).collect();
    vec![
        (
            "throughput",
            Chart {
                title: "Throughput vs concurrency".into(),
                x_label: "concurrency".into(),
                y_label: "jobs/s".into(),
                log_x: true,
                reference: None,
                series: keep(throughput),
            },
        ),
        (
            "rss",
            Chart {
                title: "Peak RSS vs concurrency".into(),
                x_label: "concurrency".into(),
                y_label: "peak RSS (MB)".into(),
                log_x: true,
                reference: Some((300.0, "target at C=10,000: 300 MB".into())),
                series: keep(rss),
            },
        ),
        (
            "efficiency",
            Chart {
                title: "IO efficiency (floor / wall) vs concurrency".into(),
                x_label: "concurrency".into(),
                y_label: "efficiency".into(),
                log_x: true,
                reference: Some((0.9, "target ≥ 0.9".into())),
                series: keep(efficiency),
            },
        ),
    ]
}

fn short(jobs: u64) -> String {
    match jobs {
        j if j >= 1_000_000 => format!("{}M", j / 1_000_000),
        j if j >= 1_000 => format!("{}k", j / 1_000),
        j => j.to_string(),
    }
}

/// Issue 7's and issue 15's targets against this run's rows (issue 15's
/// as ratios to the native baseline of the same run).
pub fn targets(rows: &[Row], comparisons: &[Comparison], native: Option<Native>) -> Vec<Target> {
    let rows: Vec<Row> = rows
        .iter()
        .filter(|r| r.processor == Processor::Wasmjobs)
        .cloned()
        .collect();
    let rows = &rows[..];
    let find = |w: Workload, c: u32| rows.iter().find(|r| r.workload == w && r.concurrency == c);
    let best = |w: Workload, fetch: Fetch| {
        rows.iter()
            .filter(|r| r.workload == w && r.fetch == fetch)
            .max_by(|a, b| a.jobs_per_sec.total_cmp(&b.jobs_per_sec))
    };
    let rate = |r: &Row| {
        format!(
            "{} jobs/s (C={}, N={})",
            group(r.jobs_per_sec.round() as u64),
            r.concurrency,
            group(r.jobs)
        )
    };
    let target = |what: &str, target: &str, measured: Option<(String, bool)>| Target {
        what: what.into(),
        target: target.into(),
        measured: measured.as_ref().map_or("".into(), |m| m.0.clone()),
        met: measured.map(|m| m.1),
    };
    let efficiency = |r: &Row, at_least: f64| {
        let e = r.efficiency.unwrap_or(0.0);
        (
            format!(
                "{e:.2} ({:.2} s against a {:.2} s floor)",
                r.time_s,
                r.floor_s.unwrap_or(0.0)
            ),
            e >= at_least,
        )
    };
    let file_target = 5.0 * 50_000.0 / SIDEKIQ_FILE_APPEND_SECS;
    let idle: Vec<&Row> = rows.iter().filter(|r| r.workload == Workload::Idle).collect();
    let idle_rss = idle.iter().map(|r| r.finish_rss_kb.max(r.start_rss_kb)).max();
    let idle_cpu = idle.iter().map(|r| r.cpu_percent).max_by(f64::total_cmp);
    let fib = rows
        .iter()
        .filter(|r| r.workload == Workload::Fib)
        .filter_map(|r| r.exec_p50_ms)
        .min_by(f64::total_cmp);
    let mut targets = vec![
        target(
            "noop, reliable fetch",
            "≥ 50,000 jobs/s",
            best(Workload::Noop, Fetch::Reliable).map(|r| (rate(r), r.jobs_per_sec >= 50_000.0)),
        ),
        target(
            "noop, basic fetch",
            "≥ 80,000 jobs/s",
            best(Workload::Noop, Fetch::Basic).map(|r| (rate(r), r.jobs_per_sec >= 80_000.0)),
        ),
        target(
            "http, C = 1,000",
            "efficiency ≥ 0.9",
            find(Workload::Http, 1_000).map(|r| efficiency(r, 0.9)),
        ),
        target(
            "http, C = 10,000",
            "efficiency ≥ 0.8",
            find(Workload::Http, 10_000).map(|r| efficiency(r, 0.8)),
        ),
        target(
            "http, C = 10,000",
            "peak RSS ≤ 300 MB",
            find(Workload::Http, 10_000).map(|r| {
                let mb = r.peak_rss_kb as f64 / 1024.0;
                (format!("{mb:.0} MB"), mb <= 300.0)
            }),
        ),
        target(
            "http2, C = 10,000",
            "peak RSS ≤ 300 MB",
            find(Workload::Http2, 10_000).map(|r| {
                let mb = r.peak_rss_kb as f64 / 1024.0;
                (format!("{mb:.0} MB"), mb <= 300.0)
            }),
        ),
        target(
            "pg sleep, C = 100",
            "efficiency ≥ 0.9",
            find(Workload::PgSleep, 100).map(|r| efficiency(r, 0.9)),
        ),
        target(
            "file append 50,000",
            &format!("≥ 5× Sidekiq's 17.03 s: ≥ {} jobs/s", group(file_target.round() as u64)),
            best(Workload::FileAppend, Fetch::Reliable).map(|r| {
                let x = r.jobs_per_sec * SIDEKIQ_FILE_APPEND_SECS / 50_000.0;
                (format!("{} ({x:.1}× Sidekiq)", rate(r)), r.jobs_per_sec >= file_target)
            }),
        ),
        target(
            "cpu fib(25)",
            "≤ 1.5× native",
            fib.zip(native).map(|(wasm, native)| {
                let ratio = wasm / native.fib25_ms;
                (
                    format!(
                        "{ratio:.2}× ({} per job in wasm, {} native)",
                        ms(wasm),
                        ms(native.fib25_ms)
                    ),
                    ratio <= 1.5,
                )
            }),
        ),
        target(
            "idle (worst concurrency)",
            "≤ 25 MB RSS",
            idle_rss.map(|kb| (format!("{:.1} MB", kb as f64 / 1024.0), kb as f64 / 1024.0 <= 25.0)),
        ),
        target(
            "idle (worst concurrency)",
            "≤ 0.1% CPU",
            idle_cpu.map(|cpu| (format!("{cpu:.2}%"), cpu <= 0.1)),
        ),
    ];
    targets.extend(native_targets(comparisons));
    targets
}

/// Issue 15's targets, each a ratio to the native baseline.
fn native_targets(comparisons: &[Comparison]) -> Vec<Target> {
    let find = |w: Workload, fetch: Fetch, c: u32| {
        comparisons
            .iter()
            .find(|x| x.workload == w && x.fetch == fetch && x.concurrency == c)
    };
    let ratio_target = |what: &str, at_least: f64, found: Option<&Comparison>, pick: fn(&Comparison) -> Option<f64>| {
        let measured = found.and_then(|c| pick(c).map(|r| (c, r)));
        Target {
            what: what.into(),
            target: format!("≥ {at_least:.2} × native"),
            measured: measured.map_or("".into(), |(c, r)| {
                format!("{r:.2} (C={}, N={})", c.concurrency, group(c.jobs))
            }),
            met: measured.map(|(_, r)| r >= at_least),
        }
    };
    let http_1000 = find(Workload::Http, Fetch::Reliable, 1_000);
    let runner_us = http_1000.and_then(|c| c.cpu_per_job);
    vec![
        ratio_target(
            "noop C = 100, reliable: jobs/s",
            0.7,
            find(Workload::Noop, Fetch::Reliable, 100),
            |c| c.throughput_ratio,
        ),
        ratio_target("http C = 1,000: efficiency", 0.95, http_1000, |c| c.efficiency_ratio),
        ratio_target(
            "http C = 10,000: efficiency",
            0.8,
            find(Workload::Http, Fetch::Reliable, 10_000),
            |c| c.efficiency_ratio,
        ),
        ratio_target(
            "http2 C = 10,000: efficiency (over HTTP/2 both)",
            0.8,
            find(Workload::Http2, Fetch::Reliable, 10_000),
            |c| c.efficiency_ratio,
        ),
        Target {
            what: "http C = 1,000: runner CPU per job".into(),
            target: "≤ 60 µs".into(),
            measured: runner_us.map_or("".into(), |cpu| {
                format!("{:.0} µs (native {:.0} µs)", cpu.wasmjobs.runner, cpu.native.runner)
            }),
            met: runner_us.map(|cpu| cpu.wasmjobs.runner <= 60.0),
        },
    ]
}
