//! One job, from fetched text to a decision: parse the payload, find the
//! plugin for its class (dispatch), run it in the sandbox, and apply the
//! retry policy. Never fails: a malformed payload goes to the dead set with
//! a clear `error_message`; a class no plugin serves (not deployed yet, or
//! removed while a new version is on its way) is retried with backoff, so
//! it runs once a plugin for it appears ([`job_retry::unserved`]).
//!
//! Metrics are per class only for classes a plugin serves (a bounded set):
//! unserved classes are counted together as `(unserved)`, unparseable
//! payloads (including class names over [`payload::MAX_CLASS_LEN`] bytes)
//! as `(malformed)`.

use super::fetch::Fetched;
use super::job_retry::{self, Write};
use crate::job::Outcome;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Counted, JobRecord, Metrics};
use crate::plugin::{Catalog, Plugin};
use crate::redis::now_f64;
use crate::redis::payload::{self, Payload};
use crate::sandbox::{ExecOptions, Executor};

/// Where a job waits when its plugin's `limits.concurrency` is reached.
pub struct Slots<'a> {
    /// The runner slot the job holds; given up while the job waits for its
    /// plugin (if there is room to park), so other plugins' jobs keep going.
    pub runner: &'a mut Option<OwnedSemaphorePermit>,
    /// Room for parked jobs (bounds the jobs held in memory to twice the
    /// concurrency).
    pub parking: &'a Arc<Semaphore>,
}

/// Runs `fetched` and decides what to write for it.
pub async fn process(
    executor: &Executor,
    catalog: &Catalog,
    metrics: &Metrics,
    fetched: &Fetched,
    slots: Slots<'_>,
) -> Write {
    let (job, enqueued_at) = match payload::job_from_raw(&fetched.raw) {
        Ok(head) => head,
        Err(error) => {
            let write = malformed(fetched, &error);
            record(metrics, MALFORMED, "", &write, None, None);
            return write;
        }
    };
    let queue_latency = (enqueued_at > 0.0).then(|| Duration::from_secs_f64((now_f64() - enqueued_at).max(0.0)));
    if tracing::enabled!(tracing::Level::DEBUG)
        && let Some(waited) = queue_latency
    {
        tracing::debug!(jid = %job.jid, class = %job.class, queue_latency_us = waited.as_micros() as u64, "job started");
    }
    let Some(plugin) = catalog.get(&job.class).cloned() else {
        tracing::warn!(jid = %job.jid, class = %job.class, "no plugin serves this class; it will be retried");
        let message = format!(
            "no plugin serves job class {:?} (add a plugin listing it in its wasmjobs.toml; the job is retried until one does)",
            job.class
        );
        let write = match Payload::parse(&fetched.raw) {
            Ok(payload) => job_retry::unserved(&payload, &message, now_f64()),
            Err(error) => malformed(fetched, &error),
        };
        // Anyone can push any class name: counting each under its own
        // label would grow memory and /metrics without bound.
        record(metrics, UNSERVED, "", &write, queue_latency, None);
        return write;
    };
    let _plugin_slot = match plugin_slot(&plugin, slots).await {
        Ok(slot) => slot,
        Err(outcome) => return decide(fetched, outcome, &plugin),
    };
    let execution = executor.execute(&plugin, &job, &ExecOptions::default()).await;
    let write = decide(fetched, execution.outcome, &plugin);
    record(
        metrics,
        &job.class,
        &plugin.version,
        &write,
        queue_latency,
        Some(execution.duration),
    );
    write
}

/// The class recorded for payloads that cannot be parsed.
const MALFORMED: &str = "(malformed)";
/// The class recorded for jobs of every class no plugin serves.
const UNSERVED: &str = "(unserved)";

/// Records a finished job in the metrics.
fn record(
    metrics: &Metrics,
    class: &str,
    version: &str,
    write: &Write,
    queue_latency: Option<Duration>,
    execution: Option<Duration>,
) {
    let outcome = match write {
        Write::Ack => Counted::Success,
        Write::Discard => Counted::Discard,
        Write::Retry { .. } => Counted::Retry,
        Write::Dead { .. } => Counted::Dead,
        Write::Drop => Counted::Drop,
    };
    metrics.record(&JobRecord {
        class,
        version,
        outcome,
        queue_latency,
        execution,
    });
}

/// Takes a slot of the plugin's `limits.concurrency`, if it has one.
async fn plugin_slot(
    plugin: &Plugin,
    slots: Slots<'_>,
) -> Result<Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>, Outcome> {
    let Some(limit) = &plugin.slots else { return Ok(None) };
    if let Ok(permit) = limit.clone().try_acquire_owned() {
        return Ok(Some((permit, None)));
    }
    let parked = slots.parking.clone().try_acquire_owned().ok();
    if parked.is_some() {
        slots.runner.take();
    }
    match limit.clone().acquire_owned().await {
        Ok(permit) => Ok(Some((permit, parked))),
        Err(_) => Err(Outcome::Retry(format!("plugin {} is being unloaded", plugin.name))),
    }
}

/// The write for a job `plugin` ran; a failure records which plugin
/// version failed (`error_plugin`, "name@version").
fn decide(fetched: &Fetched, outcome: Outcome, plugin: &Plugin) -> Write {
    match outcome {
        // Nothing to write into the payload: skip parsing it in full.
        Outcome::Success => Write::Ack,
        Outcome::Discard(_) => Write::Discard,
        failed => match Payload::parse(&fetched.raw) {
            Ok(mut payload) => {
                payload.set(
                    job_retry::ERROR_PLUGIN,
                    serde_json::Value::String(format!("{}@{}", plugin.name, plugin.version)),
                );
                job_retry::decide(&payload, &failed, now_f64())
            }
            Err(error) => malformed(fetched, &error),
        },
    }
}

/// A payload that cannot be parsed goes to the dead set, wrapped if needed.
fn malformed(fetched: &Fetched, error: &str) -> Write {
    tracing::warn!(queue = %fetched.queue, "malformed job sent to the dead set: {error}");
    let dead = payload::malformed(&fetched.raw, error, &fetched.queue, now_f64());
    Write::Dead {
        payload: dead.to_json(),
    }
}
