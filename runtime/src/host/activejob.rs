//! The `wasmjobs:job/activejob` import: the ActiveJob side of a job a
//! Rails app enqueued through ActiveJob's Sidekiq adapter.
//!
//! The runner unwraps such a job before it reaches the sandbox (the
//! `job` record's class and args are the job's own, decoded: see
//! `wasmjobs_client::activejob`); what is left of the ActiveJob hash (its
//! id, `executions`, `priority`, `locale`, `timezone`, `enqueued_at`,
//! `scheduled_at`, and the hash itself as Ruby wrote it) is this
//! capability's per-job state, an [`ActiveJobView`]. It grants nothing and
//! reads nothing but the job's own payload: a plain job gets `none`.

use std::sync::Arc;

use crate::bindings::activejob::{Context, Host};
use crate::job::ActiveJob;

/// One job's ActiveJob context, as the import serves it.
#[derive(Debug, Clone, Default)]
pub struct ActiveJobView(Option<Arc<ActiveJob>>);

/// The fields of the WIT `context` record, in its order, for building it
/// in either world's bindings.
pub(crate) type Fields = (
    String,
    String,
    u32,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

impl ActiveJobView {
    /// The view of `job`'s ActiveJob side (none for a plain job).
    pub fn new(job: Option<Arc<ActiveJob>>) -> Self {
        Self(job)
    }

    /// The context's fields, if the job came through ActiveJob (read from
    /// its hash now).
    pub(crate) fn fields(&self) -> Option<Fields> {
        let c = self.0.as_ref()?.context();
        Some((
            c.job_id,
            c.job_class,
            c.executions,
            c.priority,
            c.locale,
            c.timezone,
            c.enqueued_at,
            c.scheduled_at,
        ))
    }

    /// The ActiveJob hash as Ruby wrote it.
    pub(crate) fn raw(&self) -> Option<String> {
        self.0.as_ref().map(|job| job.hash.clone())
    }
}

impl Host for ActiveJobView {
    fn current(&mut self) -> Option<Context> {
        let (job_id, job_class, executions, priority, locale, timezone, enqueued_at, scheduled_at) = self.fields()?;
        Some(Context {
            job_id,
            job_class,
            executions,
            priority,
            locale,
            timezone,
            enqueued_at,
            scheduled_at,
        })
    }

    fn raw(&mut self) -> Option<String> {
        ActiveJobView::raw(self)
    }
}
