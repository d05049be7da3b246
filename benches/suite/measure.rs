//! Running one [`Case`] through the real path and checking it: jobs pushed
//! into Redis first (Sidekiq format), then `wasmjobs run --exit-when-empty`
//! drains them. Timing starts when the runner logs "running" and stops when
//! `stat:processed` reaches N; RSS and CPU are read from `/proc` at both
//! ends; per-job execution percentiles come from the runner's
//! `--summary-json`. Afterwards every job is accounted for: processed
//! count, failures, what is left in the queue, the retry and dead sets and
//! the in-progress lists, plus the workload's own evidence (HTTP requests
//! served, lines in the appended file).
//!
//! The native baseline (`wasmjobs-native`) is measured the same way: it
//! logs " running" once connected, drains the same jobs and is checked the
//! same way. Where the CPU goes is read for both from the nanosecond
//! per-thread counters (`/proc/PID/task/*/schedstat`) of the worker, of
//! `redis-server` and of the HTTP server's threads (its own runtime, in this
//! process), over the same window, and reported per job.
//!
//! Memory cases (`http-held`, `http2-held`) run differently: the worker
//! starts on an empty queue (idle memory), C jobs are pushed whose GET the
//! server holds open, and once it holds all C the worker's RSS, PSS and
//! mappings are read ([`crate::memory`]) before the server answers them
//! and the jobs are checked as above.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::AsyncCommands;
use serde::Serialize;
use serde_json::{Value, json};
use wasmjobs::runner::heartbeat::rss_kb;
use wasmjobs_benches::{
    JsonStyle, RunnerProcess, cpu_ns_since, cpu_ticks, named_threads_cpu_ns, peak_rss_kb, push_jobs, push_jobs_as,
    thread_cpu_ns,
};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::{TestRedis, command_calls};

use crate::memory;
use crate::plan::{Case, Fetch, Processor, Workload};

/// The name prefix of the HTTP server's threads (its own runtime), so its
/// CPU can be told from the rest of this process.
pub const HTTP_THREADS: &str = "bench-http";

/// No progress for this long ends a drain as stalled (and reports the loss).
const STALL: Duration = Duration::from_secs(60);
/// Longest a memory case may take to get all its jobs in flight.
const FILL_DEADLINE: Duration = Duration::from_secs(180);
/// How many of the largest mappings a memory case reports.
const LARGEST_MAPPINGS: usize = 5;

/// CPU per job, µs (user + system, from the threads' schedstat), by process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuPerJob {
    /// The worker: `wasmjobs run` or the native baseline.
    pub runner: f64,
    /// `redis-server` (`None` when its pid could not be read).
    pub redis: Option<f64>,
    /// The 200 ms HTTP server's threads.
    pub http_server: f64,
}

/// What one case measured.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// wasmjobs or the native baseline.
    pub processor: Processor,
    /// The workload.
    pub workload: Workload,
    /// `--fetch`.
    pub fetch: Fetch,
    /// `--concurrency`.
    pub concurrency: u32,
    /// Jobs pushed (0 for idle).
    pub jobs: u64,
    /// Seconds from "running" to the last job processed (idle: watched).
    pub time_s: f64,
    /// RSS when the runner was ready, KiB.
    pub start_rss_kb: u64,
    /// RSS after the last job (idle: at the end), KiB.
    pub finish_rss_kb: u64,
    /// Highest RSS of the runner's life (`VmHWM`), KiB.
    pub peak_rss_kb: u64,
    /// The runner's user + system CPU over `time_s` (100 = one core).
    pub cpu_percent: f64,
    /// Jobs per second over `time_s`.
    pub jobs_per_sec: f64,
    /// IO workloads: N × wait / C, the wall time with perfect overlap.
    pub floor_s: Option<f64>,
    /// IO workloads: `floor_s / time_s`.
    pub efficiency: Option<f64>,
    /// HTTP workloads: connections the HTTP server accepted during the case.
    pub http_connections: Option<u64>,
    /// CPU per job of the worker, Redis and the HTTP server over `time_s`.
    pub cpu_per_job: Option<CpuPerJob>,
    /// Median job execution time, ms (instantiate + perform), from the runner.
    pub exec_p50_ms: Option<f64>,
    /// 99th percentile job execution time, ms.
    pub exec_p99_ms: Option<f64>,
    /// Jobs that ran and succeeded.
    pub processed: u64,
    /// Jobs that failed.
    pub failed: u64,
    /// Jobs neither processed nor failed: lost.
    pub lost: u64,
    /// Everything the checks found wrong (empty when every job is accounted for).
    pub problems: Vec<String>,
    /// Memory cases: the worker's memory idle and with every job in flight.
    pub memory: Option<memory::Held>,
    /// Redis commands (`INFO commandstats`: those run by scripts too) per
    /// job, from the runner's start to the last job done, the suite's own
    /// polls taken off; drained cases only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_commands_per_job: Option<f64>,
}

