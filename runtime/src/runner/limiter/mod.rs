//! Cluster-wide rate and concurrency limits (`limits.rate`,
//! `[limits.per_key]` in a plugin's manifest): the Redis side.
//!
//! Only jobs whose plugin sets one cost anything here: the processor asks
//! [`Limiter::admit`] after the plugin is known and before the job runs,
//! and skips it (no Redis call) when the plugin has no cluster limit.
//!
//! One Lua call ([`scripts::ACQUIRE`]) checks every limit that applies —
//! the plugin's rate, the key value's rate, the key value's concurrency —
//! and takes them all or none. A rate admits a job for the earliest start
//! its window allows within [`HORIZON`] (the start is logged at once, and
//! the job waits for it in its process, giving up its runner slot while
//! there is room to park); a job whose start is further away is sent back
//! to `schedule` for its *turn*, the rate's line of waiting jobs, so that
//! a limit of N/s starts close to N jobs a second, never more, however
//! many processes share it and whatever the poll interval:
//!
//! | limit | key | ZSET member → score |
//! |---|---|---|
//! | `limits.rate` | `wasmjobs:limit:<plugin>:rate` | `identity:n` → start, Redis ms |
//! | `per_key.rate` | `wasmjobs:limit:<plugin>:key:<bucket>:rate` | `identity:n` → start |
//! | `per_key.concurrency` | `wasmjobs:limit:<plugin>:key:<bucket>:leases` | `identity:n` → lease expiry |
//!
//! Each rate key has a string beside it (`…:rate:turn`), the next turn in
//! Redis ms.
//!
//! (`<bucket>`: [`bucket::bucket`], a hash of the key value, or `none`.)
//! Refusals are counted in the HASH `wasmjobs:limit:<plugin>:overrated`
//! (`rate`, `concurrency`) by the same script, for `wasmjobs stats`.
//!
//! A concurrency lease lasts [`LEASE_TTL`]: the holding process renews
//! every lease it holds with each heartbeat ([`Limiter::renew`], every
//! 10 s) and releases it when the job ends (a [`Lease`] dropped, also when
//! the job is stopped at shutdown). A process that dies stops renewing,
//! and its leases are dropped by the next acquire once expired: no key
//! stays locked for longer than [`LEASE_TTL`] after its holder's last
//! beat, well within the heartbeat's own expiry.
//!
//! A refused job gives up its slot at once: the processor returns the
//! write [`policy::refused`] makes (rescheduled, `overrated` + 1). A job
//! admitted for a later start that is stopped before it (shutdown,
//! cancel) gives its start back ([`Start`] dropped).
//! `docs/limits.md` tells the whole story.

pub(crate) mod bucket;
pub(crate) mod policy;
mod scripts;
mod turns;

pub(crate) use turns::Turns;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;
use redis::Script;

use self::policy::Refusal;
use super::job_retry::Write;
use crate::plugin::Plugin;
use crate::plugin::cluster_limits::ClusterLimits;
use crate::redis::payload::Payload;
use crate::redis::{Redis, keys, now_f64};

/// How long a concurrency lease lasts without renewal: three heartbeats,
/// half the heartbeat's own expiry (`keys::HEARTBEAT_TTL_SECS`).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(30);

/// How far ahead a rate admits a job (which then waits in its process):
/// far enough that the jobs sent back to `schedule` for their turn are
/// moved back by a poller in time (one poll every `--poll-interval`, 5 s
/// by default, across the cluster), short enough that a graceful
/// shutdown (25 s by default) still runs what was admitted.
pub(crate) const HORIZON: Duration = Duration::from_secs(10);

/// Least time between two log lines about an unreachable limiter.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The limiter of one process.
pub(crate) struct Limiter {
    redis: Redis,
    identity: String,
    next: AtomicU64,
    acquire: Script,
    renew: Script,
    /// Leases held now: member → lease key.
    held: Mutex<HashMap<String, String>>,
    /// When the jobs this process sent back are due, for the poller.
    turns: Arc<Turns>,
    logged: Mutex<Option<Instant>>,
}

