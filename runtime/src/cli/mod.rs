//! The `wasmjobs` command line.
//!
//! - `wasmjobs run --plugins DIR`: the job runner ([`run`]).
//! - `wasmjobs enqueue CLASS [ARGS_JSON]` / `wasmjobs stats`: push jobs and
//!   read the state, Sidekiq-compatible ([`enqueue`], [`stats`]).
//! - `wasmjobs cancel JID...`, `wasmjobs pause|resume QUEUE...`: stop jobs
//!   wherever they are, stop and start fetching from queues, in every
//!   process ([`cancel`], [`pause`]).
//! - `wasmjobs limits`: what the cluster-wide limits are doing ([`limits`]).
//! - `wasmjobs exec --plugins DIR CLASS [ARGS_JSON]`: run one job through
//!   the executor and print its log lines, outcome and duration ([`exec`]).
//! - `wasmjobs plugins --plugins DIR`: list what a plugins directory holds
//!   and why any plugin was refused ([`plugins`]).
//! - `wasmjobs schedule`: the cron schedules in Redis and their next run
//!   ([`schedule`]).
//! - `wasmjobs new rust|python|js DIR` / `wasmjobs build DIR`: a first
//!   plugin from a template, built with the pinned toolchain, from
//!   anywhere ([`new`], [`build`]).
//!
//! Exit status: 0 on success, 1 when a job failed or a plugin is broken,
//! 2 on a usage or setup error, 3 when `enqueue` refused a duplicate of a
//! unique job.

pub mod build;
mod build_dev;
mod build_stop;
mod build_watch;
pub mod cancel;
pub mod enqueue;
pub mod env;
pub mod exec;
mod fleet;
pub mod limits;
pub mod migrate;
pub mod new;
pub mod pause;
pub mod plugins;
mod project;
pub mod run;
pub mod schedule;
mod sdk;
mod sources;
pub mod stats;
pub mod web;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::plugin::{Catalog, CompileCache};
use crate::sandbox::{EngineConfig, Executor};
use crate::telemetry::{self, LogFormat};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(
    name = "wasmjobs",
    version,
    about = "Background jobs as sandboxed WebAssembly components"
)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Where wasmjobs keeps its state (the embedded Redis, the compilation
    /// cache, ...). Default: the nearest `.wasmjobs` directory in the
    /// current directory or a parent, else a new `./.wasmjobs`.
    #[arg(long = "data-dir", global = true, env = "WASMJOBS_DATA_DIR", value_name = "DIR")]
    pub data_dir_option: Option<PathBuf>,
    /// The data directory in use (absolute), set by [`main`] from
    /// `--data-dir` or the search up the tree.
    #[arg(skip)]
    pub data_dir: PathBuf,
    /// How it was chosen.
    #[arg(skip)]
    pub(crate) data: project::DataDir,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run jobs from Redis (Sidekiq format) until stopped.
    Run(run::RunArgs),
    /// Run one job through the sandbox and print its logs and outcome.
    Exec(exec::ExecArgs),
    /// List the plugins in a directory and check each one.
    Plugins(plugins::PluginsArgs),
    /// Push jobs into Redis, in Sidekiq's format (or into PostgreSQL with --source).
    Enqueue(enqueue::EnqueueArgs),
    /// Create or upgrade the PostgreSQL job store's schema (idempotent).
    Migrate(migrate::MigrateArgs),
    /// Show queues, counters, live processes (of wasmjobs or Sidekiq) and cluster limits.
    Stats(stats::StatsArgs),
    /// Cancel jobs: take them out of their queue, schedule or retry set, or stop them where they run.
    Cancel(cancel::CancelArgs),
    /// Stop fetching from queues in every process (no queue: list the paused ones).
    Pause(pause::PauseArgs),
    /// Start fetching from paused queues again.
    Resume(pause::PauseArgs),
    /// Show what the cluster-wide limits are doing: starts, leases, jobs rescheduled.
    Limits(limits::LimitsArgs),
    /// Create a plugin directory ready to build: rust, python or js.
    New(new::NewArgs),
    /// Build a plugin directory's component (installing its toolchain on first use).
    Build(build::BuildArgs),
    /// List the cron schedules in Redis (plugins' and sidekiq-cron's) with their next run.
    Schedule(schedule::ScheduleArgs),
    /// Serve the dashboard: queues, retries, dead jobs, processes, cron, live counts.
    Web(web::WebArgs),
    /// Print the REDIS_URL (and data directory) this project's commands use, for another program: `eval "$(wasmjobs env)"`.
    Env(env::EnvArgs),
}

