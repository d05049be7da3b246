//! The per-job store state, and the narrow views host capabilities get of it.
//!
//! A [`JobState`] is built for one job and dropped with its store. Each
//! capability sees only its part: wasmtime-wasi through [`WasiView`] (WASI
//! context + resource table), wasmtime-wasi-http through [`WasiHttpView`]
//! (HTTP context + policy hook + table), the `log` import through the
//! [`LogSink`], the `sql` import through its [`SqlView`] (the runner's
//! databases as the plugin's grants filter them), the budgeted
//! `wasi:filesystem/types` through a [`BudgetedFs`] (wasmtime-wasi's view
//! plus the job's [`JobDisk`]), and Wasmtime's resource accounting through
//! [`MemoryLimiter`].

use std::sync::Arc;

use anyhow::Result;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::host::disk::{BudgetedFs, DiskBudget, JobDisk};
use crate::host::files;
use crate::host::http::HttpPolicy;
use crate::host::log::{LogSink, Source};
use crate::host::sql::{Databases, SqlView};
use crate::plugin::Manifest;

/// Everything a job's store holds.
pub struct JobState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    http_policy: HttpPolicy,
    pub(crate) log: LogSink,
    pub(crate) sql: SqlView,
    pub(crate) limiter: MemoryLimiter,
    /// The job's share of its plugin's disk budget. Last, so it is dropped
    /// after the table has closed the job's files.
    disk: Option<Arc<JobDisk>>,
}

impl JobState {
    /// State for one job of the plugin described by `manifest`: its
    /// preopens and granted environment variables, no arguments, stdin
    /// closed, stdout/stderr into `log`, outgoing HTTP through `http_policy`,
    /// SQL to the `databases` the manifest grants.
    pub fn new(
        manifest: &Manifest,
        log: LogSink,
        memory_limit: usize,
        http_policy: HttpPolicy,
        databases: &Arc<Databases>,
    ) -> Result<Self> {
        let mut builder = WasiCtxBuilder::new();
        // File calls run on the job's own worker thread instead of a
        // `spawn_blocking` hop each: on a local disk the call is a few µs
        // and the hop cost more than it (FileAppendJob 16k → 23k jobs/s,
        // docs/performance.md). A slow network filesystem holds that worker
        // for the call; the other workers steal its queued tasks meanwhile.
        builder
            .stdout(log.stream(Source::Stdout))
            .stderr(log.stream(Source::Stderr))
            .allow_blocking_current_thread(true);
        for name in &manifest.env {
            if let Ok(value) = std::env::var(name) {
                builder.env(name, value);
            }
        }
        files::preopen(&mut builder, manifest)?;
        Ok(Self {
            wasi: builder.build(),
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            http_policy,
            log,
            sql: SqlView::new(databases.clone(), manifest),
            limiter: MemoryLimiter::new(memory_limit),
            disk: None,
        })
    }

    /// Charges the job's writes to its plugin's read-write directories to
    /// `budget`.
    pub fn with_disk(mut self, budget: Option<&Arc<DiskBudget>>) -> Self {
        self.disk = budget.map(|budget| Arc::new(JobDisk::new(budget.clone())));
        self
    }

    /// Why the job's writes were refused for lack of space, if they were.
    pub fn disk_note(&self) -> Option<String> {
        self.disk.as_ref().and_then(|disk| disk.note())
    }

    /// The view the budgeted `wasi:filesystem/types` works on.
    pub(crate) fn budgeted_fs(&mut self) -> BudgetedFs<'_> {
        BudgetedFs {
            fs: wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            disk: self.disk.as_ref(),
        }
    }
}

impl WasiView for JobState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
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
pub struct MemoryLimiter {
    limit: usize,
    /// The size a refused growth asked for.
    pub(crate) refused: Option<usize>,
}

/// Most table elements per table: generous for any real guest, small enough
/// that a table bomb cannot hurt the host.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        Self { limit, refused: None }
    }

    /// The memory limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = Some(desired);
            wasmtime::bail!(
                "memory limit of {} exceeded: the guest asked for {}",
                mib(self.limit),
                mib(desired)
            );
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            wasmtime::bail!("table limit of {MAX_TABLE_ELEMENTS} elements exceeded: the guest asked for {desired}");
        }
        Ok(true)
    }
}

/// Bytes as MiB with one decimal, for messages.
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
