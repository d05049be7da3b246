//! Cluster-wide rate and concurrency limits (`limits.rate`,
//! `[limits.per_key]` in a plugin's manifest): the Redis side.
//!
//! Only jobs whose plugin sets one cost anything here: the processor asks
//! [`Limiter::admit`] after the plugin is known and before the job runs,
//! and skips it (no Redis call) when the plugin has no cluster limit.
//!
//! One Lua call ([`scripts::ACQUIRE`]) checks every limit that applies —
//! the plugin's rate, the key value's rate, the key value's concurrency —
//! and takes them all or none:
//!
//! | limit | key | ZSET member → score |
//! |---|---|---|
//! | `limits.rate` | `wasmjobs:limit:<plugin>:rate` | `identity:n` → start, Redis ms |
//! | `per_key.rate` | `wasmjobs:limit:<plugin>:key:<bucket>:rate` | `identity:n` → start |
//! | `per_key.concurrency` | `wasmjobs:limit:<plugin>:key:<bucket>:leases` | `identity:n` → lease expiry |
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
//! write [`policy::refused`] makes (rescheduled, `overrated` + 1).
//! `docs/limits.md` tells the whole story.

pub(crate) mod bucket;
pub(crate) mod policy;
mod scripts;

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
    logged: Mutex<Option<Instant>>,
}

/// What the processor does with a job of a limited plugin.
pub(crate) enum Admission {
    /// Run it, holding `lease` (if it took one) until it ends; its queue
    /// latency counts from `first_enqueued_at` if it was rescheduled.
    Run {
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

/// One limit of a job, as the script takes it.
struct Take {
    key: String,
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
        let verdict = self.run_acquire(&plugin.name, &takes, &member).await;
        let refusal = match verdict {
            Ok(None) => {
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
                    lease,
                    first_enqueued_at: policy::first_enqueued_at(payload),
                };
            }
            Ok(Some(refusal)) => refusal,
            Err(err) => {
                self.log_unavailable(&plugin.name, &err);
                Refusal::Unavailable
            }
        };
        let jitter = rand::rng().random::<f64>();
        Admission::Refused {
            write: policy::refused(payload, refusal, now_f64(), jitter),
            refusal,
        }
    }

    /// Runs the acquire script: `None` if every limit was taken.
    async fn run_acquire(&self, plugin: &str, takes: &[Take], member: &str) -> Result<Option<Refusal>> {
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(keys::limit_overrated(&bucket::plugin_segment(plugin)))
            .arg(member);
        for take in takes {
            invocation
                .key(&take.key)
                .arg(take.kind)
                .arg(take.limit)
                .arg(take.span_ms);
        }
        let (index, wait_ms): (i64, i64) = invocation
            .invoke_async(&mut self.redis.conn())
            .await
            .context("checking the plugin's cluster limits")?;
        let Some(take) = usize::try_from(index)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| takes.get(i))
        else {
            return Ok(None);
        };
        Ok(Some(if take.kind == "rate" {
            Refusal::Rate {
                wait_secs: wait_ms.max(0) as f64 / 1000.0,
            }
        } else {
            Refusal::Concurrency
        }))
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

/// The limits that apply to `payload`, in the order the script checks them.
fn takes(plugin: &str, limits: &ClusterLimits, payload: &Payload) -> Vec<Take> {
    let segment = bucket::plugin_segment(plugin);
    let mut takes = Vec::with_capacity(3);
    if let Some(rate) = &limits.rate {
        takes.push(Take {
            key: keys::limit_rate(&segment),
            kind: "rate",
            limit: rate.count,
            span_ms: rate.period_ms(),
        });
    }
    if let Some(per_key) = &limits.per_key {
        let bucket = bucket::bucket(payload, &per_key.key);
        if let Some(rate) = &per_key.rate {
            takes.push(Take {
                key: keys::limit_key_rate(&segment, &bucket),
                kind: "rate",
                limit: rate.count,
                span_ms: rate.period_ms(),
            });
        }
        if let Some(concurrency) = per_key.concurrency {
            takes.push(Take {
                key: keys::limit_key_leases(&segment, &bucket),
                kind: "concurrency",
                limit: u64::from(concurrency),
                span_ms: LEASE_TTL.as_millis() as u64,
            });
        }
    }
    takes
}
