//! Background loops that cannot end silently.
//!
//! Every loop `wasmjobs run` keeps beside the jobs (heartbeat, pollers,
//! reloader, control, cancel sweep, ...) is spawned through [`spawn`] with
//! a name. A loop that panics is logged as an error naming it and counted
//! (`wasmjobs_background_task_panics_total{task="…"}`); one that can be
//! made again ([`Restart::With`]) is restarted after a pause that doubles
//! from [`FIRST_PAUSE`] up to [`LONGEST_PAUSE`], so a panic that recurs
//! at once does not spin. The heartbeat is one of those: a process whose
//! heartbeat stopped looks dead to the others, which would recover its
//! jobs and run them twice. A loop that returns normally is not restarted
//! (loops return when the runner stops).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// The first pause before a panicked loop is restarted.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between restarts.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// A loop's future, boxed so one supervisor serves them all.
pub(crate) type Loop = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Whether a panicked loop can be started again.
pub(crate) enum Restart {
    /// Made anew by this function (cloning what the first run took).
    With(Box<dyn Fn() -> Loop + Send + Sync>),
    /// It owned something it consumed (a channel's receiver, a listener):
    /// what it did is off until the process restarts, and the log says so.
    Never(Loop, &'static str),
}

/// Runs a loop named `name` on `tasks`, logging and counting its panics,
/// and restarting it while `stop` is not cancelled when it can be.
pub(crate) fn spawn(
    tasks: &TaskTracker,
    name: &'static str,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    restart: Restart,
) {
    tasks.spawn(supervise(name, metrics, stop, restart));
}

/// The supervision of one loop (see [`spawn`]).
pub(crate) async fn supervise(name: &'static str, metrics: Arc<Metrics>, stop: CancellationToken, restart: Restart) {
    let (make, mut next, off) = match restart {
        Restart::With(make) => {
            let first = make();
            (Some(make), first, "")
        }
        Restart::Never(run, off) => (None, run, off),
    };
    let mut pause = FIRST_PAUSE;
    loop {
        let Err(panic) = AssertUnwindSafe(next).catch_unwind().await else {
            return;
        };
        metrics.process.task_panicked(name);
        let message = panic_message(panic.as_ref());
        let Some(make) = &make else {
            tracing::error!(
                task = name,
                "background task {name} panicked and cannot be restarted: {message}; {off} is off until the process restarts"
            );
            return;
        };
        tracing::error!(
            task = name,
            "background task {name} panicked: {message}; restarting it in {pause:?}"
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.cancelled() => return,
        }
        pause = (pause * 2).min(LONGEST_PAUSE);
        next = make();
    }
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

    #[tokio::test]
    async fn a_panicking_loop_is_counted_and_restarted_until_it_runs() {
        let metrics = Arc::new(Metrics::new(true));
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let restart = Restart::With(Box::new(move || {
            let runs = counted.clone();
            Box::pin(async move {
                if runs.fetch_add(1, Ordering::SeqCst) < 3 {
                    panic!("beat {}", runs.load(Ordering::SeqCst));
                }
            })
        }));
        supervise("heartbeat", metrics.clone(), CancellationToken::new(), restart).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4, "three panics, then a run that returned");
        assert_eq!(metrics.process.snapshot().task_panics.get("heartbeat"), Some(&3));
    }

    #[tokio::test]
    async fn a_loop_that_cannot_restart_is_counted_once() {
        let metrics = Arc::new(Metrics::new(true));
        let run: Loop = Box::pin(async { panic!("gone") });
        supervise(
            "reloader",
            metrics.clone(),
            CancellationToken::new(),
            Restart::Never(run, "hot reload"),
        )
        .await;
        assert_eq!(metrics.process.snapshot().task_panics.get("reloader"), Some(&1));
    }

    #[tokio::test]
    async fn a_stop_ends_the_restarts() {
        let metrics = Arc::new(Metrics::new(true));
        let stop = CancellationToken::new();
        let cancel = stop.clone();
        let restart = Restart::With(Box::new(move || {
            let cancel = cancel.clone();
            Box::pin(async move {
                cancel.cancel();
                panic!("again");
            })
        }));
        supervise("poller", metrics.clone(), stop, restart).await;
        assert_eq!(metrics.process.snapshot().task_panics.get("poller"), Some(&1));
    }

    #[test]
    fn panic_messages_are_read() {
        assert_eq!(panic_message(&"text"), "text");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7u8), "(no message)");
    }
}
