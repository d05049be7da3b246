//! Shared pieces of the wasmjobs benchmarks: the result table and where it
//! is written (`benches/results/<name>.md`), and [`RunnerProcess`], the real
//! `wasmjobs run` binary under measurement (its log, CPU and RSS).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::AsyncCommands;
use serde_json::Value;
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs::runner::heartbeat::rss_kb;
use wasmjobs_e2e::redis_server::TestRedis;

/// A `wasmjobs run` process started by a benchmark, logging to a temp file.
pub struct RunnerProcess {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl RunnerProcess {
    /// Starts `bin run --redis URL --plugins DIR EXTRA…` with `RUST_LOG=filter`.
    pub fn start(bin: &Path, redis_url: &str, plugins: &Path, extra: &[&str], filter: &str) -> Result<Self> {
        let data_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasmjobs-bench-data");
        Self::start_in(bin, &data_dir, redis_url, plugins, extra, filter)
    }

    /// As [`RunnerProcess::start`], with its own data directory (and so its
    /// own compilation cache).
    pub fn start_in(
        bin: &Path,
        data_dir: &Path,
        redis_url: &str,
        plugins: &Path,
        extra: &[&str],
        filter: &str,
    ) -> Result<Self> {
        let mut command = Command::new(bin);
        command
            .arg("--data-dir")
            .arg(data_dir)
            .args(["run", "--redis", redis_url, "--plugins"])
            .arg(plugins)
            .args(extra)
            .env("RUST_LOG", filter);
        Self::spawn(&mut command).context("starting wasmjobs run")
    }

