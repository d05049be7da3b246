//! The per-job store state, and the narrow views host capabilities get of it.
//!
//! A [`JobState`] is built for one job and dropped with its store. Each
//! capability sees only its part: wasmtime-wasi through [`WasiView`] (WASI
//! context + resource table), wasmtime-wasi-http through [`WasiHttpView`]
//! (HTTP context + policy hook + table), and ours through [`HostView`]: the
//! `log` import the [`LogSink`], the `sql` import its [`SqlView`] (the
//! runner's databases as the plugin's grants filter them), the `activejob`
//! import its [`ActiveJobView`], the budgeted `wasi:filesystem/types` a
//! [`BudgetedFs`] (wasmtime-wasi's view plus the job's [`JobDisk`] and,
//! when traced, its [`JobTrace`]). Wasmtime's resource accounting goes
//! through [`MemoryLimiter`]. What the job may reach comes from its plugin
//! version's [`Grants`].
//!
//! The WASI context is built when the job first calls WASI, not with the
//! state: a job that never does (a Rust guest that neither prints, reads
//! its environment nor touches a file or a clock) does not pay for one,
//! and building it (stdio, environment, two random generators seeded from
//! the OS) was ~3.5% of a NoopJob's CPU. Only a plugin with granted
//! directories has its context built at once, as opening them can fail
//! and that failure belongs at the job's start.
//!
//! An instance that runs several jobs at once (`[instances] concurrent`)
//! has one store for all of them: the WASI context, table, disk share and
//! limiter are the instance's, and each job's log sink, HTTP policy and SQL
//! view live in a [`JobScope`] keyed by the job's guest task, which the
//! `async-plugin` imports look up from the calling task
//! (`crate::host::scoped`).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use wasmtime::ResourceLimiter;
use wasmtime::component::GuestTaskId;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::host::activejob::ActiveJobView;
use crate::host::disk::{BudgetedFs, JobDisk};
use crate::host::files;
use crate::host::http::HttpPolicy;
use crate::host::log::{LogSink, Source};
use crate::host::sql::{Databases, SqlView};
use crate::host::{Grants, HostView, JobScope};
use crate::otel::JobTrace;
use crate::size::mib;

/// Everything a job's store holds.
pub struct JobState {
    wasi: LazyWasi,
    table: ResourceTable,
    http: WasiHttpCtx,
    http_policy: HttpPolicy,
    pub(crate) log: LogSink,
    pub(crate) sql: SqlView,
    /// The job's ActiveJob context (none for a plain job).
    pub(crate) activejob: ActiveJobView,
    pub(crate) limiter: MemoryLimiter,
    /// The jobs running in a concurrent instance, by their `perform` task,
    /// each with its number in the instance (empty for an instance that
    /// runs one job at a time). A finished job's task id is reused by a new
    /// job, sometimes before the old job's end is handled: the number tells
    /// whose scope an entry is, so only that job's is removed.
    pub(crate) scopes: HashMap<GuestTaskId, (u64, JobScope)>,
    /// The job's trace, while it is sampled: its file opens get spans (its
    /// HTTP policy and SQL view carry their own copy).
    trace: Option<JobTrace>,
    /// The job's share of its plugin's disk budget. Last, so it is dropped
    /// after the table has closed the job's files.
    disk: Option<Arc<JobDisk>>,
}

impl JobState {
    /// State for one job (or one concurrent instance) of the plugin version
    /// granted `grants`: its preopens and granted environment variables, no
    /// arguments, stdin closed, stdout/stderr into `log`, outgoing HTTP
    /// through `http_policy`, SQL to the `databases` it is granted, writes
    /// charged to its disk budget.
    pub fn new(
        grants: &Grants,
        log: LogSink,
        memory_limit: usize,
        http_policy: HttpPolicy,
        databases: &Arc<Databases>,
    ) -> Result<Self> {
        let built = match grants.files.is_empty() {
            // Nothing left that can fail: built at the first WASI call.
            true => None,
            false => {
                let mut builder = wasi_builder(&log, &grants.env);
                files::preopen(&mut builder, &grants.manifest, &grants.files, &grants.handles)?;
                Some(Box::new(builder.build()))
            }
        };
        Ok(Self {
            wasi: LazyWasi {
                built,
                env: grants.env.clone(),
            },
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            http_policy,
            log,
            sql: SqlView::new(databases.clone(), grants),
            activejob: ActiveJobView::default(),
            limiter: MemoryLimiter::new(memory_limit),
            scopes: HashMap::new(),
            trace: None,
            disk: job_disk(grants),
        })
    }

    /// For a job that failed with `message`: which of its requests
    /// `http.allow` refused, if one was and the message does not say so.
    pub(crate) fn http_note(&self, message: &str) -> Option<String> {
        self.http_policy.denied_note(message)
    }