/// The servers and binaries every case uses.
pub struct Bench {
    /// The `wasmjobs` binary under measurement.
    pub bin: PathBuf,
    /// The native baseline, `wasmjobs-native`.
    pub native: PathBuf,
    /// The runner's data dir (its compilation cache survives between cases).
    pub data_dir: PathBuf,
    /// The suite's own Redis.
    pub redis: TestRedis,
    /// The 200 ms endpoint over HTTP/1.1, served by threads named [`HTTP_THREADS`].
    pub http: HttpServer,
    /// The same over HTTP/2 only (prior knowledge), on the same runtime.
    pub http2: HttpServer,
    /// `redis-server`'s pid, for its CPU.
    pub redis_pid: Option<u32>,
    /// Started on first use by a `pg-sleep` case.
    pub postgres: Option<TestPostgres>,
    /// How the drained payloads' JSON is written.
    pub json: JsonStyle,
}

impl Bench {
    /// Runs one case and checks it.
    pub async fn run(&mut self, case: &Case) -> Result<Row> {
        if case.workload == Workload::Idle {
            return self.idle(case).await;
        }
        if case.workload.held() {
            return self.held(case).await;
        }
        let mut conn = self.redis.conn().await;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        let dir = self.plugin_dir(case.workload)?;
        let plugins = dir.path().to_path_buf();
        // The server the jobs call (a field borrow: `self.postgres` may start below).
        let server = if case.workload.h2() { &self.http2 } else { &self.http };
        let url = server.url("/sleep");
        let args = |i| match case.workload {
            w if w.http() => json!([url]),
            Workload::FileAppend => json!(["bench.txt", i]),
            Workload::Fib => json!([25]),
            _ => json!([]),
        };
        push_jobs_as(&mut conn, case.workload.class(), case.jobs, args, self.json).await?;

        let summary = tempfile::NamedTempFile::new()?;
        let concurrency = case.concurrency.to_string();
        let mut extra = vec![
            "--concurrency",
            &concurrency,
            "--fetch",
            case.fetch.flag(),
            "--exit-when-empty",
            "--summary-json",
        ];
        let summary_path = summary.path().to_string_lossy().into_owned();
        extra.push(&summary_path);
        let db;
        if case.workload == Workload::PgSleep {
            let postgres = self.postgres.get_or_insert_with(TestPostgres::start);
            db = format!("main={}?pool={}", postgres.url("postgres"), case.concurrency);
            extra.extend(["--db", &db]);
        }
        let (hits_before, connections_before) = (server.hits(), server.connections());
        let commands_before = redis_commands(&mut conn).await?;
        let mut runner = match case.processor {
            Processor::Wasmjobs => self.start(&plugins, &extra)?,
            Processor::Native => self.start_native(case)?,
        };
        runner.wait_for_log(" running")?;
        let pid = runner.pid();
        let (rss_start, cpu_start) = (rss_kb(pid), cpu_ticks(pid));
        let threads = self.sample_cpu(pid);
        let (elapsed, processed, failed, polls) = wait_until_done(&mut conn, case.jobs, &mut runner).await?;
        // Two GETs per poll, and the INFO itself.
        let commands = redis_commands(&mut conn)
            .await?
            .saturating_sub(commands_before + 2 * polls + 1);
        let cpu_per_job = self.cpu_per_job(pid, &threads, processed + failed);
        let cpu = (cpu_ticks(pid) - cpu_start) as f64 / elapsed.as_secs_f64();
        let (rss_end, peak) = (rss_kb(pid), peak_rss_kb(pid));
        let mut problems = Vec::new();
        let exited = match case.processor {
            Processor::Wasmjobs => runner.wait_exit(Duration::from_secs(60)),
            // It holds on after the last ack (for the samples above) until told.
            Processor::Native => runner.wait_for_log(" stopped").and_then(|()| runner.stop().map(drop)),
        };
        if let Err(err) = exited {
            problems.push(format!("the runner did not exit cleanly: {err:#}"));
        }
        let (exec_p50_ms, exec_p99_ms) = match case.processor {
            Processor::Wasmjobs => execution_percentiles(summary.path()),
            Processor::Native => (None, None),
        };

        let lost = case.jobs.saturating_sub(processed + failed);
        problems.extend(leftovers(&mut conn, case.jobs, processed, failed).await?);
        match case.workload {
            w if w.http() => {
                let served = (server.hits() - hits_before) as u64;
                if served != case.jobs {
                    problems.push(format!("the HTTP server saw {served} requests for {} jobs", case.jobs));
                }
            }
            Workload::FileAppend => {
                let file = plugins.join("file-append/data/bench.txt");
                problems.extend(check_appended(&file, case.jobs));
            }
            _ => {}
        }
        let secs = elapsed.as_secs_f64();
        let floor_s = case
            .workload
            .io_wait()
            .map(|wait| case.jobs as f64 * wait.as_secs_f64() / f64::from(case.concurrency));
        Ok(Row {
            processor: case.processor,
            workload: case.workload,
            fetch: case.fetch,
            concurrency: case.concurrency,
            jobs: case.jobs,
            time_s: secs,
            start_rss_kb: rss_start,
            finish_rss_kb: rss_end,
            peak_rss_kb: peak,
            cpu_percent: cpu,
            jobs_per_sec: processed as f64 / secs,
            floor_s,
            efficiency: floor_s.map(|floor| floor / secs),
            http_connections: case
                .workload
                .http()
                .then(|| (server.connections() - connections_before) as u64),
            cpu_per_job,
            exec_p50_ms,
            exec_p99_ms,
            processed,
            failed,
            lost,
            problems,
            memory: None,
            redis_commands_per_job: Some(commands as f64 / case.jobs.max(1) as f64),
        })
    }

