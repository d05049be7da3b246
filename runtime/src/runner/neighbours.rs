//! Ruby Sidekiq processes that fetch this process's queues.
//!
//! A queue that a live Ruby Sidekiq process also fetches is *shared*: each
//! side takes jobs the other serves, Ruby fails ours with a `NameError`,
//! and we would retry theirs as "no plugin". Ruby's side cannot be
//! changed, so this process (as Sidekiq publishes its own `queues` in its
//! heartbeat's `info`) finds the Ruby processes sharing its queues
//! ([`crate::redis::sharing::sidekiq_sharing`]) at start and every
//! [`REFRESH`], warns once per new sharer (naming it and the fix: give the
//! Wasm classes their own queue), and counts the shared queues on
//! `/metrics`.
//!
//! On a shared queue, a job whose class no plugin here serves is handed
//! back untouched (the processor's `Write::HandBack`: back to the front of
//! its queue, atomically out of this process's in-progress list, no error
//! fields, not counted as processed or failed), and the queue *rests* for
//! [`REST`] (left out of fetches like a paused one,
//! [`Paused::rest`]) so the Ruby process takes it instead of this one
//! fetching it again at once. A Ruby process counts while its beat is
//! fresh ([`crate::redis::sharing::LIVE_FOR`]); a job this process has
//! handed back [`MAX_HAND_BACKS`] times is treated as unserved after all,
//! so neither a lying process record nor a Ruby process that never
//! fetches can keep a job bouncing. On a queue only wasmjobs serves, such a job
//! is retried as "no plugin", as before.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::source::paused::Paused;
use crate::metrics::Metrics;
use crate::redis::Redis;
use crate::redis::api::{self, ProcessInfo};
use crate::redis::sharing::sidekiq_sharing;

/// How often the processes are read.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);

/// How long a shared queue is left out of fetches after a job was handed
/// back from it.
pub(crate) const REST: Duration = Duration::from_secs(1);

/// How many times one job is handed back before it is treated as a class no
/// plugin serves (retried as unserved).
pub(crate) const MAX_HAND_BACKS: u32 = 5;

/// Most jobs whose hand-backs are counted at once (then the counts start
/// over).
const MAX_TRACKED: usize = 10_000;

/// The Ruby processes sharing each of this process's queues (the
/// description of each: identity, host, pid).
type Sharing = BTreeMap<String, Vec<String>>;

/// This process's view of who else fetches its queues.
pub(crate) struct Neighbours {
    queues: Vec<String>,
    sharing: ArcSwap<Sharing>,
    paused: Arc<Paused>,
    metrics: Arc<Metrics>,
    /// How many times each job was handed back.
    bounced: Mutex<HashMap<String, u32>>,
}

