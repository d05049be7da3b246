//! What the steps of a job share: the job as it goes through them
//! ([`Started`]), the slots it may give up while it waits ([`Slots`]), and
//! how a step marks its span failed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::job::Job;
use crate::otel::JobSpan;
use crate::runner::unit::TypedJob;

/// Marks the job span, if any, failed with `message`.
pub(super) fn failed(span: Option<&JobSpan>, message: &str) {
    if let Some(span) = span {
        span.failed(message);
    }
}

/// Where a job waits when its plugin's `limits.concurrency` is reached.
pub(crate) struct Slots<'a> {
    /// The runner slot the job holds; given up while the job waits for its
    /// plugin (if there is room to park), so other plugins' jobs keep going.
    pub(crate) runner: &'a mut Option<OwnedSemaphorePermit>,
    /// Room for parked jobs (bounds the jobs held in memory to twice the
    /// concurrency).
    pub(crate) parking: &'a Arc<Semaphore>,
}

/// A job that parsed, on its way through the steps.
pub(super) struct Started<'a> {
    /// The unit's job as fetched and parsed.
    pub(super) typed: &'a TypedJob,
    /// The job to run.
    pub(super) job: &'a Job,
    /// Its trace span, when traced.
    pub(super) span: Option<&'a JobSpan>,
    /// How long it waited in its queue (from its first enqueue, for a job
    /// that waited for a cluster limit), if its payload says when it was
    /// enqueued.
    pub(super) queue_latency: Option<Duration>,
}
