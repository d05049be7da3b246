//! Taking jobs off the queues.
//!
//! **Reliable** (the default, at-least-once): a Lua script moves up to the
//! number of free slots from the queues into this process's in-progress list
//! in one atomic step; a job leaves that list only when its outcome is
//! written ([`super::outcome`]), is pushed back to its queue on shutdown, or
//! is recovered by another process if this one dies ([`super::orphans`]).
//!
//! **Basic** (at-most-once, Sidekiq's default): the script pops jobs; a job
//! popped by a process that then dies is lost. For users who want the last
//! bit of speed.
//!
//! When every queue is empty the fetcher blocks in Redis (`BLMOVE` per queue
//! for reliable, one `BRPOP` over all queues for basic) on dedicated
//! connections, so an idle process makes a couple of cheap calls a second and
//! a new job starts as soon as it is pushed. Requires Redis ≥ 6.2 (or Valkey).
//!
//! Anyone who can write to Redis can push any bytes, so every reply that
//! holds a payload is read as bytes. A payload that is not UTF-8 text is
//! never handed on: it is moved to the dead set at once, removed from the
//! in-progress list by its exact bytes ([`Burier`]), with the exact bytes
//! kept in the dead entry ([`payload::undecodable`]); the jobs fetched with
//! it run as usual. (Text that is not a valid job goes on to the processor,
//! which sends it to the dead set with its outcome.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use redis::Script;
use tokio::sync::mpsc;

use super::queues::Queues;
use crate::redis::payload;
use crate::redis::{Redis, keys, now_f64};

/// How long one blocking call waits in Redis before the loop re-checks
/// whether it should still be waiting. Shutdown does not wait for it
/// (`CLIENT UNBLOCK`), so it is long: each return is a wake-up, and on a VM
/// a wake-up costs ~0.4 ms of CPU, the bulk of an idle runner's cost
/// (docs/performance.md). A connection that dies silently is noticed after
/// this plus the response timeout.
pub const BLOCK: Duration = Duration::from_secs(15);

/// The delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FetchMode {
    /// At-least-once: jobs are held in a per-process in-progress list.
    #[default]
    Reliable,
    /// At-most-once: jobs are popped; a crash loses the jobs in flight.
    Basic,
}

/// A job taken from a queue, exactly as it was stored.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The payload text (also the in-progress list entry, for the ack).
    pub raw: String,
    /// The queue it came from.
    pub queue: String,
}