    /// Why the job's writes were refused for lack of space, if they were.
    pub fn disk_note(&self) -> Option<String> {
        self.disk.as_ref().and_then(|disk| disk.note())
    }

    /// Readies the state of a warm instance for its next job: that job's
    /// HTTP policy (fresh counters and request slots), SQL view and disk
    /// share, and a clear memory-limit verdict. The log sink is restarted
    /// by the caller (the guest's stdio streams share it); the WASI context
    /// (env, preopens, stdio) and the resource table are the instance's.
    pub(crate) fn next_job(&mut self, grants: &Grants, http_policy: HttpPolicy, databases: &Arc<Databases>) {
        self.http_policy = http_policy;
        self.sql = SqlView::new(databases.clone(), grants);
        self.disk = job_disk(grants);
        self.limiter.refused = None;
    }

    /// Gives the job's host calls its trace (recording only: see
    /// `crate::otel::host`), or none; the SQL view's and the file spans'.
    pub(crate) fn set_trace(&mut self, trace: Option<JobTrace>) {
        self.sql.set_trace(trace.clone());
        self.trace = trace;
    }
}

/// A job's WASI context, built at its first WASI call unless its plugin
/// has directories to open.
struct LazyWasi {
    /// Boxed: it is large, and the state moves into its store.
    built: Option<Box<WasiCtx>>,
    /// The granted environment, for the build.
    env: Arc<[(String, String)]>,
}

impl LazyWasi {
    /// The context, built now with its stdio into `log` if there is none
    /// yet (its plugin has no directories to open: nothing can fail).
    fn get(&mut self, log: &LogSink) -> &mut WasiCtx {
        self.built
            .get_or_insert_with(|| Box::new(wasi_builder(log, &self.env).build()))
    }
}

/// A WASI context's builder for a job logging to `log` with the granted
/// environment `env`: no arguments, stdin closed, no directories yet.
fn wasi_builder(log: &LogSink, env: &[(String, String)]) -> WasiCtxBuilder {
    let mut builder = WasiCtxBuilder::new();
    // File calls run on the job's own worker thread instead of a
    // `spawn_blocking` hop each: on a local disk the call is a few µs and
    // the hop cost more than it (FileAppendJob 16k → 23k jobs/s,
    // docs/performance.md). A slow network filesystem holds that worker for
    // the call; the other workers steal its queued tasks meanwhile.
    builder
        .stdout(log.stream(Source::Stdout))
        .stderr(log.stream(Source::Stderr))
        .allow_blocking_current_thread(true);
    for (name, value) in env {
        builder.env(name, value);
    }
    builder
}

/// A job's share of its plugin's disk budget, if the plugin has one.
fn job_disk(grants: &Grants) -> Option<Arc<JobDisk>> {
    grants
        .disk
        .as_ref()
        .map(|budget| Arc::new(JobDisk::new(budget.clone())))
}

impl HostView for JobState {
    fn http_policy(&mut self) -> &mut HttpPolicy {
        &mut self.http_policy
    }

    fn log_sink(&mut self) -> &mut LogSink {
        &mut self.log
    }

    fn sql(&mut self) -> &mut SqlView {
        &mut self.sql
    }

    fn activejob(&mut self) -> &mut ActiveJobView {
        &mut self.activejob
    }

    fn budgeted_fs(&mut self) -> BudgetedFs<'_> {
        BudgetedFs {
            fs: wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.get(&self.log).filesystem(),
                table: &mut self.table,
            },
            disk: self.disk.as_ref(),
            trace: self.trace.as_ref(),
        }
    }

    fn scope(&mut self, task: GuestTaskId) -> Option<&mut JobScope> {
        self.scopes.get_mut(&task).map(|(_, scope)| scope)
    }
}

impl WasiView for JobState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: self.wasi.get(&self.log),
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for JobState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_policy,
        }
    }
}

/// Caps a job's linear memory and tables, and remembers when it refused, so
/// the job fails with "memory limit exceeded" rather than a bare trap.
///
/// The limits bound the **sum** over every memory (and every table) of the
/// instance: a component is several core instances, each with its own
/// memory, and a per-memory check would let a guest hold the limit times
/// the number of memories. Wasmtime reports each growth as `current` →
/// `desired` of one memory (`current` is 0 when a memory is created at
/// instantiation), so the running total grows by the difference.
pub struct MemoryLimiter {
    limit: usize,
    /// Bytes of linear memory the instance holds, over all its memories.
    memory: usize,
    /// Table elements the instance holds, over all its tables.
    elements: usize,
    /// The growth (memory bytes, table elements) granted last, taken back
    /// if Wasmtime then fails to perform it.
    pending: (usize, usize),
    /// The total size a refused growth asked for.
    pub(crate) refused: Option<usize>,
}