    /// A memory case: the worker starts on an empty queue and its memory is
    /// read (idle); then C jobs are pushed whose GET the server holds
    /// (`/gate`), and once the server holds all C the memory is read again
    /// with the mappings by kind; then the gate opens, the jobs finish and
    /// are checked as in any case. wasmjobs runs without
    /// `--exit-when-empty` (it would exit on the empty queue) and is
    /// stopped once every job is processed; the native twin takes exactly
    /// C jobs (`--jobs`).
    async fn held(&mut self, case: &Case) -> Result<Row> {
        let mut conn = self.redis.conn().await;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        let dir = self.plugin_dir(case.workload)?;
        let server = self.server(case.workload);
        let gate = Gate::close(server);
        let (hits_before, connections_before) = (server.hits(), server.connections());
        let open_before = server.open_requests();
        let concurrency = case.concurrency.to_string();
        let mut runner = match case.processor {
            Processor::Wasmjobs => self.start(
                dir.path(),
                &["--concurrency", &concurrency, "--fetch", case.fetch.flag()],
            )?,
            Processor::Native => self.start_native(case)?,
        };
        runner.wait_for_log(" running")?;
        let pid = runner.pid();
        let idle = memory::read(pid)?;
        let (threads, cpu_start) = (self.sample_cpu(pid), cpu_ticks(pid));
        let started = Instant::now();
        let url = server.url("/gate");
        push_jobs(&mut conn, case.workload.class(), case.jobs, |_| json!([url])).await?;
        let mut problems = Vec::new();
        let want = open_before + case.concurrency as usize;
        let held = wait_until_held(server, want, &mut runner).await.and_then(|()| {
            Ok(memory::Held {
                in_flight: case.jobs,
                fill_s: started.elapsed().as_secs_f64(),
                idle,
                held: memory::read(pid)?,
                breakdown: memory::read_breakdown(pid, LARGEST_MAPPINGS)?,
            })
        });
        drop(gate);
        let held = held.map_err(|err| problems.push(format!("{err:#}"))).ok();
        let (_, processed, failed, _) = wait_until_done(&mut conn, case.jobs, &mut runner).await?;
        let elapsed = started.elapsed();
        let cpu_per_job = self.cpu_per_job(pid, &threads, processed + failed);
        let cpu = (cpu_ticks(pid) - cpu_start) as f64 / elapsed.as_secs_f64();
        let (rss_end, peak) = (rss_kb(pid), peak_rss_kb(pid));
        let stopped = match case.processor {
            Processor::Wasmjobs => runner.stop().map(drop),
            Processor::Native => runner.wait_for_log(" stopped").and_then(|()| runner.stop().map(drop)),
        };
        if let Err(err) = stopped {
            problems.push(format!("the runner did not stop cleanly: {err:#}"));
        }
        problems.extend(leftovers(&mut conn, case.jobs, processed, failed).await?);
        let served = (server.hits() - hits_before) as u64;
        if served != case.jobs {
            problems.push(format!("the HTTP server saw {served} requests for {} jobs", case.jobs));
        }
        let secs = elapsed.as_secs_f64();
        Ok(Row {
            time_s: secs,
            start_rss_kb: idle.rss_kb,
            finish_rss_kb: rss_end,
            peak_rss_kb: peak,
            cpu_percent: cpu,
            jobs_per_sec: processed as f64 / secs,
            http_connections: Some((server.connections() - connections_before) as u64),
            cpu_per_job,
            processed,
            failed,
            lost: case.jobs.saturating_sub(processed + failed),
            problems,
            memory: held,
            ..empty_row(case)
        })
    }

