//! Cancelling jobs: a job asked to stop never starts, or stops where it is.
//!
//! A cancel is a request in Redis (`cancelled-<jid>`, the Sidekiq wiki's
//! key, which `wasmjobs cancel` writes with who and when; or the
//! `cancelled` field of `it-<jid>`, Sidekiq 7.3.3+'s `cancel!`). This
//! process finds it four ways, so every path to a running job is covered:
//!
//! - **at fetch**: while a request may exist that this process would not
//!   hear of (`run --sidekiq-cancels`, or a `wasmjobs cancel` still open),
//!   the fetch script marks each job it takes with the request it found,
//!   at no extra round trip ([`CancelMark`]); otherwise it looks nothing
//!   up ([`CancelMark::Unneeded`]). A job taken by a blocking wait, or
//!   whose payload the script read differently than the runner, is looked
//!   up on its own before it starts;
//! - **by message**: `wasmjobs cancel` publishes the jid on the control
//!   channel ([`super::control`]); every process stops the job at once if it
//!   runs it, and remembers the request for [`RECENT_FOR`] in case it is
//!   about to start it (the messages that arrive together are looked up
//!   together, [`LOOKUP_CHUNK`] per round trip);
//! - **by sweep**: every [`SWEEP_EVERY`], the jobs running for longer than
//!   that are looked up in one pipelined round trip (for a process that
//!   missed the message, and for Sidekiq clients that only write the key);
//! - the manager registers every job it starts here ([`Cancels::register`]).
//!
//! Stopping needs no help from the guest: the processor drops the job's
//! future, which drops its Wasm store (the instance is gone at once, and
//! its in-flight HTTP requests and SQL statements with it). The job ends
//! as **cancelled**: not retried, recorded in the cancelled set with who
//! cancelled it, when, and where it was (see [`crate::redis::control`]).
//! Its log line says which of these ways stopped it ([`Via`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use smallvec::SmallVec;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::fetched::{CancelFound, CancelMark};
use super::job_retry::Write;
use crate::redis::control::{self, CancelRequest};
use crate::redis::{Redis, keys};

/// How often running jobs are looked up.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long a cancel heard for a job not running here is remembered.
pub(crate) const RECENT_FOR: Duration = Duration::from_secs(60);
/// Most such cancels remembered.
const RECENT_MAX: usize = 10_000;
/// Most jobs looked up in one round trip.
const LOOKUP_CHUNK: usize = 1_000;

/// How this process learnt of a job's cancel (in the "job cancelled" log
/// line: a cancel found by the sweep means the message never came).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// The fetch script's mark.
    Fetch,
    /// The lookup before the job started.
    Start,
    /// A message on the control channel.
    Message,
    /// The sweep of jobs running for a second or more.
    Sweep,
}

impl Via {
    /// Its name in logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Via::Fetch => "fetch",
            Via::Start => "start",
            Via::Message => "message",
            Via::Sweep => "sweep",
        }
    }
}

/// The jobs running in this process, by jid, and the cancels heard.
pub(crate) struct Cancels {
    /// Each shard's Redis, by index (none only in unit tests of the
    /// runner core): a job's cancel request is looked up on its shard.
    redis: Vec<Redis>,
    /// Written into the record: `process <identity>`.
    from: String,
    inner: Mutex<Inner>,
    next: AtomicU64,
    /// Whether to say, once, that a request written the Sidekiq way
    /// stopped a job only because it ran long enough for the sweep (off
    /// with `run --sidekiq-cancels`, where the fetch finds them).
    sidekiq_hint: AtomicBool,
    /// Shards whose look-ups at job start failed lately, and until when
    /// no job waits for one there ([`START_REST`]).
    resting: Mutex<HashMap<u16, Instant>>,
}

/// The longest a job's start waits for its cancel look-up: a Redis that
/// is slower than that (or down) lets the job start, and the sweep looks
/// again while it runs.
const START_LOOKUP: Duration = Duration::from_millis(250);
/// After a look-up at start failed on a shard, jobs from it start without
/// one for this long (a Redis that is down or hangs costs no job a wait).
const START_REST: Duration = Duration::from_secs(5);

/// The jobs running under one jid: nearly always one, kept inline (a job
/// registers with one allocation for its jid, shared with its
/// [`Registration`], and one for its [`Watch`]).
type Watches = SmallVec<[(u64, Arc<Watch>); 1]>;

#[derive(Default)]
struct Inner {
    running: HashMap<Arc<str>, Watches>,
    recent: HashMap<String, (CancelRequest, Via, Instant)>,
}

