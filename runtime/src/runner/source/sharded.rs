//! Several Redis shards as one job source (`--shard`, `docs/shards.md`).
//!
//! Each shard holding some of the runner's queues has a part: the job
//! source of those queues on that shard, exactly as with one Redis. This
//! composes them for the fetch loop, which still sees one [`JobSource`]
//! and one set of slots:
//!
//! - **fetch**: the parts are asked in the order of the queues' fetch
//!   order (strict: the shard of the first queue first; weighted: a shard
//!   comes first as often as its queues' weights say), each for what the
//!   earlier ones left unfilled, so queue weights hold across shards. A
//!   part that gave fewer jobs than asked (its queues ran dry) is not
//!   asked again for [`DRY_REST`]: asking a dry shard first on every fetch
//!   cost a round trip each, and one runner over three shards drained
//!   noop jobs at 0.80x its rate on one (`benches/redis_cost.rs`). A job
//!   pushed to a resting shard waits at most that long, or not at all when
//!   the runner is idle (the waiters of every shard block meanwhile). A
//!   part whose call fails is skipped for a backoff of its own (50 ms
//!   doubling to 1 s), said once when it starts failing and once when it
//!   answers again: a shard that is down stops only its queues.
//! - **no part holds up the others**: each call the fetch loop makes to a
//!   part (fetch, reconcile) runs as a task of its own, waited for
//!   [`PATIENCE`]. A part that has not answered by then (its Redis hangs,
//!   or a reconnect retries) is left to finish in the background and is
//!   not asked again until it has; the jobs a late fetch brings are handed
//!   out by the next fetch, or end a wait at once. A shard that refuses or
//!   drops packets so costs the others at most [`PATIENCE`] per try, and
//!   tries back off as above. A reconcile (after a lost reply) waits for
//!   its part's backoff like a fetch.
//! - **wait**: every part's waiters at once; the first job found wins.
//!   The others' waits end (`CLIENT UNBLOCK`), and a job one of them took
//!   meanwhile is handed out first by the next fetch, whichever shards it
//!   asks.
//! - every job is tagged with its shard ([`Fetched::shard`]), so its
//!   outcome goes to that shard's writer, and requeues go to its part.
//! - the heartbeat and the outcome writer of each shard use its part
//!   directly: a Redis pipeline or transaction is for one shard.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, join_all, select_all};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{JobSource, Stats};
use crate::runner::fetched::{Completion, Fetched, Known};
use crate::runner::queues::Queues;

/// First pause after a part failed; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause before a failing part is tried again: a try costs the
/// other parts at most [`PATIENCE`], and a shard that is back is served
/// within about this.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a part whose queues ran dry is left out of fetches.
pub(crate) const DRY_REST: Duration = Duration::from_millis(5);
/// How long a fetch waits for one part's answer before going on to the
/// next part without it. A healthy Redis answers a fetch in well under a
/// millisecond; a part slower than this once only has its jobs handed out
/// a fetch later.
pub(crate) const PATIENCE: Duration = Duration::from_millis(20);

/// One shard's source.
pub(crate) struct Part {
    /// The shard's index in the shard map ([`Fetched::shard`]).
    pub(crate) shard: u16,
    /// Its name, for logs.
    pub(crate) name: String,
    /// The source of the runner's queues on it.
    pub(crate) source: Arc<dyn JobSource>,
}

/// Whether a part answers, and when to try a failing one again.
#[derive(Debug, Default)]
struct Health {
    /// Set while the part fails: the pause after the last failure, and
    /// when it is over.
    failing: Option<(Duration, Instant)>,
    /// A reconcile of the part is due (its doubt was taken).
    doubted: bool,
    /// Its queues ran dry at the last fetch: not asked until then.
    dry_until: Option<Instant>,
    /// A call the fetch loop stopped waiting for ([`PATIENCE`]), still
    /// under way: the part is not asked again until it ends.
    late: Option<Late>,
}

/// A call to a part that outlived [`PATIENCE`].
#[derive(Debug)]
enum Late {
    Fetch(JoinHandle<Result<Vec<Fetched>>>),
    Reconcile(JoinHandle<Result<usize>>),
}

impl Late {
    fn is_finished(&self) -> bool {
        match self {
            Late::Fetch(task) => task.is_finished(),
            Late::Reconcile(task) => task.is_finished(),
        }
    }
}

