//! Warm instances: a plugin's instances kept between jobs, for plugins
//! whose manifest asks for it (`[instances] reuse = N`,
//! [`super::InstancePolicy`]).
//!
//! The rules, and why:
//! - **Only a clean return puts an instance back.** A trap, a timeout (the
//!   call's future was dropped mid-call) or a refused memory growth leaves
//!   the store unusable or suspect (Wasmtime poisons a trapped store), so
//!   the instance is dropped. Errors the guest *returned* (`retry`,
//!   `discard`, `dead`) are clean returns.
//! - **At most `reuse` jobs per instance**, then it is dropped: whatever a
//!   guest leaks in its globals or its heap is bounded by that count.
//! - **Per version.** The pool belongs to one loaded version of a plugin
//!   ([`super::Loaded`]); a reloaded version starts with an empty
//!   pool, and the old one goes with the old version.
//! - **Idle instances cost memory and pool slots**, so they are capped per
//!   plugin (`max_idle`) and per process ([`Instances`]: the engine's pool
//!   is sized for the concurrency plus that budget, so running jobs always
//!   find a slot), dropped after `idle_timeout` by a reaper task that exits
//!   when the pool is empty, and counted in `/metrics`.
//! - **What persists** is the guest's own state (module globals, its heap,
//!   the resources it holds) and the instance's WASI context (env,
//!   preopens, stdio), which is the plugin's and the same for every job.
//!   What is per job is reset by the executor: the log sink (labels,
//!   budget, capture), the HTTP policy (counters, the per-job request
//!   limit), the SQL view, the disk share, the epoch deadline and fuel.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use wasmtime::Store;

use super::policy::InstancePolicy;
use super::state::JobState;
use crate::bindings::Plugin as Exports;

/// Process-wide instance counters and the budget for idle instances.
#[derive(Debug)]
pub struct Instances {
    /// Most idle warm instances in the process (all plugins together).
    budget: usize,
    /// Idle warm instances now.
    idle: AtomicUsize,
    /// Instances created (every fresh instantiation).
    pub created: AtomicU64,
    /// Jobs served by a warm instance.
    pub reused: AtomicU64,
    /// Idle instances dropped after their `idle_timeout`.
    pub expired: AtomicU64,
    /// Concurrent instances alive (`[instances] concurrent`).
    pub(crate) concurrent: AtomicUsize,
    /// Jobs running on concurrent instances.
    pub(crate) concurrent_jobs: AtomicUsize,
}

impl Instances {
    /// Counters with room for `budget` idle instances.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            idle: AtomicUsize::new(0),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            concurrent: AtomicUsize::new(0),
            concurrent_jobs: AtomicUsize::new(0),
        }
    }

    /// Concurrent instances alive now, over every plugin.
    pub fn concurrent(&self) -> usize {
        self.concurrent.load(Ordering::Relaxed)
    }

    /// Idle warm instances now, over every plugin.
    pub fn idle(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// A place for one more idle instance, if the budget has one.
    fn reserve(self: &Arc<Self>) -> Option<IdleTicket> {
        self.idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.budget).then_some(n + 1)
            })
            .ok()
            .map(|_| IdleTicket(self.clone()))
    }
}

/// One idle instance's place in the process budget; freed when dropped.
struct IdleTicket(Arc<Instances>);

impl Drop for IdleTicket {
    fn drop(&mut self) {
        self.0.idle.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An instance between two jobs.
pub(crate) struct Warm {
    pub(crate) store: Store<JobState>,
    pub(crate) exports: Exports,
    /// Jobs it has served.
    pub(crate) served: u32,
}

struct Idle {
    warm: Warm,
    since: Instant,
    _ticket: IdleTicket,
}

/// The idle instances of one loaded plugin version.
#[derive(Default)]
pub struct WarmPool {
    /// Oldest first: instances are taken from the end (the most recently
    /// used, whose pages are warmest) and expire from the front.
    idle: Mutex<Vec<Idle>>,
    /// Whether a reaper task is running for this pool.
    reaping: AtomicBool,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool").field("idle", &self.len()).finish()
    }
}

impl WarmPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // Only pushes and pops happen under the lock: a panic cannot leave
        // the vector inconsistent.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Idle instances now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no instance is idle.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most recently used idle instance that has not expired, if any.
    pub(crate) fn take(&self, policy: &InstancePolicy, counters: &Instances) -> Option<Warm> {
        let (taken, expired) = {
            let mut idle = self.lock();
            let expired = drain_expired(&mut idle, policy.idle_timeout);
            (idle.pop(), expired)
        };
        counters.expired.fetch_add(expired.len() as u64, Ordering::Relaxed);
        drop(expired);
        taken.map(|idle| {
            counters.reused.fetch_add(1, Ordering::Relaxed);
            idle.warm
        })
    }

    /// Keeps `warm` for a later job if the plugin's and the process's caps
    /// allow; otherwise it is dropped here.
    pub(crate) fn put(self: &Arc<Self>, warm: Warm, policy: &InstancePolicy, counters: &Arc<Instances>) {
        let max_idle = policy.max_idle.map_or(usize::MAX, |n| n as usize);
        {
            let mut idle = self.lock();
            if idle.len() >= max_idle {
                return;
            }
            let Some(ticket) = counters.reserve() else {
                return;
            };
            idle.push(Idle {
                warm,
                since: Instant::now(),
                _ticket: ticket,
            });
        }
        self.start_reaper(policy.idle_timeout, counters);
    }

    /// Starts the task that drops expired instances, unless one runs.
    fn start_reaper(self: &Arc<Self>, idle_timeout: Duration, counters: &Arc<Instances>) {
        if self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (not in the runner): expiry happens on `take`.
            self.reaping.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(reap(Arc::downgrade(self), idle_timeout, counters.clone()));
    }
}

/// Drops `pool`'s expired instances every half `idle_timeout` until the
/// pool is empty or gone.
async fn reap(pool: Weak<WarmPool>, idle_timeout: Duration, counters: Arc<Instances>) {
    let period = (idle_timeout / 2).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let Some(pool) = pool.upgrade() else { return };
        let (expired, empty) = {
            let mut idle = pool.lock();
            let expired = drain_expired(&mut idle, idle_timeout);
            (expired, idle.is_empty())
        };
        counters.expired.fetch_add(expired.len() as u64, Ordering::Relaxed);
        drop(expired);
        if empty {
            pool.reaping.store(false, Ordering::Release);
            // An instance put back since the check, whose `put` saw this
            // reaper still running, needs one: take the role back.
            if pool.is_empty() || pool.reaping.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

/// Removes the instances idle for `idle_timeout` or longer from the front
/// of `idle`; the caller drops them outside the lock.
fn drain_expired(idle: &mut Vec<Idle>, idle_timeout: Duration) -> Vec<Idle> {
    let now = Instant::now();
    let fresh = idle
        .iter()
        .position(|i| now.duration_since(i.since) < idle_timeout)
        .unwrap_or(idle.len());
    idle.drain(..fresh).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_budget_is_shared_and_freed_on_drop() {
        let counters = Arc::new(Instances::new(2));
        let a = counters.reserve().expect("first");
        let b = counters.reserve().expect("second");
        assert!(counters.reserve().is_none(), "budget of two");
        assert_eq!(counters.idle(), 2);
        drop(a);
        assert_eq!(counters.idle(), 1);
        let c = counters.reserve().expect("freed place");
        drop((b, c));
        assert_eq!(counters.idle(), 0);
    }
}
