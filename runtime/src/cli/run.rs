//! `wasmjobs run`: the job runner.
//!
//! Fetches jobs from Redis (Sidekiq's format) and runs each in a fresh
//! sandboxed instance of its plugin, up to `--concurrency` at once, until
//! SIGTERM/SIGINT (graceful: in-flight jobs get `--timeout` seconds, the
//! rest go back to their queues). With no `--redis` and no `REDIS_URL` it
//! starts (or joins) a private redis-server in the data directory. With
//! `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) it sends traces,
//! flushed when the run ends (`crate::otel`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;

use super::{Cli, DbArgs, PluginSource, RedisArgs};
use crate::runner::{self, DeadCaps, FetchMode, Queues, RunOptions, Store};
use crate::sandbox::Limits;
use crate::sandbox::engine::KEEP_RESIDENT;
use crate::size::parse_size;

/// Arguments of `wasmjobs run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: PluginSource,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Keep jobs in PostgreSQL (postgres://…) instead of Redis: enqueued
    /// inside the application's transactions (`wasmjobs.enqueue`). Run
    /// `wasmjobs migrate --source URL` once first. Redis still holds the
    /// heartbeat, counters, cancels, pauses and limits (docs/postgres.md).
    #[arg(
        long = "source",
        env = "WASMJOBS_SOURCE",
        hide_env_values = true,
        value_name = "URL",
        conflicts_with = "fetch"
    )]
    pub jobs_source: Option<String>,
    /// Seconds a PostgreSQL claim holds a job unless renewed; renewed every
    /// quarter of it, so a dead process's jobs run elsewhere within 1.25×.
    #[arg(long, value_name = "SECS", default_value_t = runner::DEFAULT_LEASE.as_secs_f64(), requires = "jobs_source")]
    pub lease: f64,
    #[command(flatten)]
    pub db: DbArgs,
    /// Queues to serve: `a,b` in strict order, or `a:3,b:1` weighted.
    #[arg(long, short = 'q', default_value = crate::job::DEFAULT_QUEUE)]
    pub queues: Queues,
    /// Most jobs in flight at once.
    #[arg(long, short = 'c', default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Seconds a graceful shutdown waits for jobs in flight before requeueing them.
    #[arg(long, short = 't', default_value_t = 25.0)]
    pub timeout: f64,
    /// reliable: at-least-once (jobs survive a crash); basic: at-most-once, fastest.
    #[arg(long, value_enum, default_value_t)]
    pub fetch: FetchMode,
    /// A label for this process in `wasmjobs stats` and the Sidekiq Web UI.
    #[arg(long, default_value = "")]
    pub tag: String,
    /// Wall-clock limit per job, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub job_timeout: f64,
    /// Most linear memory per job (e.g. 64MiB).
    #[arg(long, default_value = "128MiB", value_parser = parse_size)]
    pub memory: usize,
    /// Most bytes a plugin's read-write directories may hold (default and cap of `limits.disk`).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub disk: usize,
    /// Bytes of each job's memory reset in place rather than returned to the
    /// kernel between jobs. 16MiB makes Python and JS jobs on fresh
    /// instances 1.6–1.7× faster and Rust jobs 0.6× as fast: for processes
    /// that run interpreter plugins (see docs/polyglot.md).
    #[arg(long, value_name = "SIZE", default_value_t = KEEP_RESIDENT, value_parser = parse_size)]
    pub keep_resident: usize,
    /// Threads that run jobs (default: one per core). `--threads 1`, one
    /// process per core, suits Python and JS plugins on fresh instances:
    /// their copy-on-write faults then flush no other core's TLB, which
    /// took ~2.5 ms of CPU per job in one two-thread process (docs/polyglot.md).
    /// Light jobs at low concurrency gain too (NoopJob at C=10: 1.29× the
    /// jobs/s), CPU-bound ones lose (FibJob at C=10: half; docs/performance.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Allow plugins that set `limits.fuel` (they alone are metered, 10–25% slower).
    #[arg(long)]
    pub fuel: bool,
    /// Average seconds between polls of the schedule and retry sets (per process).
    #[arg(long, default_value_t = 5.0)]
    pub poll_interval: f64,
    /// Most bytes a job's payload may have; a larger job goes to the dead
    /// set unrun, kept whole (0: no limit). Checked inside Redis, so a
    /// huge payload never reaches this process.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = parse_size)]
    pub max_payload: usize,
    /// Ruby apps cancel jobs the Sidekiq way (`Sidekiq::Client#cancel!`,
    /// or `SETEX cancelled-<jid>`): look those requests up at every fetch,
    /// so a job fetched after one never starts (costs Redis ~1.5 µs a job).
    /// Without it such a request stops a job once it has run for a second;
    /// `wasmjobs cancel` works on every path either way.
    #[arg(long)]
    pub sidekiq_cancels: bool,
    /// Recoveries from dead processes after which a job is a poison pill (sent to dead).
    #[arg(long, default_value_t = 3)]
    pub max_recoveries: u64,
    /// Most jobs the dead set keeps (the newest); Sidekiq's `dead_max_jobs`.
    #[arg(long, default_value_t = DeadCaps::default().max_jobs)]
    pub dead_max_jobs: u64,
    /// Days a job stays in the dead set; Sidekiq's `dead_timeout_in_seconds` (six months).
    #[arg(long, default_value_t = 180.0)]
    pub dead_days: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics and JSON at /stats (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Serve the dashboard at http://ADDR/ (as `wasmjobs web`). Any address
    /// other than loopback needs WASMJOBS_WEB_TOKEN, or WASMJOBS_WEB_USER
    /// and WASMJOBS_WEB_PASSWORD, in the environment.
    #[arg(long, value_name = "ADDR")]
    pub web: Option<std::net::SocketAddr>,
    /// Do not record per-job metrics (no latency histograms, no per-class summary).
    #[arg(long)]
    pub no_metrics: bool,
    /// Stop once every queue is empty and no job is in flight (batch runs, benchmarks).
    #[arg(long)]
    pub exit_when_empty: bool,
    /// Also write the run summary printed at exit to FILE, as JSON.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub otel: crate::otel::OtelArgs,
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| anyhow!("{flag} must be a non-negative number of seconds"))
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &RunArgs) -> Result<ExitCode> {
    // Refuse an exposed dashboard before loading anything.
    let web = match args.web {
        Some(addr) => {
            let access = crate::web::Access::from_env()?;
            access.required_for(addr)?;
            Some((addr, access))
        }
        None => None,
    };
    let shards = args.redis.shard_map(&cli.data_dir)?;
    if shards.is_sharded() && args.jobs_source.is_some() {
        bail!("--shard is for jobs kept in Redis; with --source the jobs are in PostgreSQL");
    }
    let tracing = crate::otel::Tracing::from_args(&args.otel)?;
    let store = match &args.jobs_source {
        None => Store::Redis,
        Some(url) => {
            let lease = seconds(args.lease, "--lease")?;
            if lease < Duration::from_secs(1) {
                bail!("--lease must be at least 1 second");
            }
            let pg = crate::pg::Pg::open(url)?;
            for db in &args.db.databases {
                if db.backend == crate::host::sql::Backend::Postgres && pg.same_database_and_role(&db.target) {
                    bail!(
                        "--db {}: {} is --source's database and role: a plugin granted it could read and rewrite \
                         every job in the store; give the store a role of its own (docs/postgres.md)",
                        db.label(),
                        db.redacted()
                    );
                }
            }
            crate::pg::schema::check(&pg).await?;
            Store::Postgres {
                pg: Box::new(pg),
                lease,
            }
        }
    };
    let options = RunOptions {
        shards,
        store,
        plugins: args.source.dir()?,
        data_dir: cli.data_dir.clone(),
        cache: args.source.cache(&cli.data_dir),
        queues: args.queues.clone(),
        concurrency: args.concurrency,
        shutdown_timeout: seconds(args.timeout, "--timeout")?,
        fetch: args.fetch,
        tag: args.tag.clone(),
        limits: Limits {
            memory: args.memory,
            timeout: seconds(args.job_timeout, "--job-timeout")?,
        },
        disk: args.disk as u64,
        keep_resident: args.keep_resident,
        fuel: args.fuel,
        poll_interval: seconds(args.poll_interval, "--poll-interval")?.max(Duration::from_millis(10)),
        max_recoveries: args.max_recoveries,
        max_payload: args.max_payload,
        sidekiq_cancels: args.sidekiq_cancels,
        dead: DeadCaps {
            max_jobs: args.dead_max_jobs,
            timeout: seconds(args.dead_days * 86_400.0, "--dead-days")?,
        },
        databases: args.db.databases.clone(),
        metrics_addr: args.metrics_addr,
        web,
        metrics: !args.no_metrics,
        exit_when_empty: args.exit_when_empty,
        tracing: tracing.clone(),
    };
    let summary = runner::run(options).await;
    // Whether the run ended well or not, the spans it made are sent.
    if let Some(tracing) = tracing {
        tracing.shutdown().await;
    }
    let summary = summary?;
    eprint!("\nwasmjobs run summary\n{}", summary.table());
    if let Some(path) = &args.summary_json {
        let json = serde_json::to_string_pretty(&summary).context("encoding the run summary")?;
        std::fs::write(path, json + "\n").with_context(|| format!("cannot write --summary-json {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
