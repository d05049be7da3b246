//! The job engine behind `wasmjobs run`, one small module per role in a
//! job's life (after Sidekiq's `lib/sidekiq/`):
//!
//! | module | role |
//! |---|---|
//! | [`launcher`] | start and stop: wiring only — connect, load plugins, start every loop below, shut down gracefully |
//! | [`source`] | the work protocol with Redis: fetch, wait, record, requeue, orphans, the dead set — reliable or basic behind one trait |
//! | [`fetch`] | the fetch loop: slots first, then as many jobs from the source; reconcile after a lost reply |
//! | [`manager`] | the worker pool: concurrency slots, one task per job, stop at a shutdown deadline |
//! | [`fetched`] | what passes between the source and the runner: a fetched job, a completion |
//! | [`unit`] | a unit of work: the job parsed once, finished or requeued through the writer |
//! | [`inflight`] | the jobs held and not yet recorded |
//! | [`processor`] | one job: dispatch to its plugin, run it in the sandbox, decide |
//! | [`job_retry`] | what a failure means: retry later, dead set, or drop (Sidekiq's retry policy) |
//! | [`limiter`] | cluster-wide rate and concurrency limits in Redis; a job over one is rescheduled |
//! | [`outcome`] | the writer: batches what units hand over, has the source record them |
//! | [`owed`] | the `stat:*` counters summed between writes, and when they are due |
//! | [`cancel`] | cancelled jobs: found at fetch, by message or by sweep; stopped where they are |
//! | [`control`] | the control channel: cancels and pauses announced to every process |
//! | [`scheduled`] | move due jobs from `schedule` and `retry` to their queues |
//! | [`cron`] | enqueue each tick of the cron schedules exactly once across processes |
//! | [`reloader`] | watch the plugins directory and swap new plugin versions in while jobs run |
//! | [`heartbeat`] | tell Redis (and the Sidekiq Web UI) we are alive; obey its signals |
//! | [`monitor`] | the process sampler, the `/metrics` endpoint, the `--exit-when-empty` check |
//! | [`summary`] | the table (and JSON) of what a run did, printed at exit |
//! | [`os_limits`] | raise the open-file limit, check the mapping limit, so thousands of jobs fit |
//!
//! A job's path: `source` → `fetch` → `manager` (slot, [`unit::UnitOfWork`])
//! → `processor` → sandbox → `job_retry` → `unit` → `outcome` → `source`
//! (recorded). `docs/redis-engine.md` draws the states a job goes through.

pub(crate) mod by_shard;
pub(crate) mod cancel;
pub(crate) mod control;
pub(crate) mod cron;
mod fetch;
pub(crate) mod fetched;
pub mod heartbeat;
pub(crate) mod inflight;
pub(crate) mod job_retry;
pub(crate) mod launcher;
pub(crate) mod limiter;
pub(crate) mod manager;
pub(crate) mod monitor;
pub(crate) mod neighbours;
pub mod os_limits;
pub(crate) mod outcome;
mod owed;
pub(crate) mod processor;
pub(crate) mod queues;
pub(crate) mod reloader;
pub(crate) mod scheduled;
pub(crate) mod shard;
pub(crate) mod source;
pub mod summary;
pub(crate) mod supervise;
pub(crate) mod unit;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

pub use launcher::run;
pub use queues::Queues;
pub use source::postgres::lease::DEFAULT_LEASE;
pub use source::{DeadCaps, FETCH_SCRIPT, FetchMode, Store};
pub use summary::RunSummary;
pub use supervise::set_fault_hook;

use crate::sandbox::Limits;

/// Everything `wasmjobs run` can be told.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where Redis is: the default shard and any others, and which
    /// queues each holds (one shard, the default, without `--shard`).
    pub shards: crate::redis::shards::ShardMap,
    /// Where jobs are kept: Redis (the default) or PostgreSQL.
    pub store: source::Store,
    /// The plugins directory.
    pub plugins: PathBuf,
    /// The data directory (SQLite files, embedded Redis).
    pub data_dir: PathBuf,
    /// The compilation cache (shared with reloads), or none.
    pub cache: crate::plugin::CompileCache,
    /// Queues to fetch from, and in what order.
    pub queues: Queues,
    /// Most jobs in flight at once.
    pub concurrency: u32,
    /// How long a graceful shutdown waits for jobs in flight.
    pub shutdown_timeout: Duration,
    /// At-least-once (reliable) or at-most-once (basic) fetch.
    pub fetch: FetchMode,
    /// A label shown in the heartbeat and the Web UI.
    pub tag: String,
    /// Per-job limits (memory, wall-clock); plugins may override them.
    pub limits: Limits,
    /// Default and cap of a plugin's `limits.disk`, bytes.
    pub disk: u64,
    /// Bytes of each job's memory reset in place between jobs (the
    /// engine's `keep_resident`).
    pub keep_resident: usize,
    /// Allow plugins with `limits.fuel` (only they are metered).
    pub fuel: bool,
    /// Average seconds between scheduled/retry polls (scaled by the number
    /// of processes, as Sidekiq does).
    pub poll_interval: Duration,
    /// A job found in the in-progress list of a dead process more than this
    /// many times is a poison pill and goes to the dead set.
    pub max_recoveries: u64,
    /// Bytes a job's payload may have (0: no limit); larger jobs go to the
    /// dead set unrun (`--max-payload`).
    pub max_payload: usize,
    /// Ruby clients cancel jobs by writing Sidekiq's keys
    /// (`cancelled-<jid>`, `it-<jid>`): every fetch looks them up
    /// (`--sidekiq-cancels`). Off, such a request stops a job that runs
    /// for longer than a second (the sweep).
    pub sidekiq_cancels: bool,
    /// What the dead set keeps (Sidekiq's `dead_max_jobs`, `dead_timeout_in_seconds`).
    pub dead: DeadCaps,
    /// The SQL databases plugins may use (`--db NAME=URL`), opened once and
    /// shared by every job.
    pub databases: Vec<crate::host::sql::DbSpec>,
    /// Where to serve `/metrics` and `/stats`, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where to serve the dashboard (`--web`), with the credentials it
    /// asks for, if anywhere.
    pub web: Option<(std::net::SocketAddr, crate::web::Access)>,
    /// Record per-job metrics (off: no histograms, no per-class summary).
    pub metrics: bool,
    /// Stop once every queue is empty and no job is in flight.
    pub exit_when_empty: bool,
    /// OpenTelemetry traces, if on (started and flushed by the caller).
    pub tracing: Option<std::sync::Arc<crate::otel::Tracing>>,
}

/// The runner's secrets that a plugin's `env` grant may not pass on: its
/// Redis URLs (`redis`: every shard's), the job store's URL (`store`) and
/// its PostgreSQL `--db` URLs, each as given and as the driver gets it,
/// with their passwords (SQLite targets are file names, not secrets).
pub fn protected_env<'a>(
    redis: impl IntoIterator<Item = &'a crate::redis::Target>,
    store: Option<&crate::pg::Pg>,
    databases: &[crate::host::sql::DbSpec],
) -> crate::redact::Secrets {
    let mut secrets = crate::redact::Secrets::default();
    for db in databases
        .iter()
        .filter(|db| db.backend == crate::host::sql::Backend::Postgres)
    {
        secrets.add_url(&db.url);
        secrets.add_url(&db.target);
    }
    for target in redis {
        if let crate::redis::Target::Url(url) = target {
            secrets.add_url(url);
        }
    }
    if let Some(pg) = store {
        secrets.add_url(pg.url());
    }
    secrets
}
