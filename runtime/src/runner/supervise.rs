//! Background services that cannot end silently.
//!
//! Every loop `wasmjobs run` keeps beside the jobs (heartbeat, pollers,
//! reloader, cron, control, cancel sweep, dashboard, metrics server,
//! process sampler, ...) is spawned
//! through [`spawn`] with a name and a way to make it anew. A service that
//! panics, or returns while the runner is still running, is logged as an
//! error naming it, counted (`wasmjobs_service_restarts_total{service="…"}`)
//! and started again after a pause that doubles from [`FIRST_PAUSE`] up to
//! [`LONGEST_PAUSE`] (and starts over after a run that lasted
//! [`STEADY`]), so a fault that recurs at once does not spin. The
//! heartbeat is one of them: a process whose heartbeat stopped looks dead
//! to the others, which would recover its jobs and run them twice. A
//! service that returns because the runner stops is not restarted.
//!
//! Whatever a service must keep across a restart (a channel's receiver, a
//! listening socket) it shares with its maker rather than owning it.
//!
//! Some services are **vital**: without them the process holds jobs it
//! cannot serve (the fetch loop; the outcome writers; the PostgreSQL lease
//! keeper and wake listener). They restart like the others, and while one is down (from
//! its failure until it runs again) the process's heartbeat is not
//! written ([`vital_down`]): a process whose fetch loop keeps dying stops
//! looking alive, and the others recover its jobs, instead of it holding
//! them forever behind a fresh heartbeat.
//!
//! A test can make the services fail on purpose: [`set_fault_hook`]
//! installs a function every service start calls first, inside the
//! supervision (the end-to-end tests' build of the binary installs one
//! that panics; the `wasmjobs` binary installs none).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// The first pause before a failed service is restarted.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between restarts.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(10);
/// A run this long was healthy: the next failure's pause starts over.
pub(crate) const STEADY: Duration = Duration::from_secs(60);

/// A service's future, boxed so one supervisor serves them all.
pub(crate) type Loop = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Makes a service's future anew for each (re)start.
pub(crate) type Maker = Box<dyn Fn() -> Loop + Send + Sync>;

/// Called with a service's name at the start of each of its runs.
pub(crate) type FaultHook = fn(&'static str);

static FAULT_HOOK: OnceLock<FaultHook> = OnceLock::new();

/// Installs `hook`, called with the service's name at the start of every
/// service run, where a panic counts as the service's own. For tests of
/// the supervision; the first hook installed stays.
pub fn set_fault_hook(hook: FaultHook) {
    let _ = FAULT_HOOK.set(hook);
}

/// The vital services that are down now (see the module docs).
static VITALS_DOWN: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The first vital service that is down now, if any.
pub(crate) fn vital_down() -> Option<&'static str> {
    VITALS_DOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .first()
        .copied()
}

fn set_vital(name: &'static str, up: bool) {
    let mut down = VITALS_DOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match up {
        true => down.remove(name),
        false => down.insert(name),
    };
}