    /// Starts `command` (any worker: the suite's native baseline too) with
    /// its stderr as the log and its stdout discarded.
    pub fn spawn(command: &mut Command) -> Result<Self> {
        let log = tempfile::NamedTempFile::new()?;
        let child = command
            .stdout(Stdio::null())
            .stderr(log.reopen()?)
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        Ok(Self { child, log })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Waits (up to a minute) until the log contains `needle`.
    pub fn wait_for_log(&mut self, needle: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains(needle) {
            if let Some(status) = self.child.try_wait()? {
                bail!("wasmjobs run exited ({status}): {}", self.log());
            }
            if Instant::now() > deadline {
                bail!("wasmjobs run did not log {needle:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `timeout` for the process to exit on its own (as
    /// `--exit-when-empty` does); fails with the log unless it exits 0.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("wasmjobs run exited with {status}: {}", self.log());
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("wasmjobs run still running after {timeout:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, then waits for a clean exit. Returns the whole log.
    pub fn stop(mut self) -> Result<String> {
        Command::new("kill").args(["-TERM", &self.pid().to_string()]).status()?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("wasmjobs run exited with {status}: {}", self.log());
        }
        Ok(self.log())
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime + stime of `pid`, in clock ticks (1/100 s).
pub fn cpu_ticks(pid: u32) -> u64 {
    wasmjobs::metrics::process::cpu_ticks_of(pid)
}

/// CPU time of each live thread of `pid` (`/proc/PID/task/*/schedstat`),
/// in nanoseconds: precise where [`cpu_ticks`] counts 10 ms ticks, which
/// matters for an idle process using a few ms a second.
pub fn thread_cpu_ns(pid: u32) -> std::collections::HashMap<u32, u64> {
    let mut times = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return times;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        if let Some(ns) = schedstat_ns(&task.path().join("schedstat")) {
            times.insert(tid, ns);
        }
    }
    times
}

/// The time on CPU a `schedstat` file gives (its first field), in
/// nanoseconds; `None` if the thread is gone or the file says nothing.
pub fn schedstat_ns(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// CPU nanoseconds used so far by those threads of `pid` whose name
/// (`/proc/PID/task/TID/comm`) starts with `prefix`.
pub fn named_threads_cpu_ns(pid: u32, prefix: &str) -> u64 {
    thread_cpu_ns(pid)
        .into_iter()
        .filter(|(tid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).is_ok_and(|name| name.starts_with(prefix))
        })
        .map(|(_, ns)| ns)
        .sum()
}

/// CPU nanoseconds `pid`'s threads used since `before` (from
/// [`thread_cpu_ns`]); threads that exited in between are not counted.
pub fn cpu_ns_since(pid: u32, before: &std::collections::HashMap<u32, u64>) -> u64 {
    thread_cpu_ns(pid)
        .into_iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(&tid).copied().unwrap_or(0)))
        .sum()
}

/// The highest resident set size `pid` has had (`VmHWM`), in KiB.
pub fn peak_rss_kb(pid: u32) -> u64 {
    wasmjobs::metrics::process::memory_kb_of(pid).1
}

/// The value at quantile `p` (0..=1) of an ascending slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

/// A benchmark report: rows of label → figure, printed and saved.
pub struct Report {
    name: String,
    title: String,
    rows: Vec<(String, String, String)>,
    notes: Vec<String>,
}

impl Report {
    /// A report saved as `benches/results/<name>.md`.
    pub fn new(name: &str, title: &str) -> Self {
        Self {
            name: name.to_owned(),
            title: title.to_owned(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row: what was measured, the figure, and the target (or "").
    pub fn row(&mut self, what: &str, figure: String, target: &str) {
        self.rows.push((what.to_owned(), figure, target.to_owned()));
    }

    /// Adds a line under the table.
    pub fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Prints the table and writes it to `benches/results/<name>.md`.
    pub fn finish(self) -> anyhow::Result<PathBuf> {
        let mut md = String::new();
        writeln!(md, "# {}\n", self.title)?;
        writeln!(
            md,
            "Measured {} on `{}` ({}, {} cores), wasmjobs {}.\n",
            date(),
            hostname(),
            cpu_model(),
            cores(),
            env!("CARGO_PKG_VERSION")
        )?;
        let width = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
        let fig = self.rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(6);
        writeln!(md, "| {:width$} | {:>fig$} | target |", "measure", "figure")?;
        writeln!(md, "|{}|{}|---|", "-".repeat(width + 2), "-".repeat(fig + 2))?;
        for (what, figure, target) in &self.rows {
            writeln!(md, "| {what:width$} | {figure:>fig$} | {target} |")?;
        }
        if !self.notes.is_empty() {
            writeln!(md)?;
            for note in &self.notes {
                writeln!(md, "- {note}")?;
            }
        }
        print!("\n{md}");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.md", self.name));
        std::fs::write(&path, md)?;
        println!("\nwritten to {}", path.display());
        Ok(path)
    }
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn date() -> String {
    command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown date".into())
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The CPU model from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The trimmed stdout of a command that succeeded.
pub fn command(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program).args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// What one drain measured.
pub struct Drain {
    /// From "running" to the last job processed.
    pub wall: Duration,
    /// The runner's peak RSS (VmHWM), KiB.
    pub peak_rss_kb: u64,
    /// RSS when it reported "running", KiB.
    pub rss_start_kb: u64,
    /// RSS after the last job, KiB.
    pub rss_end_kb: u64,
    /// The runner's %CPU over the drain (100 = one core).
    pub cpu: f64,
}

/// Polls `stat:processed` every 2 ms until it reaches `n`; returns how long
/// that took (the benchmark's wall time), or fails with the runner's log
/// after `timeout`.
pub async fn wait_for_processed(
    conn: &mut redis::aio::MultiplexedConnection,
    n: u64,
    timeout: Duration,
    runner: &RunnerProcess,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let processed: u64 = conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0);
        if processed >= n {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("only {processed} of {n} jobs processed: {}", runner.log());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// How the pushed payloads' JSON is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// No spaces (`{"jid":"…"}`), as Ruby's Sidekiq client and wasmjobs write it.
    Compact,
    /// A space after every `,` and `:` (`{"jid": "…"}`), as Python's
    /// `json.dumps` writes it by default, and many other clients.
    Spaced,
}

/// Pushes `n` jobs of `class` onto `default` (Sidekiq format), args from
/// `args(i)`, in batches of 10,000.
pub async fn push_jobs(
    conn: &mut redis::aio::MultiplexedConnection,
    class: &str,
    n: u64,
    args: impl Fn(u64) -> Value,
) -> Result<()> {
    push_jobs_as(conn, class, n, args, JsonStyle::Compact).await
}

/// [`push_jobs`], the payloads written in `style`.
pub async fn push_jobs_as(
    conn: &mut redis::aio::MultiplexedConnection,
    class: &str,
    n: u64,
    args: impl Fn(u64) -> Value,
    style: JsonStyle,
) -> Result<()> {
    let now = wasmjobs::redis::now_f64();
    let mut pushed = 0;
    while pushed < n {
        let count = (n - pushed).min(10_000);
        let mut payloads: Vec<Payload> = (pushed..pushed + count)
            .map(|i| Payload::new(class, args(i).as_array().cloned().unwrap_or_default(), "default", now))
            .collect();
        match style {
            JsonStyle::Compact => client::push_bulk(conn, &mut payloads).await.context("pushing jobs")?,
            JsonStyle::Spaced => {
                let mut pipe = redis::pipe();
                pipe.sadd("queues", "default").ignore();
                for payload in &mut payloads {
                    payload.set("enqueued_at", serde_json::json!(now));
                    pipe.lpush("queue:default", spaced(&payload.to_json())?).ignore();
                }
                let _: () = pipe.query_async(conn).await.context("pushing jobs")?;
            }
        }
        pushed += count;
    }
    Ok(())
}

/// `json` rewritten with `", "` and `": "` between its items.
fn spaced(json: &str) -> Result<String> {
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let value: Value = serde_json::from_str(json)?;
    let mut out = Vec::with_capacity(json.len() + 32);
    serde::Serialize::serialize(&value, &mut serde_json::Serializer::with_formatter(&mut out, Spaced))?;
    Ok(String::from_utf8(out)?)
}

/// Fails (with the runners' `log`) unless exactly `n` jobs were processed
/// and none failed.
async fn check_all_processed(
    conn: &mut redis::aio::MultiplexedConnection,
    class: &str,
    n: u64,
    log: &str,
) -> Result<()> {
    let failed: u64 = conn.get::<_, Option<u64>>("stat:failed").await?.unwrap_or(0);
    let processed: u64 = conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0);
    if failed > 0 || processed != n {
        bail!("{class}: {processed} processed, {failed} failed, for {n} pushed:\n{log}");
    }
    Ok(())
}

/// Like [`drain`] for jobs with no args, with `processes` runners at once
/// (each given `extra`), as one deploys one `--threads 1` process per core: all are started and
/// running before the jobs are pushed, and the wall time runs from the push
/// to the last job processed. `cpu` is the sum of the runners' %CPU; RSS
/// figures are summed too.
pub async fn drain_in_processes(
    bin: &Path,
    redis: &TestRedis,
    plugins: &Path,
    class: &str,
    n: u64,
    extra: &[&str],
    processes: usize,
) -> Result<Drain> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    let mut runners = Vec::with_capacity(processes);
    for _ in 0..processes {
        runners.push(start_running(bin, redis, plugins, extra)?);
    }
    let rss_start_kb = runners.iter().map(|r| rss_kb(r.pid())).sum();
    let cpu_start: Vec<u64> = runners.iter().map(|r| cpu_ticks(r.pid())).collect();
    let started = Instant::now();
    push_jobs(&mut conn, class, n, |_| Value::Array(Vec::new())).await?;
    wait_for_processed(&mut conn, n, Duration::from_secs(600), &runners[0]).await?;
    let wall = started.elapsed();
    let cpu = runners
        .iter()
        .zip(&cpu_start)
        .map(|(r, start)| (cpu_ticks(r.pid()) - start) as f64)
        .sum::<f64>()
        / wall.as_secs_f64();
    let rss_end_kb = runners.iter().map(|r| rss_kb(r.pid())).sum();
    let peak_rss_kb = runners.iter().map(|r| peak_rss_kb(r.pid())).sum();
    let mut logs = String::new();
    for runner in runners {
        logs.push_str(&runner.stop()?);
    }
    check_all_processed(&mut conn, class, n, &logs).await?;
    Ok(Drain {
        wall,
        peak_rss_kb,
        rss_start_kb,
        rss_end_kb,
        cpu,
    })
}

/// Starts `bin run` on `plugins` with `extra` flags (the launcher's lines
/// logged, the rest at warn) and waits until it is running.
pub fn start_running(bin: &Path, redis: &TestRedis, plugins: &Path, extra: &[&str]) -> Result<RunnerProcess> {
    let mut runner = RunnerProcess::start(
        bin,
        &redis.url(),
        plugins,
        extra,
        "warn,wasmjobs::runner::launcher=info",
    )?;
    runner.wait_for_log(" running")?;
    Ok(runner)
}

/// Jobs per second of a [`drain`] of `n` NoopJobs (no args): the figure
/// the overhead benchmarks (metrics, tracing, dashboard) compare.
pub async fn noop_rate(bin: &Path, redis: &TestRedis, plugins: &Path, n: u64, extra: &[&str]) -> Result<f64> {
    let run = drain(bin, redis, plugins, "NoopJob", n, |_| serde_json::json!([]), extra).await?;
    Ok(n as f64 / run.wall.as_secs_f64())
}

/// Pushes `n` jobs of `class` (args from `args(i)`), runs `bin run` with
/// `extra` flags until all are processed, and checks that none failed.
pub async fn drain(
    bin: &Path,
    redis: &TestRedis,
    plugins: &Path,
    class: &str,
    n: u64,
    args: impl Fn(u64) -> Value,
    extra: &[&str],
) -> Result<Drain> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    push_jobs(&mut conn, class, n, args).await?;
    let runner = start_running(bin, redis, plugins, extra)?;
    let rss_start_kb = rss_kb(runner.pid());
    let cpu_start = cpu_ticks(runner.pid());
    let wall = wait_for_processed(&mut conn, n, Duration::from_secs(600), &runner).await?;
    let cpu = (cpu_ticks(runner.pid()) - cpu_start) as f64 / wall.as_secs_f64();
    let rss_end_kb = rss_kb(runner.pid());
    let peak_rss_kb = peak_rss_kb(runner.pid());
    let log = runner.stop()?;
    check_all_processed(&mut conn, class, n, &log).await?;
    Ok(Drain {
        wall,
        peak_rss_kb,
        rss_start_kb,
        rss_end_kb,
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::spaced;

    #[test]
    fn spaced_json_has_a_space_after_each_comma_and_colon() {
        let text = spaced(r#"{"class":"NoopJob","args":[1,"a",{"k":[]}],"jid":"ab"}"#).expect("spaced");
        assert_eq!(
            text,
            r#"{"class": "NoopJob", "args": [1, "a", {"k": []}], "jid": "ab"}"#
        );
    }
}
