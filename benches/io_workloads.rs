//! The IO-bound seed workloads, through Redis and the real `wasmjobs run`.
//!
//! - `HttpGetJob` against a local HTTP server whose endpoint sleeps 200 ms,
//!   at concurrency C = 100, 1,000 and 10,000 with N = 10 × C jobs (at least
//!   1,000): efficiency = (N × 0.2 s / C) / wall, the share of the ideal
//!   overlap achieved, and the runner's peak RSS (`VmHWM`).
//! - `PgSleepJob` (`SELECT pg_sleep(0.1)`) on a real PostgreSQL at C = 100
//!   with a pool of 100 connections: efficiency against N × 0.1 s / 100.
//! - `FileAppendJob`, 50,000 jobs appending a line to one file: jobs/s and
//!   RSS.
//!
//! Jobs are pushed first (Sidekiq format); timing starts when the runner
//! reports "running" and ends when `stat:processed` reaches N. Every job must
//! succeed: a failure or a lost job fails the benchmark. The HTTP server,
//! Redis and PostgreSQL run on the same two cores as the runner.
//!
//! Run: `cargo bench -p wasmjobs-benches --bench io_workloads`
//! (`BENCH_QUICK=1` stops at C = 1,000 and runs 10,000 file appends;
//! `BENCH_HTTP_ONLY=1000,10000` runs only the HTTP rows at those
//! concurrencies and writes `io_workloads_partial.md` instead).

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use wasmjobs_benches::{Report, drain};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    wasmjobs::runner::os_limits::raise_open_files(10_000);
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    // Only the jobs under test: the Python and JS examples alone hold ~300 MB.
    let io_plugins = wasmjobs_e2e::runner::plugins(&["http-get", "pg-sleep"], &[]);

    let server = rt.block_on(HttpServer::start(Duration::from_millis(200)));
    let url = server.url("/sleep");
    let only: Option<Vec<u32>> = std::env::var("BENCH_HTTP_ONLY")
        .ok()
        .map(|list| list.split(',').filter_map(|c| c.trim().parse().ok()).collect());
    let name = if only.is_some() {
        "io_workloads_partial"
    } else {
        "io_workloads"
    };
    let mut report = Report::new(name, "IO-bound workloads through Redis: HTTP, PostgreSQL, files");
    let concurrencies = match &only {
        Some(list) => list.clone(),
        None if quick => vec![100, 1_000],
        None => vec![100, 1_000, 10_000],
    };
    for &c in &concurrencies {
        let n = (10 * u64::from(c)).max(1_000);
        let connections_before = server.connections();
        let run = rt.block_on(drain(
            BIN.as_ref(),
            &redis,
            io_plugins.path(),
            "HttpGetJob",
            n,
            |_| json!([url]),
            &["--concurrency", &c.to_string()],
        ))?;
        let floor = n as f64 * 0.2 / f64::from(c);
        let target = match c {
            1_000 => "≥ 0.9",
            10_000 => "≥ 0.8",
            _ => "",
        };
        report.row(
            &format!("HttpGetJob C={c}, N={n}: efficiency"),
            format!("{:.2}", floor / run.wall.as_secs_f64()),
            target,
        );
        report.row(
            &format!("HttpGetJob C={c}: wall / floor (s)"),
            format!("{:.2} / {floor:.2}", run.wall.as_secs_f64()),
            "",
        );
        report.row(
            &format!("HttpGetJob C={c}: peak RSS (MB)"),
            format!("{:.1}", run.peak_rss_kb as f64 / 1024.0),
            if c == 10_000 { "≤ 300" } else { "" },
        );
        report.row(&format!("HttpGetJob C={c}: %CPU runner"), format!("{:.0}", run.cpu), "");
        report.row(
            &format!("HttpGetJob C={c}: connections opened"),
            format!("{}", server.connections() - connections_before),
            "",
        );
    }

    if only.is_some() {
        report.finish()?;
        return Ok(());
    }

    let postgres = TestPostgres::start();
    let db = format!("main={}?pool=100", postgres.url("postgres"));
    let n = if quick { 1_000 } else { 3_000 };
    let run = rt.block_on(drain(
        BIN.as_ref(),
        &redis,
        io_plugins.path(),
        "PgSleepJob",
        n,
        |_| json!([]),
        &["--concurrency", "100", "--db", &db],
    ))?;
    let floor = n as f64 * 0.1 / 100.0;
    report.row(
        &format!("PgSleepJob C=100, pool 100, N={n}: efficiency"),
        format!("{:.2}", floor / run.wall.as_secs_f64()),
        "≥ 0.9",
    );
    report.row(
        "PgSleepJob: wall / floor (s)",
        format!("{:.2} / {floor:.2}", run.wall.as_secs_f64()),
        "",
    );
    report.row(
        "PgSleepJob: peak RSS (MB)",
        format!("{:.1}", run.peak_rss_kb as f64 / 1024.0),
        "",
    );
    drop(postgres);

    let files = wasmjobs_e2e::runner::plugins(&["file-append"], &[]);
    let n = if quick { 10_000 } else { 50_000 };
    let run = rt.block_on(drain(
        BIN.as_ref(),
        &redis,
        files.path(),
        "FileAppendJob",
        n,
        |i| json!(["bench.txt", i]),
        &["--concurrency", "100"],
    ))?;
    let written = std::fs::read_to_string(files.path().join("file-append/data/bench.txt"))?;
    if written.lines().count() as u64 != n {
        bail!("{} lines appended for {n} jobs", written.lines().count());
    }
    report.row(
        &format!("FileAppendJob C=100, N={n}: jobs/s"),
        format!("{:.0}", n as f64 / run.wall.as_secs_f64()),
        "",
    );
    report.row(
        "FileAppendJob: RSS start → end / peak (MB)",
        format!(
            "{:.1} → {:.1} / {:.1}",
            run.rss_start_kb as f64 / 1024.0,
            run.rss_end_kb as f64 / 1024.0,
            run.peak_rss_kb as f64 / 1024.0
        ),
        "",
    );
    report.row("FileAppendJob: %CPU runner", format!("{:.0}", run.cpu), "");

    report.note(
        "Efficiency = ideal wall (N × job sleep / C) ÷ measured wall; peers fall to 0.12–0.34 at C=1,000 (peers.md)."
            .into(),
    );
    report.note(
        "Peak RSS is the runner's VmHWM over its whole life (plugins compiled from the cache, pool reserved).".into(),
    );
    report.note("HTTP server, Redis (AOF, fsync every second) and PostgreSQL share the two cores with the runner; %CPU is per core.".into());
    report.finish()?;
    Ok(())
}