impl Command {
    /// The command's Redis options, if it talks to Redis.
    fn redis(&self) -> Option<&RedisArgs> {
        match self {
            Command::Run(a) => Some(&a.redis),
            Command::Enqueue(a) => a.jobs_source.is_none().then_some(&a.redis),
            Command::Stats(a) => Some(&a.redis),
            Command::Cancel(a) => Some(&a.redis),
            Command::Pause(a) | Command::Resume(a) => Some(&a.redis),
            Command::Limits(a) => Some(&a.redis),
            Command::Schedule(a) => Some(&a.redis),
            Command::Web(a) => Some(&a.redis),
            Command::Env(a) => Some(&a.redis),
            Command::Exec(_) | Command::Plugins(_) | Command::New(_) | Command::Build(_) | Command::Migrate(_) => None,
        }
    }

    /// The plugins directory the command loads, if it loads one: where
    /// its project's data directory is looked for first
    /// ([`project::DataDir::resolve`]).
    fn plugins_dir(&self) -> Option<&std::path::Path> {
        match self {
            Command::Run(args) => Some(&args.source.plugins),
            Command::Exec(args) => Some(&args.source.plugins),
            Command::Plugins(args) => Some(&args.source.plugins),
            _ => None,
        }
    }

    /// Whether the command compiles plugins (into the data directory's
    /// compilation cache).
    fn compiles_plugins(&self) -> bool {
        match self {
            Command::Run(_) | Command::Exec(_) | Command::Plugins(_) | Command::Build(_) => true,
            Command::Enqueue(_)
            | Command::Migrate(_)
            | Command::Stats(_)
            | Command::Cancel(_)
            | Command::Pause(_)
            | Command::Resume(_)
            | Command::Limits(_)
            | Command::Schedule(_)
            | Command::Web(_)
            | Command::Env(_)
            | Command::New(_) => false,
        }
    }
}

/// Where Redis is; shared by every command that talks to it.
#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    /// Redis URL (`redis://host:6379/0`, `unix:///path/redis.sock`). Without
    /// it, wasmjobs uses (and if needed starts) its private redis-server in
    /// the data directory.
    #[arg(long = "redis", env = "REDIS_URL", hide_env_values = true)]
    pub url: Option<String>,
    /// Another Redis server holding the queues routed to it (`--route`),
    /// each a complete Sidekiq keyspace; `--redis` is the shard named
    /// `default`, holding every queue routed nowhere (docs/shards.md).
    /// Repeatable; the env variable takes several, space-separated.
    #[arg(
        long = "shard",
        value_name = "NAME=URL",
        env = "WASMJOBS_SHARDS",
        hide_env_values = true,
        value_delimiter = ' ',
        value_parser = Secret::<crate::redis::shards::ShardSpec>::new("--shard (or WASMJOBS_SHARDS)")
    )]
    pub shards: Vec<crate::redis::shards::ShardSpec>,
    /// Queues that live on shard SHARD (`--shard`). Repeatable; the env
    /// variable takes several, space-separated.
    #[arg(
        long = "route",
        value_name = "QUEUE[,QUEUE...]=SHARD",
        env = "WASMJOBS_ROUTES",
        value_delimiter = ' '
    )]
    pub routes: Vec<crate::redis::shards::RouteSpec>,
}

impl RedisArgs {
    /// The Redis target these options select: the default shard.
    pub fn target(&self, data_dir: &std::path::Path) -> crate::redis::Target {
        crate::redis::Target::from_options(self.url.as_deref(), data_dir)
    }

