//! Jobs in Python and JavaScript next to Rust, through Redis and the real
//! `wasmjobs run`:
//!
//! - start-up: `wasmjobs run` from an empty compilation cache (the plugin is
//!   compiled) and again with the cache warm, to "running";
//! - noop: jobs/s and the runner's CPU per job, with a fresh instance per
//!   job (memories reset with the default `--keep-resident 64KiB`, then
//!   with `16MiB`; then in two `--threads 1` processes, C=50 each) and with
//!   warm instances (`[instances] reuse = 1000`);
//! - http (a 200 ms endpoint) at C = 1,000: efficiency (N × 0.2 s / C ÷ wall)
//!   and RSS per in-flight job ((peak − start) / C, all 1,000 jobs are
//!   waiting on the server at once), with a fresh instance per job, then
//!   for Python with 100 jobs per instance (`[instances] concurrent = 100`,
//!   the async-plugin world) and for JavaScript, whose toolchain cannot
//!   build that world, with warm instances (`reuse = 1000`).
//!
//! Run: `cargo bench -p wasmjobs-benches --bench polyglot` (after
//! `scripts/build-plugins.sh`, which builds the Python and JS plugins);
//! `POLYGLOT_LANGUAGES=Python,JavaScript` runs only those languages (and
//! writes `results/polyglot-partial.md`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use wasmjobs_benches::{Drain, Report, RunnerProcess, drain, drain_in_processes};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

/// One language's example plugins.
struct Language {
    name: &'static str,
    /// Plugin directory and class of its noop job.
    noop: (&'static str, &'static str),
    /// Plugin directory and class of its HTTP GET job.
    http: (&'static str, &'static str),
    /// Noop jobs to drain (fewer for the interpreters: ~5 ms each).
    noop_jobs: u64,
    /// Noop jobs to drain with warm instances.
    warm_jobs: u64,
}

const LANGUAGES: [Language; 3] = [
    Language {
        name: "Rust",
        noop: ("noop", "NoopJob"),
        http: ("http-get", "HttpGetJob"),
        noop_jobs: 100_000,
        warm_jobs: 100_000,
    },
    Language {
        name: "Python",
        noop: ("py-noop", "PyNoopJob"),
        http: ("py-http-get", "PyHttpGetJob"),
        noop_jobs: 2_000,
        warm_jobs: 20_000,
    },
    Language {
        name: "JavaScript",
        noop: ("js-noop", "JsNoopJob"),
        http: ("js-http-get", "JsHttpGetJob"),
        noop_jobs: 2_000,
        warm_jobs: 20_000,
    },
];

