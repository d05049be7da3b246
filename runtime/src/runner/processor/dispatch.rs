//! Dispatch: a payload that is a job, the plugin serving its class, and the
//! ActiveJob jobs that can never run.
//!
//! A malformed payload goes to the dead set with a clear `error_message`;
//! a class no plugin serves (not deployed yet, or removed while a new
//! version is on its way) is retried with backoff, so it runs once a plugin
//! for it appears ([`job_retry::unserved`]) — unless a live Ruby Sidekiq
//! process shares the queue, which gets the job back untouched
//! ([`Write::HandBack`], or [`Write::HandBackLater`] once it bounced a few
//! times; `runner::neighbours`).

use std::sync::Arc;
use std::time::Duration;

use super::finish::{self, MALFORMED, UNSERVED};
use super::started::{Started, failed};
use crate::metrics::Metrics;
use crate::plugin::{Catalog, Plugin};
use crate::redis::{Redis, now_f64};
use crate::runner::job_retry::{self, Write};
use crate::runner::neighbours::{Bounce, Neighbours};
use crate::runner::unit::TypedJob;

/// The job `typed` holds, or the dead-set write of a payload that is not one.
pub(super) fn parse<'a>(
    metrics: &Metrics,
    typed: &'a TypedJob,
    span: Option<&'a crate::otel::JobSpan>,
) -> Result<Started<'a>, Write> {
    let (job, enqueued_at) = match &typed.parsed {
        Ok((job, enqueued_at)) => (job, *enqueued_at),
        Err(error) => {
            failed(span, error);
            let write = typed.malformed(error, now_f64());
            finish::record(metrics, MALFORMED, "", &write, None, None);
            return Err(write);
        }
    };
    let queue_latency = (enqueued_at > 0.0).then(|| Duration::from_secs_f64((now_f64() - enqueued_at).max(0.0)));
    if tracing::enabled!(tracing::Level::DEBUG)
        && let Some(waited) = queue_latency
    {
        tracing::debug!(jid = %job.jid, class = %job.class, queue_latency_us = waited.as_micros() as u64, "job started");
    }
    Ok(Started {
        typed,
        job,
        span,
        queue_latency,
    })
}

/// The plugin serving the job's class in `catalog` (the catalog as it was
/// when the job started), noted on the job's span; or the job's write when
/// none does.
pub(super) async fn plugin(
    metrics: &Metrics,
    neighbours: &Neighbours,
    redis: &Redis,
    catalog: &Catalog,
    started: &Started<'_>,
) -> Result<Arc<Plugin>, Write> {
    let Started { typed, job, span, .. } = started;
    if let Some(plugin) = catalog.get(&job.class) {
        if let Some(span) = span {
            span.plugin(&plugin.name, &plugin.version);
        }
        return Ok(plugin.clone());
    }
    match neighbours.recheck(redis, &typed.fetched.queue, &job.jid).await {
        Some(Bounce::Front) => {
            tracing::debug!(jid = %job.jid, class = %job.class, queue = %typed.fetched.queue, "not ours: handed back to the Ruby Sidekiq process sharing the queue");
            return Err(Write::HandBack);
        }
        Some(Bounce::Later(after)) => {
            return Err(Write::HandBackLater {
                at: now_f64() + after.as_secs_f64(),
                payload: typed.fetched.raw.clone(),
            });
        }
        None => {}
    }
    tracing::warn!(jid = %job.jid, class = %job.class, "no plugin serves this class; it will be retried");
    let message = format!(
        "no plugin serves job class {:?} (add a plugin listing it in its wasmjobs.toml; the job is retried until one does)",
        job.class
    );
    failed(*span, &message);
    let write = match typed.payload() {
        Ok(payload) => job_retry::unserved(&payload, &message, now_f64()),
        Err(error) => typed.malformed(&error, now_f64()),
    };
    // Anyone can push any class name: counting each under its own label
    // would grow memory and /metrics without bound.
    finish::record(metrics, UNSERVED, "", &write, started.queue_latency, None);
    Err(write)
}

/// An ActiveJob job whose arguments only Ruby can decode goes to the dead
/// set: it can never succeed on a plugin.
pub(super) fn refuse_activejob(metrics: &Metrics, started: &Started<'_>, plugin: &Plugin) -> Result<(), Write> {
    let job = started.job;
    let Some(reason) = job.activejob.as_ref().and_then(|aj| aj.refused.as_deref()) else {
        return Ok(());
    };
    tracing::warn!(jid = %job.jid, class = %job.class, "ActiveJob job sent to the dead set: {reason}");
    failed(started.span, reason);
    let write = finish::write_for(started.typed, crate::job::Outcome::Dead(reason.to_owned()), plugin);
    finish::record(
        metrics,
        &job.class,
        &plugin.version,
        &write,
        started.queue_latency,
        None,
    );
    Err(write)
}