/// The parts, as one source.
pub(crate) struct Sharded {
    parts: Vec<Part>,
    health: Vec<Mutex<Health>>,
    /// The runner's queues, in their configured order and weights.
    queues: Queues,
    names: Vec<String>,
    /// Which part holds each queue.
    part_of: HashMap<String, usize>,
    /// How long a dry part rests ([`DRY_REST`]).
    dry_rest: Duration,
    /// Jobs that late fetches brought, tagged, for the next fetch or wait.
    found: Mutex<VecDeque<Fetched>>,
    /// Rung when a call to a part ends (a late one's result is ready).
    landed: Arc<Notify>,
}

impl Sharded {
    /// `parts` (one per shard holding some of `queues`) as one source;
    /// `shard_of` names each queue's shard index.
    pub(crate) fn new(parts: Vec<Part>, queues: Queues, shard_of: impl Fn(&str) -> u16) -> Self {
        let names = queues.names();
        let part_of = names
            .iter()
            .filter_map(|queue| {
                let shard = shard_of(queue);
                let index = parts.iter().position(|part| part.shard == shard)?;
                Some((queue.clone(), index))
            })
            .collect();
        Self {
            health: parts.iter().map(|_| Mutex::default()).collect(),
            parts,
            queues,
            names,
            part_of,
            dry_rest: DRY_REST,
            found: Mutex::default(),
            landed: Arc::default(),
        }
    }

    /// The same, resting dry parts for `rest` (tests).
    #[cfg(test)]
    fn resting_dry(mut self, rest: Duration) -> Self {
        self.dry_rest = rest;
        self
    }

    fn health(&self, index: usize) -> std::sync::MutexGuard<'_, Health> {
        self.health[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The parts in the order of one fetch: that of the first of their
    /// queues in the queues' fetch order.
    fn order(&self) -> Vec<usize> {
        let mut order = Vec::with_capacity(self.parts.len());
        for queue in self.queues.fetch_order() {
            if let Some(&part) = self.part_of.get(&self.names[queue])
                && !order.contains(&part)
            {
                order.push(part);
            }
        }
        order
    }

    /// Whether the part may be asked now (it is not resting after a
    /// failure, resting dry, or busy with a late call).
    fn may_ask(&self, index: usize, now: Instant) -> bool {
        let health = self.health(index);
        health.failing.is_none_or(|(_, until)| until <= now)
            && health.dry_until.is_none_or(|until| until <= now)
            && health.late.is_none()
    }

    /// Whether the part may be reconciled now: as [`Sharded::may_ask`],
    /// a dry rest aside.
    fn may_reconcile(&self, index: usize, now: Instant) -> bool {
        let health = self.health(index);
        health.failing.is_none_or(|(_, until)| until <= now) && health.late.is_none()
    }

    /// Whether every part is failing.
    fn all_failing(&self) -> bool {
        (0..self.parts.len()).all(|index| self.health(index).failing.is_some())
    }

    fn found(&self) -> std::sync::MutexGuard<'_, VecDeque<Fetched>> {
        self.found.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `call` to part `index` as a task of its own and waits for it
    /// [`PATIENCE`]; past that, leaves it running as the part's late call
    /// (`late` wraps its task) and returns `None`.
    async fn ask<T: Send + 'static>(
        &self,
        index: usize,
        call: BoxFuture<'static, Result<T>>,
        late: fn(JoinHandle<Result<T>>) -> Late,
    ) -> Option<Result<T>> {
        let landed = self.landed.clone();
        let mut task = tokio::spawn(async move {
            let result = call.await;
            landed.notify_one();
            result
        });
        match tokio::time::timeout(PATIENCE, &mut task).await {
            Ok(Ok(result)) => Some(result),
            Ok(Err(ended)) => Some(Err(anyhow!(
                "a call to shard {} ended: {ended}",
                self.parts[index].name
            ))),
            Err(_) => {
                tracing::debug!(shard = %self.parts[index].name, "shard {} is slow to answer: going on without it", self.parts[index].name);
                self.health(index).late = Some(late(task));
                None
            }
        }
    }