/// One running job's cancel state.
struct Watch {
    /// Woken once `request` is set.
    notify: Notify,
    request: OnceLock<(CancelRequest, Via)>,
    started: Instant,
    /// The shard the job came from.
    shard: u16,
}

impl Watch {
    fn cancel(&self, request: CancelRequest, via: Via) {
        if self.request.set((request, via)).is_ok() {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once the job is cancelled.
    async fn cancelled(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Listening before looking: a cancel between the look and the wait
        // still wakes this wait.
        notified.as_mut().enable();
        if self.request.get().is_none() {
            notified.await;
        }
    }
}

/// A job registered as running; unregistered when dropped.
pub(crate) struct Registration {
    cancels: Arc<Cancels>,
    jid: Arc<str>,
    id: u64,
    watch: Arc<Watch>,
}

impl Cancels {
    /// The registry of the process `identity`, whose shards are `redis`.
    pub(crate) fn new(redis: Vec<Redis>, identity: &str) -> Arc<Self> {
        Arc::new(Self {
            redis,
            from: format!("process {identity}"),
            inner: Mutex::default(),
            next: AtomicU64::new(0),
            sidekiq_hint: AtomicBool::new(true),
            resting: Mutex::default(),
        })
    }

    /// The requests on `shard` for `jids` before a job starts: `None`
    /// without waiting while the shard rests after a failure, and after
    /// at most [`START_LOOKUP`] otherwise (a failure starts the rest, said
    /// once).
    async fn lookup_at_start(&self, shard: u16, jids: &[String]) -> Option<Vec<(String, CancelRequest)>> {
        let now = Instant::now();
        if self.resting_lock().get(&shard).is_some_and(|until| now < *until) {
            return None;
        }
        let failed = match tokio::time::timeout(START_LOOKUP, self.lookup(shard, jids)).await {
            Ok(Ok(found)) => {
                self.resting_lock().remove(&shard);
                return Some(found);
            }
            Ok(Err(err)) => format!("{err:#}"),
            Err(_) => format!("Redis did not answer within {START_LOOKUP:?}"),
        };
        if self.resting_lock().insert(shard, now + START_REST).is_none() {
            tracing::warn!(
                "looking up cancel requests as jobs start: {failed}; jobs start without it (each is checked while it runs) until Redis answers"
            );
        }
        None
    }

    fn resting_lock(&self) -> MutexGuard<'_, HashMap<u16, Instant>> {
        self.resting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fetch looks up requests written the Sidekiq way
    /// (`run --sidekiq-cancels`): no hint to give.
    pub(crate) fn fetch_finds_sidekiq_cancels(&self) {
        self.sidekiq_hint.store(false, Ordering::Relaxed);
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the job `jid`, fetched from `shard`, as running here.
    pub(crate) fn register(self: &Arc<Self>, jid: &str, shard: u16) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(Watch {
            notify: Notify::new(),
            request: OnceLock::new(),
            started: Instant::now(),
            shard,
        });
        let mut inner = self.inner();
        if let Some((request, via, _)) = inner.recent.get(jid) {
            watch.cancel(request.clone(), *via);
        }
        let jid: Arc<str> = Arc::from(jid);
        inner.running.entry(jid.clone()).or_default().push((id, watch.clone()));
        drop(inner);
        Registration {
            cancels: self.clone(),
            jid,
            id,
            watch,
        }
    }

    /// Cancels every running job `jid` with `request`, learnt `via`;
    /// remembers it for a while if none runs here. Returns whether one ran.
    pub(crate) fn cancel(&self, jid: &str, request: CancelRequest, via: Via) -> bool {
        let mut inner = self.inner();
        if let Some(watches) = inner.running.get(jid) {
            for (_, watch) in watches {
                watch.cancel(request.clone(), via);
            }
            return true;
        }
        let now = Instant::now();
        if inner.recent.len() >= RECENT_MAX {
            inner
                .recent
                .retain(|_, (_, _, at)| now.duration_since(*at) < RECENT_FOR);
        }
        if inner.recent.len() < RECENT_MAX {
            inner.recent.insert(jid.to_owned(), (request, via, now));
        }
        false
    }

    /// Cancel messages for `jids` (all those that arrived together):
    /// looks the requests up on `conn`, [`LOOKUP_CHUNK`] jobs per round
    /// trip (who, when; and that there is one: anyone can publish), and
    /// acts on them.
    pub(crate) async fn heard<C: ConnectionLike + Send>(&self, conn: &mut C, jids: &[String]) {
        for chunk in jids.chunks(LOOKUP_CHUNK) {
            match requests(conn, chunk).await {
                Ok(found) => {
                    for (jid, request) in found {
                        let running = self.cancel(&jid, request, Via::Message);
                        tracing::debug!(jid = %jid, running, "cancel requested");
                    }
                }
                Err(err) => match chunk {
                    [jid] => tracing::warn!(jid = %jid, "{err:#}; the next sweep will look again"),
                    _ => tracing::warn!(jobs = chunk.len(), "{err:#}; the next sweep will look again"),
                },
            }
        }
    }

    /// Looks up the jobs running for longer than [`SWEEP_EVERY`], each on
    /// its shard; every shard is looked at, the first failure returned.
    pub(crate) async fn sweep(&self) -> Result<()> {
        let mut result = Ok(());
        for (shard, redis) in self.redis.iter().enumerate() {
            let swept = self.sweep_on(&mut redis.conn(), shard as u16).await;
            if result.is_ok() {
                result = swept;
            }
        }
        result
    }

    /// [`Cancels::sweep`] of the jobs from `shard`, on `conn`.
    pub(crate) async fn sweep_on<C: ConnectionLike + Send>(&self, conn: &mut C, shard: u16) -> Result<()> {
        let jids: Vec<String> = {
            let mut inner = self.inner();
            let now = Instant::now();
            inner
                .recent
                .retain(|_, (_, _, at)| now.duration_since(*at) < RECENT_FOR);
            inner
                .running
                .iter()
                .filter(|(_, watches)| {
                    watches.iter().any(|(_, w)| {
                        w.shard == shard && w.request.get().is_none() && now.duration_since(w.started) >= SWEEP_EVERY
                    })
                })
                .map(|(jid, _)| jid.to_string())
                .collect()
        };
        for chunk in jids.chunks(LOOKUP_CHUNK) {
            for (jid, request) in requests(conn, chunk).await? {
                tracing::debug!(jid = %jid, "cancel found by the sweep");
                if request.is_sidekiqs() && self.sidekiq_hint.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        jid = %jid,
                        "a cancel written the Sidekiq way ({}) stopped a job a second or more after it started; such a request stops a job before it starts only under `wasmjobs run --sidekiq-cancels` (said once)",
                        request.by
                    );
                }
                self.cancel(&jid, request, Via::Sweep);
            }
        }
        Ok(())
    }

