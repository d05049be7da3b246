//! The imports of the `async-plugin` world, where one instance runs
//! several jobs at once.
//!
//! The store, and so the WASI context and resource table, is the
//! instance's; what is each job's own (log sink, HTTP policy, SQL view,
//! ActiveJob context) sits in a [`JobScope`] the store state finds by the
//! guest task of the job's `perform` call ([`HostView::scope`]). Each import finds its job from the calling task: Wasmtime's
//! async call stack ends at the export call the host started, whatever
//! tasks the guest ran in between. A call whose task maps to no job (which
//! the host's bookkeeping should make impossible) gets an error value, not
//! another job's grants.
//!
//! `send`, `query` and `execute` check grants and limits with the store
//! lent, then release it while they wait, so the instance's other jobs run
//! meanwhile; the checks and the request itself are the `plugin` world's
//! ([`HttpPolicy::start`](super::http::HttpPolicy), [`SqlView`]).

use std::marker::PhantomData;

use wasmtime::component::{Access, Accessor, GuestTaskId, HasData};

use crate::bindings::concurrent::{activejob, async_http, async_sql, log};
use crate::bindings::http::{HttpError, Request, Response};
use crate::bindings::sql::{Rows, SqlError, Value};
use crate::host::log::Source;

use super::sql::SqlView;
use super::view::{HostView, JobScope};

/// The `async-plugin` imports' view of a store whose data is `S`: the
/// whole state, from which each call takes its own job's [`JobScope`].
pub(crate) struct Scoped<S>(PhantomData<fn() -> S>);

impl<S: HostView> HasData for Scoped<S> {
    type Data<'a> = ScopedView<'a, S>;
}

/// The store state as the `async-plugin` imports borrow it.
pub(crate) struct ScopedView<'a, S>(pub(crate) &'a mut S);

/// The `perform` task the calling task descends from.
fn job_task<T, S: HostView>(access: &mut Access<'_, T, Scoped<S>>) -> Option<GuestTaskId> {
    use wasmtime::AsContextMut;
    access.as_context_mut().async_call_stack().ok()?.last()
}

/// The calling job's scope, if the call comes from a job's task.
fn scope<'a, T, S: HostView>(access: &'a mut Access<'_, T, Scoped<S>>) -> Option<&'a mut JobScope> {
    let task = job_task(access)?;
    let ScopedView(state) = access.get();
    state.scope(task)
}

const NO_JOB: &str = "this call does not belong to a running job";

impl<S: HostView> async_http::Host for ScopedView<'_, S> {}

impl<T, S: HostView> async_http::HostWithStore<T> for Scoped<S> {
    async fn send(accessor: &Accessor<T, Self>, request: Request) -> Result<Response, HttpError> {
        let started = accessor.with(|mut access| match scope(&mut access) {
            Some(scope) => scope.http.start(request),
            None => Err(HttpError::InvalidRequest(NO_JOB.into())),
        });
        started?.await
    }
}

/// The calling job's SQL view, cloned out of the store so the statement
/// runs without holding it.
fn sql_view<T, S: HostView>(accessor: &Accessor<T, Scoped<S>>) -> Result<SqlView, SqlError> {
    accessor.with(|mut access| match scope(&mut access) {
        Some(scope) => Ok(scope.sql.clone()),
        None => Err(SqlError::Connection(NO_JOB.into())),
    })
}

impl<S: HostView> async_sql::Host for ScopedView<'_, S> {}

impl<T, S: HostView> async_sql::HostWithStore<T> for Scoped<S> {
    async fn query(
        accessor: &Accessor<T, Self>,
        db: String,
        statement: String,
        params: Vec<Value>,
    ) -> Result<Rows, SqlError> {
        sql_view(accessor)?.rows(&db, statement, params).await
    }

    async fn execute(
        accessor: &Accessor<T, Self>,
        db: String,
        statement: String,
        params: Vec<Value>,
    ) -> Result<u64, SqlError> {
        sql_view(accessor)?.affected(&db, statement, params).await
    }
}

impl<S: HostView> log::Host for ScopedView<'_, S> {}

impl<T, S: HostView> log::HostWithStore<T> for Scoped<S> {
    fn log(mut access: Access<'_, T, Self>, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => crate::bindings::log::Level::Trace,
            log::Level::Debug => crate::bindings::log::Level::Debug,
            log::Level::Info => crate::bindings::log::Level::Info,
            log::Level::Warn => crate::bindings::log::Level::Warn,
            log::Level::Error => crate::bindings::log::Level::Error,
        };
        match scope(&mut access) {
            Some(scope) => scope.log.record(level, Source::Log, &message),
            // Not a job's line (the instance's own, say at start-up): the
            // instance's sink, labelled with the plugin only.
            None => access.get().0.log_sink().record(level, Source::Log, &message),
        }
    }
}

impl<S: HostView> activejob::Host for ScopedView<'_, S> {}

impl<T, S: HostView> activejob::HostWithStore<T> for Scoped<S> {
    fn current(mut access: Access<'_, T, Self>) -> Option<activejob::Context> {
        let context = scope(&mut access)?.activejob.context()?;
        Some(super::activejob::record!(activejob::Context, context))
    }

    fn raw(mut access: Access<'_, T, Self>) -> Option<String> {
        scope(&mut access)?.activejob.raw()
    }
}
