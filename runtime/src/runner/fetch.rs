//! The fetch loop: takes jobs while there are free slots, until quiet.
//!
//! It holds slots first and asks the job source for as many jobs as it
//! holds slots, so jobs never wait in memory. When the queues are empty it
//! waits in Redis holding one slot ([`JobSource::wait`]). After a failed
//! call it backs off, and while the source doubts (a reply may have been
//! lost), it reconciles: every job the source holds for this process that
//! the runner does not know — neither running nor awaiting its outcome
//! write — goes back to its queue. The loop never knows the fetch mode.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::fetched::Fetched;
use super::inflight::InFlightTable;
use super::manager::Manager;
use super::source::{JobSource, MAX_BATCH};

/// First pause after a failed fetch; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between two failed fetches.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs until `quiet` is cancelled, then stops the source's waiters.
/// Returns the jobs it took but did not start (to be requeued).
pub(crate) async fn run(
    source: Arc<dyn JobSource>,
    manager: Arc<Manager>,
    inflight: Arc<InFlightTable>,
    quiet: CancellationToken,
) -> Vec<Fetched> {
    let mut leftovers = Vec::new();
    let mut backoff = FIRST_BACKOFF;
    while !quiet.is_cancelled() {
        let mut permits = tokio::select! {
            permits = manager.slots(MAX_BATCH) => permits,
            () = quiet.cancelled() => break,
        };
        let jobs = match source.fetch(permits.len()).await {
            Ok(jobs) => {
                backoff = FIRST_BACKOFF;
                jobs
            }
            Err(err) => {
                tracing::warn!("{err:#}; retrying in {backoff:?}");
                drop(permits);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = quiet.cancelled() => break,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if source.take_doubt() {
            reconcile(source.as_ref(), &jobs, &inflight).await;
        }
        if jobs.is_empty() {
            // Every queue is empty: wait in Redis, holding one slot.
            permits.truncate(1);
            let job = tokio::select! {
                job = source.wait() => job,
                () = quiet.cancelled() => None,
            };
            match (job, permits.pop()) {
                (Some(job), Some(permit)) => leftovers.extend(manager.start(job, permit)),
                (Some(job), None) => leftovers.push(job),
                (None, _) => {}
            }
            continue;
        }
        for (job, permit) in jobs.into_iter().zip(permits) {
            leftovers.extend(manager.start(job, permit));
        }
    }
    leftovers.extend(source.stop_waiting().await);
    leftovers
}

/// Puts back what the source holds for this process that nobody here
/// knows about: jobs moved by a call whose reply was lost.
async fn reconcile(source: &dyn JobSource, fetched: &[Fetched], inflight: &InFlightTable) {
    let mut known = inflight.known();
    for job in fetched {
        known.add(job);
    }
    match source.reconcile(&known).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            jobs = n,
            "requeued jobs whose fetch reply was lost while Redis was away"
        ),
        Err(err) => {
            tracing::warn!("{err:#}; will check again");
            source.doubt();
        }
    }
}