/// Moves up to ARGV[1] jobs from KEYS[2..] (in order) to KEYS[1] (reliable),
/// or pops them (basic, when ARGV[2] == "0"). Returns [queue index, job, …].
const FETCH_LUA: &str = r#"
local max = tonumber(ARGV[1])
local keep = ARGV[2] == "1"
local out = {}
local got = 0
for i = 2, #KEYS do
  local need = max - got
  if need <= 0 then break end
  local jobs = redis.call('RPOP', KEYS[i], need)
  if jobs then
    if keep then redis.call('LPUSH', KEYS[1], unpack(jobs)) end
    for _, job in ipairs(jobs) do
      out[#out + 1] = tostring(i - 2)
      out[#out + 1] = job
    end
    got = got + #jobs
  end
end
return out
"#;

/// How long after a lost reply the in-progress list keeps being reconciled.
pub const DOUBT_WINDOW: Duration = Duration::from_secs(5);
/// Least time between two reconciles.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(250);

#[derive(Default)]
struct DoubtWindow {
    until: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
}

/// Most jobs one fetch moves (also bounded by free slots).
pub const MAX_BATCH: usize = 500;

/// The fetch side of one process.
pub struct Fetcher {
    /// When reconciles are due after a lost reply.
    window: std::sync::Mutex<DoubtWindow>,
    /// Set when a call failed after Redis may have carried it out (a lost
    /// reply): the in-progress list may then hold jobs nobody runs.
    doubt: Arc<AtomicBool>,
    mode: FetchMode,
    redis: Redis,
    queues: Queues,
    names: Vec<String>,
    inprogress: String,
    script: Script,
}

impl Fetcher {
    /// A fetcher for `queues`, holding reliable jobs in `identity`'s list.
    pub fn new(mode: FetchMode, redis: Redis, queues: Queues, identity: &str) -> Self {
        let names = queues.names();
        Self {
            window: std::sync::Mutex::new(DoubtWindow::default()),
            doubt: Arc::new(AtomicBool::new(false)),
            mode,
            redis,
            queues,
            names,
            inprogress: keys::inprogress(identity),
            script: Script::new(FETCH_LUA),
        }
    }

    /// The delivery guarantee in use.
    pub fn mode(&self) -> FetchMode {
        self.mode
    }

    /// This process's in-progress list.
    pub fn inprogress_key(&self) -> &str {
        &self.inprogress
    }

    /// Notes that a reply may have been lost (reliable mode only matters).
    pub fn doubt(&self) {
        if self.mode == FetchMode::Reliable {
            self.doubt.store(true, Ordering::Release);
        }
    }

    /// Whether a reconcile is due. After a lost reply, reconciles keep
    /// coming (at most every [`RECONCILE_EVERY`]) for [`DOUBT_WINDOW`]:
    /// while Redis restarts, orphans can appear after the first check.
    pub fn take_doubt(&self) -> bool {
        let now = std::time::Instant::now();
        let mut window = self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.doubt.swap(false, Ordering::AcqRel) {
            window.until = Some(now + DOUBT_WINDOW);
        }
        match window.until {
            Some(until) if now < until => {
                if window.last.is_some_and(|last| now < last + RECONCILE_EVERY) {
                    return false;
                }
                window.last = Some(now);
                true
            }
            Some(_) => {
                // One last check as the window closes.
                window.until = None;
                window.last = None;
                true
            }
            None => false,
        }
    }

    /// Pushes back to their queues the jobs in our in-progress list that are
    /// not in `known` (jobs running or awaiting their outcome write): they
    /// were moved by a call whose reply was lost. Returns how many.
    pub async fn reconcile(&self, known: &std::collections::HashSet<String>) -> Result<usize> {
        let listed: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&self.inprogress)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.redis.conn())
            .await
            .context("reading the in-progress list")?;
        let requeuer = Requeuer::default();
        let mut requeued = 0;
        for bytes in listed {
            let raw = match String::from_utf8(bytes) {
                Ok(raw) if known.contains(&raw) => continue,
                Ok(raw) => raw,
                Err(err) => {
                    let default = self.names.first().map_or("default", String::as_str);
                    Burier::default()
                        .bury(&self.redis, Some(&self.inprogress), err.as_bytes(), default)
                        .await?;
                    continue;
                }
            };
            let raw = &raw;
            let queue = crate::redis::payload::Payload::parse(raw)
                .map(|p| p.queue().to_owned())
                .unwrap_or_else(|_| self.names.first().cloned().unwrap_or_else(|| "default".into()));
            if requeuer
                .requeue(&self.redis, &self.inprogress, raw, &queue, raw)
                .await?
            {
                requeued += 1;
            }
        }
        Ok(requeued)
    }

    /// Takes up to `max` jobs without blocking.
    pub async fn fetch(&self, max: usize) -> Result<Vec<Fetched>> {
        let order = self.queues.fetch_order();
        let mut invocation = self.script.prepare_invoke();
        invocation.key(&self.inprogress);
        for &i in &order {
            invocation.key(keys::queue(&self.names[i]));
        }
        invocation
            .arg(max.min(MAX_BATCH))
            .arg(if self.mode == FetchMode::Reliable { "1" } else { "0" });
        let flat: Vec<Vec<u8>> = invocation
            .invoke_async(&mut self.redis.conn())
            .await
            .context("fetching jobs")?;
        let mut jobs = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(position), Some(raw)) = (flat.next(), flat.next()) {
            let position: usize = std::str::from_utf8(&position)
                .ok()
                .and_then(|p| p.parse().ok())
                .context("fetch script returned a bad queue index")?;
            let queue = order.get(position).map(|&i| self.names[i].clone()).unwrap_or_default();
            jobs.extend(self.decode(raw, queue).await);
        }
        Ok(jobs)
    }

    /// The fetched job `raw`, if it is text; else it goes to the dead set
    /// (and, reliable, leaves the in-progress list). If that write fails,
    /// reliable: the entry stays in the list and a reconcile is asked for,
    /// which buries it later; basic: it is lost (logged), as any job popped
    /// at most once. The jobs fetched with it go ahead either way.
    async fn decode(&self, raw: Vec<u8>, queue: String) -> Option<Fetched> {
        match String::from_utf8(raw) {
            Ok(raw) => Some(Fetched { raw, queue }),
            Err(err) => {
                let from = (self.mode == FetchMode::Reliable).then_some(self.inprogress.as_str());
                let bytes = err.as_bytes().len();
                if let Err(err) = Burier::default().bury(&self.redis, from, err.as_bytes(), &queue).await {
                    if from.is_some() {
                        tracing::warn!(queue = %queue, "{err:#}; it stays in the in-progress list and is buried at the next check");
                        self.doubt();
                    } else {
                        tracing::error!(queue = %queue, bytes, "{err:#}; the payload, popped in basic mode, is lost");
                    }
                }
                None
            }
        }
    }

    /// Starts the blocking waiters: while `armed` is true they wait in Redis
    /// for a job to appear and send it to `found`. Reliable mode runs one
    /// `BLMOVE` waiter per queue (atomic move, so nothing is ever held only
    /// in memory); basic mode one `BRPOP` over all queues. Stop them with
    /// [`Waiters::stop`] after closing `found`.
    pub fn spawn_waiters(&self, armed: tokio::sync::watch::Receiver<bool>, found: mpsc::Sender<Fetched>) -> Waiters {
        let groups: Vec<(Vec<String>, Option<String>)> = match self.mode {
            FetchMode::Reliable => self
                .names
                .iter()
                .map(|n| (vec![n.clone()], Some(self.inprogress.clone())))
                .collect(),
            FetchMode::Basic => vec![(self.names.clone(), None)],
        };
        let mut waiters = Waiters {
            redis: self.redis.clone(),
            tasks: Vec::new(),
            client_ids: Vec::new(),
        };
        for (queues, inprogress) in groups {
            let client_id = Arc::new(AtomicI64::new(-1));
            let waiter = Waiter {
                redis: self.redis.clone(),
                queues,
                inprogress,
                client_id: client_id.clone(),
                doubt: self.doubt.clone(),
            };
            waiters
                .tasks
                .push(tokio::spawn(waiter.run(armed.clone(), found.clone())));
            waiters.client_ids.push(client_id);
        }
        waiters
    }
}

