//! What one job costs the Redis server, by command: the input of the
//! shard model (`docs/shards.md`, "How far one shard goes").
//!
//! For reliable and basic fetch at C=100: 100,000 `NoopJob` (20,000 with
//! `BENCH_QUICK=1`) pushed up front, `CONFIG RESETSTAT`, then the real
//! binary drains them. Read after the drain: the server's own CPU
//! (`INFO cpu`, user + system), and per command `INFO commandstats` (calls
//! and the time Redis spent executing them, `usec`). Reported per job:
//! Redis CPU, commands, and each command's calls and µs; and the ceiling
//! one Redis core puts on a fleet at that cost (1 s ÷ CPU per job), beside
//! the rate this 2-core machine reached with the runner on the same cores.
//! `commandstats` counts a script's inner commands under their own names
//! as well as under `evalsha`, so the per-command µs add up to more than
//! the `evalsha` line; the CPU figure is the one to divide by.
//!
//! The redis-server is started with the append-only file on (fsync every
//! second), as `wasmjobs run` runs its embedded one, and pinned to the last
//! core when `taskset` exists (the runner gets the others), so its CPU is
//! not shared with the runner's threads mid-measure.
//!
//! Run: `cargo bench -p wasmjobs-benches --bench redis_cost`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use redis::AsyncCommands;
use serde_json::json;
use wasmjobs_benches::{Report, RunnerProcess, cores, push_jobs, wait_for_processed};
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let jobs: u64 = if quick { 20_000 } else { 100_000 };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let plugin_dir = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let pinned = rt.block_on(pin(&redis))?;
    let mut report = Report::new("redis_cost", "What a job costs the Redis server, by command");
    for mode in ["reliable", "basic"] {
        let cost = rt.block_on(drain(&redis, plugin_dir.path(), mode, jobs, pinned))?;
        let per_job = cost.cpu_us / jobs as f64;
        report.row(
            &format!(
                "{mode}, C=100, {jobs} jobs: Redis CPU per job (µs) / commands run per job (a script's own included)"
            ),
            format!("{per_job:.2} / {:.2}", cost.calls() as f64 / jobs as f64),
            "",
        );
        report.row(
            &format!("{mode}: one Redis core's ceiling (jobs/s) / the rate reached here (jobs/s)"),
            format!("{:.0} / {:.0}", 1e6 / per_job, jobs as f64 / cost.wall.as_secs_f64()),
            "",
        );
        for (command, (calls, usec)) in cost.top(6) {
            report.row(
                &format!("{mode}: `{command}` per job: calls / µs"),
                format!("{:.3} / {:.2}", calls as f64 / jobs as f64, usec as f64 / jobs as f64),
                "",
            );
        }
    }
    // The same drain over 1, 2 and 3 shards: six queues spread evenly.
    let others = [TestRedis::start(), TestRedis::start()];
    let servers = [&redis, &others[0], &others[1]];
    for server in &servers[1..] {
        rt.block_on(pin(server))?;
    }
    for count in 1..=3 {
        let run = rt.block_on(sharded_drain(&servers[..count], plugin_dir.path(), jobs, pinned))?;
        let per_job: Vec<String> = run
            .cpu_us
            .iter()
            .map(|us| format!("{:.2}", us / (jobs as f64 / count as f64)))
            .collect();
        report.row(
            &format!("reliable, C=100, {jobs} jobs over {count} shard(s): jobs/s / each shard's Redis CPU per job it held (µs)"),
            format!("{:.0} / {}", jobs as f64 / run.wall.as_secs_f64(), per_job.join(", ")),
            "",
        );
    }
    report.note(
        "Shards: the queues q0..q5 routed round-robin over the shards (--shard, --route), every redis-server on the same pinned core, one runner; a shard's CPU per job is its CPU over the jobs its queues held.".into(),
    );
    report.note(format!(
        "redis-server with appendonly yes, appendfsync everysec; {}.",
        match pinned {
            Some(core) => format!("pinned to core {core} with taskset, the runner to the other cores"),
            None => "not pinned (no taskset, or one core)".to_owned(),
        }
    ));
    report.note(
        "µs per command are Redis's own (INFO commandstats usec), which counts a script's inner commands under their names too; the CPU per job (INFO cpu) is the total.".into(),
    );
    report.finish()?;
    Ok(())
}

/// Turns on the append-only file and pins the server to the last core
/// (when there are two or more and `taskset` runs); returns that core.
async fn pin(redis: &TestRedis) -> Result<Option<usize>> {
    let mut conn = redis.conn().await;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query_async::<()>(&mut conn)
        .await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(str::trim)
        .context("redis INFO has no process_id")?
        .to_owned();
    let last = cores().saturating_sub(1);
    if last == 0 {
        return Ok(None);
    }
    Ok(taskset(&pid, &last.to_string()).then_some(last))
}

/// Pins every thread of process `pid` to `cpus` (`taskset -a -p -c`);
/// whether it could.
fn taskset(pid: &str, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, pid])
        .output()
        .is_ok_and(|out| out.status.success())
}

struct Cost {
    wall: Duration,
    cpu_us: f64,
    /// Command → (calls, usec).
    commands: BTreeMap<String, (u64, u64)>,
}