    /// Sweeps every [`SWEEP_EVERY`] until `stop`.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep(SWEEP_EVERY) => {}
                () = stop.cancelled() => return,
            }
            match self.sweep().await {
                Ok(()) => failing = false,
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!("{err:#}; running jobs are checked for cancels again in {SWEEP_EVERY:?}");
                }
                Err(_) => {}
            }
        }
    }

    /// The cancel requests on `shard` for `jids`.
    async fn lookup(&self, shard: u16, jids: &[String]) -> Result<Vec<(String, CancelRequest)>> {
        match self.redis.get(usize::from(shard)) {
            Some(redis) => requests(&mut redis.conn(), jids).await,
            None => Ok(Vec::new()),
        }
    }
}

/// The cancel requests in Redis for `jids`, read on `conn` in one round
/// trip.
async fn requests<C: ConnectionLike + Send>(conn: &mut C, jids: &[String]) -> Result<Vec<(String, CancelRequest)>> {
    let mut pipe = redis::pipe();
    for jid in jids {
        pipe.cmd("GET").arg(keys::cancel_request(jid));
        pipe.cmd("HGET").arg(keys::iteration(jid)).arg("cancelled");
    }
    let values: Vec<redis::Value> = pipe.query_async(conn).await.context("cannot look up cancel requests")?;
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => Some(text.clone()),
        // Missing, or a key of another type (someone else's): no request.
        _ => None,
    };
    Ok(jids
        .iter()
        .zip(values.chunks(2))
        .filter_map(|(jid, pair)| {
            let request = match pair {
                [key, _] if text(key).is_some() => CancelRequest::from_value(&text(key)?, false),
                [_, field] => CancelRequest::from_value(&text(field)?, true),
                _ => return None,
            };
            Some((jid.clone(), request))
        })
        .collect())
}

