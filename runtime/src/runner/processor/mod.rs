//! One job, from its unit of work to a decision: find the
//! plugin for its class (dispatch), run it in the sandbox (releasing a
//! `unique_until: "start"` lock just before), and apply the retry policy. Never fails: a malformed payload goes to the dead set with
//! a clear `error_message`; a class no plugin serves (not deployed yet, or
//! removed while a new version is on its way) is retried with backoff, so
//! it runs once a plugin for it appears ([`job_retry::unserved`]).
//!
//! A plugin with cluster limits (`limits.rate`, `[limits.per_key]`) has
//! each job admitted by the [`Limiter`] after its per-process slot and
//! before it runs: an admitted job may have to wait for its start (parked,
//! without its runner slot, while there is room), a refused job is
//! rescheduled at once (giving up its slots), and a plugin without them
//! costs no Redis call.
//!
//! With tracing on, each job gets a span (`crate::otel::job`) from here to
//! its decision: the processor notes the plugin, the queue latency and
//! any failure, and ends it with the outcome; the executor gets its
//! context for the spans of the job's host calls.
//!
//! On a queue a live Ruby Sidekiq process also fetches, a job whose class
//! no plugin serves is handed back to it untouched ([`Write::HandBack`],
//! `super::neighbours`), instead of being retried as unserved.
//!
//! An ActiveJob job (a Rails app's wrapper payload) arrives unwrapped
//! (`crate::redis::job_head`): its class is the job's own, everywhere a
//! person reads it. One whose arguments only Ruby can decode goes to the
//! dead set when a plugin serves its class (it can never succeed there).
//!
//! Metrics are per class only for classes a plugin serves (a bounded set):
//! unserved classes are counted together as `(unserved)`, unparseable
//! payloads (including class names over [`crate::job::MAX_CLASS_LEN`] bytes)
//! as `(malformed)`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::cancel::{Registration, Via};
use super::job_retry::{self, Write};
use super::limiter::{Admission, Limiter, policy};
use super::neighbours::Neighbours;
use super::reloader::LiveCatalog;
use super::source::unique;
use super::unit::TypedJob;
use crate::job::Outcome;
use crate::metrics::{Counted, JobRecord, Metrics};
use crate::otel::{self, JobSpan, Tracing};
use crate::plugin::{Catalog, Plugin};
use crate::redis::control::CancelRequest;
use crate::redis::{Redis, now_f64};
use crate::sandbox::{ExecOptions, Executor};

/// What the manager runs for each job: the processor, or a test double in
/// unit tests of the runner core.
pub(crate) trait Perform: Send + Sync {
    /// Runs `job` and decides what to write for it; stops it (and writes
    /// it as cancelled) if `cancel` says so, before or while it runs.
    fn perform<'a>(
        &'a self,
        job: &'a TypedJob,
        slots: Slots<'a>,
        cancel: Option<&'a Registration>,
    ) -> BoxFuture<'a, Write>;
}

/// Runs jobs on the plugins of the live catalog.
pub(crate) struct Processor {
    pub(crate) executor: Arc<Executor>,
    pub(crate) catalog: LiveCatalog,
    pub(crate) metrics: Arc<Metrics>,
    /// Cluster-wide limits, for plugins that have some.
    pub(crate) limiter: Arc<Limiter>,
    /// For releasing `unique_until: "start"` locks as jobs start.
    pub(crate) redis: Redis,
    /// OpenTelemetry traces, when on: a span per job (`crate::otel`).
    pub(crate) tracing: Option<Arc<Tracing>>,
    /// The Ruby Sidekiq processes sharing our queues, to hand their jobs
    /// back to.
    pub(crate) neighbours: Arc<Neighbours>,
}

impl Perform for Processor {
    fn perform<'a>(
        &'a self,
        job: &'a TypedJob,
        slots: Slots<'a>,
        cancel: Option<&'a Registration>,
    ) -> BoxFuture<'a, Write> {
        // The catalog as it is when the job starts: a reload from now on
        // does not change the version it runs on.
        let catalog = self.catalog.load_full();
        async move {
            let Some(tracing) = &self.tracing else {
                return self.run(&catalog, job, slots, cancel, None).await;
            };
            let span = tracing.job_span(&otel::job::Start {
                raw: &job.fetched.raw,
                queue: &job.fetched.queue,
                job: job.parsed.as_ref().ok().map(|(job, _)| job),
            });
            let write = self.run(&catalog, job, slots, cancel, Some(&span)).await;
            span.end(outcome(&write));
            write
        }
        .boxed()
    }
}

