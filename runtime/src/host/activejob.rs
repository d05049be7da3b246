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
use crate::job::{ActiveJob, ActiveJobContext};

/// The WIT `context` record `$record` (either world's bindings generate
/// one) from the [`ActiveJobContext`] `$c`.
macro_rules! record {
    ($record:path, $c:expr) => {{
        let c = $c;
        $record {
            job_id: c.job_id,
            job_class: c.job_class,
            executions: c.executions,
            priority: c.priority,
            locale: c.locale,
            timezone: c.timezone,
            enqueued_at: c.enqueued_at,
            scheduled_at: c.scheduled_at,
        }
    }};
}
pub(crate) use record;

/// One job's ActiveJob context, as the import serves it.
#[derive(Debug, Clone, Default)]
pub struct ActiveJobView(Option<Arc<ActiveJob>>);

impl ActiveJobView {
    /// The view of `job`'s ActiveJob side (none for a plain job).
    pub fn new(job: Option<Arc<ActiveJob>>) -> Self {
        Self(job)
    }

    /// The context, if the job came through ActiveJob (read from its hash
    /// now).
    pub(crate) fn context(&self) -> Option<ActiveJobContext> {
        self.0.as_ref().map(|job| job.context())
    }

    /// The ActiveJob hash as Ruby wrote it.
    pub(crate) fn raw(&self) -> Option<String> {
        self.0.as_ref().map(|job| job.hash.clone())
    }
}

impl Host for ActiveJobView {
    fn current(&mut self) -> Option<Context> {
        self.context().map(|c| record!(Context, c))
    }

    fn raw(&mut self) -> Option<String> {
        ActiveJobView::raw(self)
    }
}
