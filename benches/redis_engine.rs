//! The Redis engine benchmark: `wasmjobs run` draining pre-pushed jobs.
//!
//! - 100,000 `NoopJob` pushed up front (Sidekiq format), then the real
//!   binary runs until `stat:processed` reaches 100,000: jobs/s, RSS at
//!   start and end, %CPU of the runner and of redis-server, for reliable
//!   and basic fetch at concurrency 10 and 100. Timing starts when the
//!   runner reports "running" (plugins loaded), as the peers' figures cover
//!   processing only; start-up is reported separately.
//! - Enqueue-to-start latency at a steady 1,000 jobs/s (5 s), from each
//!   job's `enqueued_at` to the moment the runner starts it.
//!
//! Redis: a local redis-server with append-only persistence (fsync every
//! second), as `wasmjobs run` configures its embedded one.
//!
//! Run: `cargo bench -p wasmjobs-benches --bench redis_engine`
//! (`BENCH_QUICK=1` for 20,000 jobs).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::AsyncCommands;
use serde_json::json;
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs::runner::heartbeat::rss_kb;
use wasmjobs_benches::{Report, RunnerProcess, cpu_ticks, percentile, push_jobs, wait_for_processed};

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");
use wasmjobs_e2e::redis_server::TestRedis;

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let jobs: u64 = if quick { 20_000 } else { 100_000 };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    // Only the job under test: the Python and JS examples alone hold ~300 MB.
    let plugin_dir = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let plugins = plugin_dir.path().to_path_buf();
    let mut report = Report::new("redis_engine", "Redis engine: draining pre-pushed NoopJobs");
    let redis_pid: u32 = rt.block_on(async {
        let mut conn = redis.conn().await;
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .context("redis INFO has no process_id")
    })?;

    for (mode, concurrency, target) in [
        ("reliable", 10, ""),
        ("reliable", 100, "≥ 50,000"),
        ("basic", 10, ""),
        ("basic", 100, "≥ 80,000"),
    ] {
        let run = rt.block_on(drain(&redis, redis_pid, &plugins, mode, concurrency, jobs))?;
        report.row(
            &format!("{mode}, C={concurrency}: jobs/s"),
            format!("{:.0}", jobs as f64 / run.wall.as_secs_f64()),
            target,
        );
        report.row(
            &format!("{mode}, C={concurrency}: wall (s)"),
            format!("{:.2}", run.wall.as_secs_f64()),
            "",
        );
        report.row(
            &format!("{mode}, C={concurrency}: RSS start → end (MB)"),
            format!(
                "{:.1} → {:.1}",
                run.rss_start_kb as f64 / 1024.0,
                run.rss_end_kb as f64 / 1024.0
            ),
            "",
        );
        report.row(
            &format!("{mode}, C={concurrency}: %CPU runner / redis"),
            format!("{:.0} / {:.0}", run.runner_cpu, run.redis_cpu),
            "",
        );
        report.row(
            &format!("{mode}, C={concurrency}: start-up (ms)"),
            format!("{:.0}", run.startup.as_secs_f64() * 1e3),
            "",
        );
    }

    let latencies = rt.block_on(steady_latency(&redis, &plugins))?;
    report.row(
        "latency at 1,000 jobs/s: p50 (ms)",
        format!("{:.3}", percentile(&latencies, 0.50)),
        "≤ 0.5",
    );
    report.row(
        "latency at 1,000 jobs/s: p99 (ms)",
        format!("{:.3}", percentile(&latencies, 0.99)),
        "≤ 2",
    );
    report.row(
        "latency at 1,000 jobs/s: max (ms)",
        format!("{:.3}", percentile(&latencies, 1.0)),
        "",
    );
    report.note(format!(
        "{jobs} NoopJob per drain row; every job counted through stat:processed (no loss, no extra)."
    ));
    report.note(format!(
        "Latency: {} jobs pushed one at a time at 1 ms intervals; enqueued_at → start of the job in the runner.",
        latencies.len()
    ));
    report.note("Runner and redis-server share the machine's cores; %CPU is per core (200 = both cores).".into());
    report.finish()?;
    Ok(())
}

struct Drain {
    wall: Duration,
    startup: Duration,
    rss_start_kb: u64,
    rss_end_kb: u64,
    runner_cpu: f64,
    redis_cpu: f64,
}

async fn drain(
    redis: &TestRedis,
    redis_pid: u32,
    plugins: &Path,
    mode: &str,
    concurrency: u32,
    jobs: u64,
) -> Result<Drain> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    push_jobs(&mut conn, "NoopJob", jobs, |_| json!([])).await?;
    let spawned = Instant::now();
    let mut runner = RunnerProcess::start(
        BIN.as_ref(),
        &redis.url(),
        plugins,
        &["--concurrency", &concurrency.to_string(), "--fetch", mode],
        "info",
    )?;
    runner.wait_for_log(" running")?;
    let startup = spawned.elapsed();
    let rss_start_kb = rss_kb(runner.pid());
    let (cpu_runner0, cpu_redis0) = (cpu_ticks(runner.pid()), cpu_ticks(redis_pid));
    let wall = wait_for_processed(&mut conn, jobs, Duration::from_secs(300), &runner).await?;
    let (cpu_runner1, cpu_redis1) = (cpu_ticks(runner.pid()), cpu_ticks(redis_pid));
    let rss_end_kb = rss_kb(runner.pid());
    runner.stop()?;
    let processed: u64 = conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0);
    if processed != jobs {
        bail!("{processed} processed for {jobs} jobs pushed");
    }
    let percent = |ticks: u64| ticks as f64 / 100.0 / wall.as_secs_f64() * 100.0;
    Ok(Drain {
        wall,
        startup,
        rss_start_kb,
        rss_end_kb,
        runner_cpu: percent(cpu_runner1 - cpu_runner0),
        redis_cpu: percent(cpu_redis1 - cpu_redis0),
    })
}

/// Pushes one job per millisecond for five seconds into an idle runner and
/// returns each job's enqueue-to-start latency in milliseconds.
async fn steady_latency(redis: &TestRedis, plugins: &Path) -> Result<Vec<f64>> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    let mut runner = RunnerProcess::start(
        BIN.as_ref(),
        &redis.url(),
        plugins,
        &["--log-format", "json"],
        "warn,wasmjobs::runner::launcher=info,wasmjobs::runner::processor=debug",
    )?;
    runner.wait_for_log("running")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let count = 5_000u64;
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..count {
        ticker.tick().await;
        let mut payload = Payload::new("NoopJob", vec![], "default", wasmjobs::redis::now_f64());
        client::push(&mut conn, &mut payload).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0) < count {
        if Instant::now() > deadline {
            bail!("the latency run did not finish");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = runner.stop()?;
    let mut latencies = Vec::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(us) = event["fields"]["queue_latency_us"].as_i64() {
            latencies.push(us as f64 / 1000.0);
        }
    }
    if latencies.len() as u64 != count {
        bail!("{} latencies logged for {count} jobs", latencies.len());
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}
