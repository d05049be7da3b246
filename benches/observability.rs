//! What observability costs, against the real `wasmjobs run`.
//!
//! - **Recording on vs off**: 100,000 pre-pushed `NoopJob`s drained at
//!   C=100 (reliable fetch), alternately with per-job metrics (the default)
//!   and with `--no-metrics`, three times each; median jobs/s of each and
//!   the ratio. The metrics endpoint is served and scraped every second
//!   during the "on" runs, as Prometheus would.
//! - **Idle**: a runner with nothing to do, watched for 60 s after a 5 s
//!   settle: RSS at the end and %CPU over the 60 s (`BENCH_QUICK=1`: 15 s).
//!
//! Run: `cargo bench -p wasmjobs-benches --bench observability`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use wasmjobs::runner::heartbeat::rss_kb;
use wasmjobs_benches::{Report, RunnerProcess, cpu_ticks, noop_rate, percentile};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");
const JOBS: u64 = 100_000;
const ROUNDS: usize = 3;

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    // Only the job under test: the Python and JS examples alone hold ~300 MB.
    let plugin_dir = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let plugins = plugin_dir.path().to_path_buf();
    let mut report = Report::new("observability", "Observability: recording cost and the idle process");

    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS * 2 {
        let metrics_on = round % 2 == 0;
        let addr = free_addr()?;
        let scraping = metrics_on.then(|| scrape_every_second(addr.clone()));
        let extra: Vec<&str> = if metrics_on {
            vec!["--concurrency", "100", "--metrics-addr", &addr]
        } else {
            vec!["--concurrency", "100", "--no-metrics"]
        };
        let rate = rt.block_on(noop_rate(BIN.as_ref(), &redis, &plugins, JOBS, &extra))?;
        if let Some(scraping) = scraping {
            scraping.stop();
        }
        if metrics_on { on.push(rate) } else { off.push(rate) }
    }
    on.sort_by(f64::total_cmp);
    off.sort_by(f64::total_cmp);
    let (on_median, off_median) = (percentile(&on, 0.5), percentile(&off, 0.5));
    report.row(
        "NoopJob C=100, metrics on (scraped 1/s): jobs/s, median",
        format!("{on_median:.0}"),
        "",
    );
    report.row(
        "NoopJob C=100, --no-metrics: jobs/s, median",
        format!("{off_median:.0}"),
        "",
    );
    report.row("metrics on ÷ off", format!("{:.3}", on_median / off_median), "≥ 0.97");
    report.row(
        "runs on / off (jobs/s)",
        format!(
            "{} / {}",
            on.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", "),
            off.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ")
        ),
        "",
    );

    let watch = if quick {
        Duration::from_secs(15)
    } else {
        Duration::from_secs(60)
    };
    let (rss_mb, cpu) = idle(&redis, &plugins, watch)?;
    report.row(
        &format!("idle {} s: RSS (MB)", watch.as_secs()),
        format!("{rss_mb:.1}"),
        "≤ 25",
    );
    report.row(
        &format!("idle {} s: %CPU", watch.as_secs()),
        format!("{cpu:.3}"),
        "≤ 0.1",
    );
    report.note(format!(
        "{JOBS} NoopJob per run, reliable fetch, {ROUNDS} runs each way, alternating."
    ));
    report.note("Idle: every example plugin loaded, embedded defaults otherwise (heartbeat 10 s, poller ~5 s, blocking fetch 2 s, sampler 1 s).".into());
    report.finish()?;
    Ok(())
}

fn free_addr() -> Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// A thread that GETs `/metrics` once a second until stopped.
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Scraper {
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn scrape_every_second(addr: String) -> Scraper {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
                let _ = write!(stream, "GET /metrics HTTP/1.0\r\n\r\n");
                let mut sink = Vec::new();
                let _ = stream.read_to_end(&mut sink);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    Scraper { stop, thread }
}

/// RSS (MB) at the end of `watch` and %CPU over it, for an idle runner.
fn idle(redis: &TestRedis, plugins: &std::path::Path, watch: Duration) -> Result<(f64, f64)> {
    let runner = RunnerProcess::start(BIN.as_ref(), &redis.url(), plugins, &[], "warn")?;
    let started = Instant::now();
    while rss_kb(runner.pid()) == 0 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(5));
    let ticks = cpu_ticks(runner.pid());
    let from = Instant::now();
    std::thread::sleep(watch);
    let cpu = (cpu_ticks(runner.pid()) - ticks) as f64 / from.elapsed().as_secs_f64();
    let rss = rss_kb(runner.pid()) as f64 / 1024.0;
    runner.stop()?;
    Ok((rss, cpu))
}