impl Neighbours {
    /// None known until the first [`refresh`](Neighbours::refresh).
    pub(crate) fn new(queues: Vec<String>, paused: Arc<Paused>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            queues,
            sharing: ArcSwap::from_pointee(Sharing::new()),
            paused,
            metrics,
            bounced: Mutex::new(HashMap::new()),
        })
    }

    /// Whether a live Ruby Sidekiq process fetches `queue` too.
    pub(crate) fn shares(&self, queue: &str) -> bool {
        self.sharing.load().contains_key(queue)
    }

    /// Whether the job `jid` of `queue`, of a class no plugin serves, goes
    /// back to the Ruby processes sharing the queue; if so it is counted and
    /// the queue rests. Not when none shares it, nor when this process has
    /// already handed that job back [`MAX_HAND_BACKS`] times (no Ruby
    /// process takes it: a Ruby process that is busy for good, or a
    /// process record that lies), so a job cannot bounce for ever.
    pub(crate) fn hand_back(&self, queue: &str, jid: &str) -> bool {
        if !self.shares(queue) {
            return false;
        }
        {
            let mut bounced = self.bounced.lock().unwrap_or_else(PoisonError::into_inner);
            if bounced.len() >= MAX_TRACKED && !bounced.contains_key(jid) {
                bounced.clear();
            }
            let times = bounced.entry(jid.to_owned()).or_insert(0);
            if *times >= MAX_HAND_BACKS {
                bounced.remove(jid);
                tracing::warn!(jid = %jid, queue = %queue, "handed back {MAX_HAND_BACKS} times and no Ruby Sidekiq process took it: treated as a class no plugin serves");
                return false;
            }
            *times += 1;
        }
        self.metrics.process.handed_back.fetch_add(1, Ordering::Relaxed);
        self.paused.rest(queue, REST);
        true
    }

    /// Reads the live processes once; warns about each new sharer.
    pub(crate) async fn refresh(&self, redis: &Redis) -> anyhow::Result<()> {
        let processes = api::processes(&mut redis.conn()).await?;
        let sharing: Sharing = sidekiq_sharing(&processes, &self.queues, crate::redis::now_f64())
            .into_iter()
            .map(|(queue, sharers)| (queue, sharers.iter().map(|p| describe(p)).collect()))
            .collect();
        let before = self.sharing.load();
        for (queue, sharers) in &sharing {
            for sharer in sharers {
                if !before.get(queue).is_some_and(|known| known.contains(sharer)) {
                    tracing::warn!(
                        queue = %queue,
                        "queue {queue:?} is also fetched by the Ruby Sidekiq process {sharer}: jobs of classes no \
                         plugin here serves are handed back to it, and it fails those our plugins serve; give the \
                         Wasm classes a queue of their own (queue_as :wasm / sidekiq_options queue: \"wasm\") and \
                         run wasmjobs with -q wasm (docs/activejob.md)"
                    );
                }
            }
        }
        for queue in before.keys().filter(|queue| !sharing.contains_key(*queue)) {
            tracing::info!(queue = %queue, "no Ruby Sidekiq process fetches queue {queue:?} any more");
        }
        self.metrics.process.set_shared_queues(
            &self.queues,
            sharing
                .iter()
                .map(|(queue, sharers)| (queue.clone(), sharers.len() as u64))
                .collect(),
        );
        self.sharing.store(Arc::new(sharing));
        Ok(())
    }

    /// Keeps the view current until `stop`.
    pub(crate) async fn run(self: Arc<Self>, redis: Redis, stop: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => {}
                () = stop.cancelled() => return,
            }
            match self.refresh(&redis).await {
                Ok(()) => failing = false,
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!("{err:#}; keeping the last known Ruby Sidekiq processes sharing our queues");
                }
                Err(_) => {}
            }
        }
    }
}

/// How a log line names a process.
fn describe(process: &ProcessInfo) -> String {
    let cut = |text: &str| crate::job::preview(text);
    format!(
        "{} (host {}, pid {}{})",
        cut(&process.identity),
        cut(&process.hostname),
        process.pid,
        process
            .version
            .as_deref()
            .map(|v| format!(", {}", cut(v)))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_goes_back_only_to_a_sharer_and_a_bounded_number_of_times() {
        let paused = Paused::new(vec!["default".into()], None);
        let metrics = Arc::new(Metrics::new(false));
        let neighbours = Neighbours::new(vec!["default".into()], paused.clone(), metrics.clone());
        assert!(
            !neighbours.hand_back("default", "j1"),
            "no Ruby process shares the queue"
        );
        neighbours.sharing.store(Arc::new(Sharing::from([(
            "default".to_owned(),
            vec!["ruby".to_owned()],
        )])));
        for _ in 0..MAX_HAND_BACKS {
            assert!(neighbours.hand_back("default", "j1"));
        }
        assert!(
            paused.current().contains("default"),
            "the queue rests after a hand-back"
        );
        assert!(
            !neighbours.hand_back("default", "j1"),
            "bounced enough: unserved after all"
        );
        assert!(neighbours.hand_back("default", "j2"));
        assert!(!neighbours.hand_back("other", "j3"));
        assert_eq!(
            metrics.process.handed_back.load(Ordering::Relaxed),
            u64::from(MAX_HAND_BACKS) + 1
        );
    }
}
