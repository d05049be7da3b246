//! Admission: the plugin's `limits.concurrency` slot, its cluster limits,
//! and the release of a `unique_until: "start"` lock as the job starts.
//!
//! A plugin with cluster limits (`limits.rate`, `[limits.per_key]`) has
//! each job admitted by the [`Limiter`](crate::runner::limiter::Limiter)
//! after its per-process slot and before it runs: an admitted job may have
//! to wait for its start (parked, without its runner slot, while there is
//! room), a refused job is rescheduled at once (giving up its slots), and a
//! plugin without them costs no Redis call.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::finish;
use super::started::{Slots, Started, failed};
use crate::job::Outcome;
use crate::metrics::Metrics;
use crate::plugin::Plugin;
use crate::redis::Redis;
use crate::redis::now_f64;
use crate::runner::job_retry::Write;
use crate::runner::limiter::{Admission, Lease, Limiter};
use crate::runner::source::unique;

/// The permits a job holds while it waits for or runs under its plugin's
/// `limits.concurrency`: the plugin's slot and, if it parked, its room.
pub(super) type PluginSlot = Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>;

/// Takes a slot of the plugin's `limits.concurrency`, if it has one,
/// giving up the runner slot while it waits if there is room to park.
pub(super) async fn plugin_slot(
    started: &Started<'_>,
    plugin: &Plugin,
    slots: &mut Slots<'_>,
) -> Result<PluginSlot, Write> {
    let Some(limit) = &plugin.slots else { return Ok(None) };
    if let Ok(permit) = limit.clone().try_acquire_owned() {
        return Ok(Some((permit, None)));
    }
    let parked = park(slots);
    match limit.clone().acquire_owned().await {
        Ok(permit) => Ok(Some((permit, parked))),
        Err(_) => {
            let outcome = Outcome::Retry(format!("plugin {} is being unloaded", plugin.name));
            failed(started.span, outcome.message().unwrap_or_default());
            Err(finish::write_for(started.typed, outcome, plugin))
        }
    }
}

/// What an admitted job holds until it ends: its cluster-limit lease and,
/// if it waited for its start parked, its room.
pub(super) struct Admitted {
    _lease: Option<Lease>,
    _parked: Option<OwnedSemaphorePermit>,
}

/// Admits the job under its plugin's cluster limits, if it has any:
/// waits for a later start if the limiter says so (the queue latency then
/// counts from the job's first enqueue); a refused job ends here,
/// rescheduled.
pub(super) async fn cluster_limits(
    metrics: &Metrics,
    limiter: &Arc<Limiter>,
    started: &mut Started<'_>,
    plugin: &Plugin,
    slots: &mut Slots<'_>,
) -> Result<Admitted, Write> {
    let mut admitted = Admitted {
        _lease: None,
        _parked: None,
    };
    if !plugin.manifest.cluster_limits.any() {
        return Ok(admitted);
    }
    let job = started.job;
    let payload = started
        .typed
        .payload()
        .map_err(|error| started.typed.malformed(&error, now_f64()))?;
    match limiter.admit(plugin, &payload).await {
        Admission::Run {
            start,
            lease,
            first_enqueued_at,
        } => {
            admitted._lease = lease;
            if !start.wait.is_zero() {
                tracing::debug!(jid = %job.jid, class = %job.class, wait_ms = start.wait.as_millis() as u64, "admitted by a rate limit for a later start: waiting");
                admitted._parked = park(slots);
                tokio::time::sleep(start.wait).await;
            }
            start.begun();
            if let Some(first) = first_enqueued_at {
                started.queue_latency = Some(Duration::from_secs_f64((now_f64() - first).max(0.0)));
            }
            Ok(admitted)
        }
        Admission::Refused { write, refusal } => {
            tracing::debug!(jid = %job.jid, class = %job.class, reason = refusal.label(), "over a cluster limit: rescheduled");
            metrics.limited.add(&plugin.name, refusal.label());
            if !matches!(write, Write::Reschedule { .. }) {
                finish::record(metrics, &job.class, &plugin.version, &write, None, None);
            }
            Err(write)
        }
    }
}

/// `unique_until: "start"`: the job's lock is released as it starts.
pub(super) async fn release_unique_lock(metrics: &Metrics, redis: &Redis, started: &Started<'_>) {
    if unique::release_at_start(redis, started.typed.unique.as_ref(), &started.job.jid).await {
        metrics.process.unique_locks_released.fetch_add(1, Ordering::Relaxed);
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
