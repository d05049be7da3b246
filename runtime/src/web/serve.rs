//! Serving the dashboard's connections, with time limits a client cannot
//! stretch.
//!
//! `axum::serve` gives hyper no timer, so a client that opens a connection
//! and sends half a request head holds it (and a graceful shutdown that
//! waits for it) forever. Here each connection is HTTP/1.1 with:
//! - [`HEADER_TIMEOUT`] to send a request head, which also closes a
//!   keep-alive connection idle that long (hyper arms it whenever it waits
//!   for a head);
//! - a form body within [`super::auth::BODY_TIMEOUT`] (checked by the guard);
//! - at most [`MAX_CONNECTIONS`] at once: further clients wait in the
//!   kernel's backlog.
//!
//! On stop the listener closes (once its last holder, the supervisor's
//! maker, is gone), idle connections are closed, requests in progress get
//! [`SHUTDOWN_GRACE`] to finish, and whatever is left is dropped: stopping
//! never waits on a client.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Longest a client may take to send a request head, or stay idle between
/// requests on a kept-alive connection.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a stop waits for requests in progress.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Most connections served at once.
const MAX_CONNECTIONS: usize = 256;

/// Serves `app` on `listener` until `stop`.
pub(crate) async fn serve(listener: Arc<TcpListener>, app: Router, stop: CancellationToken) {
    let service = TowerToHyperService::new(app);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, most likely: wait a little
                    // rather than spin.
                    tracing::warn!("web: cannot accept a connection: {err}");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        () = stop.cancelled() => break,
                    }
                }
            },
            () = stop.cancelled() => break,
        };
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service.clone());
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%peer, "web: connection ended: {err}");
            }
            drop(permit);
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        tracing::info!(
            connections = connections.len(),
            "web: requests still in progress after {SHUTDOWN_GRACE:?}; closing them"
        );
    }
    connections.shutdown().await;
}
