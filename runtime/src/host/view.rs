//! [`HostView`]: how every capability reaches its part of a job's store
//! state, without knowing the embedder's store type.
//!
//! As in wasmtime-wasi (`WasiView`) each capability borrows only its own
//! slice: the one-call HTTP import its [`HttpPolicy`], the `log` import the
//! job's [`LogSink`], `sql` its [`SqlView`], `activejob` its
//! [`ActiveJobView`], the budgeted filesystem a [`BudgetedFs`]. The linker
//! functions in [`super`] are generic over the store's data type `T:
//! HostView`; the sandbox's `JobState` is the one implementation.
//!
//! An instance running several jobs at once keeps each job's own state in a
//! [`JobScope`] found by the job's guest task ([`HostView::scope`]): the
//! `async-plugin` imports look it up from the calling task
//! ([`super::scoped`]).

use wasmtime::component::GuestTaskId;
use wasmtime_wasi::WasiView;
use wasmtime_wasi_http::WasiHttpView;

use super::activejob::ActiveJobView;
use super::disk::BudgetedFs;
use super::http::HttpPolicy;
use super::log::LogSink;
use super::sql::SqlView;

/// A job's store state, as the host capabilities see it.
pub trait HostView: WasiView + WasiHttpView + Send + 'static {
    /// The outgoing-request policy of the one-call `http` import.
    fn http_policy(&mut self) -> &mut HttpPolicy;
    /// Where the `log` import's lines go (the instance's sink, for an
    /// instance that runs several jobs at once).
    fn log_sink(&mut self) -> &mut LogSink;
    /// The databases the plugin is granted.
    fn sql(&mut self) -> &mut SqlView;
    /// The job's ActiveJob context.
    fn activejob(&mut self) -> &mut ActiveJobView;
    /// The view the budgeted `wasi:filesystem/types` works on.
    fn budgeted_fs(&mut self) -> BudgetedFs<'_>;
    /// The scope of the job whose `perform` is the guest task `task`, in an
    /// instance that runs several jobs at once; none elsewhere.
    fn scope(&mut self, task: GuestTaskId) -> Option<&mut JobScope>;
}

/// What one job of a concurrent instance has to itself: its log sink
/// (its `jid` on every line, its own budget), its HTTP policy (counters,
/// open-request slots), its SQL view and its ActiveJob context.
pub struct JobScope {
    /// The job's log sink.
    pub log: LogSink,
    /// The job's outgoing-request policy.
    pub http: HttpPolicy,
    /// The job's view of the granted databases.
    pub sql: SqlView,
    /// The job's ActiveJob context.
    pub activejob: ActiveJobView,
}
