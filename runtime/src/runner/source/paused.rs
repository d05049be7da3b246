//! Paused queues, as this process sees them.
//!
//! The truth is Sidekiq Pro's `paused` SET in Redis (bare queue names;
//! `wasmjobs pause` / `resume` write it, and so does Sidekiq Pro's
//! `Queue#pause!`). This process keeps a copy of the part that concerns
//! its own queues, read again every [`REFRESH`] and at once when the
//! control channel says it changed ([`Paused::nudge`]). The fetch leaves
//! paused queues out of its Lua call, and the waiters do not block on them
//! (a waiter blocked on a queue when it is paused is unblocked and waits
//! for the copy to change instead). Jobs already taken run to the end.
//!
//! If Redis cannot be read, the last copy stands: a queue is never resumed
//! (or paused) by an error.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::redis::{Redis, keys};

/// Longest time between two reads of the `paused` set. The control
/// channel makes a pause take effect in milliseconds; this bounds it for
/// writers that only run `SADD paused` (Sidekiq Pro's clients).
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// The paused subset of this process's queues.
pub(crate) type PausedSet = Arc<HashSet<String>>;

/// This process's copy of the paused queues.
pub(crate) struct Paused {
    queues: Vec<String>,
    current: watch::Sender<PausedSet>,
    nudge: Notify,
    /// Where `/metrics` reads how many of them are paused.
    metrics: Option<Arc<Metrics>>,
}

impl Paused {
    /// A copy for `queues`, none paused until the first read; counted in
    /// `metrics` if given.
    pub(crate) fn new(queues: Vec<String>, metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            queues,
            current: watch::channel(PausedSet::default()).0,
            nudge: Notify::new(),
            metrics,
        })
    }

    /// The paused queues now.
    pub(crate) fn current(&self) -> PausedSet {
        self.current.borrow().clone()
    }

    /// Follows changes.
    pub(crate) fn watch(&self) -> watch::Receiver<PausedSet> {
        self.current.subscribe()
    }

    /// The set changed in Redis: read it now.
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Reads the set once; returns whether the copy changed.
    pub(crate) async fn refresh(&self, redis: &Redis) -> anyhow::Result<bool> {
        if self.queues.is_empty() {
            return Ok(false);
        }
        let flags: Vec<bool> = redis::cmd("SMISMEMBER")
            .arg(keys::PAUSED)
            .arg(&self.queues)
            .query_async(&mut redis.conn())
            .await
            .map_err(|err| anyhow::anyhow!("cannot read the paused queues: {err}"))?;
        let paused: HashSet<String> = self
            .queues
            .iter()
            .zip(flags)
            .filter(|(_, paused)| *paused)
            .map(|(queue, _)| queue.clone())
            .collect();
        if let Some(metrics) = &self.metrics {
            metrics
                .process
                .paused_queues
                .store(paused.len() as u64, Ordering::Relaxed);
        }
        Ok(self.current.send_if_modified(|current| {
            if **current == paused {
                return false;
            }
            let (before, after) = (current.clone(), &paused);
            for queue in after.difference(&before) {
                tracing::info!(queue = %queue, "queue paused: not fetching from it");
            }
            for queue in before.difference(after) {
                tracing::info!(queue = %queue, "queue resumed");
            }
            *current = Arc::new(paused.clone());
            true
        }))
    }

    /// Keeps the copy current until `stop`.
    pub(crate) async fn run(self: Arc<Self>, redis: Redis, stop: CancellationToken) {
        let mut failing = false;
        loop {
            match self.refresh(&redis).await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("reading the paused queues again");
                }
                Ok(_) => {}
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!("{err:#}; keeping the last known paused queues");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => {}
                () = self.nudge.notified() => {}
                () = stop.cancelled() => return,
            }
        }
    }
}
