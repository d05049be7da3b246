//! The poller: moves due jobs from `schedule` and `retry` to their queues.
//!
//! As in Sidekiq, the pause between polls is random around
//! `poll_interval × live processes`, so a cluster polls about once per
//! `poll_interval` in total and processes do not stampede. Each move is the
//! job source's ([`DueMover`]): atomic, so a job is enqueued exactly once
//! however many processes poll; members are read as bytes, and one that is
//! not a valid job goes to the dead set instead of stopping the poller,
//! and a set key of another type (written by some other client) stops the
//! polling of that set alone, said once until it is readable again.
//!
//! While jobs this process's limiter sent back for their turn are due
//! ([`Turns`]), it polls every second instead, so they come back in time
//! whatever the interval.
//!
//! When a plugin appears for a class that had none, the jobs of that class
//! waiting in `retry` for it ([`Poller::release_unserved`]) are enqueued at
//! once instead of at their backoff time.

use std::time::Duration;

use anyhow::{Context, Result};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::limiter::Turns;
use super::source::DeadCaps;
use super::source::due::DueMover;
use crate::redis::payload::Payload;
use crate::redis::{Redis, bounded, keys, now_f64};

/// The `error_class` of a job retried because no plugin served its class.
const NO_PLUGIN: &str = super::job_retry::NO_PLUGIN;

/// Jobs read per round.
const BATCH: usize = 100;

/// The scheduled-job poller.
pub(crate) struct Poller {
    redis: Redis,
    average: Duration,
    mover: DueMover,
    /// When the jobs sent back by the limiter are due.
    turns: std::sync::Arc<Turns>,
    /// What fails now (a set, or the poll itself), already said.
    failing: std::sync::Mutex<std::collections::HashSet<&'static str>>,
}

impl Poller {
    /// A poller whose average pause per process is `average` (shorter
    /// while `turns` says limited jobs are due); jobs over `max_payload`
    /// bytes (0: no limit) go to the dead set unread.
    pub(crate) fn new(
        redis: Redis,
        average: Duration,
        dead: DeadCaps,
        max_payload: usize,
        turns: std::sync::Arc<Turns>,
    ) -> Self {
        Self {
            redis,
            average,
            mover: DueMover::new(dead, max_payload),
            turns,
            failing: Default::default(),
        }
    }

    /// Polls until `stop`.
    pub(crate) async fn run(self: std::sync::Arc<Self>, stop: CancellationToken) {
        // A random first wait spreads processes started together.
        let mut pause = self.average.mul_f64(rand::rng().random_range(0.0..1.0));
        loop {
            let paused = std::time::Instant::now();
            loop {
                let left = self.turns.pause(pause, now_f64()).saturating_sub(paused.elapsed());
                if left.is_zero() {
                    break;
                }
                // A job sent back meanwhile may shorten the pause.
                tokio::select! {
                    () = tokio::time::sleep(left) => {}
                    () = self.turns.sent() => {}
                    () = stop.cancelled() => return,
                }
            }
            let processes = match self.poll().await {
                Ok((_, processes)) => {
                    self.note("poll", Ok(()));
                    processes
                }
                Err(err) => {
                    self.note("poll", Err(format!("{err:#}")));
                    1
                }
            };
            let average = self.average.mul_f64(processes.max(1) as f64);
            pause = average.mul_f64(rand::rng().random_range(0.5..1.5));
        }
    }

    /// One poll: the first batch of due jobs of both sets and the number of
    /// live processes (for the next pause) in a single round trip, which is
    /// all an idle cluster costs; then moves what is due, batch by batch.
    /// Returns (jobs moved, live processes).
    async fn poll(&self) -> Result<(usize, u64)> {
        let now = now_f64();
        let mut pipe = redis::pipe();
        self.mover.load(&mut pipe);
        for set in [keys::SCHEDULE, keys::RETRY] {
            self.mover.stage_due(&mut pipe, set, BATCH, now);
        }
        pipe.cmd("SCARD").arg(keys::PROCESSES);
        // One key of another type fails its own reply, not the poll.
        pipe.ignore_errors();
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut self.redis.conn())
            .await
            .context("reading due scheduled and retry jobs")?;
        let mut replies = replies.into_iter();
        let schedule = replies.next().map(bounded::reply::<Vec<Vec<u8>>>);
        let retry = replies.next().map(bounded::reply::<Vec<Vec<u8>>>);
        let processes = replies.next().and_then(|n| bounded::reply::<u64>(n).ok()).unwrap_or(1);
        let mut moved = 0;
        let sets = [(keys::SCHEDULE, schedule), (keys::RETRY, retry)];
        for (set, due) in sets {
            let due = match due.unwrap_or_else(|| Err("no reply".into())) {
                Ok(due) => {
                    self.note(set, Ok(()));
                    due
                }
                Err(why) => {
                    self.note(set, Err(format!("cannot read the {set} set: {why}")));
                    continue;
                }
            };
            moved += self.move_due(set, due, now).await?;
        }
        if moved > 0 {
            tracing::debug!(moved, "enqueued due scheduled/retry jobs");
        }
        Ok((moved, processes))
    }

    /// Says a failure of `what` once, and its end.
    fn note(&self, what: &'static str, result: Result<(), String>) {
        let mut failing = self.failing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(()) if failing.remove(what) => tracing::info!("scheduled poller: {what} readable again"),
            Ok(()) => {}
            Err(why) if failing.insert(what) => {
                tracing::warn!("scheduled poller: {why} (said once until it works again)")
            }
            Err(why) => tracing::debug!("scheduled poller: {why}"),
        }
    }

    /// Moves the `due` members of `set`, then the next batches while they
    /// are full.
    async fn move_due(&self, set: &str, mut due: Vec<Vec<u8>>, now: f64) -> Result<usize> {
        let mut moved = 0;
        loop {
            for member in &due {
                moved += self.move_one(set, member, now).await? as usize;
            }
            if due.len() < BATCH {
                break;
            }
            let mut pipe = redis::pipe();
            self.mover.load(&mut pipe);
            self.mover.stage_due(&mut pipe, set, BATCH, now_f64());
            (due,) = pipe
                .query_async(&mut self.redis.conn())
                .await
                .with_context(|| format!("reading due jobs from {set}"))?;
        }
        Ok(moved)
    }

    /// Enqueues now the jobs in `retry` that failed only because no plugin
    /// served their class (`error_class` `wasmjobs::NoPlugin`) and whose
    /// class is in `classes`. Returns how many moved.
    pub(crate) async fn release_unserved(&self, classes: &[String]) -> Result<usize> {
        let mut moved = 0;
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("ZSCAN")
                .arg(keys::RETRY)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut self.redis.conn())
                .await
                .context("scanning the retry set")?;
            // ZSCAN returns member, score, member, score...
            for member in page.iter().step_by(2) {
                // Not text: not a job waiting for a plugin (the poller buries it when due).
                let Ok(text) = std::str::from_utf8(member) else {
                    continue;
                };
                if !text.contains(NO_PLUGIN) {
                    continue;
                }
                let Ok(job) = Payload::parse(text) else { continue };
                if job.str("error_class") == Some(NO_PLUGIN) && classes.iter().any(|c| c == job.job_class()) {
                    moved += self.move_one(keys::RETRY, member, now_f64()).await? as usize;
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(moved)
    }

    async fn move_one(&self, set: &str, member: &[u8], now: f64) -> Result<bool> {
        self.mover.move_one(&self.redis, set, member, now).await
    }
}
