//! Concurrent instances: one instance runs up to K jobs at once, for
//! plugins built for the `async-plugin` world with `[instances]
//! concurrent = K` ([`super::InstancePolicy`]).
//!
//! Each instance is a *lane*: a task that owns the store, instantiates the
//! plugin, and drives Wasmtime's event loop (`Store::run_concurrent`),
//! starting a `perform` call for every job it is handed while fewer than K
//! run, and handing each job's result back to the job's own caller. While
//! one job awaits an `async-http` or `async-sql` import, the others run, so
//! 1,000 jobs waiting on the network need 1,000 / K instances, not 1,000.
//! Each job's log sink, HTTP policy and SQL view are its own
//! ([`JobScope`], found by the imports from the calling task), and so are
//! its outcome and its log lines.
//!
//! The rules, and why:
//! - **A lane takes jobs while it runs fewer than K and has taken fewer
//!   than `reuse`** (10,000 unless set); then it finishes what it runs and
//!   retires. Idle for `idle_timeout`, it retires too, and when its plugin
//!   version is replaced (hot reload) it finishes its jobs and goes with it.
//! - **A trap, a refused memory growth or a timeout ends the instance and
//!   every job in it.** Wasmtime poisons a trapped store and cannot cancel
//!   one task of several (its event loop does not run while a guest
//!   computes, so the deadline is watched from outside it). The job at
//!   fault gets the trap or "timed out"; the others are retried with a
//!   message naming what ended their instance. `limits.memory` bounds the
//!   instance (all its jobs together), `limits.timeout` each job.
//! - **A job whose caller stops waiting (it was cancelled) ends the
//!   instance too**, for the same reason: its task cannot be stopped alone,
//!   and a cancelled job must stop at once. The caller's going wakes the
//!   watchdog; the other jobs are retried.
//! - **Jobs of one instance share its memory**: module globals, the heap,
//!   the guest's stdout and stderr (labelled with the plugin, not a job).
//!   They are one plugin's jobs, as the threads of one process are; no
//!   other plugin's job ever runs there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, mpsc, oneshot};
use wasmtime::component::TypedFunc;
use wasmtime::{Store, WasmBacktrace};

use super::failure::{Occupancy, describe_trap};
use super::state::JobState;
use super::warm::Instances;
use crate::bindings::concurrent::AsyncPluginPre;
use crate::bindings::types::{Job as WitJob, JobError};
use crate::host::JobScope;

/// What one job of a lane ended with.
pub(crate) enum Finished {
    /// `perform` returned.
    Returned(Result<(), JobError>),
    /// The instance ended before it did: a trap (message, backtrace), a
    /// timeout, another job's failure.
    Ended { message: String, backtrace: Option<String> },
}

/// A job handed to a lane.
struct Submission {
    job: WitJob,
    scope: JobScope,
    deadline: Instant,
    timeout: Duration,
    reply: oneshot::Sender<Finished>,
}

/// One instance, as the executor sees it: its intake, held only here, so
/// that dropping the plugin version's [`Lanes`] ends the lane's intake.
struct Lane {
    intake: mpsc::UnboundedSender<Box<Submission>>,
    counts: Arc<LaneCounts>,
    /// Woken when a caller stops waiting for its job.
    abandoned: Arc<Notify>,
}

/// What the executor and the lane's task both track.
struct LaneCounts {
    /// Jobs handed to it and not yet finished.
    load: AtomicUsize,
    /// Jobs handed to it in all.
    taken: AtomicU32,
    /// Set (under the lanes' lock) when it takes no more jobs.
    closed: AtomicBool,
}

/// What a lane needs to build and run its instance.
pub(crate) struct LaneSpec {
    /// The process's instance counters (this instance is counted alive).
    pub(crate) counters: Arc<Instances>,
    pub(crate) pre: AsyncPluginPre<JobState>,
    pub(crate) state: JobState,
    pub(crate) concurrent: usize,
    pub(crate) reuse: u32,
    pub(crate) idle_timeout: Duration,
}