    /// Takes in the results of the late calls that ended: their jobs wait
    /// in `found`, their failures start (or lengthen) the part's backoff.
    fn settle(&self) {
        for index in 0..self.parts.len() {
            let ended = {
                let mut health = self.health(index);
                match &health.late {
                    Some(late) if late.is_finished() => health.late.take(),
                    _ => None,
                }
            };
            let ended = match ended {
                Some(Late::Fetch(task)) => task.now_or_never().map(|r| r.map(|r| r.map(Some))),
                Some(Late::Reconcile(task)) => task.now_or_never().map(|r| r.map(|r| r.map(|_| None))),
                None => continue,
            };
            let result = match ended {
                Some(Ok(result)) => result,
                Some(Err(ended)) => Err(anyhow!("a call to shard {} ended: {ended}", self.parts[index].name)),
                None => Err(anyhow!("a call to shard {} was lost", self.parts[index].name)),
            };
            match result {
                Ok(jobs) => {
                    self.answered(index);
                    if let Some(jobs) = jobs {
                        let jobs = self.tag(index, jobs);
                        self.found().extend(jobs);
                    }
                }
                Err(err) => {
                    self.failed(index, &err);
                    // A failed call may have moved jobs (a lost reply).
                    self.health(index).doubted = true;
                }
            }
        }
    }

    fn failed(&self, index: usize, err: &anyhow::Error) {
        let mut health = self.health(index);
        let pause = match health.failing {
            None => {
                tracing::warn!(
                    shard = %self.parts[index].name,
                    "{err:#}; the queues of shard {} wait until it answers again, the other shards' keep running",
                    self.parts[index].name
                );
                FIRST_BACKOFF
            }
            Some((last, _)) => {
                tracing::debug!(shard = %self.parts[index].name, "{err:#}");
                (last * 2).min(MAX_BACKOFF)
            }
        };
        health.failing = Some((pause, Instant::now() + pause));
    }

    fn answered(&self, index: usize) {
        if self.health(index).failing.take().is_some() {
            tracing::info!(shard = %self.parts[index].name, "shard {} answers again: fetching from its queues", self.parts[index].name);
        }
    }

    fn tag(&self, index: usize, mut jobs: Vec<Fetched>) -> Vec<Fetched> {
        for job in &mut jobs {
            job.shard = self.parts[index].shard;
        }
        jobs
    }

    /// The part of shard `shard`, if this runner has one.
    fn part_for(&self, shard: u16) -> Option<usize> {
        self.parts.iter().position(|part| part.shard == shard)
    }
}

impl JobSource for Sharded {
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>> {
        async move {
            // What any shard's waiters already took comes first, whether
            // or not that shard is asked below: it is held for this
            // process and must not wait for its shard's turn.
            self.settle();
            let mut jobs = self.take_found(max);
            let mut first_error = None;
            let now = Instant::now();
            for index in self.order() {
                if jobs.len() >= max {
                    break;
                }
                if !self.may_ask(index, now) {
                    continue;
                }
                let asked = max - jobs.len();
                let source = self.parts[index].source.clone();
                let call = async move { source.fetch(asked).await }.boxed();
                match self.ask(index, call, Late::Fetch).await {
                    Some(Ok(found)) => {
                        self.answered(index);
                        self.health(index).dry_until = (found.len() < asked).then(|| Instant::now() + self.dry_rest);
                        jobs.extend(self.tag(index, found));
                    }
                    Some(Err(err)) => {
                        self.failed(index, &err);
                        first_error.get_or_insert(err);
                    }
                    None => {}
                }
            }
            // The fetch fails (and the loop backs off) only when every
            // part fails: otherwise the loop waits on the parts that
            // answer, resting or late ones included.
            match first_error {
                Some(err) if jobs.is_empty() && self.all_failing() => Err(err),
                _ => Ok(jobs),
            }
        }
        .boxed()
    }