impl Processor {
    /// Runs `job`, or stops it if `cancel` says so; `span` is its trace.
    async fn run(
        &self,
        catalog: &Catalog,
        job: &TypedJob,
        slots: Slots<'_>,
        cancel: Option<&Registration>,
        span: Option<&JobSpan>,
    ) -> Write {
        let Some(cancel) = cancel else {
            return process(self, catalog, job, slots, span).await;
        };
        cancel.check_at_start(&job.fetched.cancel).await;
        let started = std::time::Instant::now();
        if cancel.requested().is_none() {
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                write = process(self, catalog, job, slots, span) => return write,
            }
        }
        // Cancelled: the job's future (its store, instance, HTTP
        // requests and SQL statements) is gone by now.
        let request = cancel.requested().cloned().unwrap_or_else(|| CancelRequest {
            by: "unknown".into(),
            at: now_f64(),
        });
        let (class, version) = match (&job.parsed, catalog.get(job.class())) {
            (Ok((parsed, _)), Some(plugin)) => (parsed.class.as_str(), plugin.version.as_str()),
            _ => (UNSERVED, ""),
        };
        let write = cancel.write(&job.fetched.raw, &request);
        let via = cancel.via().map_or("", Via::as_str);
        tracing::info!(jid = %job.jid(), class = %class, by = %request.by, via = %via, ran_ms = started.elapsed().as_millis() as u64, "job cancelled");
        failed(span, &format!("cancelled by {}", request.by));
        record(&self.metrics, class, version, &write, None, Some(started.elapsed()));
        write
    }
}

/// The job span's `wasmjobs.outcome` for `write`.
fn outcome(write: &Write) -> &'static str {
    match write {
        Write::Ack => "success",
        Write::Discard => "discard",
        Write::Retry { .. } => "retry",
        Write::Dead { .. } => "dead",
        Write::Drop => "drop",
        Write::Reschedule { .. } => "rescheduled",
        Write::Cancelled { .. } => "cancelled",
        Write::HandBack => "handed back",
    }
}