impl Registration {
    /// Before the job starts: the request found at fetch, if the fetch
    /// looked at this very jid; nothing if the fetch found no need to
    /// look; else looked up now. A lookup that fails
    /// lets the job run (the sweep looks again while it runs).
    pub(crate) async fn check_at_start(&self, mark: &CancelMark) {
        let request = match mark {
            CancelMark::Checked { jid, request } if **jid == *self.jid => request.as_ref().map(|found| match found {
                CancelFound::Key(value) => (CancelRequest::from_value(value, false), Via::Fetch),
                CancelFound::Iteration(value) => (CancelRequest::from_value(value, true), Via::Fetch),
            }),
            // Any request would have come as a message (remembered when
            // the job was registered).
            CancelMark::Unneeded => None,
            _ => self
                .cancels
                .lookup_at_start(self.watch.shard, &[self.jid.to_string()])
                .await
                .and_then(|mut found| found.pop())
                .map(|(_, request)| (request, Via::Start)),
        };
        if let Some((request, via)) = request {
            self.watch.cancel(request, via);
        }
    }

    /// The request, once the job is cancelled.
    pub(crate) fn requested(&self) -> Option<&CancelRequest> {
        self.watch.request.get().map(|(request, _)| request)
    }

    /// How this process learnt of the request, once the job is cancelled.
    pub(crate) fn via(&self) -> Option<Via> {
        self.watch.request.get().map(|(_, via)| *via)
    }

    /// Resolves when the job is cancelled.
    pub(crate) async fn cancelled(&self) {
        self.watch.cancelled().await;
    }

    /// The write for the job `raw`, cancelled by `request`.
    pub(crate) fn write(&self, raw: &str, request: &CancelRequest) -> Write {
        Write::Cancelled {
            jid: self.jid.to_string(),
            payload: control::cancelled_payload(raw, request, &self.cancels.from),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.cancels.inner();
        if let Some(watches) = inner.running.get_mut(&*self.jid) {
            watches.retain(|(id, _)| *id != self.id);
            if watches.is_empty() {
                inner.running.remove(&*self.jid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CancelRequest {
        CancelRequest {
            by: "me".into(),
            at: 1.0,
        }
    }

    #[tokio::test]
    async fn a_cancel_stops_every_job_with_that_jid_and_only_those() {
        let cancels = Cancels::new(Vec::new(), "p");
        let (a, b, other) = (
            cancels.register("j", 0),
            cancels.register("j", 0),
            cancels.register("k", 0),
        );
        assert!(cancels.cancel("j", request(), Via::Message));
        a.cancelled().await;
        b.cancelled().await;
        assert_eq!(a.requested(), Some(&request()));
        assert!(other.requested().is_none());
        drop((a, b));
        assert!(!cancels.inner().running.contains_key("j"));
    }

    /// A job already waiting is woken by a cancel from another task, and
    /// a job registered twice under one jid leaves its twin registered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_wakes_a_job_already_waiting_for_it() {
        let cancels = Cancels::new(Vec::new(), "p");
        let (first, twin) = (cancels.register("j", 0), cancels.register("j", 0));
        drop(twin);
        assert!(cancels.inner().running.contains_key("j"), "the first is still running");
        let waiting = tokio::spawn(async move {
            first.cancelled().await;
            first.requested().cloned()
        });
        // Whether the cancel lands before or after the wait begins, it wakes it.
        tokio::task::yield_now().await;
        assert!(cancels.cancel("j", request(), Via::Message));
        let woken = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting job was woken")
            .expect("the task");
        assert_eq!(woken, Some(request()));
        assert!(!cancels.inner().running.contains_key("j"));
    }

    #[tokio::test]
    async fn a_cancel_heard_before_the_job_starts_is_remembered() {
        let cancels = Cancels::new(Vec::new(), "p");
        assert!(!cancels.cancel("later", request(), Via::Message));
        let job = cancels.register("later", 0);
        assert_eq!(job.requested(), Some(&request()));
        assert_eq!(job.via(), Some(Via::Message));
    }

    #[tokio::test]
    async fn the_fetch_mark_counts_only_for_the_jid_the_runner_parsed() {
        let cancels = Cancels::new(Vec::new(), "p");
        let job = cancels.register("real", 0);
        let forged = CancelMark::Checked {
            jid: "other".into(),
            request: Some(CancelFound::Key("1".into())),
        };
        job.check_at_start(&forged).await;
        assert!(job.requested().is_none());
        let own = CancelMark::Checked {
            jid: "real".into(),
            request: Some(CancelFound::Iteration("5".into())),
        };
        job.check_at_start(&own).await;
        assert_eq!(job.requested().map(|r| r.at), Some(5.0));
        assert_eq!(job.via(), Some(Via::Fetch));
    }
}