/// The lanes of one loaded plugin version. Dropping it (the version was
/// replaced and its last job finished) closes every lane's intake, so the
/// lanes finish and go.
#[derive(Default)]
pub struct Lanes {
    lanes: Mutex<Vec<Arc<Lane>>>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").field("instances", &self.len()).finish()
    }
}

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Lane>>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Instances alive now.
    pub fn len(&self) -> usize {
        self.lock()
            .iter()
            .filter(|lane| !lane.counts.closed.load(Ordering::Acquire))
            .count()
    }

    /// Whether no instance is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `job` on a lane with room, starting one with `spawn` if none
    /// has (`spawn` builds the new instance's state; it runs under the
    /// lanes' lock, so jobs arriving together fill one new instance rather
    /// than each starting its own). Returns what the job ended with and
    /// whether it ran on an instance that already existed.
    pub(crate) async fn run(
        self: &Arc<Self>,
        job: WitJob,
        scope: JobScope,
        timeout: Duration,
        concurrent: usize,
        reuse: u32,
        spawn: impl FnOnce() -> Result<LaneSpec, String>,
    ) -> (Finished, bool) {
        let (reply, finished) = oneshot::channel();
        let submission = Box::new(Submission {
            job,
            scope,
            deadline: Instant::now() + timeout,
            timeout,
            reply,
        });
        let (reused, abandoned) = match self.hand_over(submission, concurrent, reuse, spawn) {
            Ok(handed) => handed,
            Err(message) => {
                return (
                    Finished::Ended {
                        message,
                        backtrace: None,
                    },
                    false,
                );
            }
        };
        // If this future is dropped before the job finished (the job was
        // cancelled), the lane's watchdog hears of it at once.
        let waiting = Abandon(Some(abandoned));
        let finished = finished.await.unwrap_or(Finished::Ended {
            message: "the instance running this job stopped without a result".into(),
            backtrace: None,
        });
        waiting.disarm();
        (finished, reused)
    }

    /// Hands `submission` to the first open lane with room, or to a new
    /// one; whether the lane existed, and its watchdog's bell.
    fn hand_over(
        self: &Arc<Self>,
        mut submission: Box<Submission>,
        concurrent: usize,
        reuse: u32,
        spawn: impl FnOnce() -> Result<LaneSpec, String>,
    ) -> Result<(bool, Arc<Notify>), String> {
        let mut lanes = self.lock();
        lanes.retain(|lane| !lane.counts.closed.load(Ordering::Acquire));
        let room = |lane: &&Arc<Lane>| {
            lane.counts.load.load(Ordering::Acquire) < concurrent && lane.counts.taken.load(Ordering::Acquire) < reuse
        };
        if let Some(lane) = lanes.iter().find(room) {
            let counts = &lane.counts;
            counts.load.fetch_add(1, Ordering::AcqRel);
            counts.taken.fetch_add(1, Ordering::AcqRel);
            match lane.intake.send(submission) {
                Ok(()) => return Ok((true, lane.abandoned.clone())),
                // The lane ended meanwhile: start another.
                Err(refused) => {
                    counts.load.fetch_sub(1, Ordering::AcqRel);
                    counts.closed.store(true, Ordering::Release);
                    submission = refused.0;
                }
            }
        }
        let spec = spawn()?;
        let (intake, jobs) = mpsc::unbounded_channel();
        let counts = Arc::new(LaneCounts {
            load: AtomicUsize::new(1),
            taken: AtomicU32::new(1),
            closed: AtomicBool::new(false),
        });
        // The intake cannot be closed yet: the receiver is right here.
        let _ = intake.send(submission);
        let abandoned = Arc::new(Notify::new());
        lanes.push(Arc::new(Lane {
            intake,
            counts: counts.clone(),
            abandoned: abandoned.clone(),
        }));
        drop(lanes);
        let lanes = Arc::downgrade(self);
        let bell = abandoned.clone();
        tokio::spawn(async move {
            drive(spec, jobs, &counts, &lanes, &bell).await;
            counts.closed.store(true, Ordering::Release);
        });
        Ok((false, abandoned))
    }
}

/// Rings the lane's bell if dropped armed: the caller stopped waiting.
struct Abandon(Option<Arc<Notify>>);

impl Abandon {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(bell) = self.0.take() {
            bell.notify_one();
        }
    }
}

/// The jobs a lane runs, shared between its event loop and the code that
/// cleans up after the loop ended abnormally.
#[derive(Default)]
struct Running {
    /// By job number in the instance.
    jobs: HashMap<u64, Pending>,
}

