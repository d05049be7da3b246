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
//!
//! A queue can also *rest* ([`Paused::rest`]): left out the same way for a
//! moment, without anything written to Redis — a queue shared with a Ruby
//! Sidekiq process after a job was handed back to it
//! (`runner::neighbours`), so this process does not fetch that job again
//! at once. A rest ends at the first read of the set after its time.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// The queues paused in Redis as last read, and those resting (until
    /// when); `current` is the union.
    parts: Mutex<(HashSet<String>, HashMap<String, Instant>)>,
    nudge: Notify,
    /// Where `/metrics` reads how many of them are paused.
    metrics: Option<Arc<Metrics>>,
    /// This copy's paused queues in the metrics' gauge.
    counted: std::sync::atomic::AtomicU64,
}

impl Paused {
    /// A copy for `queues`, none paused until the first read; counted in
    /// `metrics` if given.
    pub(crate) fn new(queues: Vec<String>, metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            queues,
            current: watch::channel(PausedSet::default()).0,
            parts: Mutex::new((HashSet::new(), HashMap::new())),
            nudge: Notify::new(),
            metrics,
            counted: std::sync::atomic::AtomicU64::new(0),
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
        let count = paused.len() as u64;
        let changed = self.settle(paused);
        // After the copy is published: whoever reads the gauge (a test,
        // an operator) may count on the fetch leaving the queues out. The
        // gauge is the process's, summed over its shards' copies: it moves
        // by this copy's change.
        let before = self.counted.swap(count, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            let gauge = &metrics.process.paused_queues;
            gauge.fetch_add(count, Ordering::Relaxed);
            gauge.fetch_sub(before, Ordering::Relaxed);
        }
        Ok(changed)
    }

    /// Takes `paused` as the queues paused in Redis now, ends the rests
    /// that are over, and publishes the result; returns whether it changed.
    fn settle(&self, paused: HashSet<String>) -> bool {
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        let before = std::mem::replace(&mut parts.0, paused.clone());
        for queue in paused.difference(&before) {
            tracing::info!(queue = %queue, "queue paused: not fetching from it");
        }
        for queue in before.difference(&paused) {
            tracing::info!(queue = %queue, "queue resumed");
        }
        let now = Instant::now();
        parts.1.retain(|_, until| *until > now);
        self.publish(&parts)
    }

    /// Leaves `queue` out of fetches for `pause` (at least until the next
    /// read of the set after it), without pausing it in Redis.
    pub(crate) fn rest(&self, queue: &str, pause: Duration) {
        if !self.queues.iter().any(|q| q == queue) {
            return;
        }
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        parts.1.insert(queue.to_owned(), Instant::now() + pause);
        self.publish(&parts);
    }

    /// Sends the union of the paused and resting queues, if it changed.
    fn publish(&self, parts: &(HashSet<String>, HashMap<String, Instant>)) -> bool {
        let left_out: HashSet<String> = parts.0.iter().chain(parts.1.keys()).cloned().collect();
        self.current.send_if_modified(|current| {
            if **current == left_out {
                return false;
            }
            *current = Arc::new(left_out);
            true
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(queues: &[&str]) -> HashSet<String> {
        queues.iter().map(|q| (*q).to_owned()).collect()
    }

    #[test]
    fn a_resting_queue_is_left_out_until_its_rest_is_over() {
        let paused = Paused::new(vec!["a".into(), "b".into()], None);
        let mut watch = paused.watch();
        paused.rest("a", Duration::from_secs(60));
        paused.rest("not-ours", Duration::from_secs(60));
        assert!(watch.has_changed().unwrap());
        assert_eq!(*watch.borrow_and_update().clone(), set(&["a"]));
        // A read of the set keeps a rest that is not over, beside a pause.
        assert!(paused.settle(set(&["b"])));
        assert_eq!(*paused.current(), set(&["a", "b"]));
        paused.rest("a", Duration::ZERO);
        assert!(paused.settle(set(&["b"])));
        assert_eq!(*paused.current(), set(&["b"]));
        assert!(!paused.settle(set(&["b"])));
    }
}