/// The running waiters of a fetcher.
pub struct Waiters {
    redis: Redis,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    client_ids: Vec<Arc<AtomicI64>>,
}

impl Waiters {
    /// Stops the waiters for good: `CLIENT UNBLOCK` ends a wait in progress
    /// at once (else a job requeued at shutdown could be moved straight back
    /// into this process's list by a waiter still blocked in Redis), then
    /// waits for the tasks to finish. Close the `found` channel first.
    pub async fn stop(self) {
        let mut conn = self.redis.conn();
        for (task, id) in self.tasks.into_iter().zip(&self.client_ids) {
            let id = id.load(Ordering::Acquire);
            if id >= 0
                && let Err(err) = redis::cmd("CLIENT")
                    .arg("UNBLOCK")
                    .arg(id)
                    .query_async::<i64>(&mut conn)
                    .await
            {
                tracing::warn!("cannot unblock a fetch waiter: {err}");
            }
            if tokio::time::timeout(Duration::from_secs(6), task).await.is_err() {
                tracing::warn!("a fetch waiter did not stop in time");
            }
        }
    }
}

/// One blocking wait loop on its own connection.
struct Waiter {
    redis: Redis,
    queues: Vec<String>,
    /// Reliable: the list to move into. Basic: none.
    inprogress: Option<String>,
    /// The Redis client id of the waiter's connection, for `CLIENT UNBLOCK`.
    client_id: Arc<AtomicI64>,
    /// The fetcher's lost-reply flag.
    doubt: Arc<AtomicBool>,
}