/// A job started in the instance and not finished.
struct Pending {
    reply: oneshot::Sender<Finished>,
    jid: String,
    deadline: Instant,
    timeout: Duration,
}

/// Runs one instance until it retires or fails.
async fn drive(
    spec: LaneSpec,
    mut jobs: mpsc::UnboundedReceiver<Box<Submission>>,
    lane: &LaneCounts,
    lanes: &std::sync::Weak<Lanes>,
    abandoned: &Notify,
) {
    let LaneSpec {
        counters,
        pre,
        state,
        concurrent,
        reuse,
        idle_timeout,
    } = spec;
    let _alive = Occupancy::new(&counters.concurrent);
    let running = Arc::new(Mutex::new(Running::default()));
    let mut store = Store::new(pre.engine(), state);
    store.limiter(|state| &mut state.limiter);
    store.epoch_deadline_async_yield_and_update(1);
    store.set_epoch_deadline(1);

    let perform = match instantiate(&pre, &mut store).await {
        Ok(perform) => perform,
        Err(err) => {
            let message = format!("cannot instantiate the plugin: {}", describe_trap(&err, store.data()));
            close(lane, lanes);
            fail_all(&running, &mut jobs, &message);
            return;
        }
    };

    let event_loop = {
        let running = running.clone();
        let jobs = &mut jobs;
        store.run_concurrent(async move |accessor| {
            let mut calls = FuturesUnordered::new();
            let mut taken: u32 = 0;
            let mut next_id: u64 = 0;
            loop {
                let room = calls.len() < concurrent && taken < reuse;
                if !room && calls.is_empty() {
                    return None;
                }
                tokio::select! {
                    submission = jobs.recv(), if room => {
                        let Some(submission) = submission else {
                            if calls.is_empty() {
                                return None;
                            }
                            // No more jobs will come: finish these.
                            taken = reuse;
                            continue;
                        };
                        taken += 1;
                        let Submission { job, scope, deadline, timeout, reply } = *submission;
                        let jid = job.jid.clone();
                        let id = next_id;
                        next_id += 1;
                        let started = accessor.with(|mut access| {
                            let call = perform.start_call_concurrent(&mut access, (job,))?;
                            access.get().scopes.insert(call.task(), (id, scope));
                            Ok::<_, wasmtime::Error>(call)
                        });
                        let call = match started {
                            Ok(call) => call,
                            Err(err) => {
                                let _ = reply.send(Finished::Ended { message: format!("cannot start the job: {err:#}"), backtrace: None });
                                lane.load.fetch_sub(1, Ordering::AcqRel);
                                continue;
                            }
                        };
                        let task = call.task();
                        lock(&running).jobs.insert(id, Pending { reply, jid, deadline, timeout });
                        calls.push(async move { (id, task, perform.finish_call_concurrent(accessor, call).await) });
                    }
                    Some((id, task, result)) = calls.next() => {
                        let (finished, failure) = accessor.with(|mut access| {
                            let state = access.get();
                            // Only its own: a new job may hold the task id already.
                            if state.scopes.get(&task).is_some_and(|(serial, _)| *serial == id) {
                                state.scopes.remove(&task);
                            }
                            match result {
                                Ok((returned,)) => (Finished::Returned(returned), None),
                                // The store is poisoned: this job gets the
                                // trap, the others are ended with it.
                                Err(err) => {
                                    let message = describe_trap(&err, state);
                                    let backtrace = err.downcast_ref::<WasmBacktrace>().map(|bt| bt.to_string());
                                    let jid = lock(&running).jobs.get(&id).map(|job| job.jid.clone()).unwrap_or_default();
                                    let failure = format!("the instance stopped because job {jid} failed: {message}");
                                    (Finished::Ended { message, backtrace }, Some(failure))
                                }
                            }
                        });
                        if let Some(pending) = lock(&running).jobs.remove(&id) {
                            let _ = pending.reply.send(finished);
                        }
                        lane.load.fetch_sub(1, Ordering::AcqRel);
                        if failure.is_some() {
                            return failure;
                        }
                    }
                    _ = tokio::time::sleep(idle_timeout), if calls.is_empty() => {
                        if close_if_idle(lane, lanes) {
                            return None;
                        }
                    }
                }
            }
        })
    };
    let watchdog = overdue(&running, abandoned);
    let ended = tokio::select! {
        ended = event_loop => match ended {
            Ok(failure) => failure,
            Err(err) => Some(format!("the instance stopped: {}", describe_trap(&err, store.data()))),
        },
        (jid, stop) = watchdog => Some(match stop {
            Stop::Timeout => format!("the instance was stopped because job {jid} ran past its timeout"),
            Stop::Abandoned => format!("the instance was stopped because job {jid} was cancelled"),
        }),
    };
    close(lane, lanes);
    if let Some(message) = ended {
        fail_all(&running, &mut jobs, &message);
    }
    drop(store);
}

