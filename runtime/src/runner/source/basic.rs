//! Basic fetch: at-most-once, Sidekiq's default.
//!
//! Jobs are popped: a job popped by a process that then dies is lost. For
//! users who want the last bit of speed. Nothing is held in Redis for this
//! process, so there is nothing to register, reconcile or recover; jobs
//! taken but not started are pushed back at shutdown.

use std::sync::Arc;

use anyhow::Result;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::dead::{DeadSet, Place};
use super::doubt::Doubt;
use super::paused::Paused;
use super::requeue::Requeue;
use super::waiters::{Wait, Waiting};
use super::{JobSource, Settings, Stats, record, take};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::{Completion, Fetched, Known};

/// The basic job source of one process.
pub(crate) struct Basic {
    redis: Redis,
    settings: Settings,
    /// The queues' names, shared by the jobs fetched from them.
    names: Vec<Arc<str>>,
    fetch: take::FetchScript,
    requeue: Requeue,
    dead: Arc<DeadSet>,
    waiting: Waiting,
    paused: Arc<Paused>,
}

impl Basic {
    /// The source for `settings` (starts its waiter, disarmed).
    pub(crate) fn new(redis: Redis, settings: Settings, paused: Arc<Paused>) -> Self {
        let names = settings.queues.shared_names();
        let dead = Arc::new(DeadSet::new(settings.dead));
        let waits = vec![Wait::Pop {
            queues: settings.queues.names(),
        }];
        // Nothing is held in Redis, so a lost reply leaves nothing to find.
        let waiting = Waiting::start(
            &redis,
            waits,
            dead.clone(),
            Arc::new(Doubt::default()),
            paused.watch(),
            settings.max_payload,
        );
        Self {
            names,
            fetch: take::FetchScript::new(),
            requeue: Requeue::new(),
            redis,
            settings,
            dead,
            waiting,
            paused,
        }
    }
}

impl JobSource for Basic {
    fn fetch(&self, max: usize) -> BoxFuture<'_, Result<Vec<Fetched>>> {
        async move {
            let mut jobs = self.waiting.take_found(max);
            if jobs.len() < max {
                let paused = self.paused.current();
                let oversized = take::Oversized {
                    dead: &self.dead,
                    max_payload: self.settings.max_payload,
                };
                let taken = take::take(
                    &self.redis,
                    &self.fetch,
                    &self.settings.queues,
                    &self.names,
                    take::Keep::Pop,
                    &paused,
                    &oversized,
                    self.settings.sidekiq_cancels,
                    max - jobs.len(),
                );
                let taken = match taken.await {
                    Ok(took) => took.jobs,
                    Err(err) if jobs.is_empty() => return Err(err),
                    Err(err) => {
                        tracing::warn!("{err:#}");
                        Vec::new()
                    }
                };
                for (raw, queue, cancel) in taken {
                    match String::from_utf8(raw) {
                                Ok(raw) => jobs.push(Fetched {
                            raw,
                            queue,
                            cancel,
                            receipt: None,
                            shard: 0,
                            held: None,
                        }),
                        Err(err) => {
                            let bytes = err.as_bytes();
                            let buried = self.dead.bury_undecodable(&self.redis, Place::Nowhere, bytes, &queue);
                            if let Err(err) = buried.await {
                                tracing::error!(queue = %queue, bytes = bytes.len(), "{err:#}; the payload, popped in basic mode, is lost");
                            }
                        }
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

    fn doubt(&self) {}

    fn take_doubt(&self) -> bool {
        false
    }

    fn reconcile<'a>(&'a self, _known: &'a Known) -> BoxFuture<'a, Result<usize>> {
        async { Ok(0) }.boxed()
    }

    fn register(&self, _pipe: &mut redis::Pipeline) {}

    fn record<'a>(&'a self, batch: &'a [Completion], stats: &'a Stats) -> BoxFuture<'a, Result<()>> {
        async move {
            let (transaction, _) = record::transaction(batch, stats, None, &self.dead, &self.requeue, now_f64());
            record::send(transaction, &self.redis).await
        }
        .boxed()
    }

    fn requeue_all(&self, jobs: Vec<Fetched>) -> BoxFuture<'_, u64> {
        async move {
            let mut requeued = 0;
            // Newest first to the front: the oldest ends up fetched first.
            for job in jobs.into_iter().rev() {
                let pushed = redis::pipe()
                    .cmd("RPUSH")
                    .arg(keys::queue(&job.queue))
                    .arg(&job.raw)
                    .ignore()
                    .cmd("SADD")
                    .arg(keys::QUEUES)
                    .arg(&*job.queue)
                    .ignore()
                    .query_async::<()>(&mut self.redis.conn())
                    .await;
                match pushed {
                    Ok(()) => requeued += 1,
                    Err(err) => tracing::error!(queue = %job.queue, "cannot requeue a job popped in basic mode: {err}; payload: {}", job.raw),
                }
            }
            requeued
        }
        .boxed()
    }

    fn recover_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        async { Ok(0) }.boxed()
    }

    fn waiting(&self) -> BoxFuture<'_, Result<u64>> {
        super::redis_waiting(&self.redis, &self.names).boxed()
    }

    fn unregister(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}
