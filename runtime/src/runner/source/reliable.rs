//! Reliable fetch (the default): at-least-once.
//!
//! A job is moved atomically from its queue into one of this process's
//! lists — a batch list `wasmjobs:inprogress:<identity>:b<slot>`
//! ([`super::batches`]), or the in-progress list
//! `wasmjobs:inprogress:<identity>` — and leaves it only when its outcome
//! is recorded, when it is pushed back to its queue at shutdown, or when
//! another process recovers it after this one died ([`super::orphans`]). A
//! reply lost while Redis is away raises doubt, and the lists are
//! reconciled with what the runner holds ([`super::doubt`]).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::batches::Batches;
use super::dead::{DeadSet, Place};
use super::doubt::Doubt;
use super::liveness::Origin;
use super::orphans::Recovery;
use super::paused::Paused;
use super::requeue::Requeue;
use super::waiters::{Wait, Waiting};
use super::{JobSource, Settings, Stats, record, take};
use crate::job::DEFAULT_QUEUE;
use crate::redis::payload::{self, Payload};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::{CancelMark, Completion, Fetched, Held, Known};

/// The reliable job source of one process.
pub(crate) struct Reliable {
    redis: Redis,
    settings: Settings,
    /// The queues' names, shared by the jobs fetched from them.
    names: Vec<Arc<str>>,
    list: String,
    /// Every list this process may hold jobs in ([`keys::held_lists`]).
    lists: Vec<String>,
    batches: Batches,
    origin: Option<String>,
    fetch: take::FetchScript,
    requeue: Requeue,
    dead: Arc<DeadSet>,
    doubt: Arc<Doubt>,
    waiting: Waiting,
    recovery: Recovery,
    paused: Arc<Paused>,
}

impl Reliable {
    /// The source for `settings` (starts its waiters, disarmed).
    pub(crate) fn new(redis: Redis, settings: Settings, paused: Arc<Paused>) -> Self {
        let names = settings.queues.shared_names();
        let list = keys::inprogress(&settings.identity);
        let dead = Arc::new(DeadSet::new(settings.dead));
        let doubt = Arc::new(Doubt::default());
        let waits = names
            .iter()
            .map(|queue| Wait::Move {
                queue: queue.to_string(),
                into: list.clone(),
            })
            .collect();
        let waiting = Waiting::start(
            &redis,
            waits,
            dead.clone(),
            doubt.clone(),
            paused.watch(),
            settings.max_payload,
        );
        let origin = Origin::current();
        if origin.is_none() {
            tracing::warn!(
                "cannot read this process's boot id, PID namespace or start time from /proc: other processes judge it by its heartbeat only"
            );
        }
        let recovery = Recovery::new(
            redis.clone(),
            &settings.identity,
            origin.clone(),
            settings.max_recoveries,
        );
        Self {
            names,
            origin: origin.map(|o| o.encode()),
            fetch: take::FetchScript::new(),
            lists: keys::held_lists(&settings.identity),
            batches: Batches::new(&settings.identity),
            requeue: Requeue::new(),
            redis,
            settings,
            list,
            dead,
            doubt,
            waiting,
            recovery,
            paused,
        }
    }

    /// The fetched job `raw` (held in `held`'s batch list, else in the
    /// in-progress list), if it is text; else it goes to the dead set and
    /// leaves the list. If that write fails, the entry stays and doubt is
    /// raised, so the reconcile that follows buries it.
    async fn decode(&self, raw: Vec<u8>, queue: Arc<str>, cancel: CancelMark, held: Option<&Held>) -> Option<Fetched> {
        match String::from_utf8(raw) {
            Ok(raw) => Some(Fetched {
                raw,
                queue,
                cancel,
                receipt: None,
                shard: 0,
                held: held.cloned(),
            }),
            Err(err) => {
                let place = Place::List {
                    key: held.map_or(&self.list, |h| h.key()),
                    member: err.as_bytes(),
                };
                match self
                    .dead
                    .bury_undecodable(&self.redis, place, err.as_bytes(), &queue)
                    .await
                {
                    Ok(_) => {
                        if let Some(held) = held {
                            self.batches.leave(held, 1);
                        }
                    }
                    Err(err) => {
                        tracing::warn!(queue = %queue, "{err:#}; it stays in the in-progress list and is buried at the next check");
                        self.doubt.raise();
                    }
                }
                None
            }
        }
    }