/// Instantiates the plugin and finds its `perform`.
async fn instantiate(
    pre: &AsyncPluginPre<JobState>,
    store: &mut Store<JobState>,
) -> wasmtime::Result<TypedFunc<(WitJob,), (Result<(), JobError>,)>> {
    let instance = pre.instance_pre().instantiate_async(&mut *store).await?;
    instance.get_typed_func::<(WitJob,), (Result<(), JobError>,)>(&mut *store, "perform")
}

/// Why the watchdog stops an instance.
enum Stop {
    /// A job ran past its deadline.
    Timeout,
    /// A job's caller stopped waiting (it was cancelled).
    Abandoned,
}

/// Resolves with the jid of the first running job past its deadline, or
/// whose caller stopped waiting (checked when `abandoned` rings).
async fn overdue(running: &Mutex<Running>, abandoned: &Notify) -> (String, Stop) {
    loop {
        let now = Instant::now();
        let (earliest, gone) = {
            let running = lock(running);
            let earliest = running
                .jobs
                .values()
                .map(|job| (job.deadline, job.jid.clone()))
                .min_by_key(|(deadline, _)| *deadline);
            let gone = running
                .jobs
                .values()
                .find(|job| job.reply.is_closed())
                .map(|job| job.jid.clone());
            (earliest, gone)
        };
        if let Some(jid) = gone {
            return (jid, Stop::Abandoned);
        }
        // Checked at least every 100 ms: a job that arrives later may have
        // an earlier deadline than this one.
        let wake = match earliest {
            Some((deadline, jid)) if deadline <= now => return (jid, Stop::Timeout),
            Some((deadline, _)) => deadline.min(now + Duration::from_millis(100)),
            None => now + Duration::from_millis(100),
        };
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            () = abandoned.notified() => {}
        }
    }
}

fn lock(running: &Mutex<Running>) -> std::sync::MutexGuard<'_, Running> {
    running.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks the lane closed if it is still idle (under the lanes' lock, so no
/// job is handed to it after); returns whether it did.
fn close_if_idle(lane: &LaneCounts, lanes: &std::sync::Weak<Lanes>) -> bool {
    let Some(lanes) = lanes.upgrade() else {
        lane.closed.store(true, Ordering::Release);
        return true;
    };
    let _held = lanes.lock();
    if lane.load.load(Ordering::Acquire) > 0 {
        return false;
    }
    lane.closed.store(true, Ordering::Release);
    true
}

/// Marks the lane closed, so it is handed no more jobs.
fn close(lane: &LaneCounts, lanes: &std::sync::Weak<Lanes>) {
    let lanes = lanes.upgrade();
    let _held = lanes.as_ref().map(|lanes| lanes.lock());
    lane.closed.store(true, Ordering::Release);
}

/// Ends every job the lane holds or was handed: the job past its deadline
/// with "timed out", the others with `message`.
fn fail_all(running: &Mutex<Running>, jobs: &mut mpsc::UnboundedReceiver<Box<Submission>>, message: &str) {
    let now = Instant::now();
    for (
        _,
        Pending {
            reply,
            deadline,
            timeout,
            ..
        },
    ) in lock(running).jobs.drain()
    {
        let message = match deadline <= now {
            true => format!("timed out after {timeout:?}"),
            false => format!("{message}; this job shared the instance and is retried"),
        };
        let _ = reply.send(Finished::Ended {
            message,
            backtrace: None,
        });
    }
    jobs.close();
    while let Ok(submission) = jobs.try_recv() {
        let _ = submission.reply.send(Finished::Ended {
            message: format!("{message}; this job had not started and is retried"),
            backtrace: None,
        });
    }
}
