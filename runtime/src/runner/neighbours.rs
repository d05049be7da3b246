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
//! fresh ([`crate::redis::sharing::LIVE_FOR`]). A job this process has
//! handed back [`MAX_HAND_BACKS`] times in a row waits [`DEFER`] in
//! `schedule` instead, still untouched (`Write::HandBackLater`), so
//! neither a Ruby process busy for minutes nor a process record that
//! lies keeps a job bouncing, and none of them turns a Ruby job into a
//! failure.
//!
//! A job of a class no plugin serves, on a queue no Ruby process is known
//! to share, first has the processes read again ([`Neighbours::recheck`]):
//! a Ruby process started since the last read (they are read every
//! [`REFRESH`]) is found before its job would be retried as "no plugin".
//! On a queue only wasmjobs serves, such a job is retried as "no plugin",
//! as before.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

/// How many times in a row one job is handed back to the front of its
/// queue before it waits [`DEFER`] in `schedule`.
pub(crate) const MAX_HAND_BACKS: u32 = 5;

/// How long a job that no Ruby process took after [`MAX_HAND_BACKS`]
/// hand-backs waits in `schedule` (whoever polls it then puts it back).
pub(crate) const DEFER: Duration = Duration::from_secs(30);

/// Most jobs whose hand-backs are counted at once (then the counts start
/// over).
const MAX_TRACKED: usize = 10_000;

/// The Ruby processes sharing each of this process's queues (the
/// description of each: identity, host, pid).
type Sharing = BTreeMap<String, Vec<String>>;

/// Where a job of a class no plugin here serves goes, on a queue a Ruby
/// Sidekiq process shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Bounce {
    /// Back to the front of its queue.
    Front,
    /// Into `schedule`, due after this long.
    Later(Duration),
}

/// This process's view of who else fetches its queues.
pub(crate) struct Neighbours {
    queues: Vec<String>,
    sharing: ArcSwap<Sharing>,
    paused: Arc<Paused>,
    metrics: Arc<Metrics>,
    /// How many times each job was handed back.
    bounced: Mutex<HashMap<String, u32>>,
    /// When the last look at the processes started (held while they are
    /// read, so jobs waiting on a [`recheck`](Neighbours::recheck) use its
    /// result).
    read: tokio::sync::Mutex<Option<Instant>>,
    /// The members of `processes` when the records were last read.
    seen: Mutex<HashSet<Vec<u8>>>,
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
            read: tokio::sync::Mutex::new(None),
            seen: Mutex::new(HashSet::new()),
        })
    }

    /// Whether a live Ruby Sidekiq process fetches `queue` too.
    pub(crate) fn shares(&self, queue: &str) -> bool {
        self.sharing.load().contains_key(queue)
    }

    /// Where the job `jid` of `queue`, of a class no plugin serves, goes
    /// for the Ruby processes sharing the queue, if any does: back to the
    /// front (the queue then rests), or, after [`MAX_HAND_BACKS`] in a row,
    /// [`DEFER`] into `schedule` (no Ruby process takes it: one busy for
    /// long, or a process record that lies). Counted either way.
    pub(crate) fn hand_back(&self, queue: &str, jid: &str) -> Option<Bounce> {
        if !self.shares(queue) {
            return None;
        }
        let bounce = {
            let mut bounced = self.bounced.lock().unwrap_or_else(PoisonError::into_inner);
            if bounced.len() >= MAX_TRACKED && !bounced.contains_key(jid) {
                bounced.clear();
            }
            let times = bounced.entry(jid.to_owned()).or_insert(0);
            if *times >= MAX_HAND_BACKS {
                bounced.remove(jid);
                Bounce::Later(DEFER)
            } else {
                *times += 1;
                Bounce::Front
            }
        };
        self.metrics.process.handed_back.fetch_add(1, Ordering::Relaxed);
        match bounce {
            Bounce::Front => self.paused.rest(queue, REST),
            Bounce::Later(after) => tracing::warn!(
                jid = %jid,
                queue = %queue,
                "handed back {MAX_HAND_BACKS} times and no Ruby Sidekiq process took it: it waits {}s in schedule, untouched",
                after.as_secs()
            ),
        }
        Some(bounce)
    }

    /// [`hand_back`](Neighbours::hand_back), after looking at the
    /// processes again if `queue` is not known to be shared and no look has
    /// started since this call: a Ruby process that started after the last
    /// read (they are read every [`REFRESH`]) is found before its job is
    /// retried as "no plugin". A look is one `SMEMBERS processes`; the
    /// records are read only if a member is new since they were last read
    /// (a Sidekiq process that starts is a new identity). One look at a
    /// time, and the jobs that wait for it use its result, so a flood of
    /// such jobs costs a command or two a fetched batch. A failed read
    /// keeps the last view.
    pub(crate) async fn recheck(&self, redis: &Redis, queue: &str, jid: &str) -> Option<Bounce> {
        if !self.shares(queue) {
            let asked = Instant::now();
            let mut read = self.read.lock().await;
            if read.is_none_or(|started| started < asked) {
                *read = Some(Instant::now());
                let members = api::process_identities(&mut redis.conn()).await;
                let known = |members: &[Vec<u8>]| {
                    let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                    members.iter().all(|m| seen.contains(m))
                };
                if !members.as_deref().is_ok_and(known)
                    && let Err(err) = self.read_processes(redis).await
                {
                    tracing::debug!("{err:#}; keeping the last known Ruby Sidekiq processes sharing our queues");
                }
            }
        }
        self.hand_back(queue, jid)
    }

    /// Reads the live processes once; warns about each new sharer.
    pub(crate) async fn refresh(&self, redis: &Redis) -> anyhow::Result<()> {
        let mut read = self.read.lock().await;
        *read = Some(Instant::now());
        self.read_processes(redis).await
    }

    async fn read_processes(&self, redis: &Redis) -> anyhow::Result<()> {
        let members = api::process_identities(&mut redis.conn()).await?;
        let processes = api::processes_of(&mut redis.conn(), members.clone()).await?;
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = members.into_iter().collect();
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
    fn a_job_goes_back_only_to_a_sharer_and_waits_in_schedule_after_bouncing() {
        let paused = Paused::new(vec!["default".into()], None);
        let metrics = Arc::new(Metrics::new(false));
        let neighbours = Neighbours::new(vec!["default".into()], paused.clone(), metrics.clone());
        assert!(
            neighbours.hand_back("default", "j1").is_none(),
            "no Ruby process shares the queue"
        );
        neighbours.sharing.store(Arc::new(Sharing::from([(
            "default".to_owned(),
            vec!["ruby".to_owned()],
        )])));
        for _ in 0..MAX_HAND_BACKS {
            assert_eq!(neighbours.hand_back("default", "j1"), Some(Bounce::Front));
        }
        assert!(
            paused.current().contains("default"),
            "the queue rests after a hand-back"
        );
        assert_eq!(
            neighbours.hand_back("default", "j1"),
            Some(Bounce::Later(DEFER)),
            "bounced enough: it waits in schedule, still handed back"
        );
        assert_eq!(
            neighbours.hand_back("default", "j1"),
            Some(Bounce::Front),
            "back from schedule: counted from the start"
        );
        assert_eq!(neighbours.hand_back("default", "j2"), Some(Bounce::Front));
        assert_eq!(neighbours.hand_back("other", "j3"), None);
        assert_eq!(
            metrics.process.handed_back.load(Ordering::Relaxed),
            u64::from(MAX_HAND_BACKS) + 3
        );
    }
}