fn main() -> Result<()> {
    wasmjobs::runner::os_limits::raise_open_files(10_000);
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let examples = wasmjobs_e2e::plugins_dir();
    let server = rt.block_on(HttpServer::start(Duration::from_millis(200)));
    let url = server.url("/sleep");
    // A run of some languages only must not overwrite the full report.
    let name = match std::env::var_os("POLYGLOT_LANGUAGES") {
        Some(_) => "polyglot-partial",
        None => "polyglot",
    };
    let mut report = Report::new(name, "Jobs in Python and JavaScript next to Rust");

    for Language {
        name: language,
        noop: (noop_dir, noop),
        http: (http_dir, http),
        noop_jobs,
        warm_jobs,
    } in LANGUAGES
    {
        if !selected(language) {
            continue;
        }
        let plugins = tempfile::tempdir()?;
        wasmjobs_e2e::copy_plugin(&examples.join(noop_dir), plugins.path());
        wasmjobs_e2e::copy_plugin(&examples.join(http_dir), plugins.path());
        if language == "Python" {
            wasmjobs_e2e::copy_plugin(&examples.join("py-async-http-get"), plugins.path());
        }
        let size = std::fs::read_dir(plugins.path().join(http_dir))?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "wasm"))
            .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
            .sum::<u64>();
        report.row(
            &format!("{language}: HTTP component size (MB)"),
            format!("{:.1}", size as f64 / 1e6),
            "",
        );

        let data = tempfile::tempdir()?;
        let cold = time_to_running(&redis, data.path(), plugins.path())?;
        let warm = time_to_running(&redis, data.path(), plugins.path())?;
        report.row(
            &format!("{language}: start, 2 plugins compiled / cached (ms)"),
            format!("{:.0} / {:.0}", cold.as_secs_f64() * 1e3, warm.as_secs_f64() * 1e3),
            "",
        );

        let run = rt.block_on(drain(
            BIN.as_ref(),
            &redis,
            plugins.path(),
            noop,
            noop_jobs,
            |_| json!([]),
            &["--concurrency", "100"],
        ))?;
        let rate = noop_rows(
            &mut report,
            [
                &format!("{language}: noop C=100 (jobs/s)"),
                &format!("{language}: noop CPU per job (ms)"),
            ],
            &run,
            noop_jobs,
            None,
        );

        let resident = rt.block_on(drain(
            BIN.as_ref(),
            &redis,
            plugins.path(),
            noop,
            noop_jobs,
            |_| json!([]),
            &["--concurrency", "100", "--keep-resident", "16MiB"],
        ))?;
        noop_rows(
            &mut report,
            [
                &format!("{language}: noop C=100, --keep-resident 16MiB (jobs/s)"),
                &format!("{language}: noop CPU per job, --keep-resident 16MiB (ms)"),
            ],
            &resident,
            noop_jobs,
            Some((rate, "default")),
        );

        let split = rt.block_on(drain_in_processes(
            BIN.as_ref(),
            &redis,
            plugins.path(),
            noop,
            noop_jobs,
            &["--concurrency", "50", "--threads", "1"],
            2,
        ))?;
        noop_rows(
            &mut report,
            [
                &format!("{language}: noop, 2 processes --threads 1, C=50 each (jobs/s)"),
                &format!("{language}: noop CPU per job, 2 processes --threads 1 (ms)"),
            ],
            &split,
            noop_jobs,
            Some((rate, "one process")),
        );

        let manifest = plugins.path().join(noop_dir).join("wasmjobs.toml");
        let text = std::fs::read_to_string(&manifest)?;
        std::fs::write(&manifest, format!("{text}\n[instances]\nreuse = 1000\n"))?;
        let warm = rt.block_on(drain(
            BIN.as_ref(),
            &redis,
            plugins.path(),
            noop,
            warm_jobs,
            |_| json!([]),
            &["--concurrency", "100"],
        ))?;
        noop_rows(
            &mut report,
            [
                &format!("{language}: noop C=100, reuse = 1000 (jobs/s)"),
                &format!("{language}: noop CPU per job, reuse = 1000 (ms)"),
            ],
            &warm,
            warm_jobs,
            Some((rate, "fresh")),
        );

        let fresh = rt.block_on(http_drain(&redis, plugins.path(), http, &url, HTTP_JOBS))?;
        http_rows(
            &mut report,
            &format!("{language}: http C=1000, N={HTTP_JOBS}"),
            &fresh,
            HTTP_JOBS,
            None,
        );
        // What the interpreters do with many HTTP jobs per instance: Python
        // runs 100 at once in one instance (the async-plugin world); JS
        // cannot build such components, so its instances serve jobs one
        // after another instead.
        let (variant, dir, class, extra) = match language {
            "Python" => ("concurrent = 100", "py-async-http-get", "PyAsyncHttpGetJob", ""),
            "JavaScript" => ("reuse = 1000", http_dir, http, "\n[instances]\nreuse = 1000\n"),
            _ => continue,
        };
        if !extra.is_empty() {
            let manifest = plugins.path().join(dir).join("wasmjobs.toml");
            let text = std::fs::read_to_string(&manifest)?;
            std::fs::write(&manifest, format!("{text}{extra}"))?;
        }
        let shared = rt.block_on(http_drain(&redis, plugins.path(), class, &url, HTTP_JOBS))?;
        http_rows(
            &mut report,
            &format!("{language}: http C=1000, N={HTTP_JOBS}, {variant}"),
            &shared,
            HTTP_JOBS,
            Some(&fresh),
        );
        if language == "Python" {
            // Ten rounds of 1,000, where the two above are ramp-up and
            // ramp-down as much as steady state.
            let long = rt.block_on(http_drain(&redis, plugins.path(), class, &url, 10 * HTTP_JOBS))?;
            http_rows(
                &mut report,
                &format!("{language}: http C=1000, N={}, {variant}", 10 * HTTP_JOBS),
                &long,
                10 * HTTP_JOBS,
                None,
            );
        }
    }
    report.note("--keep-resident 16MiB: each memory's first 16 MiB are reset by copying the image back between jobs (PAGEMAP_SCAN off) instead of being decommitted and faulted in again; default 64 KiB with PAGEMAP_SCAN.".into());
    report.note("2 processes --threads 1: two runners on the same Redis, each with one job thread, both running before the jobs are pushed; wall from the push to the last job; CPU summed.".into());
    report.note("Start: `wasmjobs run` until it logs \"running\", with an empty compilation cache, then with it warm (same data dir).".into());
    report.note("http, concurrent = 100: PyAsyncHttpGetJob (plugins/py-async-http-get, an `async def` job built for the async-plugin world), 100 jobs per instance, so 10 instances for 1,000 jobs in flight.".into());
    report.note("RSS per in-flight job: (peak − ready) / 1,000 while 1,000 HTTP jobs wait on the 200 ms server; it includes each job's hyper connection (~23 KB).".into());
    report.note(
        "CPU per job: the runner's user + system CPU over the drain ÷ jobs (Redis and the server excluded).".into(),
    );
    report.finish()?;
    Ok(())
}

