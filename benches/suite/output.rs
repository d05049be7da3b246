//! The suite's report: per-workload tables in the seed report's shape
//! (Job processor, Concurrency, Jobs, Time, Start RSS, Finish RSS, %CPU,
//! then jobs/s, IO efficiency and execution p50 / p99; HTTP adds the
//! server's connection count), the targets of issues 7 and 15 with the
//! measured figure beside each, the loss checks, wasmjobs ÷ the native
//! baseline ([`crate::compare`]), the memory per in-flight job with its
//! mappings by kind ([`crate::memory`]), and three SVG charts. Written as
//! `<stem>.md`, `<stem>.json` and `<stem>-*.svg`.

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
        for workload in Workload::ALL.into_iter().filter(|w| !w.held()) {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.workload == workload).collect();
            if rows.is_empty() {
                continue;
            }
            writeln!(md, "\n## {}\n", heading(workload))?;
            table(&mut md, workload, &rows, self.native)?;
        }
        memory_section(&mut md, &self.rows)?;
        Ok(md)
    }
}

fn heading(workload: Workload) -> &'static str {
    match workload {
        Workload::Noop => "Noop (`NoopJob`)",
        Workload::Http => "HTTP GET of a 200 ms endpoint (`HttpGetJob`), HTTP/1.1",
        Workload::Http2 => "HTTP GET of a 200 ms endpoint (`HttpGetJob`), HTTP/2 with prior knowledge",
        Workload::HttpHeld => "Memory per in-flight job: `HttpGetJob`s held open by the server, HTTP/1.1",
        Workload::Http2Held => "Memory per in-flight job: `HttpGetJob`s held open by the server, HTTP/2",
        Workload::AsyncHttp => {
            "HTTP GET of a 200 ms endpoint as an async job (`AsyncHttpGetJob`, 100 jobs per instance), HTTP/1.1"
        }
        Workload::AsyncHttp2 => {
            "HTTP GET of a 200 ms endpoint as an async job (`AsyncHttpGetJob`, 100 jobs per instance), HTTP/2 with prior knowledge"
        }
        Workload::AsyncHttpHeld => "Memory per in-flight job: `AsyncHttpGetJob`s held open by the server, HTTP/1.1",
        Workload::AsyncHttp2Held => "Memory per in-flight job: `AsyncHttpGetJob`s held open by the server, HTTP/2",
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

/// The memory cases: per in-flight job, then where the memory is.
fn memory_section(md: &mut String, rows: &[Row]) -> std::fmt::Result {
    let held: Vec<&Row> = rows.iter().filter(|r| r.workload.held()).collect();
    let Some(first) = held.first() else {
        return Ok(());
    };
    writeln!(
        md,
        "\n## Memory per in-flight HTTP job (C = {}, every request held open)\n",
        group(u64::from(first.concurrency))
    )?;
    writeln!(
        md,
        "| worker | protocol | jobs held | fill-up | idle RSS | idle PSS | held RSS | held PSS | RSS / job | PSS / job | HTTP conns | Check |"
    )?;
    writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")?;
    for r in &held {
        let check = if r.problems.is_empty() { "ok" } else { "**LOSS**" };
        let conns = r.http_connections.map_or("".into(), group);
        match &r.memory {
            Some(m) => {
                let (rss, pss) = m.per_job_kb();
                writeln!(
                    md,
                    "| {} | {} | {} | {:.2} s | {} | {} | {} | {} | {rss:.1} KB | {pss:.1} KB | {conns} | {check} |",
                    worker(r),
                    protocol(r.workload),
                    group(m.in_flight),
                    m.fill_s,
                    mib(m.idle.rss_kb),
                    mib(m.idle.pss_kb),
                    mib(m.held.rss_kb),
                    mib(m.held.pss_kb),
                )?;
            }
            None => writeln!(
                md,
                "| {} | {} | | | | | | | | | {conns} | {check} |",
                worker(r),
                protocol(r.workload)
            )?,
        }
    }
    writeln!(
        md,
        "\nThe worker starts on an empty queue; idle is read right after it logs \"running\", before \
         any job exists. Then C jobs are pushed whose GET the server holds open (`/gate`); once the \
         server holds all C at once (fill-up: from the first push), RSS (`VmRSS`) and PSS \
         (`smaps_rollup`) are read, with `/proc/PID/smaps` below; then the server answers them all \
         and every job is checked as in the other cases. Per job = (held − idle) ÷ C. RSS counts a \
         page once per mapping of it, so the compiled component's data image, mapped once per \
         instance, counts C times in RSS but once in PSS."
    )?;
    for r in &held {
        let Some(m) = &r.memory else {
            continue;
        };
        let per_job = |kb: u64| kb as f64 / m.in_flight.max(1) as f64;
        writeln!(
            md,
            "\n### {}, {}: mappings with {} jobs in flight\n",
            worker(r),
            protocol(r.workload),
            group(m.in_flight)
        )?;
        writeln!(md, "| kind | mappings | virtual | RSS | PSS | RSS ÷ C | PSS ÷ C |")?;
        writeln!(md, "|---|--:|--:|--:|--:|--:|--:|")?;
        for k in &m.breakdown.kinds {
            writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.1} KB | {:.1} KB |",
                k.kind.label(),
                group(k.mappings),
                size(k.size_kb),
                mib(k.rss_kb),
                mib(k.pss_kb),
                per_job(k.rss_kb),
                per_job(k.pss_kb)
            )?;
        }
        let largest: Vec<String> = m
            .breakdown
            .largest
            .iter()
            .map(|l| {
                let name = if l.name.is_empty() {
                    "anon".to_owned()
                } else {
                    format!("`{}`", l.name)
                };
                format!(
                    "{name} {} {} ({}): {} RSS, {} PSS",
                    l.perms,
                    size(l.size_kb),
                    l.kind.short(),
                    mib(l.rss_kb),
                    mib(l.pss_kb)
                )
            })
            .collect();
        writeln!(md, "\nLargest mappings: {}.", largest.join("; "))?;
    }
    Ok(())
}

