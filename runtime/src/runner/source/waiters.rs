//! Waiting in Redis when every queue is empty.
//!
//! Each waiter is a task on its own connection that sleeps (no Redis
//! traffic) until the fetch loop runs dry and arms it, then blocks in Redis
//! for up to [`super::BLOCK`]: reliable runs one `BLMOVE` per queue (an
//! atomic move into the in-progress list, so a job is never held only in
//! memory), basic one `BRPOP` over all queues. A job found goes into a
//! channel the source reads from first on its next fetch, so nothing is
//! lost when the fetch loop stops waiting before a waiter returns.
//!
//! Waiters leave paused queues out ([`super::paused`]): a waiter whose
//! queues are all paused sleeps until that changes, and a change ends the
//! waits in progress (`CLIENT UNBLOCK`) so each waiter blocks again on the
//! queues not paused. A wait that took a job from a queue paused before
//! the unblock arrived puts it back unrun (`return_paused`).
//!
//! [`Waiting::stop`] ends a wait in progress at once with `CLIENT UNBLOCK`
//! before anything is requeued at shutdown: a waiter still blocked in Redis
//! would otherwise move a requeued job straight back into this process's
//! list.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::dead::{DeadSet, Place};
use super::doubt::Doubt;
use super::paused::PausedSet;
use crate::redis::{Redis, keys};
use crate::runner::fetched::Fetched;

/// What one waiter blocks on.
#[derive(Debug, Clone)]
pub(super) enum Wait {
    /// `BLMOVE queue → into` (reliable).
    Move { queue: String, into: String },
    /// `BRPOP` over the queues (basic).
    Pop { queues: Vec<String> },
}

impl Wait {
    /// This wait without the queues in `paused` or `wrong`; `None` if
    /// nothing is left.
    fn without(&self, paused: &HashSet<String>, wrong: &HashSet<String>) -> Option<Wait> {
        let out = |queue: &String| paused.contains(queue) || wrong.contains(queue);
        match self {
            Wait::Move { queue, .. } if out(queue) => None,
            Wait::Move { .. } => Some(self.clone()),
            Wait::Pop { queues } => {
                let open: Vec<String> = queues.iter().filter(|q| !out(q)).cloned().collect();
                (!open.is_empty()).then_some(Wait::Pop { queues: open })
            }
        }
    }

    /// The queues of this wait.
    fn queues(&self) -> Vec<&str> {
        match self {
            Wait::Move { queue, .. } => vec![queue.as_str()],
            Wait::Pop { queues } => queues.iter().map(String::as_str).collect(),
        }
    }
}

/// How long a queue key found of another type is left out of the blocking
/// waits before it is looked at again.
const WRONG_FOR: Duration = Duration::from_secs(30);

/// The queues among `queues` whose key holds something else than a list
/// (another client's key): one `TYPE` each, on the rare path after a
/// `WRONGTYPE`.
async fn wrongly_typed(conn: &mut redis::aio::MultiplexedConnection, queues: &[&str]) -> Result<Vec<String>> {
    let mut pipe = redis::pipe();
    for queue in queues {
        pipe.cmd("TYPE").arg(keys::queue(queue));
    }
    let kinds: Vec<String> = pipe.query_async(conn).await.context("TYPE of the queue keys")?;
    Ok(queues
        .iter()
        .zip(kinds)
        .filter(|(_, kind)| kind != "list" && kind != "none")
        .map(|(queue, _)| (*queue).to_owned())
        .collect())
}

/// The waiters of one source.
pub(super) struct Waiting {
    redis: Redis,
    armed: Arc<watch::Sender<bool>>,
    found: tokio::sync::Mutex<mpsc::Receiver<Fetched>>,
    tasks: std::sync::Mutex<Vec<(JoinHandle<()>, Arc<AtomicI64>)>>,
}

/// Disarms the waiters when a wait ends, however it ends, and ends the
/// waits still blocked in Redis: after a find, the other waiters' (they
/// would take jobs the runner has no slot for, and a recovered job could
/// be pulled straight back into a busy process); after a wait given up
/// (another shard's wait found a job first), every one's. A job a waiter
/// took meanwhile stays in `found` for the next fetch.
struct Armed<'a> {
    waiting: &'a Waiting,
    found: bool,
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.waiting.armed.send_replace(false);
        let ids = self.waiting.client_ids();
        // The waiter that found the job disarmed itself.
        if ids.len() > usize::from(self.found)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(unblock(self.waiting.redis.clone(), ids));
        }
    }
}

