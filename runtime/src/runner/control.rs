//! Listening on the control channel: what `wasmjobs cancel`, `pause` and
//! `resume` announce reaches every running process in milliseconds.
//!
//! One pub/sub connection per process, subscribed to
//! [`keys::CONTROL_CHANNEL`]. A cancel goes to [`Cancels::heard`]; a change
//! of the paused queues to [`Paused::nudge`]. Messages are only nudges:
//! the state they announce is in Redis, and the sweep and the paused
//! poller read it anyway, so a message lost while the connection was down
//! delays an action by a second at most. On every (re)connection both are
//! read again at once. Anyone can publish: text that is not a message is
//! ignored ([`Message::decode`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::cancel::Cancels;
use super::source::paused::Paused;
use crate::redis::control::Message;
use crate::redis::{Redis, keys};

/// A subscription with no message for this long is checked with a ping,
/// so a connection that died silently is replaced.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Listens until `stop`, reconnecting with backoff.
pub(crate) async fn listen(redis: Redis, cancels: Arc<Cancels>, paused: Arc<Paused>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    loop {
        let ended = tokio::select! {
            ended = subscribed(&redis, &cancels, &paused) => ended,
            () = stop.cancelled() => return,
        };
        if let Err(err) = ended {
            if !failing {
                tracing::warn!(
                    "control channel: {err:#}; reconnecting (cancels and pauses are still read from Redis every second)"
                );
            }
            failing = true;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One subscription, until its connection fails.
async fn subscribed(redis: &Redis, cancels: &Cancels, paused: &Paused) -> anyhow::Result<()> {
    let mut pubsub = redis.pubsub().await?;
    pubsub
        .subscribe(keys::CONTROL_CHANNEL)
        .await
        .map_err(|err| anyhow::anyhow!("cannot subscribe: {err}"))?;
    // Whatever was announced while not subscribed.
    paused.nudge();
    if let Err(err) = cancels.sweep().await {
        tracing::debug!("{err:#}");
    }
    let (mut sink, mut messages) = pubsub.split();
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            () = tokio::time::sleep(PING_EVERY) => {
                let pong: redis::RedisResult<String> = sink.ping().await;
                pong.map_err(|err| anyhow::anyhow!("the subscription does not answer: {err}"))?;
                continue;
            }
        };
        let Some(message) = message else {
            anyhow::bail!("the subscription's connection closed");
        };
        let Ok(text) = message.get_payload::<String>() else {
            continue;
        };
        match Message::decode(&text) {
            Some(Message::Cancel(jid)) => cancels.heard(&jid).await,
            Some(Message::Paused) => paused.nudge(),
            None => tracing::debug!("ignoring {:?} on the control channel", crate::job::preview(&text)),
        }
    }
}