    /// Puts the entry `raw` of the list `list` back at the front of its
    /// queue — or, if it is not a job, buries it. Returns whether it was
    /// requeued.
    async fn put_back(&self, list: &str, raw: &[u8]) -> Result<bool> {
        let place = Place::List { key: list, member: raw };
        let Ok(text) = std::str::from_utf8(raw) else {
            self.dead
                .bury_undecodable(&self.redis, place, raw, DEFAULT_QUEUE)
                .await?;
            return Ok(false);
        };
        let queue = match Payload::parse(text) {
            Ok(job) => job.queue().to_owned(),
            Err(error) => {
                let now = now_f64();
                tracing::warn!("a malformed job in the in-progress list was sent to the dead set: {error}");
                let entry = payload::malformed(text, &error, DEFAULT_QUEUE, now);
                self.dead.bury(&self.redis, place, &entry.to_json(), now).await?;
                return Ok(false);
            }
        };
        self.requeue.run(&self.redis, list, raw, raw, &queue).await
    }

    /// The entries of every list this process may hold jobs in, read in
    /// one round trip: (list, entries newest first), the in-progress list
    /// first (a batch list holds its oldest at its head: reversed).
    async fn listed(&self) -> Result<Vec<(&str, Vec<Vec<u8>>)>> {
        let mut pipe = redis::pipe();
        for list in &self.lists {
            pipe.cmd("LRANGE").arg(list).arg(0).arg(-1);
        }
        let listed: Vec<Vec<Vec<u8>>> = pipe
            .query_async(&mut self.redis.conn())
            .await
            .context("reading the in-progress lists")?;
        Ok(self
            .lists
            .iter()
            .map(String::as_str)
            .zip(listed)
            .enumerate()
            .map(|(i, (list, mut entries))| {
                if i > 0 {
                    entries.reverse();
                }
                (list, entries)
            })
            .collect())
    }

    /// Takes up to `max` jobs, into a free batch list if there is one.
    async fn take(&self, max: usize) -> Result<Vec<Fetched>> {
        let paused = self.paused.current();
        let oversized = take::Oversized {
            dead: &self.dead,
            max_payload: self.settings.max_payload,
        };
        let slot = self.batches.claim();
        let keep = take::Keep::Hold {
            list: &self.list,
            batch: slot.map(|slot| self.batches.key(slot)),
        };
        let took = take::take(
            &self.redis,
            &self.fetch,
            &self.settings.queues,
            &self.names,
            keep,
            &paused,
            &oversized,
            self.settings.sidekiq_cancels,
            max,
        )
        .await;
        let took = match took {
            Ok(took) => took,
            Err(err) => {
                if let Some(slot) = slot {
                    self.batches.suspect(slot);
                }
                return Err(err);
            }
        };
        let held = match slot {
            Some(slot) if took.in_batch => self.batches.filled(slot, took.jobs.len()),
            Some(slot) => {
                self.batches.unused(slot);
                None
            }
            None => None,
        };
        let mut jobs = Vec::with_capacity(took.jobs.len());
        for (raw, queue, cancel) in took.jobs {
            jobs.extend(self.decode(raw, queue, cancel, held.as_ref()).await);
        }
        Ok(jobs)
    }
}

impl JobSource for Reliable {
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>> {
        async move {
            let mut jobs = self.waiting.take_found(max);
            if jobs.len() < max {
                match self.take(max - jobs.len()).await {
                    Ok(taken) => jobs.extend(taken),
                    Err(err) => {
                        // The script may have run and only its reply been
                        // lost: its jobs would sit in our lists unrun.
                        self.doubt.raise();
                        if jobs.is_empty() {
                            return Err(err);
                        }
                        tracing::warn!("{err:#}");
                    }
                }
            }
            Ok(jobs)
        }
        .boxed()
    }

