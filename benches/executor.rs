//! Executor benchmark: the cost of a fresh sandboxed instance per job.
//!
//! - `NoopJob`: instantiate + perform + drop per second on ONE core (a
//!   current-thread runtime), one job at a time and 64 at a time.
//!   Target ≥ 100,000/s.
//! - `FibJob(25)`: the guest's time per job against the same recursive
//!   function compiled natively. Target ≤ 1.5× native.
//!
//! Run: `cargo bench -p wasmjobs-benches --bench executor`
//! (`BENCH_QUICK=1` for a shorter run).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmjobs::job::Job;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{EngineConfig, ExecOptions, Executor};
use wasmjobs_benches::Report;

/// The allocator the `wasmjobs` binary runs with, so these figures are the
/// product's (glibc malloc here cost ~5% of the noop rate).
#[global_allocator]
static ALLOCATOR: wasmjobs::Allocator = wasmjobs::Allocator;

fn main() -> anyhow::Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let noop_jobs: u32 = if quick { 50_000 } else { 300_000 };
    let fib_runs = if quick { 20 } else { 100 };

    let executor = Arc::new(Executor::new(&EngineConfig {
        concurrency: 128,
        ..EngineConfig::default()
    })?);
    // Only the plugins measured here: the Python/JS examples would add
    // ~300 MB and, on a cold cache, 20 s of compiling to the start.
    let plugins = wasmjobs_e2e::runner::plugins(&["noop", "fib"], &[]);
    let catalog = Arc::new(Catalog::load(plugins.path(), &executor, &wasmjobs_e2e::cache())?);
    anyhow::ensure!(catalog.broken().is_empty(), "broken plugins: {:?}", catalog.broken());

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut report = Report::new("executor", "Executor: a fresh sandboxed instance per job");

    // Warm up: page in the pool slots and the code.
    rt.block_on(noop_sequential(&executor, &catalog, 10_000))?;

    let rate = rt.block_on(noop_sequential(&executor, &catalog, noop_jobs))?;
    report.row(
        "NoopJob, 1 core, 1 in flight (jobs/s)",
        format!("{rate:.0}"),
        "≥ 100,000",
    );
    let rate = rt.block_on(noop_concurrent(&executor, &catalog, noop_jobs, 64))?;
    report.row(
        "NoopJob, 1 core, 64 in flight (jobs/s)",
        format!("{rate:.0}"),
        "≥ 100,000",
    );

    let wasm = rt.block_on(fib_wasm(&executor, &catalog, fib_runs))?;
    let native = fib_native(fib_runs);
    report.row("FibJob(25) in wasm, median (ms)", format!("{:.3}", ms(wasm)), "");
    report.row("fib(25) native, median (ms)", format!("{:.3}", ms(native)), "");
    report.row(
        "FibJob(25) wasm / native",
        format!("{:.2}×", wasm.as_secs_f64() / native.as_secs_f64()),
        "≤ 1.5×",
    );
    report.note(format!("NoopJob: {noop_jobs} executions per row after 10,000 warm-up; each is Store::new + instantiate_async + perform + drop, with the job's WASI context, log sink and limiter built as in production."));
    report.note(format!(
        "FibJob: median of {fib_runs} runs; the wasm figure includes instantiation and the log call."
    ));
    report.finish()?;
    Ok(())
}

fn job(class: &str, args: &str) -> anyhow::Result<Job> {
    Job::new(class, args)
}

async fn noop_sequential(executor: &Executor, catalog: &Catalog, n: u32) -> anyhow::Result<f64> {
    let plugin = catalog.get("NoopJob").ok_or_else(|| anyhow::anyhow!("no NoopJob"))?;
    let job = job("NoopJob", "[]")?;
    let options = ExecOptions::default();
    let started = Instant::now();
    for _ in 0..n {
        let execution = executor.execute(&plugin.loaded, &job, &options).await;
        anyhow::ensure!(execution.outcome.is_success(), "noop failed: {}", execution.outcome);
    }
    Ok(f64::from(n) / started.elapsed().as_secs_f64())
}

async fn noop_concurrent(
    executor: &Arc<Executor>,
    catalog: &Arc<Catalog>,
    n: u32,
    in_flight: u32,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (executor, catalog) = (executor.clone(), catalog.clone());
        tasks.spawn(async move { noop_sequential(&executor, &catalog, n / in_flight).await.map(|_| ()) });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(f64::from(n / in_flight * in_flight) / started.elapsed().as_secs_f64())
}

async fn fib_wasm(executor: &Executor, catalog: &Catalog, runs: usize) -> anyhow::Result<Duration> {
    let plugin = catalog.get("FibJob").ok_or_else(|| anyhow::anyhow!("no FibJob"))?;
    let job = job("FibJob", "[25]")?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let execution = executor.execute(&plugin.loaded, &job, &ExecOptions::default()).await;
        anyhow::ensure!(execution.outcome.is_success(), "fib failed: {}", execution.outcome);
        times.push(execution.duration);
    }
    Ok(median(times))
}

/// The seed's fib, natively: the same source as `plugins/fib/src/lib.rs`.
#[inline(never)]
fn fib(n: u32) -> u64 {
    if n <= 1 { 1 } else { fib(n - 1).wrapping_add(fib(n - 2)) }
}

fn fib_native(runs: usize) -> Duration {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        assert_eq!(black_box(fib(black_box(25))), 121_393);
        times.push(started.elapsed());
    }
    median(times)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