    /// Starts the runner with no jobs and watches it for `case.idle`.
    async fn idle(&mut self, case: &Case) -> Result<Row> {
        let mut conn = self.redis.conn().await;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        let concurrency = case.concurrency.to_string();
        let dir = self.plugin_dir(case.workload)?;
        let mut runner = self.start(dir.path(), &["--concurrency", &concurrency])?;
        runner.wait_for_log(" running")?;
        let pid = runner.pid();
        // Let start-up work (compilation-cache loads, the first samples) finish.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss_start, cpu_start) = (rss_kb(pid), thread_cpu_ns(pid));
        tokio::time::sleep(case.idle).await;
        let cpu = cpu_ns_since(pid, &cpu_start) as f64 / 1e7 / case.idle.as_secs_f64();
        let (rss_end, peak) = (rss_kb(pid), peak_rss_kb(pid));
        let mut problems = Vec::new();
        if let Err(err) = runner.stop() {
            problems.push(format!("the runner did not stop cleanly: {err:#}"));
        }
        Ok(Row {
            time_s: case.idle.as_secs_f64(),
            start_rss_kb: rss_start,
            finish_rss_kb: rss_end,
            peak_rss_kb: peak,
            cpu_percent: cpu,
            problems,
            ..empty_row(case)
        })
    }

    /// A private plugins directory holding only `workload`'s plugin: the
    /// runner is measured with the job under test loaded, not every example
    /// (the Python and JS ones alone hold ~300 MB once loaded), and the file
    /// workload gets a fresh `data/`. For HTTP/2 workloads the copy's
    /// manifest grants loopback with `h2 = true`, so the runner speaks
    /// HTTP/2 with prior knowledge to the suite's HTTP/2-only server.
    fn plugin_dir(&self, workload: Workload) -> Result<tempfile::TempDir> {
        let dir = wasmjobs_e2e::runner::plugins(&[workload.plugin()], &[]);
        if workload.h2() {
            let manifest = dir.path().join(workload.plugin()).join("wasmjobs.toml");
            let text = std::fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
            std::fs::write(&manifest, with_h2_rule(&text)?)
                .with_context(|| format!("writing {}", manifest.display()))?;
        }
        Ok(dir)
    }

    /// The HTTP server `workload`'s jobs call.
    fn server(&self, workload: Workload) -> &HttpServer {
        if workload.h2() { &self.http2 } else { &self.http }
    }

    /// The native baseline for `case` (memory cases: it waits for exactly
    /// N jobs, as they are pushed after it started).
    fn start_native(&self, case: &Case) -> Result<RunnerProcess> {
        let jobs = case.jobs.to_string();
        RunnerProcess::spawn(
            std::process::Command::new(&self.native)
                .args(["--redis", &self.redis.url(), "--fetch", case.fetch.flag(), "--hold"])
                .args(["--concurrency", &case.concurrency.to_string()])
                .args(case.workload.h2().then_some("--h2"))
                .args(if case.workload.held() {
                    vec!["--jobs", &jobs]
                } else {
                    vec![]
                }),
        )
    }

    /// The per-thread CPU counters of the worker `pid`, Redis and the HTTP
    /// server now.
    fn sample_cpu(&self, pid: u32) -> ThreadCpu {
        ThreadCpu {
            runner: thread_cpu_ns(pid),
            redis: self.redis_pid.map(thread_cpu_ns),
            http_server: named_threads_cpu_ns(std::process::id(), HTTP_THREADS),
        }
    }

