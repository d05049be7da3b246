//! One job, from its unit of work to a decision, as an ordered list of
//! small steps ([`process`], the order written once), after Sidekiq's
//! `processor.rb#dispatch`:
//!
//! 1. parse and dispatch: a payload that is a job, the plugin serving its
//!    class ([`dispatch`]);
//! 2. admission: the plugin's concurrency slot, its cluster limits, a
//!    `unique_until: "start"` lock released ([`admit`]);
//! 3. execute: the sandbox, with the job's trace context;
//! 4. decide and record: the retry policy's write, the metrics
//!    ([`finish`]).
//!
//! Each step that ends the job (malformed, unserved, refused, over a
//! limit) returns its write having recorded why; nothing ever fails.
//! Around the steps: a cancel (`super::cancel`) stops the job before or
//! while it runs, and with tracing on each job gets a span
//! (`crate::otel::job`) from here to its decision: the steps note the
//! plugin, the queue latency and any failure, and the span ends with the
//! outcome.
//!
//! An ActiveJob job (a Rails app's wrapper payload) arrives unwrapped
//! (`crate::redis::job_head`): its class is the job's own, everywhere a
//! person reads it.

mod admit;
mod dispatch;
mod finish;
mod started;

pub(crate) use started::Slots;
use started::{Started, failed};

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::by_shard::ByShard;
use super::cancel::{Registration, Via};
use super::job_retry::Write;
use super::limiter::Limiter;
use super::neighbours::Neighbours;
use super::reloader::LiveCatalog;
use super::unit::TypedJob;
use crate::metrics::Metrics;
use crate::otel::{self, JobSpan, Tracing};
use crate::plugin::{Catalog, Plugin};
use crate::redis::control::CancelRequest;
use crate::redis::{Redis, now_f64};
use crate::sandbox::{ExecOptions, Execution, Executor};

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
    /// Each shard's Redis, for releasing `unique_until: "start"` locks as
    /// jobs start (a job's lock is on its shard).
    pub(crate) redis: ByShard<Redis>,
    /// OpenTelemetry traces, when on: a span per job (`crate::otel`).
    pub(crate) tracing: Option<Arc<Tracing>>,
    /// The Ruby Sidekiq processes sharing our queues on each shard, to
    /// hand their jobs back to.
    pub(crate) neighbours: ByShard<Arc<Neighbours>>,
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
            _ => (finish::UNSERVED, ""),
        };
        let write = cancel.write(&job.fetched.raw, &request);
        let via = cancel.via().map_or("", Via::as_str);
        tracing::info!(jid = %job.jid(), class = %class, by = %request.by, via = %via, ran_ms = started.elapsed().as_millis() as u64, "job cancelled");
        failed(span, &format!("cancelled by {}", request.by));
        finish::record(&self.metrics, class, version, &write, None, Some(started.elapsed()));
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
        Write::HandBackLater { .. } => "handed back later",
    }
}

/// The steps of one job, in order. Each step either hands the job on or
/// ends it with its write (`Err`), having recorded why: its metrics, its
/// span, its log line.
async fn process(
    processor: &Processor,
    catalog: &Catalog,
    typed: &TypedJob,
    mut slots: Slots<'_>,
    span: Option<&JobSpan>,
) -> Write {
    let steps = async {
        let Processor {
            executor,
            metrics,
            limiter,
            redis,
            neighbours,
            ..
        } = processor;
        let shard = typed.fetched.shard;
        let mut job = dispatch::parse(metrics, typed, span)?;
        let plugin = dispatch::plugin(metrics, neighbours.get(shard), redis.get(shard), catalog, &job).await?;
        dispatch::refuse_activejob(metrics, &job, &plugin)?;
        let _plugin_slot = admit::plugin_slot(&job, &plugin, &mut slots).await?;
        let admitted = admit::cluster_limits(metrics, limiter, &mut job, &plugin, &mut slots).await?;
        admit::release_unique_lock(metrics, redis.get(shard), &job).await;
        let execution = execute(executor, &job, &plugin).await;
        drop(admitted);
        Ok(finish::decide(metrics, &job, &plugin, execution))
    };
    steps.await.unwrap_or_else(|write| write)
}

/// Runs the job on its plugin's sandbox, its trace carrying the queue
/// latency; marks the span failed if the job failed.
async fn execute(executor: &Executor, job: &Started<'_>, plugin: &Plugin) -> Execution {
    let trace = job.span.map(|span| {
        if let Some(latency) = job.queue_latency {
            span.queue_latency(latency);
        }
        span.host()
    });
    let execution = executor
        .execute_traced(&plugin.loaded, job.job, &ExecOptions::default(), trace)
        .await;
    if let Some(message) = execution.outcome.message() {
        failed(job.span, message);
    }
    execution
}