/// Most table elements per instance, over all its tables: generous for any
/// real guest, small enough that a table bomb cannot hurt the host.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            memory: 0,
            elements: 0,
            pending: (0, 0),
            refused: None,
        }
    }

    /// The memory limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let total = self.memory.saturating_add(growth);
        if total > self.limit {
            self.refused = Some(total);
            self.pending = (0, 0);
            wasmtime::bail!(
                "memory limit of {} exceeded: the guest asked for {} in all",
                mib(self.limit),
                mib(total)
            );
        }
        self.memory = total;
        self.pending = (growth, 0);
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory = self.memory.saturating_sub(self.pending.0);
        self.pending = (0, 0);
        Ok(())
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let total = self.elements.saturating_add(growth);
        if total > MAX_TABLE_ELEMENTS {
            self.pending = (0, 0);
            wasmtime::bail!(
                "table limit of {MAX_TABLE_ELEMENTS} elements exceeded: the guest asked for {total} in all"
            );
        }
        self.elements = total;
        self.pending = (0, growth);
        Ok(true)
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.elements = self.elements.saturating_sub(self.pending.1);
        self.pending = (0, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::files::{Handles, Mode, Preopen};
    use crate::host::http::{HttpClient, HttpLimits};
    use crate::host::log::JobLabels;

    /// A job's state under grants of `env` and `files` (none opened).
    fn state(env: &[(&str, &str)], files: Vec<Preopen>) -> Result<JobState> {
        let grants = Grants {
            plugin: "x".into(),
            manifest: std::path::Path::new("/p/x/wasmjobs.toml").into(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            files,
            handles: Handles::default(),
            sql: Default::default(),
            log: Default::default(),
            http_allow: Arc::default(),
            http_stats: Arc::default(),
            http_pools: Arc::default(),
            disk: None,
        };
        let log = LogSink::new(JobLabels::default(), true, grants.log);
        let http = HttpPolicy::new(
            Arc::new(HttpClient::new(HttpLimits::default())),
            grants.http_pools.clone(),
            grants.http_allow.clone(),
            grants.http_stats.clone(),
            log.clone(),
        );
        JobState::new(&grants, log, 1 << 20, http, &Databases::empty())
    }

    #[test]
    fn the_wasi_context_is_built_at_the_first_wasi_call() {
        let mut state = state(&[("REGION", "eu")], Vec::new()).unwrap();
        assert!(state.wasi.built.is_none(), "a job that never calls WASI builds none");
        let _ = WasiView::ctx(&mut state);
        let first: *const WasiCtx = &**state.wasi.built.as_ref().expect("built by the call");
        let _ = state.budgeted_fs();
        let again: *const WasiCtx = &**state.wasi.built.as_ref().expect("still there");
        assert_eq!(first, again, "built once, then kept");
    }

    #[test]
    fn a_plugin_with_directories_opens_them_when_the_job_starts() {
        // Its directories were not opened at load (no handles here): the
        // job's start says so, rather than its first file call.
        let data = Preopen {
            host: "/p/x/data".into(),
            guest: "/data".into(),
            mode: Mode::ReadOnly,
            outside: false,
        };
        let err = state(&[], vec![data]).err().expect("the directories cannot be opened");
        assert!(
            format!("{err:#}").contains("not opened when the plugin loaded"),
            "{err:#}"
        );
    }

    #[test]
    fn memory_limit_bounds_the_sum_of_all_memories() {
        let mut limiter = MemoryLimiter::new(4 << 20);
        assert!(limiter.memory_growing(0, 3 << 20, None).unwrap());
        // A second memory of 3 MiB would make 6 MiB in all.
        assert!(limiter.memory_growing(0, 3 << 20, None).is_err());
        assert_eq!(limiter.refused, Some(6 << 20));
        // Growing the first memory by 1 MiB still fits.
        assert!(limiter.memory_growing(3 << 20, 4 << 20, None).unwrap());
        assert!(limiter.memory_growing(4 << 20, (4 << 20) + 1, None).is_err());
    }

    #[test]
    fn a_failed_growth_is_taken_back() {
        let mut limiter = MemoryLimiter::new(4 << 20);
        assert!(limiter.memory_growing(0, 3 << 20, None).unwrap());
        limiter.memory_grow_failed(wasmtime::format_err!("no room")).unwrap();
        assert!(limiter.memory_growing(0, 4 << 20, None).unwrap());
    }

    #[test]
    fn table_limit_bounds_the_sum_of_all_tables() {
        let mut limiter = MemoryLimiter::new(4 << 20);
        assert!(limiter.table_growing(0, 600_000, None).unwrap());
        assert!(limiter.table_growing(0, 600_000, None).is_err());
        assert!(limiter.table_growing(600_000, 1_000_000, None).unwrap());
        limiter.table_grow_failed(wasmtime::format_err!("no room")).unwrap();
        assert!(
            limiter.table_growing(0, 400_000, None).unwrap(),
            "the failed growth is taken back"
        );
        assert!(limiter.table_growing(0, 1, None).is_err());
    }
}