    /// Every shard and which queues each holds.
    pub fn shard_map(&self, data_dir: &std::path::Path) -> Result<crate::redis::shards::ShardMap> {
        crate::redis::shards::ShardMap::new(self.target(data_dir), &self.shards, &self.routes)
    }
}

/// The runner's SQL databases; shared by the commands that run jobs.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// A database plugins may use if their manifest grants NAME
    /// (`sql = ["NAME"]`): `NAME=postgres://user:pass@host/db?pool=20` or
    /// `NAME=sqlite://file.db` (under the data directory; `sqlite:///abs`
    /// for an absolute path). `NAME@PLUGIN=URL` is NAME for the plugin in
    /// directory PLUGIN only, with its own credentials and pool (on
    /// PostgreSQL, a role per plugin keeps plugins out of each other's
    /// sessions). Repeatable; the env variable takes several,
    /// space-separated. URL parameters `pool`, `timeout` (seconds),
    /// `max_rows` and `max_bytes` are wasmjobs's (docs/sql.md).
    #[arg(
        long = "db",
        value_name = "NAME[@PLUGIN]=URL",
        env = "WASMJOBS_DB",
        hide_env_values = true,
        value_delimiter = ' ',
        value_parser = Secret::<crate::host::sql::DbSpec>::new("--db (or WASMJOBS_DB)")
    )]
    pub databases: Vec<crate::host::sql::DbSpec>,
}

/// Parses a value that may hold a password (`--db`, `--shard`). An
/// invalid one is reported with the reason alone: clap's own message
/// repeats the value, password and all.
#[derive(Debug)]
struct Secret<T> {
    /// The flag and its env variable, for the message.
    flag: &'static str,
    parsed: std::marker::PhantomData<fn() -> T>,
}

impl<T> Secret<T> {
    const fn new(flag: &'static str) -> Self {
        Self {
            flag,
            parsed: std::marker::PhantomData,
        }
    }
}

impl<T> Clone for Secret<T> {
    fn clone(&self) -> Self {
        Self::new(self.flag)
    }
}

impl<T> clap::builder::TypedValueParser for Secret<T>
where
    T: std::str::FromStr<Err = anyhow::Error> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let invalid = |reason: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid {} value: {reason}\n", self.flag),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| invalid("it is not UTF-8".to_owned()))?;
        text.parse()
            .map_err(|error: anyhow::Error| invalid(format!("{error:#}")))
    }
}

/// The compilation cache every command using `data_dir` shares (so what
/// `build`, `plugins` or `exec` compiled, `run` loads).
fn data_cache(data_dir: &std::path::Path) -> CompileCache {
    CompileCache::new(data_dir.join("cache"))
}

/// Where plugins come from; shared by the commands that load them.
#[derive(Debug, Clone, Args)]
pub struct PluginSource {
    /// The plugins directory (each plugin a subdirectory with a wasmjobs.toml).
    #[arg(long, env = "WASMJOBS_PLUGINS", default_value = "./plugins")]
    pub plugins: PathBuf,
    /// Compile every component instead of using the on-disk cache.
    #[arg(long)]
    pub no_cache: bool,
}

impl PluginSource {
    /// The plugins directory as an absolute path (not resolving symlinks),
    /// as every command uses it: the watcher reports absolute paths, and a
    /// plugin is named after its directory, which `.` does not have.
    pub fn dir(&self) -> Result<PathBuf> {
        crate::plugin::catalog::absolute_dir(&self.plugins)
    }

    /// The compilation cache under `data_dir`, unless disabled.
    pub fn cache(&self, data_dir: &std::path::Path) -> CompileCache {
        if self.no_cache {
            CompileCache::disabled()
        } else {
            data_cache(data_dir)
        }
    }

    /// An executor sized for `concurrency` and the catalog of this source;
    /// `protected` are the values no plugin's `env` may pass on
    /// ([`crate::runner::protected_env`]).
    pub fn load(
        &self,
        data_dir: &std::path::Path,
        config: &EngineConfig,
        protected: crate::redact::Secrets,
    ) -> Result<(Executor, Catalog)> {
        self.load_serving(data_dir, config, protected, None)
    }