/// What the processor does with a job of a limited plugin.
pub(crate) enum Admission {
    /// Run it once `start` is due, holding `lease` (if it took one) until
    /// it ends; its queue latency counts from `first_enqueued_at` if it
    /// was rescheduled.
    Run {
        /// When it may start, logged in its rate windows.
        start: Start,
        /// The concurrency lease, released when dropped.
        lease: Option<Lease>,
        /// The job's enqueue time before its first reschedule.
        first_enqueued_at: Option<f64>,
    },
    /// Do not run it: write this (a reschedule, or the retry path past
    /// the cap), counted under `refusal`.
    Refused {
        /// What to write.
        write: Write,
        /// Why.
        refusal: Refusal,
    },
}

/// A concurrency lease held by a running job; released when dropped.
pub(crate) struct Lease {
    limiter: Arc<Limiter>,
    key: String,
    member: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.limiter
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.member);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let redis = self.limiter.redis.clone();
        let key = std::mem::take(&mut self.key);
        let member = std::mem::take(&mut self.member);
        runtime.spawn(async move {
            let released: Result<(), _> = redis::cmd("ZREM")
                .arg(&key)
                .arg(&member)
                .query_async(&mut redis.conn())
                .await;
            if let Err(err) = released {
                tracing::warn!(%key, "cannot release a concurrency lease (it expires within {LEASE_TTL:?}): {err}");
            }
        });
    }
}

/// A job's start as its rate windows logged it: due after `wait`. Dropped
/// before [`Start::begun`] (the job stopped while it waited), it takes its
/// entries out of the windows, so the start is not lost to others.
pub(crate) struct Start {
    /// How long the job waits for its start.
    pub(crate) wait: Duration,
    /// The windows holding it, to give it back; empty once begun.
    given_back: Option<Box<(Redis, String, Vec<String>)>>,
}

impl Start {
    /// The job started: its start stays in the windows.
    pub(crate) fn begun(mut self) {
        self.given_back = None;
    }
}

impl Drop for Start {
    fn drop(&mut self) {
        let Some((redis, member, keys)) = self.given_back.take().map(|b| *b) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("ZREM").arg(key).arg(&member).ignore();
            }
            if let Err(err) = pipe.query_async::<()>(&mut redis.conn()).await {
                tracing::debug!("cannot give back a reserved start (it leaves its window in time): {err}");
            }
        });
    }
}

/// One limit of a job, as the script takes it.
struct Take {
    key: String,
    /// The rate's turn counter (for a concurrency limit, unused).
    turn: String,
    kind: &'static str,
    limit: u64,
    span_ms: u64,
}

impl Limiter {
    /// The limiter of the process `identity`.
    pub(crate) fn new(redis: Redis, identity: &str) -> Arc<Self> {
        Arc::new(Self {
            redis,
            identity: identity.to_owned(),
            next: AtomicU64::new(0),
            acquire: Script::new(scripts::ACQUIRE),
            renew: Script::new(scripts::RENEW),
            held: Mutex::new(HashMap::new()),
            turns: Arc::new(Turns::default()),
            logged: Mutex::new(None),
        })
    }

    /// Checks and takes the cluster limits of `plugin` for the job `raw`
    /// (call only when `plugin` has some). Never fails: a payload that
    /// cannot be read is the caller's (`Err`), an unreachable Redis is a
    /// reschedule.
    pub(crate) async fn admit(self: &Arc<Self>, plugin: &Plugin, payload: &Payload) -> Admission {
        let limits = &plugin.manifest.cluster_limits;
        let takes = takes(&plugin.name, limits, payload);
        let member = format!("{}:{}", self.identity, self.next.fetch_add(1, Ordering::Relaxed));
        let refusal = match self.run_acquire(&plugin.name, &takes, &member).await {
            Ok(Verdict::Taken { wait }) => {
                let rates: Vec<String> = takes
                    .iter()
                    .filter(|t| t.kind == "rate")
                    .map(|t| t.key.clone())
                    .collect();
                let start = Start {
                    wait,
                    given_back: (!wait.is_zero() && !rates.is_empty())
                        .then(|| Box::new((self.redis.clone(), member.clone(), rates))),
                };
                let lease = takes.iter().find(|t| t.kind == "concurrency").map(|take| {
                    self.held
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(member.clone(), take.key.clone());
                    Lease {
                        limiter: self.clone(),
                        key: take.key.clone(),
                        member,
                    }
                });
                return Admission::Run {
                    start,
                    lease,
                    first_enqueued_at: policy::first_enqueued_at(payload),
                };
            }
            Ok(Verdict::Refused(refusal)) => refusal,
            Err(err) => {
                self.log_unavailable(&plugin.name, &err);
                Refusal::Unavailable
            }
        };
        let jitter = rand::rng().random::<f64>();
        let write = policy::refused(payload, refusal, now_f64(), jitter);
        if let Write::Reschedule { at, .. } = &write {
            self.turns.sent_back(*at);
        }
        Admission::Refused { write, refusal }
    }

