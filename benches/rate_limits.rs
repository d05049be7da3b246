//! How closely a cluster rate limit (`limits.rate`, `docs/limits.md`) is
//! met when enough jobs wait, against three real `wasmjobs run` processes
//! sharing one real redis-server, each with the defaults users get
//! (`--concurrency 100`, `--poll-interval 5`).
//!
//! For each rate N/s (1, 100, 1,000): N × 80 jobs of the chaos test
//! guest's `span` mode are pushed (each appends its start time, wall-clock
//! ms, to a file every process writes to), the three processes start, and
//! the starts are counted over the minute from 10 s after the first start
//! (the measure), plus:
//! - the busiest sliding second of the whole run, in the limiter's own log
//!   (read every 300 ms while it runs: the starts it gave, in Redis's
//!   clock; never above N) and in the guests' clock readings (each a few
//!   ms after its start, later when a loaded machine wakes a job late);
//! - the refusals per started job (no polling storm: each job asks the
//!   limiter once, plus once per refusal; a job sent back for its turn
//!   should mostly run when it comes back);
//! - Redis's CPU over the run ÷ the jobs started (at 1/s mostly the idle
//!   costs of three processes: heartbeats, fetches, polls).
//!
//! `BENCH_QUICK=1`: a 20 s measure. `BENCH_WASMJOBS=<binary>` measures
//! another build (for a before/after table).
//! Run: `cargo bench -p wasmjobs-benches --bench rate_limits`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use wasmjobs_benches::{Report, RunnerProcess, push_jobs};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

/// What one rate's run measured.
struct Measured {
    rate: u64,
    per_sec: f64,
    busiest: usize,
    busiest_logged: usize,
    refusals_per_start: f64,
    redis_cpu_us_per_start: f64,
}

/// The start times (ms) in the span file.
fn starts(file: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut starts: Vec<u64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("start "))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse().ok())
        .collect();
    starts.sort_unstable();
    starts
}

/// Most starts in any window `[t, t + 1000)` of the sorted `starts`.
fn busiest_second(starts: &[u64]) -> usize {
    let mut most = 0;
    let mut from = 0;
    for (to, &t) in starts.iter().enumerate() {
        while starts[from] + 1_000 <= t {
            from += 1;
        }
        most = most.max(to + 1 - from);
    }
    most
}

/// Redis's CPU seconds so far (user + sys).
async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            ["used_cpu_sys", "used_cpu_user"]
                .contains(&name)
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum())
}