    /// CPU per job since `before`, for `jobs` jobs.
    fn cpu_per_job(&self, pid: u32, before: &ThreadCpu, jobs: u64) -> Option<CpuPerJob> {
        let per_job = |ns: u64| ns as f64 / 1_000.0 / jobs as f64;
        (jobs > 0).then(|| CpuPerJob {
            runner: per_job(cpu_ns_since(pid, &before.runner)),
            redis: self
                .redis_pid
                .zip(before.redis.as_ref())
                .map(|(redis, before)| per_job(cpu_ns_since(redis, before))),
            http_server: per_job(
                named_threads_cpu_ns(std::process::id(), HTTP_THREADS).saturating_sub(before.http_server),
            ),
        })
    }

    fn start(&self, plugins: &Path, extra: &[&str]) -> Result<RunnerProcess> {
        RunnerProcess::start_in(
            &self.bin,
            &self.data_dir,
            &self.redis.url(),
            plugins,
            extra,
            "warn,wasmjobs::runner::launcher=info",
        )
    }
}

/// `manifest` (the http-get plugin's) with its `[http]` rule replaced by
/// one granting loopback over HTTP/2 with prior knowledge.
fn with_h2_rule(manifest: &str) -> Result<String> {
    const RULE: &str = r#"allow = [{ host = "127.0.0.1:*", h2 = true }]"#;
    let mut in_http = false;
    let mut replaced = false;
    let mut out = String::with_capacity(manifest.len() + RULE.len());
    for line in manifest.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            in_http = trimmed.starts_with("[http]");
        }
        if in_http && trimmed.starts_with("allow") && trimmed.contains('=') {
            out.push_str(RULE);
            replaced = true;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if !replaced {
        bail!("the manifest has no one-line `allow = [...]` under [http] to replace:\n{manifest}");
    }
    Ok(out)
}

/// The server's `/gate`, shut for a memory case and opened again when
/// dropped (however the case ends), so no request is left held.
struct Gate<'a>(&'a HttpServer);

impl<'a> Gate<'a> {
    fn close(server: &'a HttpServer) -> Self {
        server.close_gate();
        Self(server)
    }
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        self.0.open_gate();
    }
}

/// Per-thread CPU counters (ns) at the start of a measured window.
struct ThreadCpu {
    runner: std::collections::HashMap<u32, u64>,
    redis: Option<std::collections::HashMap<u32, u64>>,
    http_server: u64,
}

/// `redis-server`'s pid, from `INFO server`.
pub async fn redis_pid(conn: &mut redis::aio::MultiplexedConnection) -> Option<u32> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await.ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// A row for `case` with nothing measured.
pub fn empty_row(case: &Case) -> Row {
    Row {
        processor: case.processor,
        workload: case.workload,
        fetch: case.fetch,
        concurrency: case.concurrency,
        jobs: case.jobs,
        time_s: 0.0,
        start_rss_kb: 0,
        finish_rss_kb: 0,
        peak_rss_kb: 0,
        cpu_percent: 0.0,
        jobs_per_sec: 0.0,
        floor_s: None,
        efficiency: None,
        http_connections: None,
        cpu_per_job: None,
        exec_p50_ms: None,
        exec_p99_ms: None,
        processed: 0,
        failed: 0,
        lost: case.jobs,
        problems: Vec::new(),
        memory: None,
        redis_commands_per_job: None,
    }
}

/// Calls of every Redis command so far (`INFO commandstats`).
async fn redis_commands(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    Ok(command_calls(conn).await?.values().sum())
}