impl Waiting {
    /// Starts one waiter per entry of `waits`, disarmed, following `paused`.
    pub(super) fn start(
        redis: &Redis,
        waits: Vec<Wait>,
        dead: Arc<DeadSet>,
        doubt: Arc<Doubt>,
        paused: watch::Receiver<PausedSet>,
        max_payload: usize,
    ) -> Self {
        let (armed, armed_rx) = watch::channel(false);
        let armed = Arc::new(armed);
        let (found_tx, found) = mpsc::channel(64);
        let tasks = waits
            .into_iter()
            .map(|wait| {
                let client_id = Arc::new(AtomicI64::new(-1));
                let waiter = Waiter {
                    armed: armed.clone(),
                    redis: redis.clone(),
                    wait,
                    client_id: client_id.clone(),
                    doubt: doubt.clone(),
                    dead: dead.clone(),
                    paused: paused.clone(),
                    max_payload,
                };
                (tokio::spawn(waiter.run(armed_rx.clone(), found_tx.clone())), client_id)
            })
            .collect::<Vec<_>>();
        let ids: Vec<Arc<AtomicI64>> = tasks.iter().map(|(_, id)| id.clone()).collect();
        // Ends with the source (its channel closes when the found channel's
        // receiver, here, is dropped).
        let closed = found_tx.clone();
        tokio::spawn(unblock_on_change(redis.clone(), paused, ids, closed));
        Self {
            redis: redis.clone(),
            armed,
            found: tokio::sync::Mutex::new(found),
            tasks: std::sync::Mutex::new(tasks),
        }
    }

    /// Jobs the waiters found, up to `max`, without waiting.
    pub(super) fn take_found(&self, max: usize) -> Vec<Fetched> {
        let mut jobs = Vec::new();
        if let Ok(mut found) = self.found.try_lock() {
            while jobs.len() < max {
                match found.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
        }
        jobs
    }

    /// Arms the waiters and waits for the first job they find.
    pub(super) async fn wait(&self) -> Option<Fetched> {
        let mut found = self.found.lock().await;
        if let Ok(job) = found.try_recv() {
            return Some(job);
        }
        self.armed.send_replace(true);
        let mut armed = Armed {
            waiting: self,
            found: false,
        };
        let job = found.recv().await;
        // The runner has work now: the guard ends the other waits, in the
        // background so the job starts at once.
        armed.found = true;
        job
    }

    /// The Redis client ids of the waiters' connections.
    fn client_ids(&self) -> Vec<i64> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(_, id)| id.load(Ordering::Acquire))
            .filter(|&id| id >= 0)
            .collect()
    }

    /// Stops the waiters for good; returns the jobs they found that were
    /// not handed out.
    pub(super) async fn stop(&self) -> Vec<Fetched> {
        self.armed.send_replace(false);
        let mut found = self.found.lock().await;
        found.close();
        unblock(self.redis.clone(), self.client_ids()).await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for (task, _) in tasks {
            if tokio::time::timeout(Duration::from_secs(6), task).await.is_err() {
                tracing::warn!("a fetch waiter did not stop in time");
            }
        }
        let mut left = Vec::new();
        while let Some(job) = found.recv().await {
            left.push(job);
        }
        left
    }
}

/// Unblocks every waiter whenever the paused queues change, so each blocks
/// again on the queues not paused; ends when `found` closes.
async fn unblock_on_change(
    redis: Redis,
    mut paused: watch::Receiver<PausedSet>,
    ids: Vec<Arc<AtomicI64>>,
    found: mpsc::Sender<Fetched>,
) {
    loop {
        tokio::select! {
            changed = paused.changed() => if changed.is_err() { return },
            () = found.closed() => return,
        }
        // Twice: a waiter that read the old set just before the change
        // may not have sent its blocking call yet when the first unblock
        // goes out.
        for pause in [Duration::ZERO, Duration::from_millis(100)] {
            tokio::time::sleep(pause).await;
            let ids = ids
                .iter()
                .map(|id| id.load(Ordering::Acquire))
                .filter(|&id| id >= 0)
                .collect();
            unblock(redis.clone(), ids).await;
        }
    }
}

