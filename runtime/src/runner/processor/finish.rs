//! The end of a job's steps: the write its outcome calls for (the retry
//! policy, [`job_retry`]) and its metrics.
//!
//! Metrics are per class only for classes a plugin serves (a bounded set):
//! unserved classes are counted together as [`UNSERVED`], unparseable
//! payloads (including class names over [`crate::job::MAX_CLASS_LEN`]
//! bytes) as [`MALFORMED`].

use std::time::Duration;

use super::started::Started;
use crate::job::Outcome;
use crate::metrics::{JobRecord, Metrics};
use crate::plugin::Plugin;
use crate::redis::now_f64;
use crate::runner::job_retry::{self, Write};
use crate::runner::limiter::policy;
use crate::runner::unit::TypedJob;
use crate::sandbox::Execution;

/// The class recorded for payloads that cannot be parsed.
pub(super) const MALFORMED: &str = "(malformed)";
/// The class recorded for jobs of every class no plugin serves.
pub(super) const UNSERVED: &str = "(unserved)";

/// The write for the job's execution, recorded in the metrics.
pub(super) fn decide(metrics: &Metrics, started: &Started<'_>, plugin: &Plugin, execution: Execution) -> Write {
    let write = write_for(started.typed, execution.outcome, plugin);
    record(
        metrics,
        &started.job.class,
        &plugin.version,
        &write,
        started.queue_latency,
        Some(execution.duration),
    );
    write
}

/// The write for a job `plugin` ran (or refused); a failure records which
/// plugin version failed (`error_plugin`, "name@version").
pub(super) fn write_for(typed: &TypedJob, outcome: Outcome, plugin: &Plugin) -> Write {
    match outcome {
        // Nothing to write into the payload: skip parsing it in full.
        Outcome::Success => Write::Ack,
        Outcome::Discard(_) => Write::Discard,
        failed => match typed.payload() {
            Ok(mut payload) => {
                // Its wait for a limit is over: a retry's queue latency
                // counts from its own enqueue.
                payload.remove(policy::FIRST_ENQUEUED_AT);
                payload.set(
                    job_retry::ERROR_PLUGIN,
                    serde_json::Value::String(format!("{}@{}", plugin.name, plugin.version)),
                );
                job_retry::decide(&payload, &failed, now_f64())
            }
            Err(error) => typed.malformed(&error, now_f64()),
        },
    }
}

/// Records a finished job in the metrics.
pub(super) fn record(
    metrics: &Metrics,
    class: &str,
    version: &str,
    write: &Write,
    queue_latency: Option<Duration>,
    execution: Option<Duration>,
) {
    // Not run (rescheduled, handed back): counted apart
    // (`Metrics::limited`, `handed_back`).
    let Some(outcome) = write.counted() else { return };
    metrics.record(&JobRecord {
        class,
        version,
        outcome,
        queue_latency,
        execution,
    });
}
