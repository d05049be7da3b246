//! Starting no instance while started jobs wait for a core.
//!
//! A job's instance lives from its start to its end. In a runner short of
//! CPU (10,000 HTTP jobs in flight on two cores), jobs whose response had
//! arrived waited in the run queue holding their instance while jobs taken
//! meanwhile were started, each with an instance of its own (~105 KB): the
//! peak memory followed how many were alive at once, 5,000–8,000 of the
//! 10,000, not the work there was (`docs/performance.md`).
//!
//! So each job's future is [`Backlog::track`]ed: it counts as *ready* from
//! the moment something wakes it until its poll returns `Pending` again
//! (the count is kept by the waker it is polled with, so a job whose
//! response has arrived counts at once, before any core reaches it). A job
//! about to be instantiated waits in [`Backlog::wait_for_cpu`] while more
//! than [`READY_LIMIT`] jobs are ready, holding its slot but no instance;
//! each job that goes back to waiting lets one through. Jobs already
//! started are thus resumed before new ones begin, and a runner with a
//! core to spare never waits here. No job waits longer than
//! [`LONGEST_WAIT`]: guests that loop stay ready for as long as their
//! timeout lets them, and 256 of them must not stop every other job
//! from starting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;

/// Ready jobs above which no job is instantiated. Enough to keep every
/// worker thread busy for a few milliseconds, so a gate that opens finds
/// work queued; small beside a pool of thousands.
pub(crate) const READY_LIMIT: usize = 256;
/// The longest a job waits at the gate. A burst of answers drains within
/// tens of milliseconds at C=10,000 on two cores; a backlog that does not
/// is work that will not settle (looping guests), and new jobs share the
/// cores with it, as they would without the gate.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_millis(100);

/// The ready jobs, and the jobs waiting for them to get a core.
#[derive(Debug)]
pub(crate) struct Backlog {
    ready: AtomicUsize,
    limit: usize,
    longest: Duration,
    cleared: Notify,
}

impl Default for Backlog {
    fn default() -> Self {
        Self::new(READY_LIMIT, LONGEST_WAIT)
    }
}

impl Backlog {
    /// A backlog letting jobs be instantiated while at most `limit` are
    /// ready (the caller included), or once they have waited `longest`.
    pub(crate) fn new(limit: usize, longest: Duration) -> Self {
        Self {
            ready: AtomicUsize::new(0),
            limit: limit.max(1),
            longest,
            cleared: Notify::new(),
        }
    }

    /// Ready jobs now.
    pub(crate) fn ready(&self) -> usize {
        self.ready.load(Ordering::Acquire)
    }

    /// `future`, counted as ready whenever it has been woken and not yet
    /// polled to `Pending`. It counts from now: a job is ready when made.
    pub(crate) fn track<F: Future>(self: &Arc<Self>, future: F) -> Tracked<F> {
        self.ready.fetch_add(1, Ordering::AcqRel);
        let wake = Arc::new(TaskWake {
            state: AtomicU8::new(WOKEN),
            backlog: self.clone(),
            task: AtomicWaker::new(),
        });
        Tracked {
            future,
            counted: Counted {
                waker: Waker::from(wake.clone()),
                wake,
            },
        }
    }

    /// Returns once at most the limit of jobs are ready, the caller (a
    /// tracked job, being polled) included, or after the longest wait.
    pub(crate) async fn wait_for_cpu(&self) {
        if self.ready() <= self.limit {
            return;
        }
        let _ = tokio::time::timeout(self.longest, self.settled()).await;
        // Room for more than this job: let the next waiter check too, so
        // a backlog that cleared at once lets through as many as fit.
        if self.ready() < self.limit {
            self.cleared.notify_one();
        }
    }

    async fn settled(&self) {
        loop {
            let cleared = self.cleared.notified();
            tokio::pin!(cleared);
            cleared.as_mut().enable();
            if self.ready() <= self.limit {
                break;
            }
            cleared.await;
        }
    }

    fn woken(&self) {
        self.ready.fetch_add(1, Ordering::AcqRel);
    }

    fn went_idle(&self) {
        let before = self.ready.fetch_sub(1, Ordering::AcqRel);
        if before <= self.limit {
            self.cleared.notify_one();
        }
    }
}

/// The job is waiting and nothing has woken it: not counted.
const IDLE: u8 = 0;
/// The job is being polled: counted.
const RUNNING: u8 = 1;
/// Woken, not yet polled (or woken while being polled): counted.
const WOKEN: u8 = 2;
/// Finished or dropped: never counted again.
const DONE: u8 = 3;

/// What a tracked job's waker does: count the job as ready, then wake its
/// task.
#[derive(Debug)]
struct TaskWake {
    state: AtomicU8,
    backlog: Arc<Backlog>,
    task: AtomicWaker,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if state != IDLE && state != RUNNING {
                break;
            }
            match self
                .state
                .compare_exchange(state, WOKEN, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(IDLE) => {
                    self.backlog.woken();
                    break;
                }
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        self.task.wake();
    }
}