    /// When the jobs this process sent back to `schedule` are due.
    pub(crate) fn turns(&self) -> Arc<Turns> {
        self.turns.clone()
    }

    /// Runs the acquire script.
    async fn run_acquire(&self, plugin: &str, takes: &[Take], member: &str) -> Result<Verdict> {
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(keys::limit_overrated(&bucket::plugin_segment(plugin)))
            .arg(member)
            .arg(HORIZON.as_millis() as u64);
        for take in takes {
            invocation
                .key(&take.key)
                .key(&take.turn)
                .arg(take.kind)
                .arg(take.limit)
                .arg(take.span_ms);
        }
        let (index, wait_ms): (i64, i64) = invocation
            .invoke_async(&mut self.redis.conn())
            .await
            .context("checking the plugin's cluster limits")?;
        Ok(verdict(takes, index, wait_ms))
    }

    fn log_unavailable(&self, plugin: &str, err: &anyhow::Error) {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            *logged = Some(Instant::now());
            tracing::error!(
                plugin,
                "{err:#}; its jobs are rescheduled, not run unlimited, until Redis answers"
            );
        }
    }

    /// Adds the renewal of every lease held now to a heartbeat transaction.
    pub(crate) fn renew(&self, pipe: &mut redis::Pipeline) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_empty() {
            return;
        }
        let mut invocation = self.renew.prepare_invoke();
        invocation.arg(LEASE_TTL.as_millis() as u64);
        for (member, key) in held.iter() {
            invocation.key(key).arg(member);
        }
        drop(held);
        pipe.load_script(&self.renew).ignore();
        pipe.invoke_script(&invocation).ignore();
    }
}

/// What the acquire script said.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Every limit taken: the job starts after `wait` (at most [`HORIZON`]).
    Taken { wait: Duration },
    /// Not taken.
    Refused(Refusal),
}

/// Reads the script's `{index, wait_ms}` (whatever it holds).
fn verdict(takes: &[Take], index: i64, wait_ms: i64) -> Verdict {
    let wait = Duration::from_millis(wait_ms.max(0) as u64);
    let Some(take) = usize::try_from(index)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| takes.get(i))
    else {
        return Verdict::Taken {
            wait: wait.min(HORIZON),
        };
    };
    Verdict::Refused(if take.kind == "rate" {
        Refusal::Rate {
            wait_secs: wait.as_secs_f64(),
        }
    } else {
        Refusal::Concurrency
    })
}

/// The limits that apply to `payload`, in the order the script checks them.
fn takes(plugin: &str, limits: &ClusterLimits, payload: &Payload) -> Vec<Take> {
    let segment = bucket::plugin_segment(plugin);
    let mut takes = Vec::with_capacity(3);
    if let Some(rate) = &limits.rate {
        let key = keys::limit_rate(&segment);
        takes.push(Take {
            turn: keys::limit_turn(&key),
            key,
            kind: "rate",
            limit: rate.count,
            span_ms: rate.period_ms(),
        });
    }
    if let Some(per_key) = &limits.per_key {
        let bucket = bucket::bucket(payload, &per_key.key);
        if let Some(rate) = &per_key.rate {
            let key = keys::limit_key_rate(&segment, &bucket);
            takes.push(Take {
                turn: keys::limit_turn(&key),
                key,
                kind: "rate",
                limit: rate.count,
                span_ms: rate.period_ms(),
            });
        }
        if let Some(concurrency) = per_key.concurrency {
            let key = keys::limit_key_leases(&segment, &bucket);
            takes.push(Take {
                turn: key.clone(),
                key,
                kind: "concurrency",
                limit: u64::from(concurrency),
                span_ms: LEASE_TTL.as_millis() as u64,
            });
        }
    }
    takes
}