impl Waiter {
    async fn run(self, mut armed: tokio::sync::watch::Receiver<bool>, found: mpsc::Sender<Fetched>) {
        let mut conn = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            if found.is_closed() {
                return;
            }
            // Sleep (no Redis traffic) until the fetch loop runs dry.
            tokio::select! {
                changed = armed.wait_for(|&a| a) => if changed.is_err() { return },
                () = found.closed() => return,
            }
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
            match self.wait_once(c).await {
                Ok(Some(job)) => {
                    backoff = Duration::from_millis(100);
                    if let Err(mpsc::error::SendError(job)) = found.send(job).await {
                        // Shutting down. Reliable: the job is in our
                        // in-progress list and is pushed back with the rest.
                        // Basic: it exists only here, so put it back now.
                        if self.inprogress.is_none() {
                            self.put_back(c, &job).await;
                        }
                        return;
                    }
                }
                Ok(None) => backoff = Duration::from_millis(100),
                Err(err) => {
                    tracing::warn!("blocking fetch: {err:#}; reconnecting in {backoff:?}");
                    if self.inprogress.is_some() {
                        self.doubt.store(true, Ordering::Release);
                    }
                    conn = None;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection> {
        let mut conn = self.redis.dedicated(BLOCK).await?;
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await
            .context("CLIENT ID")?;
        self.client_id.store(id, Ordering::Release);
        Ok(conn)
    }

    async fn put_back(&self, conn: &mut redis::aio::MultiplexedConnection, job: &Fetched) {
        let pushed: redis::RedisResult<()> = redis::cmd("RPUSH")
            .arg(keys::queue(&job.queue))
            .arg(&job.raw)
            .query_async(conn)
            .await;
        if let Err(err) = pushed {
            tracing::error!(queue = %job.queue, "a job popped at shutdown could not be put back: {err}; payload: {}", job.raw);
        }
    }

    async fn wait_once(&self, conn: &mut redis::aio::MultiplexedConnection) -> Result<Option<Fetched>> {
        let timeout = BLOCK.as_secs_f64();
        match &self.inprogress {
            Some(inprogress) => {
                let queue = &self.queues[0];
                let job: Option<Vec<u8>> = redis::cmd("BLMOVE")
                    .arg(keys::queue(queue))
                    .arg(inprogress)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .arg(timeout)
                    .query_async(conn)
                    .await
                    .context("BLMOVE")?;
                match job {
                    Some(raw) => self.decode(raw, queue.clone()).await,
                    None => Ok(None),
                }
            }
            None => {
                let lists: Vec<String> = self.queues.iter().map(|q| keys::queue(q)).collect();
                let popped: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                    .arg(&lists)
                    .arg(timeout)
                    .query_async(conn)
                    .await
                    .context("BRPOP")?;
                match popped {
                    Some((list, raw)) => {
                        self.decode(raw, list.strip_prefix("queue:").unwrap_or(&list).to_owned())
                            .await
                    }
                    None => Ok(None),
                }
            }
        }
    }

    /// The job `raw` taken from `queue`, if it is text; else it goes to the
    /// dead set. Reliable: if that fails, the error makes the loop set the
    /// lost-reply flag, and the reconcile that follows buries it.
    async fn decode(&self, raw: Vec<u8>, queue: String) -> Result<Option<Fetched>> {
        match String::from_utf8(raw) {
            Ok(raw) => Ok(Some(Fetched { raw, queue })),
            Err(err) => {
                Burier::default()
                    .bury(&self.redis, self.inprogress.as_deref(), err.as_bytes(), &queue)
                    .await?;
                Ok(None)
            }
        }
    }
}

/// Puts `raw` back at the front of `queue` (the next job fetched) if it is
/// still in the in-progress list; atomic, so a job acked at the same moment
/// is not requeued as well.
const REQUEUE_LUA: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

/// Moves jobs from an in-progress list back to their queues.
pub struct Requeuer {
    script: Script,
}

impl Default for Requeuer {
    fn default() -> Self {
        Self {
            script: Script::new(REQUEUE_LUA),
        }
    }
}

impl Requeuer {
    /// Removes `raw` from `inprogress` and pushes `replacement` (usually the
    /// same text) to the front of `queue`. Returns false if `raw` was no
    /// longer there.
    pub async fn requeue(
        &self,
        redis: &Redis,
        inprogress: &str,
        raw: &str,
        queue: &str,
        replacement: &str,
    ) -> Result<bool> {
        let moved: i64 = self
            .script
            .key(inprogress)
            .key(keys::queue(queue))
            .key(keys::QUEUES)
            .arg(raw)
            .arg(replacement)
            .arg(queue)
            .invoke_async(&mut redis.conn())
            .await
            .context("requeueing a job")?;
        Ok(moved == 1)
    }
}

/// Removes ARGV[1] from the list KEYS[1] (when there is one: `#KEYS == 2`)
/// and adds ARGV[2] to the dead set (the last key) with score ARGV[3]; with
/// a list, only if the entry was still there.
const BURY_LUA: &str = r#"
local dead = KEYS[#KEYS]
if #KEYS == 2 and redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', dead, ARGV[3], ARGV[2])
return 1
"#;

/// Sends payloads that are not UTF-8 text to the dead set.
pub struct Burier {
    script: Script,
}

impl Default for Burier {
    fn default() -> Self {
        Self {
            script: Script::new(BURY_LUA),
        }
    }
}

impl Burier {
    /// Adds the dead-set entry for the undecodable `raw` (taken from
    /// `queue`) and, if `from` names a list (an in-progress list), removes
    /// `raw` from it by its exact bytes, atomically. Returns false if `raw`
    /// was no longer in `from`.
    pub async fn bury(&self, redis: &Redis, from: Option<&str>, raw: &[u8], queue: &str) -> Result<bool> {
        let now = now_f64();
        let dead = payload::undecodable(raw, queue, now);
        let mut invocation = self.script.prepare_invoke();
        if let Some(list) = from {
            invocation.key(list);
        }
        invocation.key(keys::DEAD).arg(raw).arg(dead.to_json()).arg(now);
        let buried: i64 = invocation
            .invoke_async(&mut redis.conn())
            .await
            .context("sending a payload that is not UTF-8 text to the dead set")?;
        if buried == 1 {
            tracing::warn!(
                queue = %queue,
                jid = %dead.jid(),
                bytes = raw.len(),
                "a job payload that is not UTF-8 text was sent to the dead set"
            );
        }
        Ok(buried == 1)
    }
}