/// Marks the job span, if any, failed with `message`.
fn failed(span: Option<&JobSpan>, message: &str) {
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

/// Runs `typed` and decides what to write for it; notes on `span` what
/// the job span reports (plugin, queue latency, failure).
async fn process(
    processor: &Processor,
    catalog: &Catalog,
    typed: &TypedJob,
    mut slots: Slots<'_>,
    span: Option<&JobSpan>,
) -> Write {
    let Processor {
        executor,
        metrics,
        limiter,
        ..
    } = processor;
    let (job, enqueued_at) = match &typed.parsed {
        Ok((job, enqueued_at)) => (job, *enqueued_at),
        Err(error) => {
            failed(span, error);
            let write = typed.malformed(error, now_f64());
            record(metrics, MALFORMED, "", &write, None, None);
            return write;
        }
    };
    let mut queue_latency = (enqueued_at > 0.0).then(|| Duration::from_secs_f64((now_f64() - enqueued_at).max(0.0)));
    if tracing::enabled!(tracing::Level::DEBUG)
        && let Some(waited) = queue_latency
    {
        tracing::debug!(jid = %job.jid, class = %job.class, queue_latency_us = waited.as_micros() as u64, "job started");
    }
    let Some(plugin) = catalog.get(&job.class).cloned() else {
        if processor.neighbours.hand_back(&typed.fetched.queue, &job.jid) {
            tracing::debug!(jid = %job.jid, class = %job.class, queue = %typed.fetched.queue, "not ours: handed back to the Ruby Sidekiq process sharing the queue");
            return Write::HandBack;
        }
        tracing::warn!(jid = %job.jid, class = %job.class, "no plugin serves this class; it will be retried");
        let message = format!(
            "no plugin serves job class {:?} (add a plugin listing it in its wasmjobs.toml; the job is retried until one does)",
            job.class
        );
        failed(span, &message);
        let write = match typed.payload() {
            Ok(payload) => job_retry::unserved(&payload, &message, now_f64()),
            Err(error) => typed.malformed(&error, now_f64()),
        };
        // Anyone can push any class name: counting each under its own
        // label would grow memory and /metrics without bound.
        record(metrics, UNSERVED, "", &write, queue_latency, None);
        return write;
    };
    if let Some(span) = span {
        span.plugin(&plugin.name, &plugin.version);
    }
    if let Some(reason) = job.activejob.as_ref().and_then(|aj| aj.refused.as_deref()) {
        tracing::warn!(jid = %job.jid, class = %job.class, "ActiveJob job sent to the dead set: {reason}");
        failed(span, reason);
        let write = decide(typed, Outcome::Dead(reason.to_owned()), &plugin);
        record(metrics, &job.class, &plugin.version, &write, queue_latency, None);
        return write;
    }
    let _plugin_slot = match plugin_slot(&plugin, &mut slots).await {
        Ok(slot) => slot,
        Err(outcome) => {
            failed(span, outcome.message().unwrap_or_default());
            return decide(typed, outcome, &plugin);
        }
    };
    let mut lease = None;
    // Room held while the job waited for its start, parked: kept until it
    // ends, as a runner slot would be.
    let mut _parked = None;
    if plugin.manifest.cluster_limits.any() {
        let payload = match typed.payload() {
            Ok(payload) => payload,
            Err(error) => return typed.malformed(&error, now_f64()),
        };
        match limiter.admit(&plugin, &payload).await {
            Admission::Run {
                start,
                lease: taken,
                first_enqueued_at,
            } => {
                lease = taken;
                if !start.wait.is_zero() {
                    tracing::debug!(jid = %job.jid, class = %job.class, wait_ms = start.wait.as_millis() as u64, "admitted by a rate limit for a later start: waiting");
                    _parked = park(&mut slots);
                    tokio::time::sleep(start.wait).await;
                }
                start.begun();
                if let Some(first) = first_enqueued_at {
                    queue_latency = Some(Duration::from_secs_f64((now_f64() - first).max(0.0)));
                }
            }
            Admission::Refused { write, refusal } => {
                tracing::debug!(jid = %job.jid, class = %job.class, reason = refusal.label(), "over a cluster limit: rescheduled");
                metrics.limited.add(&plugin.name, refusal.label());
                if !matches!(write, Write::Reschedule { .. }) {
                    record(metrics, &job.class, &plugin.version, &write, None, None);
                }
                return write;
            }
        }
    }
    if unique::release_at_start(&processor.redis, &typed.fetched.raw, &job.jid).await {
        metrics.process.unique_locks_released.fetch_add(1, Ordering::Relaxed);
    }
    let trace = match span {
        Some(span) => {
            if let Some(latency) = queue_latency {
                span.queue_latency(latency);
            }
            Some(span.host())
        }
        None => None,
    };
    let execution = executor
        .execute_traced(&plugin.loaded, job, &ExecOptions::default(), trace)
        .await;
    if let Some(message) = execution.outcome.message() {
        failed(span, message);
    }
    drop(lease);
    let write = decide(typed, execution.outcome, &plugin);
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
        // Not run: counted apart (`Metrics::limited`, `handed_back`).
        Write::Reschedule { .. } | Write::HandBack => return,
        Write::Cancelled { .. } => Counted::Cancelled,
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
    slots: &mut Slots<'_>,
) -> Result<Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>, Outcome> {
    let Some(limit) = &plugin.slots else { return Ok(None) };
    if let Ok(permit) = limit.clone().try_acquire_owned() {
        return Ok(Some((permit, None)));
    }
    let parked = park(slots);
    match limit.clone().acquire_owned().await {
        Ok(permit) => Ok(Some((permit, parked))),
        Err(_) => Err(Outcome::Retry(format!("plugin {} is being unloaded", plugin.name))),
    }
}

/// Gives up the job's runner slot while it waits, if there is room to
/// park (else it waits in its slot); the permit returned is the room.
fn park(slots: &mut Slots<'_>) -> Option<OwnedSemaphorePermit> {
    if slots.runner.is_none() {
        return None;
    }
    let parked = slots.parking.clone().try_acquire_owned().ok();
    if parked.is_some() {
        slots.runner.take();
    }
    parked
}

/// The write for a job `plugin` ran; a failure records which plugin
/// version failed (`error_plugin`, "name@version").
fn decide(typed: &TypedJob, outcome: Outcome, plugin: &Plugin) -> Write {
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