/// Whether `language` is in `POLYGLOT_LANGUAGES` (comma-separated, e.g.
/// `Python,JavaScript`; all when unset).
fn selected(language: &str) -> bool {
    std::env::var("POLYGLOT_LANGUAGES")
        .map(|only| only.split(',').any(|name| name.trim().eq_ignore_ascii_case(language)))
        .unwrap_or(true)
}

/// HTTP jobs in flight at once, and jobs drained, in the http rows.
const HTTP_CONCURRENCY: u64 = 1_000;
const HTTP_JOBS: u64 = 2 * HTTP_CONCURRENCY;

/// Drains `jobs` jobs of `class` GETting `url` at C = 1,000.
async fn http_drain(redis: &TestRedis, plugins: &Path, class: &str, url: &str, jobs: u64) -> Result<Drain> {
    drain(
        BIN.as_ref(),
        redis,
        plugins,
        class,
        jobs,
        |_| json!([url]),
        &["--concurrency", &HTTP_CONCURRENCY.to_string()],
    )
    .await
}

/// Reports an HTTP drain: efficiency (beside `compared`'s, as a ratio),
/// peak RSS and RSS per in-flight job.
fn http_rows(report: &mut Report, label: &str, run: &Drain, jobs: u64, compared: Option<&Drain>) {
    let floor = jobs as f64 * 0.2 / HTTP_CONCURRENCY as f64;
    let efficiency = |run: &Drain| floor / run.wall.as_secs_f64();
    let ratio = |ratio: f64| format!(", {ratio:.2}× fresh instances");
    report.row(
        &format!("{label}: efficiency"),
        format!(
            "{:.2} ({:.2} s{})",
            efficiency(run),
            run.wall.as_secs_f64(),
            compared
                .map(|fresh| ratio(efficiency(run) / efficiency(fresh)))
                .unwrap_or_default()
        ),
        "",
    );
    report.row(
        &format!("{label}: peak RSS (MB)"),
        format!(
            "{:.0}{}",
            run.peak_rss_kb as f64 / 1024.0,
            compared
                .map(|fresh| ratio(run.peak_rss_kb as f64 / fresh.peak_rss_kb as f64))
                .unwrap_or_default()
        ),
        "",
    );
    report.row(
        &format!("{label}: RSS per in-flight job (KB)"),
        format!(
            "{:.0}",
            run.peak_rss_kb.saturating_sub(run.rss_start_kb) as f64 / HTTP_CONCURRENCY as f64
        ),
        "",
    );
}

/// Reports a noop drain of `jobs` jobs in rows `rows`: its rate (beside
/// `compared`, a rate and what it is, as a ratio) and the runner's CPU per
/// job; returns the rate.
fn noop_rows(report: &mut Report, rows: [&str; 2], run: &Drain, jobs: u64, compared: Option<(f64, &str)>) -> f64 {
    let rate = jobs as f64 / run.wall.as_secs_f64();
    let figure = match compared {
        Some((base, what)) => format!("{rate:.0} ({:.2}× {what})", rate / base),
        None => format!("{rate:.0}"),
    };
    report.row(rows[0], figure, "");
    report.row(
        rows[1],
        format!("{:.3}", run.cpu / 100.0 * run.wall.as_secs_f64() / jobs as f64 * 1e3),
        "",
    );
    rate
}

/// Starts `wasmjobs run` on `plugins` with `data_dir` and returns how long it
/// took to log "running"; stops it.
fn time_to_running(redis: &TestRedis, data_dir: &Path, plugins: &Path) -> Result<Duration> {
    let started = Instant::now();
    let mut runner = RunnerProcess::start_in(
        BIN.as_ref(),
        data_dir,
        &redis.url(),
        plugins,
        &[],
        "warn,wasmjobs::runner::launcher=info",
    )?;
    runner.wait_for_log(" running")?;
    let elapsed = started.elapsed();
    runner.stop()?;
    Ok(elapsed)
}