/// The worker of a memory row and its job class (the native worker does
/// the same GET for either class).
fn worker(row: &Row) -> String {
    format!("{}, `{}`", row.processor.name(), row.workload.class())
}

fn protocol(workload: Workload) -> &'static str {
    if workload.h2() { "HTTP/2" } else { "HTTP/1.1" }
}

/// `12.3 MB` (MiB, as the rest of the report).
fn mib(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

/// A virtual size: KB, MB, GB or TB.
fn size(kb: u64) -> String {
    let kb = kb as f64;
    match kb {
        kb if kb >= 1024.0 * 1024.0 * 1024.0 => format!("{:.1} TB", kb / 1024.0 / 1024.0 / 1024.0),
        kb if kb >= 1024.0 * 1024.0 => format!("{:.1} GB", kb / 1024.0 / 1024.0),
        kb if kb >= 1024.0 => format!("{:.1} MB", kb / 1024.0),
        kb => format!("{kb:.0} KB"),
    }
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
        Workload::AsyncHttp,
        Workload::AsyncHttp2,
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
        series(
            "http-async (200 ms)".into(),
            &|r| r.workload == Workload::AsyncHttp,
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
    let all_rows = rows;
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
    // The design's memory bound at C=10,000, for both kinds of HTTP job.
    for workload in [
        Workload::Http,
        Workload::Http2,
        Workload::AsyncHttp,
        Workload::AsyncHttp2,
    ] {
        targets.push(target(
            &format!("{}, C = 10,000", workload.name()),
            "peak RSS ≤ 300 MB",
            find(workload, 10_000).map(|r| {
                let mb = r.peak_rss_kb as f64 / 1024.0;
                (format!("{mb:.0} MB"), mb <= 300.0)
            }),
        ));
    }
    targets.extend(native_targets(comparisons));
    targets.extend(memory_targets(all_rows, comparisons));
    targets
}

/// The HTTP workloads of one kind of job: `HttpGetJob` on a fresh
/// instance each, or `AsyncHttpGetJob` a hundred to an instance.
#[derive(Clone, Copy)]
struct HttpJobs {
    /// The HTTP/1.1 workload's name, which labels its targets.
    h1: Workload,
    h2: Workload,
    h1_held: Workload,
    h2_held: Workload,
}

/// Issue 15's HTTP targets are checked for both kinds of job.
const HTTP_JOBS: [HttpJobs; 2] = [
    HttpJobs {
        h1: Workload::Http,
        h2: Workload::Http2,
        h1_held: Workload::HttpHeld,
        h2_held: Workload::Http2Held,
    },
    HttpJobs {
        h1: Workload::AsyncHttp,
        h2: Workload::AsyncHttp2,
        h1_held: Workload::AsyncHttpHeld,
        h2_held: Workload::AsyncHttp2Held,
    },
];

/// Issue 15's memory targets: per in-flight job from the memory cases,
/// and the HTTP/1.1 drain's peak RSS at C=10,000 against native's.
fn memory_targets(rows: &[Row], comparisons: &[Comparison]) -> Vec<Target> {
    let per_job = |processor: Processor, workload: Workload| {
        rows.iter()
            .find(|r| r.processor == processor && r.workload == workload)
            .and_then(|r| r.memory.as_ref())
            .map(|m| m.per_job_kb())
    };
    let mut targets = Vec::new();
    for jobs in HTTP_JOBS {
        let (h1_name, h2_name) = (jobs.h1.name(), jobs.h2.name());
        let h2 = per_job(Processor::Wasmjobs, jobs.h2_held);
        let h1 = per_job(Processor::Wasmjobs, jobs.h1_held);
        let h1_native = per_job(Processor::Native, jobs.h1_held);
        let peak = comparisons
            .iter()
            .find(|c| c.workload == jobs.h1 && c.concurrency == 10_000);
        targets.extend([
            Target {
                what: format!("{h2_name}, jobs held at C = 10,000: PSS per in-flight job"),
                target: "≤ 30 KB".into(),
                measured: h2.map_or("".into(), |(_, pss)| format!("{pss:.1} KB")),
                met: h2.map(|(_, pss)| pss <= 30.0),
            },
            Target {
                what: format!("{h2_name}, jobs held at C = 10,000: RSS per in-flight job"),
                target: "≤ 40 KB".into(),
                measured: h2.map_or("".into(), |(rss, _)| format!("{rss:.1} KB")),
                met: h2.map(|(rss, _)| rss <= 40.0),
            },
            Target {
                what: format!("{h1_name}, jobs held at C = 10,000: RSS per in-flight job"),
                target: "≤ native's (the connection's cost) + 15 KB".into(),
                measured: h1.zip(h1_native).map_or("".into(), |((rss, pss), (native, _))| {
                    format!("{rss:.1} KB, PSS {pss:.1} KB (native {native:.1} KB)")
                }),
                met: h1.zip(h1_native).map(|((rss, _), (native, _))| rss <= native + 15.0),
            },
            Target {
                what: format!("{h1_name}, C = 10,000: peak RSS"),
                target: "≤ native's + 15 KB per in-flight job".into(),
                measured: peak.map_or("".into(), |c| {
                    format!("{} (native {})", mib(c.peak_rss_kb.wasmjobs), mib(c.peak_rss_kb.native))
                }),
                met: peak.map(|c| {
                    c.peak_rss_kb.wasmjobs as f64 <= c.peak_rss_kb.native as f64 + 15.0 * f64::from(c.concurrency)
                }),
            },
        ]);
    }
    targets
}

/// Issue 15's targets, each a ratio to the native baseline.
fn native_targets(comparisons: &[Comparison]) -> Vec<Target> {
    let find = |w: Workload, fetch: Fetch, c: u32| {
        comparisons
            .iter()
            .find(|x| x.workload == w && x.fetch == fetch && x.concurrency == c)
    };
    let ratio_target =
        |what: String, at_least: f64, found: Option<&Comparison>, pick: fn(&Comparison) -> Option<f64>| {
            let measured = found.and_then(|c| pick(c).map(|r| (c, r)));
            Target {
                what,
                target: format!("≥ {at_least:.2} × native"),
                measured: measured.map_or("".into(), |(c, r)| {
                    format!("{r:.2} (C={}, N={})", c.concurrency, group(c.jobs))
                }),
                met: measured.map(|(_, r)| r >= at_least),
            }
        };
    let mut targets = vec![ratio_target(
        "noop C = 100, reliable: jobs/s".into(),
        0.7,
        find(Workload::Noop, Fetch::Reliable, 100),
        |c| c.throughput_ratio,
    )];
    for jobs in HTTP_JOBS {
        let (h1_name, h2_name) = (jobs.h1.name(), jobs.h2.name());
        let http_1000 = find(jobs.h1, Fetch::Reliable, 1_000);
        let runner_us = http_1000.and_then(|c| c.cpu_per_job);
        targets.extend([
            ratio_target(format!("{h1_name} C = 1,000: efficiency"), 0.95, http_1000, |c| {
                c.efficiency_ratio
            }),
            ratio_target(
                format!("{h1_name} C = 10,000: efficiency"),
                0.8,
                find(jobs.h1, Fetch::Reliable, 10_000),
                |c| c.efficiency_ratio,
            ),
            ratio_target(
                format!("{h2_name} C = 10,000: efficiency (over HTTP/2 both)"),
                0.8,
                find(jobs.h2, Fetch::Reliable, 10_000),
                |c| c.efficiency_ratio,
            ),
            Target {
                what: format!("{h1_name} C = 1,000: runner CPU per job"),
                target: "≤ 60 µs".into(),
                measured: runner_us.map_or("".into(), |cpu| {
                    format!("{:.0} µs (native {:.0} µs)", cpu.wasmjobs.runner, cpu.native.runner)
                }),
                met: runner_us.map(|cpu| cpu.wasmjobs.runner <= 60.0),
            },
        ]);
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::empty_row;
    use crate::memory::{Breakdown, Held, Kind, KindTotal, Memory};
    use crate::plan::cases;

    /// A memory case's row: `rss` and `pss` KiB per job over an idle 20 MB.
    fn held_row(case: &crate::plan::Case, rss: u64, pss: u64) -> Row {
        let idle = Memory {
            rss_kb: 20_480,
            pss_kb: 18_432,
        };
        Row {
            processed: case.jobs,
            lost: 0,
            http_connections: Some(if case.workload.h2() { 1 } else { case.jobs }),
            memory: Some(Held {
                in_flight: case.jobs,
                fill_s: 1.5,
                idle,
                held: Memory {
                    rss_kb: idle.rss_kb + rss * case.jobs,
                    pss_kb: idle.pss_kb + pss * case.jobs,
                },
                breakdown: Breakdown {
                    kinds: vec![KindTotal {
                        kind: Kind::Heap,
                        mappings: 3,
                        size_kb: 1 << 20,
                        rss_kb: rss * case.jobs,
                        pss_kb: pss * case.jobs,
                    }],
                    largest: Vec::new(),
                },
            }),
            ..empty_row(case)
        }
    }

    #[test]
    fn memory_cases_report_per_job_figures_against_the_issue_15_targets() {
        let plan = cases(
            true,
            &[Workload::HttpHeld, Workload::Http2Held, Workload::AsyncHttp2Held],
        );
        let rows: Vec<Row> = plan
            .iter()
            .map(|case| match (case.processor, case.workload) {
                (Processor::Wasmjobs, Workload::HttpHeld) => held_row(case, 40, 30),
                (Processor::Wasmjobs, Workload::Http2Held) => held_row(case, 41, 29),
                (Processor::Wasmjobs, _) => held_row(case, 23, 22),
                (Processor::Native, w) if w.h2() => held_row(case, 10, 10),
                (Processor::Native, _) => held_row(case, 26, 26),
            })
            .collect();
        let targets = memory_targets(&rows, &[]);
        let met: Vec<(&str, &str, Option<bool>)> = targets
            .iter()
            .map(|t| (t.what.split(',').next().unwrap_or(""), t.target.as_str(), t.met))
            .collect();
        assert_eq!(
            met,
            [
                ("http2", "≤ 30 KB", Some(true)),
                ("http2", "≤ 40 KB", Some(false)),
                ("http", "≤ native's (the connection's cost) + 15 KB", Some(true)),
                ("http", "≤ native's + 15 KB per in-flight job", None),
                // The async job's HTTP/2 rows, from its own case only.
                ("http2-async", "≤ 30 KB", Some(true)),
                ("http2-async", "≤ 40 KB", Some(true)),
                ("http-async", "≤ native's (the connection's cost) + 15 KB", None),
                ("http-async", "≤ native's + 15 KB per in-flight job", None),
            ]
        );
        assert_eq!(targets[2].measured, "40.0 KB, PSS 30.0 KB (native 26.0 KB)");
        assert_eq!(targets[5].measured, "23.0 KB");

        let mut md = String::new();
        memory_section(&mut md, &rows).unwrap();
        assert!(
            md.contains("| wasmjobs, `HttpGetJob` | HTTP/2 | 10_000 | 1.50 s | 20.0 MB | 18.0 MB | 420.4 MB | 301.2 MB | 41.0 KB | 29.0 KB | 1 | ok |"),
            "{md}"
        );
        assert!(
            md.contains("### native, `AsyncHttpGetJob`, HTTP/2: mappings with 10_000 jobs in flight"),
            "{md}"
        );
        assert!(
            md.contains("| anon heap (mimalloc/glibc arenas, [heap]) | 3 | 1.0 GB |"),
            "{md}"
        );
    }

    #[test]
    fn virtual_sizes_read_in_the_largest_unit() {
        assert_eq!(size(36), "36 KB");
        assert_eq!(size(2048), "2.0 MB");
        assert_eq!(size(6_412_420), "6.1 GB");
        assert_eq!(size(84_676_346_304), "78.9 TB");
    }
}