    fn wait(&self) -> BoxFuture<'_, Option<Fetched>> {
        async move {
            if self.parts.is_empty() {
                return std::future::pending().await;
            }
            let waits = self
                .parts
                .iter()
                .enumerate()
                .map(|(index, part)| part.source.wait().map(move |job| (index, job)).boxed());
            let mut waits = select_all(waits);
            loop {
                // A late fetch that brought jobs ends the wait.
                self.settle();
                if let Some(job) = self.found().pop_front() {
                    return Some(job);
                }
                tokio::select! {
                    ((index, job), _, _) = &mut waits => {
                        return job.map(|mut job| {
                            job.shard = self.parts[index].shard;
                            job
                        });
                    }
                    () = self.landed.notified() => {}
                }
            }
        }
        .boxed()
    }

    fn stop_waiting(&self) -> BoxFuture<'_, Vec<Fetched>> {
        async move {
            let stopped = join_all(self.parts.iter().map(|part| part.source.stop_waiting())).await;
            self.settle();
            let mut left: Vec<Fetched> = self.found().drain(..).collect();
            left.extend(
                stopped
                    .into_iter()
                    .enumerate()
                    .flat_map(|(index, jobs)| self.tag(index, jobs)),
            );
            left
        }
        .boxed()
    }

    fn doubt(&self) {
        for part in &self.parts {
            part.source.doubt();
        }
    }

    fn take_doubt(&self) -> bool {
        let now = Instant::now();
        let mut any = false;
        for (index, part) in self.parts.iter().enumerate() {
            if part.source.take_doubt() {
                self.health(index).doubted = true;
            }
            any |= self.health(index).doubted && self.may_reconcile(index, now);
        }
        any
    }

    fn reconcile<'a>(&'a self, known: &'a Known) -> BoxFuture<'a, Result<usize>> {
        async move {
            self.settle();
            let now = Instant::now();
            let mut requeued = 0;
            for (index, part) in self.parts.iter().enumerate() {
                if !self.health(index).doubted || !self.may_reconcile(index, now) {
                    continue;
                }
                self.health(index).doubted = false;
                // Jobs a late fetch brought are held here, not unknown.
                let mut known = known.clone();
                for job in self.found().iter().filter(|job| job.shard == part.shard) {
                    known.add(job);
                }
                let source = part.source.clone();
                let call = async move { source.reconcile(&known).await }.boxed();
                match self.ask(index, call, Late::Reconcile).await {
                    Some(Ok(n)) => {
                        self.answered(index);
                        requeued += n;
                    }
                    Some(Err(err)) => {
                        tracing::warn!(shard = %part.name, "{err:#}; will check again once shard {} answers", part.name);
                        self.failed(index, &err);
                        self.health(index).doubted = true;
                    }
                    None => {}
                }
            }
            Ok(requeued)
        }
        .boxed()
    }

    /// Registers nothing: a pipeline is for one Redis, and each shard's
    /// heartbeat registers through its own part.
    fn register(&self, _pipe: &mut redis::Pipeline) {}

    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>> {
        async move {
            // Counters belong to the shard their jobs came from: only
            // that shard's writer can tell.
            if batch.is_empty() && !stats.is_empty() {
                bail!("counters without their batch; each shard's writer records its own");
            }
            for (index, part) in self.parts.iter().enumerate() {
                let ours: Vec<&Completion> = batch.iter().filter(|c| c.job.shard == part.shard).collect();
                if ours.is_empty() {
                    continue;
                }
                if ours.len() == batch.len() {
                    return self.parts[index].source.record(batch, stats).await;
                }
                Err(anyhow!(
                    "a batch of outcomes spans shards; each shard's writer records its own"
                ))?;
            }
            Ok(())
        }
        .boxed()
    }

    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64> {
        self.requeue_all_except(jobs, &[])
    }

    fn requeue_all_except<'a>(&'a self, jobs: Vec<Fetched>, stuck: &'a [u16]) -> BoxFuture<'a, u64> {
        async move {
            let mut by_part: Vec<Vec<Fetched>> = self.parts.iter().map(|_| Vec::new()).collect();
            for job in jobs {
                match self.part_for(job.shard) {
                    Some(index) => by_part[index].push(job),
                    None => tracing::error!(
                        shard = job.shard,
                        queue = %job.queue,
                        "a job of a shard this runner does not serve cannot be requeued; it stays held for recovery"
                    ),
                }
            }
            let requeued = join_all(
                self.parts
                    .iter()
                    .zip(by_part)
                    .filter(|(part, _)| !stuck.contains(&part.shard))
                    .map(|(part, jobs)| part.source.requeue_all(jobs)),
            )
            .await;
            requeued.into_iter().sum()
        }
        .boxed()
    }

    fn take_found(&self, max: usize) -> Vec<Fetched> {
        let mut jobs = Vec::new();
        {
            let mut found = self.found();
            let n = found.len().min(max);
            jobs.extend(found.drain(..n));
        }
        for (index, part) in self.parts.iter().enumerate() {
            if jobs.len() >= max {
                break;
            }
            jobs.extend(self.tag(index, part.source.take_found(max - jobs.len())));
        }
        jobs
    }

    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        async move {
            // At once: a shard that hangs must not hold up the others'.
            let swept = join_all(self.parts.iter().map(|part| part.source.recover_orphans())).await;
            let mut recovered = 0;
            let mut failed = 0;
            for (part, swept) in self.parts.iter().zip(swept) {
                match swept {
                    Ok(n) => recovered += n,
                    Err(err) => {
                        failed += 1;
                        tracing::warn!(shard = %part.name, "orphan recovery on shard {}: {err:#}", part.name);
                    }
                }
            }
            match failed > 0 && failed == self.parts.len() {
                true => Err(anyhow!("no shard could be swept for orphans")),
                false => Ok(recovered),
            }
        }
        .boxed()
    }

    fn waiting(&self) -> BoxFuture<'_, Result<u64>> {
        async move {
            let mut waiting = 0;
            for part in &self.parts {
                waiting += part
                    .source
                    .waiting()
                    .await
                    .map_err(|err| err.context(format!("shard {}", part.name)))?;
            }
            Ok(waiting)
        }
        .boxed()
    }

    fn unregister(&self) -> BoxFuture<'_, ()> {
        self.unregister_except(&[])
    }

    fn unregister_except<'a>(&'a self, stuck: &'a [u16]) -> BoxFuture<'a, ()> {
        async move {
            let parts = self.parts.iter().filter(|part| !stuck.contains(&part.shard));
            join_all(parts.map(|part| part.source.unregister())).await;
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::runner::source::memory::MemorySource;

    /// A source over one in-memory queue per shard: `(queue, shard)`.
    fn sharded(queues: &str, shards: &[(&str, u16)]) -> (Sharded, Vec<Arc<MemorySource>>) {
        let queues: Queues = queues.parse().unwrap();
        let memories: Vec<Arc<MemorySource>> = shards
            .iter()
            .map(|(queue, _)| Arc::new(MemorySource::named(queue)))
            .collect();
        let parts = shards
            .iter()
            .zip(&memories)
            .map(|((_, shard), memory)| Part {
                shard: *shard,
                name: format!("s{shard}"),
                source: memory.clone(),
            })
            .collect();
        let routes: Vec<(String, u16)> = shards.iter().map(|(q, s)| ((*q).to_owned(), *s)).collect();
        let shard_of = move |queue: &str| routes.iter().find(|(q, _)| q == queue).map_or(0, |(_, s)| *s);
        (Sharded::new(parts, queues, shard_of), memories)
    }

    fn taken(jobs: &[Fetched]) -> Vec<(&str, u16)> {
        jobs.iter().map(|j| (j.raw.as_str(), j.shard)).collect()
    }

    #[tokio::test]
    async fn strict_order_holds_across_shards_and_jobs_carry_their_shard() {
        let (source, memories) = sharded("high,low", &[("low", 0), ("high", 2)]);
        memories[0].push("l1");
        memories[1].push("h1");
        memories[1].push("h2");
        assert_eq!(taken(&source.fetch(2).await.unwrap()), [("h1", 2), ("h2", 2)]);
        memories[1].push("h3");
        assert_eq!(taken(&source.fetch(5).await.unwrap()), [("h3", 2), ("l1", 0)]);
        // Both ran dry: they rest, then are asked again in order.
        memories[0].push("l2");
        memories[1].push("h4");
        assert!(
            source.fetch(5).await.unwrap().is_empty(),
            "a dry shard is asked at once"
        );
        tokio::time::sleep(DRY_REST * 2).await;
        assert_eq!(taken(&source.fetch(5).await.unwrap()), [("h4", 2), ("l2", 0)]);
    }

    #[tokio::test]
    async fn weights_hold_across_shards() {
        let (source, memories) = sharded("a:3,b:1", &[("a", 0), ("b", 1)]);
        // Each queue runs dry at every other fetch here: no rest, or the
        // other would always come first.
        let source = source.resting_dry(Duration::ZERO);
        let mut first_a = 0u32;
        for _ in 0..4000 {
            memories[0].push("ja");
            memories[1].push("jb");
            let jobs = source.fetch(1).await.unwrap();
            first_a += u32::from(&*jobs[0].queue == "a");
            assert_eq!(source.fetch(1).await.unwrap().len(), 1);
        }
        let share = f64::from(first_a) / 4000.0;
        assert!(
            (0.70..0.80).contains(&share),
            "queue a came first {share} of the time, not ~0.75"
        );
    }

    #[tokio::test]
    async fn a_failing_shard_stops_only_its_queues_and_is_tried_again() {
        let (source, memories) = sharded("a,b", &[("a", 0), ("b", 1)]);
        let source = source.resting_dry(Duration::ZERO);
        memories[0].push("ja");
        memories[1].push("jb");
        memories[0].fail_fetches.store(true, Ordering::Release);
        assert_eq!(taken(&source.fetch(5).await.unwrap()), [("jb", 1)]);
        // Every shard failing: the error is the fetch's.
        memories[1].fail_fetches.store(true, Ordering::Release);
        assert!(source.fetch(5).await.is_err());
        memories[0].fail_fetches.store(false, Ordering::Release);
        memories[1].fail_fetches.store(false, Ordering::Release);
        // Each is asked again once its pause is over.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.is_empty() && Instant::now() < deadline {
            got = source.fetch(5).await.unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(taken(&got), [("ja", 0)]);
    }

    #[tokio::test]
    async fn a_hanging_shard_holds_up_no_other_and_its_jobs_come_when_it_answers() {
        // Shard 0 holds the first queue, so strict order asks it first.
        let (source, memories) = sharded("a,b", &[("a", 0), ("b", 1)]);
        let source = source.resting_dry(Duration::ZERO);
        memories[0].hang_fetches.store(true, Ordering::Release);
        memories[0].push("ja");
        for round in 0..20 {
            memories[1].push("jb");
            let got = tokio::time::timeout(Duration::from_secs(5), source.fetch(1))
                .await
                .unwrap_or_else(|_| panic!("fetch {round} waited for the hanging shard"))
                .unwrap();
            assert_eq!(taken(&got), [("jb", 1)], "fetch {round}");
        }
        // Nothing left on b: a wait ends when a's late fetch lands.
        let waiting = tokio::spawn(async move {
            let job = source.wait().await;
            (source, job)
        });
        tokio::task::yield_now().await;
        memories[0].answer_again();
        let (source, job) = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends when the late fetch lands")
            .unwrap();
        let job = job.expect("a job");
        assert_eq!((job.raw.as_str(), job.shard), ("ja", 0));
        // And the shard is asked again as usual.
        memories[0].push("ja2");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.is_empty() && Instant::now() < deadline {
            got = source.fetch(5).await.unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(taken(&got), [("ja2", 0)]);
    }

    #[tokio::test]
    async fn a_shard_that_keeps_failing_is_reconciled_only_after_its_backoff() {
        let (source, memories) = sharded("a,b", &[("a", 0), ("b", 1)]);
        let source = source.resting_dry(Duration::ZERO);
        memories[0].push("ja");
        memories[0].lose_next_reply.store(true, Ordering::Release);
        assert!(source.fetch(1).await.unwrap().is_empty(), "a's reply was lost");
        // Shard a is in its backoff: no reconcile is due until it is over.
        assert!(!source.take_doubt(), "a failing shard is not reconciled in its backoff");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !source.take_doubt() {
            assert!(Instant::now() < deadline, "the reconcile never came due");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(source.reconcile(&Known::default()).await.unwrap(), 1);
        assert_eq!(memories[0].state().queue.len(), 1, "the lost job is back in its queue");
    }

    #[tokio::test]
    async fn a_wait_takes_from_any_shard_and_requeues_go_home() {
        let (source, memories) = sharded("a,b", &[("a", 0), ("b", 1)]);
        memories[1].push("jb");
        let job = tokio::time::timeout(Duration::from_secs(5), source.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((job.raw.as_str(), job.shard), ("jb", 1));
        assert_eq!(source.requeue_all(vec![job]).await, 1);
        assert_eq!(memories[1].state().queue.len(), 1);
        assert!(memories[0].state().queue.is_empty());
    }
}