/// Runs `make()`'s future as the vital service `name` until it returns a
/// value (it ends by itself only when the runner stops), restarting it
/// after a panic as [`supervise`] does and marking it down meanwhile
/// ([`vital_down`]); `restarted` is called before each restart (to count
/// it, or to raise a job source's doubt). Returns `None` if `stop` came
/// while it was down.
pub(crate) async fn vital<T, F>(
    name: &'static str,
    stop: &CancellationToken,
    mut make: impl FnMut() -> F,
    mut restarted: impl FnMut(),
) -> Option<T>
where
    F: Future<Output = T> + Send,
{
    let mut pause = FIRST_PAUSE;
    loop {
        let started = Instant::now();
        let panic = match run_once(name, make()).await {
            Ok(value) => {
                set_vital(name, true);
                return Some(value);
            }
            Err(panic) => panic,
        };
        set_vital(name, false);
        if started.elapsed() >= STEADY {
            pause = FIRST_PAUSE;
        }
        tracing::error!(
            service = name,
            "background service {name} panicked: {}; restarting it in {pause:?} (the heartbeat waits until it runs)",
            panic_message(panic.as_ref())
        );
        restarted();
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return None,
        }
        set_vital(name, true);
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// Runs the service `name` on `tasks`, restarting it (see the module
/// docs) until `stop` is cancelled.
pub(crate) fn spawn(
    tasks: &TaskTracker,
    name: &'static str,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    make: Maker,
) {
    tasks.spawn(supervise(name, metrics, stop, make));
}

/// The supervision of one service (see [`spawn`]).
pub(crate) async fn supervise(name: &'static str, metrics: Arc<Metrics>, stop: CancellationToken, make: Maker) {
    let mut pause = FIRST_PAUSE;
    loop {
        let started = Instant::now();
        let ended = run_once(name, make()).await;
        if stop.is_cancelled() {
            return;
        }
        if started.elapsed() >= STEADY {
            pause = FIRST_PAUSE;
        }
        metrics.process.service_restarted(name);
        let why = match ended {
            Ok(()) => "ended while the runner is running".to_owned(),
            Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
        };
        tracing::error!(
            service = name,
            "background service {name} {why}; restarting it in {pause:?}"
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return,
        }
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// One run of the service `name`: the fault hook first, then `run`, a
/// panic in either caught.
async fn run_once<T>(name: &'static str, run: impl Future<Output = T>) -> std::thread::Result<T> {
    AssertUnwindSafe(async move {
        if let Some(hook) = FAULT_HOOK.get() {
            hook(name);
        }
        run.await
    })
    .catch_unwind()
    .await
}

/// The text a panic carried (`panic!("…")` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".into()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn restarts(metrics: &Metrics, name: &str) -> Option<u64> {
        metrics.process.snapshot().service_restarts.get(name).copied()
    }

    #[tokio::test]
    async fn a_panicking_service_is_counted_and_restarted_until_it_stops() {
        let metrics = Arc::new(Metrics::new(true));
        let stop = CancellationToken::new();
        let runs = Arc::new(AtomicU32::new(0));
        let (counted, cancel) = (runs.clone(), stop.clone());
        let make: Maker = Box::new(move || {
            let (runs, cancel) = (counted.clone(), cancel.clone());
            Box::pin(async move {
                if runs.fetch_add(1, Ordering::SeqCst) < 3 {
                    panic!("beat {}", runs.load(Ordering::SeqCst));
                }
                // The fourth run lasts until the runner stops.
                cancel.cancel();
            })
        });
        supervise("heartbeat", metrics.clone(), stop, make).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4, "three panics, then a run that lasted");
        assert_eq!(restarts(&metrics, "heartbeat"), Some(3));
    }

    #[tokio::test]
    async fn a_service_that_returns_early_is_restarted() {
        let metrics = Arc::new(Metrics::new(true));
        let stop = CancellationToken::new();
        let runs = Arc::new(AtomicU32::new(0));
        let (counted, cancel) = (runs.clone(), stop.clone());
        let make: Maker = Box::new(move || {
            let (runs, cancel) = (counted.clone(), cancel.clone());
            Box::pin(async move {
                // Returns at once (its channel closed, say) twice.
                if runs.fetch_add(1, Ordering::SeqCst) == 2 {
                    cancel.cancel();
                }
            })
        });
        supervise("reloader", metrics.clone(), stop, make).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(restarts(&metrics, "reloader"), Some(2));
    }

    #[tokio::test]
    async fn a_stop_ends_the_restarts() {
        let metrics = Arc::new(Metrics::new(true));
        let stop = CancellationToken::new();
        let cancel = stop.clone();
        let make: Maker = Box::new(move || {
            let cancel = cancel.clone();
            Box::pin(async move {
                cancel.cancel();
                panic!("again");
            })
        });
        supervise("poller", metrics.clone(), stop, make).await;
        assert_eq!(restarts(&metrics, "poller"), None, "stopping is not a failure");
    }

    #[test]
    fn panic_messages_are_read() {
        assert_eq!(panic_message(&"text"), "text");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7u8), "(no message)");
    }
}