impl Cost {
    /// Commands run, a script's inner commands included.
    fn calls(&self) -> u64 {
        self.commands.values().map(|(calls, _)| calls).sum()
    }

    /// The `n` commands Redis spent most time on.
    fn top(&self, n: usize) -> Vec<(&str, (u64, u64))> {
        let mut all: Vec<(&str, (u64, u64))> = self.commands.iter().map(|(c, v)| (c.as_str(), *v)).collect();
        all.sort_by_key(|(_, (_, usec))| std::cmp::Reverse(*usec));
        all.truncate(n);
        all
    }
}

async fn drain(redis: &TestRedis, plugins: &Path, mode: &str, jobs: u64, pinned: Option<usize>) -> Result<Cost> {
    let mut conn = redis.conn().await;
    redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
    push_jobs(&mut conn, "NoopJob", jobs, |_| json!([])).await?;
    let mut runner = RunnerProcess::start(
        BIN.as_ref(),
        &redis.url(),
        plugins,
        &["--concurrency", "100", "--fetch", mode],
        "info",
    )?;
    if let Some(core) = pinned {
        taskset(&runner.pid().to_string(), &format!("0-{}", core.saturating_sub(1)));
    }
    runner.wait_for_log(" running")?;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut conn)
        .await?;
    let cpu_before = cpu_seconds(&mut conn).await?;
    let wall = wait_for_processed(&mut conn, jobs, Duration::from_secs(300), &runner).await?;
    let cpu_after = cpu_seconds(&mut conn).await?;
    let commands = commandstats(&mut conn).await?;
    runner.stop()?;
    let processed: u64 = conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0);
    if processed != jobs {
        bail!("{processed} processed for {jobs} jobs pushed");
    }
    Ok(Cost {
        wall,
        cpu_us: (cpu_after - cpu_before) * 1e6,
        commands,
    })
}

/// A drain over shards: its wall time and each shard's CPU, µs.
struct ShardRun {
    wall: Duration,
    cpu_us: Vec<f64>,
}

/// Drains `jobs` NoopJobs spread evenly over the queues `q0`..`q5`, the
/// queues routed round-robin over `servers` (the first is the default
/// shard), with one reliable runner at C=100.
async fn sharded_drain(servers: &[&TestRedis], plugins: &Path, jobs: u64, pinned: Option<usize>) -> Result<ShardRun> {
    let mut conns = Vec::new();
    for server in servers {
        let mut conn = server.conn().await;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        conns.push(conn);
    }
    let now = wasmjobs::redis::now_f64();
    for (index, conn) in conns.iter_mut().enumerate() {
        let queues: Vec<String> = (0..6)
            .filter(|q| q % servers.len() == index)
            .map(|q| format!("q{q}"))
            .collect();
        let held = (0..jobs).filter(|i| queues.contains(&format!("q{}", i % 6)));
        let mut payloads: Vec<_> = held
            .map(|i| {
                wasmjobs_client::Job::new("NoopJob")
                    .queue(format!("q{}", i % 6))
                    .to_payload(now)
                    .map(|(p, _)| p)
            })
            .collect::<Result<_, _>>()?;
        for chunk in payloads.chunks_mut(10_000) {
            wasmjobs_client::push::push_bulk(conn, chunk)
                .await
                .context("pushing jobs")?;
        }
    }
    let mut args: Vec<String> = ["--concurrency", "100", "--queues", "q0,q1,q2,q3,q4,q5"]
        .map(String::from)
        .to_vec();
    for (index, server) in servers.iter().enumerate().skip(1) {
        args.push("--shard".into());
        args.push(format!("s{index}={}", server.url()));
        let routed: Vec<String> = (0..6)
            .filter(|q| q % servers.len() == index)
            .map(|q| format!("q{q}"))
            .collect();
        args.push("--route".into());
        args.push(format!("{}=s{index}", routed.join(",")));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut runner = RunnerProcess::start(BIN.as_ref(), &servers[0].url(), plugins, &args, "info")?;
    if let Some(core) = pinned {
        taskset(&runner.pid().to_string(), &format!("0-{}", core.saturating_sub(1)));
    }
    runner.wait_for_log(" running")?;
    let mut before = Vec::new();
    for conn in &mut conns {
        before.push(cpu_seconds(conn).await?);
    }
    let started = std::time::Instant::now();
    loop {
        let mut processed = 0;
        for conn in &mut conns {
            processed += conn.get::<_, Option<u64>>("stat:processed").await?.unwrap_or(0);
        }
        if processed >= jobs {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("only {processed} of {jobs} jobs processed: {}", runner.log());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let wall = started.elapsed();
    let mut cpu_us = Vec::new();
    for (conn, before) in conns.iter_mut().zip(before) {
        cpu_us.push((cpu_seconds(conn).await? - before) * 1e6);
    }
    runner.stop()?;
    Ok(ShardRun { wall, cpu_us })
}

/// The server's CPU time so far (user + system), in seconds.
async fn cpu_seconds(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> Result<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("INFO cpu has no {name}"))
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// `INFO commandstats`: command → (calls, usec). Our own INFO calls
/// (a handful) are left in; they do not move a per-job figure.
async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> Result<BTreeMap<String, (u64, u64)>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let mut stats = BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let field = |key: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        stats.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    Ok(stats)
}
