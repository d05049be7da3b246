//! Host capabilities: what a guest can import, each in its own module.
//!
//! Every capability sees only its own slice of the per-job store state
//! through a narrow view ([`view::HostView`]), as wasmtime-wasi does, and
//! reads what the plugin may do from its [`grants::Grants`], built once per
//! plugin version; nothing here knows the embedder's store type or the
//! plugin's manifest. [`files`] builds the filesystem preopens a manifest grants, [`http`]
//! is the outgoing-request policy, [`log`] routes guest log lines and stdio
//! into `tracing`, [`sql`] reaches the runner's databases the manifest
//! grants, [`disk`] holds the read-write preopens to the plugin's
//! `limits.disk`, [`activejob`] gives an ActiveJob job its context. [`link`] assembles them into the one [`Linker`] shared by
//! every plugin of the `plugin` world; [`link_concurrent`] does the same
//! for the `async-plugin` world, whose HTTP, SQL and log imports find
//! their job from the calling task (`scoped`).
//!
//! Nothing is granted by default: no preopens, no environment variables, no
//! databases, no sockets (wasmtime-wasi denies TCP/UDP unless allowed), stdin closed.
//!
//! With tracing on, the views also carry the job's trace context
//! (`crate::otel::JobTrace`): HTTP requests, SQL statements and file opens
//! get child spans of the job span, and HTTP requests a `traceparent`.

pub mod activejob;
pub mod disk;
pub(crate) mod file_hint;
pub mod files;
pub mod grants;
pub mod http;
pub mod log;
pub(crate) mod net_hint;
pub(crate) mod scoped;
pub mod sql;
pub mod view;

use anyhow::Result;
use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};

pub use grants::{Grants, SqlGrants};
pub use view::{HostView, JobScope};

/// The linker with every import of the `wasmjobs:job/plugin` world.
///
/// Built once per engine; pre-linking each plugin against it
/// (`Linker::instantiate_pre`) resolves imports at load time, so a job only
/// pays for instantiation.
pub fn link<T: HostView>(engine: &Engine) -> Result<Linker<T>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    link_budgeted_fs(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    crate::bindings::http::add_to_linker::<T, HasSelf<http::HttpPolicy>>(&mut linker, T::http_policy)?;
    crate::bindings::log::add_to_linker::<T, HasSelf<log::LogSink>>(&mut linker, T::log_sink)?;
    crate::bindings::sql::add_to_linker::<T, HasSelf<sql::SqlView>>(&mut linker, T::sql)?;
    crate::bindings::activejob::add_to_linker::<T, HasSelf<activejob::ActiveJobView>>(&mut linker, T::activejob)?;
    Ok(linker)
}

/// The linker with every import of the `wasmjobs:job/async-plugin` world,
/// for the engine of plugins that run several jobs per instance: WASI as
/// for `plugin` (its calls hold the instance while they run), no
/// `wasi:http`, and `async-http`, `async-sql`, `log` and `activejob` resolved per job
/// ([`scoped`]). The synchronous `http` and `sql` come along because the
/// async ones use their types (and toolchains import a used interface
/// whole); they work, under the plugin's grants, but hold the instance's
/// other jobs while they wait, and count against the instance rather than
/// a job.
pub fn link_concurrent<T: HostView>(engine: &Engine) -> Result<Linker<T>> {
    use crate::bindings::concurrent::{activejob as async_activejob, async_http, async_sql, log as async_log};
    use scoped::{Scoped, ScopedView};
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    link_budgeted_fs(&mut linker)?;
    async_http::add_to_linker::<T, Scoped<T>>(&mut linker, |state| ScopedView(state))?;
    async_log::add_to_linker::<T, Scoped<T>>(&mut linker, |state| ScopedView(state))?;
    async_sql::add_to_linker::<T, Scoped<T>>(&mut linker, |state| ScopedView(state))?;
    async_activejob::add_to_linker::<T, Scoped<T>>(&mut linker, |state| ScopedView(state))?;
    crate::bindings::http::add_to_linker::<T, HasSelf<http::HttpPolicy>>(&mut linker, T::http_policy)?;
    crate::bindings::sql::add_to_linker::<T, HasSelf<sql::SqlView>>(&mut linker, T::sql)?;
    Ok(linker)
}

/// Replaces the `wasi:filesystem/types` wasmtime-wasi linked with the
/// budgeted one ([`disk`]). Same interface names and versions (the same
/// generated bindings), so semver-compatible imports resolve exactly as
/// before; only the host functions behind them change.
fn link_budgeted_fs<T: HostView>(linker: &mut Linker<T>) -> Result<()> {
    use wasmtime_wasi::p2::bindings::filesystem::types;
    linker.allow_shadowing(true);
    let linked = types::add_to_linker::<T, disk::fs::Budgeted>(linker, T::budgeted_fs);
    linker.allow_shadowing(false);
    linked?;
    Ok(())
}