/// Polls `stat:processed` + `stat:failed` every 2 ms until they reach `n`,
/// the runner exits, or nothing moves for [`STALL`]. Returns the elapsed
/// time, both counters and the number of polls.
async fn wait_until_done(
    conn: &mut redis::aio::MultiplexedConnection,
    n: u64,
    runner: &mut RunnerProcess,
) -> Result<(Duration, u64, u64, u64)> {
    let started = Instant::now();
    let mut last = (0, 0);
    let mut last_move = Instant::now();
    let mut polls = 0;
    loop {
        polls += 1;
        let (processed, failed): (Option<u64>, Option<u64>) = redis::pipe()
            .get("stat:processed")
            .get("stat:failed")
            .query_async(conn)
            .await?;
        let now = (processed.unwrap_or(0), failed.unwrap_or(0));
        if now.0 + now.1 >= n || runner.has_exited() || last_move.elapsed() > STALL {
            return Ok((started.elapsed(), now.0, now.1, polls));
        }
        if now != last {
            last = now;
            last_move = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Polls the server every 10 ms until it holds `want` requests open;
/// fails when the worker exits or after [`FILL_DEADLINE`].
async fn wait_until_held(server: &HttpServer, want: usize, runner: &mut RunnerProcess) -> Result<()> {
    let deadline = Instant::now() + FILL_DEADLINE;
    loop {
        let open = server.open_requests();
        if open >= want {
            return Ok(());
        }
        if runner.has_exited() {
            bail!(
                "the worker exited with {open} of {want} requests held: {}",
                runner.log()
            );
        }
        if Instant::now() > deadline {
            bail!("only {open} of {want} requests were held at once after {FILL_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the counters and keys say is wrong after a drain of `n` jobs.
async fn leftovers(
    conn: &mut redis::aio::MultiplexedConnection,
    n: u64,
    processed: u64,
    failed: u64,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if processed != n {
        problems.push(format!("{processed} of {n} jobs processed"));
    }
    if failed > 0 {
        problems.push(format!("{failed} jobs failed"));
    }
    let queued: u64 = conn.llen("queue:default").await?;
    let retry: u64 = conn.zcard("retry").await?;
    let dead: u64 = conn.zcard("dead").await?;
    let held = wasmjobs_e2e::runner::jobs_in_progress(conn).await;
    for (count, place) in [
        (queued, "left in the queue"),
        (retry, "in the retry set"),
        (dead, "in the dead set"),
        (held, "held in an in-progress list"),
    ] {
        if count > 0 {
            problems.push(format!("{count} jobs {place}"));
        }
    }
    Ok(problems)
}

/// Checks that `file` holds exactly the ids `0..n`, one per line.
fn check_appended(file: &Path, n: u64) -> Vec<String> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(err) => return vec![format!("cannot read {}: {err}", file.display())],
    };
    let lines = text.lines().count() as u64;
    let ids: BTreeSet<u64> = text.lines().filter_map(|line| line.parse().ok()).collect();
    let mut problems = Vec::new();
    if lines != n {
        problems.push(format!("{} has {lines} lines for {n} jobs", file.display()));
    }
    if ids.len() as u64 != n || ids.iter().next_back().is_some_and(|&max| max + 1 != n) {
        problems.push(format!(
            "{} holds {} distinct ids, not 0..{n}",
            file.display(),
            ids.len()
        ));
    }
    problems
}

/// Execution p50 / p99 (ms) of the run's only class, from `--summary-json`.
fn execution_percentiles(summary: &Path) -> (Option<f64>, Option<f64>) {
    let parsed: Option<Value> = std::fs::read(summary)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let execution = parsed
        .as_ref()
        .and_then(|s| s.pointer("/classes/0/execution_ms"))
        .cloned()
        .unwrap_or(Value::Null);
    (execution["p50"].as_f64(), execution["p99"].as_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmjobs::plugin::manifest::Manifest;

    #[test]
    fn the_h2_copy_of_the_http_get_manifest_grants_loopback_over_http2() {
        let path = wasmjobs_e2e::guests::repo_root().join("plugins/http-get/wasmjobs.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let before = Manifest::parse(&path, &text).unwrap();
        let grant = before.http_allow.grant("http", "127.0.0.1", 8080).unwrap();
        assert!(grant.private && !grant.h2, "the example speaks HTTP/1.1");

        let h2 = with_h2_rule(&text).unwrap();
        let after = Manifest::parse(&path, &h2).unwrap();
        let grant = after.http_allow.grant("http", "127.0.0.1", 8080).unwrap();
        assert!(grant.private && grant.h2, "{h2}");
        assert_eq!(after.classes, before.classes);
    }

    #[test]
    fn a_manifest_without_an_allow_line_is_refused() {
        let err = with_h2_rule("component = \"x.wasm\"\n[http]\n").unwrap_err();
        assert!(err.to_string().contains("no one-line `allow"), "{err}");
        assert!(
            with_h2_rule("[files]\nallow = 1\n").is_err(),
            "only [http]'s allow is replaced"
        );
    }
}