fn measure(rt: &tokio::runtime::Runtime, bin: &Path, rate: u64, measure_secs: u64) -> Result<Measured> {
    let redis = TestRedis::start();
    let dir = wasmjobs_e2e::runner::plugins(&[], &["chaos"]);
    wasmjobs_e2e::append_to_manifest(&dir.path().join("chaos"), &format!("[limits]\nrate = \"{rate}/s\""));
    let file = dir.path().join("chaos/data/rate.log");
    let jobs = rate * (measure_secs + 20);
    let mut conn = rt.block_on(redis.conn());
    rt.block_on(push_jobs(&mut conn, "ChaosJob", jobs, |_| {
        json!(["span", "rate.log", "r", 0])
    }))?;
    let cpu_before = rt.block_on(redis_cpu(&mut conn))?;
    let runners = (0..3)
        .map(|_| RunnerProcess::start(bin, &redis.url(), dir.path(), &[], "warn"))
        .collect::<Result<Vec<_>>>()?;
    // The measure: a minute (or the quick run's 20 s) from 10 s after the first start.
    let deadline = Instant::now() + Duration::from_secs(measure_secs + 120);
    let first = loop {
        if let Some(&first) = starts(&file).first() {
            break first;
        }
        if Instant::now() > deadline {
            bail!(
                "no job started:\n{}",
                runners.iter().map(RunnerProcess::log).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (from, to) = (first + 10_000, first + 10_000 + measure_secs * 1000);
    // The limiter's log keeps one window (and the starts given ahead):
    // read it often enough to see every start it gave.
    let mut logged: HashMap<String, u64> = HashMap::new();
    while wasmjobs::redis::now_f64() * 1000.0 < to as f64 + 500.0 {
        let log: Vec<(String, f64)> = rt.block_on(
            redis::cmd("ZRANGE")
                .arg("wasmjobs:limit:chaos:rate")
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut conn),
        )?;
        logged.extend(log.into_iter().map(|(member, ms)| (member, ms as u64)));
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut logged: Vec<u64> = logged.into_values().collect();
    logged.sort_unstable();
    let cpu_after = rt.block_on(redis_cpu(&mut conn))?;
    for runner in runners {
        runner.stop()?;
    }
    let all = starts(&file);
    let counted = all.iter().filter(|&&t| t >= from && t < to).count();
    let refused: u64 = rt
        .block_on(
            redis::cmd("HGET")
                .arg("wasmjobs:limit:chaos:overrated")
                .arg("rate")
                .query_async::<Option<u64>>(&mut conn),
        )?
        .unwrap_or(0);
    let started = all.len().max(1) as f64;
    Ok(Measured {
        rate,
        per_sec: counted as f64 / measure_secs as f64,
        busiest: busiest_second(&all),
        busiest_logged: busiest_second(&logged),
        refusals_per_start: refused as f64 / started,
        redis_cpu_us_per_start: (cpu_after - cpu_before) * 1e6 / started,
    })
}

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let measure_secs = if quick { 20 } else { 60 };
    let bin: PathBuf = std::env::var_os("BENCH_WASMJOBS").map_or_else(|| BIN.into(), PathBuf::from);
    let rt = tokio::runtime::Runtime::new()?;
    let mut report = Report::new(
        "rate_limits",
        "Cluster rate limits: starts delivered against the limit, three processes",
    );
    let mut runs: HashMap<u64, Measured> = HashMap::new();
    for rate in [1, 100, 1_000] {
        let measured = measure(&rt, &bin, rate, measure_secs).with_context(|| format!("rate {rate}/s"))?;
        eprintln!(
            "{rate}/s: {:.2} starts/s ({:.3} of the limit), busiest second {} (log) {} (guests), {:.2} refusals per start, Redis {:.0} µs CPU per start",
            measured.per_sec,
            measured.per_sec / rate as f64,
            measured.busiest_logged,
            measured.busiest,
            measured.refusals_per_start,
            measured.redis_cpu_us_per_start
        );
        runs.insert(rate, measured);
    }
    for rate in [1, 100, 1_000] {
        let m = &runs[&rate];
        report.row(
            &format!("rate = \"{rate}/s\": starts/s over {measure_secs} s ÷ limit"),
            format!("{:.3} ({:.2}/s)", m.per_sec / m.rate as f64, m.per_sec),
            "≥ 0.9",
        );
        report.row(
            &format!("rate = \"{rate}/s\": busiest sliding second, starts in the limiter's log"),
            m.busiest_logged.to_string(),
            &format!("≤ {rate}"),
        );
        report.row(
            &format!("rate = \"{rate}/s\": busiest sliding second, starts on the guests' clocks"),
            m.busiest.to_string(),
            "",
        );
        report.row(
            &format!("rate = \"{rate}/s\": refusals (jobs sent back for a turn) per start"),
            format!("{:.2}", m.refusals_per_start),
            "",
        );
        report.row(
            &format!("rate = \"{rate}/s\": Redis CPU over the run ÷ starts"),
            format!("{:.0} µs", m.redis_cpu_us_per_start),
            "",
        );
    }
    report.note(format!(
        "Three `wasmjobs run` processes with the defaults (--concurrency 100, --poll-interval 5), N × {} chaos `span` jobs pushed first; starts read from the guest's own clock.",
        measure_secs + 20
    ));
    report.note(format!("Binary: {}.", bin.display()));
    report.finish()?;
    Ok(())
}