pin_project_lite::pin_project! {
    /// A future counted in its [`Backlog`] while ready.
    pub(crate) struct Tracked<F> {
        #[pin]
        future: F,
        counted: Counted,
    }
}

/// The job's place in the count, taken out of it when the job ends or is
/// dropped.
struct Counted {
    /// Wakes `wake`, made once.
    waker: Waker,
    wake: Arc<TaskWake>,
}

impl<F: Future> Future for Tracked<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let wake = &this.counted.wake;
        wake.task.register(cx.waker());
        // Polled without a wake of ours (its first poll, or another waker
        // of the task): it is ready now all the same.
        if wake.state.swap(RUNNING, Ordering::AcqRel) == IDLE {
            wake.backlog.woken();
        }
        let mut own = Context::from_waker(&this.counted.waker);
        match this.future.poll(&mut own) {
            Poll::Ready(output) => {
                // Counted while polled; never again.
                wake.state.store(DONE, Ordering::Release);
                wake.backlog.went_idle();
                Poll::Ready(output)
            }
            Poll::Pending => {
                // Woken while it was polled: it stays ready.
                if wake
                    .state
                    .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    wake.backlog.went_idle();
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let before = self.wake.state.swap(DONE, Ordering::AcqRel);
        if before == RUNNING || before == WOKEN {
            self.wake.backlog.went_idle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_counts_while_woken_and_not_while_it_waits() {
        let backlog = Arc::new(Backlog::new(4, Duration::from_secs(60)));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let job = tokio::spawn(backlog.track(Box::pin(async move {
            let _ = rx.await;
        })));
        assert_eq!(backlog.ready(), 1, "a job is ready when made");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while backlog.ready() != 0 {
            assert!(tokio::time::Instant::now() < deadline, "the waiting job still counts");
            tokio::task::yield_now().await;
        }
        // The wake counts at once, before the job is polled again.
        let _ = tx.send(());
        assert_eq!(backlog.ready(), 1, "woken: ready before its poll");
        job.await.expect("the job ends");
        assert_eq!(backlog.ready(), 0, "a finished job does not count");
    }

    #[test]
    fn a_wake_counts_before_the_poll_and_a_dropped_job_stops_counting() {
        let backlog = Arc::new(Backlog::new(4, Duration::from_secs(60)));
        let (rx, tx) = futures_util::future::abortable(std::future::pending::<()>());
        let mut job = std::pin::pin!(backlog.track(rx));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(job.as_mut().poll(&mut cx).is_pending());
        assert_eq!(backlog.ready(), 0);
        tx.abort();
        assert_eq!(backlog.ready(), 1, "woken, not yet polled: ready");
        assert!(job.as_mut().poll(&mut cx).is_ready());
        assert_eq!(backlog.ready(), 0);
        let (rx, _tx) = futures_util::future::abortable(std::future::pending::<()>());
        let job = backlog.track(rx);
        assert_eq!(backlog.ready(), 1);
        drop(job);
        assert_eq!(backlog.ready(), 0, "a dropped job does not count");
    }

    #[tokio::test]
    async fn jobs_wait_while_more_are_ready_than_the_limit_and_go_once_they_settle() {
        let backlog = Arc::new(Backlog::new(2, Duration::from_secs(60)));
        // Three ready jobs that do not go idle until told to.
        let mut holders = Vec::new();
        let mut release = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            release.push(tx);
            holders.push(backlog.track(Box::pin(async move {
                let _ = rx.await;
            })));
        }
        assert_eq!(backlog.ready(), 3);
        let waiter = {
            let backlog = backlog.clone();
            tokio::spawn(async move {
                // Not tracked itself: stands for a job that counts nothing
                // while it waits at the gate.
                backlog.wait_for_cpu().await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "3 ready against a limit of 2: the gate is shut");
        // The held jobs are polled to `Pending`: none is ready any more.
        let running: Vec<_> = holders.into_iter().map(tokio::spawn).collect();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the gate opens once the ready jobs settle")
            .expect("the waiter ends");
        for tx in release {
            let _ = tx.send(());
        }
        for job in running {
            job.await.expect("a held job ends");
        }
        assert_eq!(backlog.ready(), 0);
    }

    #[tokio::test]
    async fn a_backlog_that_never_settles_holds_a_job_back_only_for_the_longest_wait() {
        let longest = Duration::from_millis(50);
        let backlog = Arc::new(Backlog::new(1, longest));
        // Two jobs that stay ready (as looping guests do): never settles.
        let (_a, _b) = (
            backlog.track(Box::pin(std::future::pending::<()>())),
            backlog.track(Box::pin(std::future::pending::<()>())),
        );
        let asked = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), backlog.wait_for_cpu())
            .await
            .expect("the gate lets the job go after its longest wait");
        assert!(asked.elapsed() >= longest, "it waited: the backlog was over the limit");
        assert_eq!(backlog.ready(), 2);
    }
}
