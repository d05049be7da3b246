//! Waking an idle process when a job is enqueued: one dedicated connection
//! `LISTEN`s on `wasmjobs_jobs`, which the jobs table's trigger notifies
//! with the queue's name when a claimable job appears (an insert, a
//! requeue, a recovery). PostgreSQL delivers a notification when the
//! transaction that made it commits, so a job enqueued inside an
//! application's transaction wakes a runner within milliseconds of the
//! commit, and a rolled-back one never does.
//!
//! While the connection is down the waiters poll (every [`DOWN_POLL`]),
//! and it is made again with a backoff.
//!
//! Any role that can connect may `NOTIFY` on the channel, and each wake-up
//! costs an idle process a claim (a flood of 67,000 cost 3.2 CPU-s): the
//! waiters are woken at most once per [`WAKE_GAP`]. A notification that
//! comes sooner is not dropped but deferred to the end of the gap, so a
//! real job waits at most that long.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::pg::{CHANNEL, Pg};

/// How often an idle process looks for work while it cannot listen.
pub(super) const DOWN_POLL: Duration = Duration::from_secs(1);

/// How often an idle process looks for work while it listens: only a
/// notification lost with a connection, or a job whose `run_at` passed
/// while nobody looked, waits this long.
pub(super) const LISTEN_POLL: Duration = Duration::from_secs(5);

/// Least time between two wake-ups by notification.
pub(super) const WAKE_GAP: Duration = Duration::from_millis(10);

/// What the listener tells the waiters.
#[derive(Default)]
pub(super) struct Wake {
    /// Notified on every notification for one of our queues.
    pub(super) notify: Notify,
    /// Whether the `LISTEN` connection is up.
    listening: AtomicBool,
}

impl Wake {
    /// How long a waiter may sleep without a notification.
    pub(super) fn poll(&self) -> Duration {
        if self.listening.load(Ordering::Acquire) {
            LISTEN_POLL
        } else {
            DOWN_POLL
        }
    }
}

/// Listens until `stop`, reconnecting as needed; wakes the waiters for a
/// notification naming one of `queues`, and once after each reconnect (a
/// notification may have been missed while down).
pub(super) async fn listen(pg: Pg, queues: Vec<String>, wake: Arc<Wake>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    while !stop.is_cancelled() {
        let mut listener = match pg.listener().await {
            Ok(listener) => listener,
            Err(err) => {
                if !warned {
                    tracing::warn!("{err:#}; polling for jobs every {DOWN_POLL:?} until it can listen");
                    warned = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(err) = listener.client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
            tracing::warn!("PostgreSQL: LISTEN {CHANNEL}: {err}");
            continue;
        }
        if warned {
            tracing::info!("listening for new jobs in PostgreSQL again");
        }
        warned = false;
        backoff = Duration::from_millis(100);
        wake.listening.store(true, Ordering::Release);
        wake.notify.notify_waiters();
        // The last wake-up, and whether a notification waits for the gap.
        let mut woke = Instant::now();
        let mut owed = false;
        loop {
            let message = tokio::select! {
                message = listener.messages.recv() => message,
                () = tokio::time::sleep_until(woke + WAKE_GAP), if owed => {
                    owed = false;
                    woke = Instant::now();
                    wake.notify.notify_waiters();
                    continue;
                }
                () = stop.cancelled() => None,
            };
            match message {
                Some(AsyncMessage::Notification(note)) => {
                    if queues.iter().any(|queue| queue == note.payload()) {
                        let now = Instant::now();
                        if now >= woke + WAKE_GAP {
                            woke = now;
                            wake.notify.notify_waiters();
                        } else {
                            owed = true;
                        }
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        wake.listening.store(false, Ordering::Release);
        wake.notify.notify_waiters();
        if !stop.is_cancelled() {
            tracing::warn!("lost the PostgreSQL LISTEN connection; polling every {DOWN_POLL:?} until it is back");
            warned = true;
        }
    }
}
