//! What the dashboard costs (`docs/web.md`), against the real
//! `wasmjobs run`, and what the published latency histograms take in Redis
//! (`docs/observability.md`).
//!
//! - **Dashboard open vs closed**: N pre-pushed `NoopJob`s drained at
//!   C=100 (reliable fetch), alternately with nobody watching and with a
//!   `wasmjobs web` process beside the runner and three open overview
//!   pages' worth of polling (`GET /api/overview` once a second each, as
//!   the page's script does). Median jobs/s of each and the ratio (target
//!   ≥ 0.98).
//! - **Histograms in Redis**: after each drain (which starts from an empty
//!   Redis and ends with the runner's last publication), `MEMORY USAGE` of
//!   every `wasmjobs:latency:*` hash; with one hash per minute, an hour of
//!   one process publishing the same classes is at most 60 such hashes
//!   (target ≤ 1 MB per process-hour; `SAMPLES 0`, every field counted). The run publishes a four-class mix
//!   (`NoopJob`, `FibJob` with three inputs spreading the execution times,
//!   `EchoJob`) so the hashes carry realistic bucket spreads.
//!
//! N is 100,000 (`BENCH_QUICK=1`: 10,000, one round each).
//! Run: `cargo bench -p wasmjobs-benches --bench web`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use wasmjobs_benches::{Report, noop_rate, percentile, push_jobs, start_running, wait_for_processed};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

/// `wasmjobs web` on `addr`, until dropped.
struct Dashboard(Child);

impl Dashboard {
    fn start(redis_url: &str, addr: &str) -> Result<Self> {
        let child = Command::new(BIN)
            .args(["web", "--redis", redis_url, "--addr", addr])
            .env_remove("WASMJOBS_WEB_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting wasmjobs web")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(addr, "/api/overview").is_err() {
            if Instant::now() > deadline {
                bail!("wasmjobs web did not answer on {addr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self(child))
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 GET; the status line must say 200.
fn get(addr: &str, path: &str) -> Result<()> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", response.lines().next().unwrap_or(""));
    }
    Ok(())
}

/// Polls like `tabs` open overview pages until `stop`; counts the polls.
fn watch(addr: String, tabs: usize, stop: Arc<AtomicBool>, polls: Arc<AtomicU64>) -> Vec<std::thread::JoinHandle<()>> {
    (0..tabs)
        .map(|tab| {
            let (addr, stop, polls) = (addr.clone(), stop.clone(), polls.clone());
            std::thread::spawn(move || {
                // Tabs opened at different moments.
                std::thread::sleep(Duration::from_millis(333 * tab as u64));
                while !stop.load(Ordering::Relaxed) {
                    if get(&addr, "/api/overview").is_ok() {
                        polls.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        })
        .collect()
}

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (jobs, rounds) = if quick { (10_000u64, 1) } else { (100_000, 3) };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let plugins = wasmjobs_e2e::runner::plugins(&["noop", "fib", "echo"], &[]);
    let mut report = Report::new("web", "The dashboard's cost, and the latency histograms' size in Redis");
    let addr = wasmjobs_e2e::runner::free_addr();
    let extra = ["--concurrency", "100"];

    let (mut closed, mut open, mut polled) = (Vec::new(), Vec::new(), 0u64);
    for _ in 0..rounds {
        closed.push(rt.block_on(noop_rate(BIN.as_ref(), &redis, plugins.path(), jobs, &extra))?);

        let dashboard = Dashboard::start(&redis.url(), &addr)?;
        let (stop, polls) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let watchers = watch(addr.clone(), 3, stop.clone(), polls.clone());
        let rate = rt.block_on(noop_rate(BIN.as_ref(), &redis, plugins.path(), jobs, &extra));
        stop.store(true, Ordering::Relaxed);
        for watcher in watchers {
            let _ = watcher.join();
        }
        drop(dashboard);
        open.push(rate?);
        polled += polls.load(Ordering::Relaxed);
    }
    closed.sort_by(f64::total_cmp);
    open.sort_by(f64::total_cmp);
    let median = |runs: &[f64]| percentile(runs, 0.5);
    report.row(
        "NoopJob C=100, no dashboard: jobs/s, median",
        format!("{:.0}", median(&closed)),
        "",
    );
    report.row(
        "NoopJob C=100, `wasmjobs web` with three overview pages polling: jobs/s, median",
        format!("{:.0}", median(&open)),
        "",
    );
    report.row(
        "dashboard open ÷ closed",
        format!("{:.3}", median(&open) / median(&closed)),
        "≥ 0.98",
    );
    let list = |runs: &[f64]| runs.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    report.row(
        "runs closed / open (jobs/s)",
        format!("{} / {}", list(&closed), list(&open)),
        "",
    );

    // The histograms: a mix of classes and execution times, one process.
    let (bytes, hashes, fields) = rt.block_on(async {
        let mut conn = redis.conn().await;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        push_jobs(&mut conn, "FibJob", 3_000, |i| {
            let n = [5u64, 15, 22][(i % 3) as usize];
            json!([n])
        })
        .await?;
        push_jobs(&mut conn, "EchoJob", 3_000, |i| json!([i])).await?;
        push_jobs(&mut conn, "NoopJob", 10_000, |_| json!([])).await?;
        let runner = start_running(BIN.as_ref(), &redis, plugins.path(), &extra)?;
        wait_for_processed(&mut conn, 16_000, Duration::from_secs(600), &runner).await?;
        runner.stop()?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("wasmjobs:latency:*")
            .query_async(&mut conn)
            .await?;
        let (mut bytes, mut fields) = (0u64, 0u64);
        for key in &keys {
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await?;
            bytes += used.unwrap_or(0);
            let len: u64 = redis::cmd("HLEN").arg(key).query_async(&mut conn).await?;
            fields += len;
        }
        anyhow::Ok((bytes, keys.len() as u64, fields))
    })?;
    let per_hash = bytes as f64 / hashes.max(1) as f64;
    report.row(
        "latency hashes after one run: hashes, fields, bytes (MEMORY USAGE)",
        format!("{hashes}, {fields}, {bytes}"),
        "",
    );
    report.row(
        "per process-hour (60 such hashes), bytes",
        format!("{:.0}", per_hash * 60.0),
        "≤ 1 MB",
    );
    report.note(format!(
        "{jobs} NoopJob per drain, reliable fetch, C=100, {rounds} round(s), closed then open each round; \
         {polled} polls of /api/overview answered while open."
    ));
    report.note(
        "Histograms: 3,000 FibJob (fib 5, 15 and 22), 3,000 EchoJob and 10,000 NoopJob through one runner, whose \
         stop publishes what is left. Each process adds its counts to the same per-minute hashes, so several \
         processes publishing the same classes take no more keys."
            .into(),
    );
    report.finish()?;
    Ok(())
}