/// Ends the waits in progress on the connections `ids` (`CLIENT UNBLOCK`;
/// a connection not blocked is unaffected).
async fn unblock(redis: Redis, ids: Vec<i64>) {
    let mut conn = redis.conn();
    for id in ids {
        if let Err(err) = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(id)
            .query_async::<i64>(&mut conn)
            .await
        {
            tracing::warn!("cannot unblock a fetch waiter: {err}");
        }
    }
}

/// One blocking wait loop on its own connection.
struct Waiter {
    /// Shared with [`Waiting`]: a waiter that finds a job disarms them all.
    armed: Arc<watch::Sender<bool>>,
    redis: Redis,
    wait: Wait,
    /// The Redis client id of the waiter's connection, for `CLIENT UNBLOCK`.
    client_id: Arc<AtomicI64>,
    doubt: Arc<Doubt>,
    dead: Arc<DeadSet>,
    paused: watch::Receiver<PausedSet>,
    /// Bytes a payload may have (0: no limit): a larger one is buried.
    max_payload: usize,
}

impl Waiter {
    async fn run(mut self, mut armed: watch::Receiver<bool>, found: mpsc::Sender<Fetched>) {
        let mut conn = None;
        let mut backoff = Duration::from_millis(100);
        // Queue keys of another type, left out of the wait, and since when.
        let mut wrong: HashSet<String> = HashSet::new();
        let mut wrong_since = Instant::now();
        loop {
            if !wrong.is_empty() && wrong_since.elapsed() >= WRONG_FOR {
                wrong.clear();
            }
            // Sleep (no Redis traffic) until the fetch loop runs dry.
            tokio::select! {
                changed = armed.wait_for(|&a| a) => if changed.is_err() { return },
                () = found.closed() => return,
            }
            let paused = self.paused.borrow_and_update().clone();
            let Some(wait) = self.wait.without(&paused, &wrong) else {
                // Every queue of this waiter is paused (or not a list):
                // sleep until that changes (or the fetch loop stops
                // waiting).
                let recheck = WRONG_FOR.saturating_sub(wrong_since.elapsed());
                tokio::select! {
                    changed = self.paused.changed() => if changed.is_err() { return },
                    changed = armed.wait_for(|&a| !a) => if changed.is_err() { return },
                    () = found.closed() => return,
                    () = tokio::time::sleep(recheck), if !wrong.is_empty() => {}
                }
                continue;
            };
            if conn.is_none() {
                match self.connect().await {
                    Ok(c) => conn = Some(c),
                    Err(err) => {
                        tracing::warn!("blocking fetch: {err:#}; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            match self.wait_once(&wait, c).await {
                Ok(Some(job)) if self.paused.borrow().contains(&*job.queue) => {
                    // Paused while this wait was blocked, before the unblock
                    // arrived: the job goes back where it was, unrun.
                    backoff = Duration::from_millis(100);
                    self.return_paused(c, &job).await;
                }
                Ok(Some(job)) => {
                    backoff = Duration::from_millis(100);
                    // Before handing it on, so this waiter does not block
                    // again before the fetch loop has disarmed it.
                    self.armed.send_replace(false);
                    if let Err(mpsc::error::SendError(job)) = found.send(job).await {
                        self.put_back(c, &job).await;
                        return;
                    }
                }
                Ok(None) => backoff = Duration::from_millis(100),
                Err(err) if format!("{err:#}").contains("WRONGTYPE") => {
                    // A queue key of another type (another client's): the
                    // command moved nothing, and the connection is fine.
                    // The wait goes on without it (the non-blocking fetch
                    // skips it too, and says so).
                    tracing::debug!("blocking fetch: {err:#}");
                    match wrongly_typed(c, &wait.queues()).await {
                        Ok(found_wrong) if !found_wrong.is_empty() => {
                            if wrong.is_empty() {
                                wrong_since = Instant::now();
                            }
                            wrong.extend(found_wrong);
                        }
                        // No queue key is the wrong one (the list it moves
                        // into is, or it was fixed meanwhile), or TYPE
                        // failed: not a tight loop.
                        _ => tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(5)) => {}
                            () = found.closed() => return,
                        },
                    }
                }
                Err(err) => {
                    tracing::warn!("blocking fetch: {err:#}; reconnecting in {backoff:?}");
                    if matches!(self.wait, Wait::Move { .. }) {
                        self.doubt.raise();
                    }
                    conn = None;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection> {
        let mut conn = self.redis.dedicated(super::BLOCK).await?;
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await
            .context("CLIENT ID")?;
        self.client_id.store(id, Ordering::Release);
        Ok(conn)
    }

    /// Shutting down with a job in hand. Reliable: it is in the in-progress
    /// list and is pushed back with the rest. Basic: it exists only here,
    /// so it goes back now.
    async fn put_back(&self, conn: &mut redis::aio::MultiplexedConnection, job: &Fetched) {
        if !matches!(self.wait, Wait::Pop { .. }) {
            return;
        }
        let pushed: redis::RedisResult<()> = redis::cmd("RPUSH")
            .arg(keys::queue(&job.queue))
            .arg(&job.raw)
            .query_async(conn)
            .await;
        if let Err(err) = pushed {
            tracing::error!(queue = %job.queue, "a job popped at shutdown could not be put back: {err}; payload: {}", job.raw);
        }
    }

    /// Puts `job`, taken from a queue paused meanwhile, back at the end
    /// of its queue that fetches take from (where it was), out of the
    /// in-progress list in the same transaction (reliable).
    async fn return_paused(&self, conn: &mut redis::aio::MultiplexedConnection, job: &Fetched) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        if let Wait::Move { into, .. } = &self.wait {
            pipe.cmd("LREM").arg(into).arg(1).arg(&job.raw).ignore();
        }
        pipe.cmd("RPUSH").arg(keys::queue(&job.queue)).arg(&job.raw).ignore();
        match pipe.query_async::<()>(conn).await {
            Ok(()) => tracing::debug!(queue = %job.queue, "a job taken as its queue was paused went back"),
            Err(err) => {
                tracing::warn!(queue = %job.queue, "a job taken as its queue was paused could not go back: {err}");
                match self.wait {
                    // Still in the in-progress list: the reconcile that
                    // doubt brings returns it to its queue.
                    Wait::Move { .. } => self.doubt.raise(),
                    Wait::Pop { .. } => {
                        tracing::error!(queue = %job.queue, "payload of the job not put back: {}", job.raw)
                    }
                }
            }
        }
    }

    async fn wait_once(&self, wait: &Wait, conn: &mut redis::aio::MultiplexedConnection) -> Result<Option<Fetched>> {
        let timeout = super::BLOCK.as_secs_f64();
        let (raw, queue, place_key) = match wait {
            Wait::Move { queue, into } => {
                let job: Option<Vec<u8>> = redis::cmd("BLMOVE")
                    .arg(keys::queue(queue))
                    .arg(into)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .arg(timeout)
                    .query_async(conn)
                    .await
                    .context("BLMOVE")?;
                let Some(raw) = job else { return Ok(None) };
                (raw, queue.clone(), Some(into.as_str()))
            }
            Wait::Pop { queues } => {
                let lists: Vec<String> = queues.iter().map(|q| keys::queue(q)).collect();
                let popped: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                    .arg(&lists)
                    .arg(timeout)
                    .query_async(conn)
                    .await
                    .context("BRPOP")?;
                let Some((list, raw)) = popped else { return Ok(None) };
                let queue = list.strip_prefix("queue:").unwrap_or(&list).to_owned();
                (raw, queue, None)
            }
        };
        if self.max_payload > 0 && raw.len() > self.max_payload {
            let place = match place_key {
                Some(key) => Place::List { key, member: &raw },
                None => Place::Nowhere,
            };
            self.dead
                .bury_oversized(&self.redis, place, &raw, self.max_payload, &queue)
                .await?;
            return Ok(None);
        }
        match String::from_utf8(raw) {
            Ok(raw) => Ok(Some(Fetched::new(raw, queue))),
            Err(err) => {
                // Reliable: if this fails, the error raises doubt and the
                // reconcile that follows buries it.
                let place = match place_key {
                    Some(key) => Place::List {
                        key,
                        member: err.as_bytes(),
                    },
                    None => Place::Nowhere,
                };
                self.dead
                    .bury_undecodable(&self.redis, place, err.as_bytes(), &queue)
                    .await?;
                Ok(None)
            }
        }
    }
}