    /// [`PluginSource::load`], compiling only the plugins that serve
    /// `class` when it is given.
    pub fn load_serving(
        &self,
        data_dir: &std::path::Path,
        config: &EngineConfig,
        protected: crate::redact::Secrets,
        class: Option<&str>,
    ) -> Result<(Executor, Catalog)> {
        let executor = Executor::new(config)?.protect_env(protected);
        let catalog = Catalog::load_serving(&self.dir()?, &executor, &self.cache(data_dir), class)?;
        Ok((executor, catalog))
    }
}

/// Parses the command line, runs the command, and maps the result to an
/// exit status.
pub fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let cwd = match std::env::current_dir() {
        Ok(cwd) => cwd,
        Err(err) => {
            eprintln!("error: cannot read the current directory: {err}");
            return ExitCode::from(2);
        }
    };
    cli.data = project::DataDir::resolve(cli.data_dir_option.as_deref(), &cwd, cli.command.plugins_dir());
    cli.data_dir = cli.data.path.clone();
    // Said only when the command makes something there: its Redis (no
    // URL given) or the compilation cache (commands that load plugins).
    let embedded = !matches!(cli.command, Command::Env(_))
        && cli
            .command
            .redis()
            .is_some_and(|r| r.url.as_deref().is_none_or(|u| u.trim().is_empty()));
    if (embedded || cli.command.compiles_plugins())
        && let Some(notice) = cli.data.notice(embedded)
    {
        eprintln!("{notice}");
    }
    let default_filter = match cli.command {
        // `exec` prints the job's log lines and outcome itself.
        Command::Exec(_) => "warn,wasmjobs::compile=info,wasmjobs::guest=off,wasmjobs::sandbox=error",
        Command::Run(_) => "info",
        Command::Plugins(_) | Command::Build(_) => "warn,wasmjobs::compile=info",
        Command::Enqueue(_)
        | Command::Migrate(_)
        | Command::Stats(_)
        | Command::New(_)
        | Command::Cancel(_)
        | Command::Pause(_)
        | Command::Resume(_)
        | Command::Schedule(_)
        | Command::Limits(_)
        | Command::Env(_) => "warn",
        Command::Web(_) => "warn,wasmjobs::web=info",
    };
    telemetry::init(cli.log_format, default_filter);
    let result = match &cli.command {
        Command::Run(args) => {
            runtime_with(args.threads.map(usize::from)).and_then(|rt| rt.block_on(run::run(&cli, args)))
        }
        Command::Exec(args) => runtime().and_then(|rt| rt.block_on(exec::run(&cli, args))),
        Command::Plugins(args) => plugins::run(&cli, args),
        Command::Enqueue(args) => runtime().and_then(|rt| rt.block_on(enqueue::run(&cli, args))),
        Command::Migrate(args) => runtime().and_then(|rt| rt.block_on(migrate::run(args))),
        Command::Stats(args) => runtime().and_then(|rt| rt.block_on(stats::run(&cli, args))),
        Command::Cancel(args) => runtime().and_then(|rt| rt.block_on(cancel::run(&cli, args))),
        Command::Pause(args) => runtime().and_then(|rt| rt.block_on(pause::run(&cli, args, true))),
        Command::Resume(args) => runtime().and_then(|rt| rt.block_on(pause::run(&cli, args, false))),
        Command::Limits(args) => runtime().and_then(|rt| rt.block_on(limits::run(&cli, args))),
        Command::New(args) => new::run(args),
        Command::Build(args) => build::run(&cli, args),
        Command::Schedule(args) => runtime().and_then(|rt| rt.block_on(schedule::run(&cli, args))),
        Command::Web(args) => runtime().and_then(|rt| rt.block_on(web::run(&cli, args))),
        Command::Env(args) => env::run(&cli, args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    runtime_with(None)
}

/// The async runtime, with `threads` worker threads (default: one per
/// core, or `TOKIO_WORKER_THREADS`).
fn runtime_with(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads);
    }
    builder.enable_all().build().context("cannot start the async runtime")
}