    fn wait(&self) -> BoxFuture<'_, Option<Fetched>> {
        self.waiting.wait().boxed()
    }

    fn stop_waiting(&self) -> BoxFuture<'_, Vec<Fetched>> {
        self.waiting.stop().boxed()
    }

    fn take_found(&self, max: usize) -> Vec<Fetched> {
        self.waiting.take_found(max)
    }

    fn doubt(&self) {
        self.doubt.raise();
    }

    fn take_doubt(&self) -> bool {
        self.doubt.take(Instant::now())
    }

    fn reconcile<'a>(&'a self, known: &'a Known) -> BoxFuture<'a, Result<usize>> {
        async move {
            let mut requeued = 0;
            // The batch lists (by slot) that keep an entry.
            let mut kept = Vec::new();
            for (at, (list, entries)) in self.listed().await?.into_iter().enumerate() {
                for raw in entries {
                    if std::str::from_utf8(&raw).is_ok_and(|text| known.raws.contains(text)) {
                        if let Some(slot) = at.checked_sub(1) {
                            kept.push(slot);
                        }
                        continue;
                    }
                    if self.put_back(list, &raw).await? {
                        requeued += 1;
                    }
                }
            }
            // What a lost fetch left in a batch list is back in its queue.
            self.batches.reconciled(&kept);
            Ok(requeued)
        }
        .boxed()
    }

    fn register(&self, pipe: &mut redis::Pipeline) {
        let identity = &self.settings.identity;
        pipe.cmd("SADD").arg(keys::HOLDERS).arg(identity).ignore();
        if let Some(origin) = &self.origin {
            pipe.cmd("HSET").arg(keys::ORIGINS).arg(identity).arg(origin).ignore();
        }
    }

    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>> {
        async move {
            let (transaction, leaving) =
                record::transaction(batch, stats, Some(&self.list), &self.dead, &self.requeue, now_f64());
            record::send(transaction, &self.redis).await?;
            for (held, jobs) in &leaving {
                self.batches.leave(held, *jobs);
            }
            Ok(())
        }
        .boxed()
    }

    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64> {
        async move {
            // Every job taken is in a list, `jobs` included. A list's head
            // is its newest: pushing to the front in that order puts its
            // oldest at the very front, so jobs run again in the order they
            // were fetched.
            let listed: Vec<(String, Vec<u8>)> = match self.listed().await {
                Ok(listed) => listed
                    .into_iter()
                    .flat_map(|(list, entries)| entries.into_iter().map(move |raw| (list.to_owned(), raw)))
                    .collect(),
                Err(err) => {
                    tracing::error!("{err:#}; trying the {} jobs not started one by one", jobs.len());
                    jobs.into_iter()
                        .rev()
                        .map(|j| {
                            let list = j.held.as_ref().map_or(self.list.clone(), |h| h.key().to_owned());
                            (list, j.raw.into_bytes())
                        })
                        .collect()
                }
            };
            let mut requeued = 0;
            for (list, raw) in listed {
                match self.put_back(&list, &raw).await {
                    Ok(true) => requeued += 1,
                    Ok(false) => {}
                    Err(err) => {
                        tracing::error!("cannot requeue a job: {err:#}; it is recovered when this process is seen dead")
                    }
                }
            }
            requeued
        }
        .boxed()
    }

    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        self.recovery.sweep(&self.dead).boxed()
    }

    fn waiting(&self) -> BoxFuture<'_, Result<u64>> {
        super::redis_waiting(&self.redis, &self.names).boxed()
    }

    fn unregister(&self) -> BoxFuture<'_, ()> {
        async move {
            let identity = &self.settings.identity;
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("SREM")
                .arg(keys::HOLDERS)
                .arg(identity)
                .ignore()
                .cmd("HDEL")
                .arg(keys::ORIGINS)
                .arg(identity)
                .ignore();
            for list in &self.lists {
                pipe.cmd("LLEN").arg(list);
            }
            let forget = pipe.query_async::<Vec<u64>>(&mut self.redis.conn()).await;
            match forget.map(|lens| lens.iter().sum::<u64>()) {
                Ok(0) => {}
                Ok(left) => tracing::error!(
                    "{left} jobs are still in {} (or its batch lists); they will be recovered as orphans",
                    self.list
                ),
                Err(err) => tracing::warn!("{err:#}"),
            }
        }
        .boxed()
    }
}
