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
    listen_pinging(redis, cancels, paused, stop, PING_EVERY).await;
}

/// [`listen`], pinging a quiet subscription every `ping_every` (tests
/// shorten it).
async fn listen_pinging(
    redis: Redis,
    cancels: Arc<Cancels>,
    paused: Arc<Paused>,
    stop: CancellationToken,
    ping_every: Duration,
) {
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    loop {
        let ended = tokio::select! {
            ended = subscribed(&redis, &cancels, &paused, ping_every) => ended,
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
async fn subscribed(redis: &Redis, cancels: &Cancels, paused: &Paused, ping_every: Duration) -> anyhow::Result<()> {
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
            () = tokio::time::sleep(ping_every) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::Target;

    /// The ids of the connections subscribed to the control channel.
    async fn subscribers(conn: &mut redis::aio::ConnectionManager) -> Vec<String> {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(conn)
            .await
            .expect("CLIENT LIST");
        list.lines()
            .filter(|line| line.split(' ').any(|field| field == "sub=1"))
            .filter_map(|line| line.split(' ').find_map(|field| field.strip_prefix("id=")))
            .map(str::to_owned)
            .collect()
    }

    /// How many PINGs the server has answered.
    async fn pings(conn: &mut redis::aio::ConnectionManager) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .expect("INFO");
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_ping:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (at most 10 s) until `check` holds.
    async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !check().await {
            assert!(std::time::Instant::now() < deadline, "not within 10 s: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_subscription_outlives_its_pings_and_still_hears_cancels() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let mut conn = redis.conn();
        let cancels = Cancels::new(Some(redis.clone()), "test");
        let paused = Paused::new(vec!["default".into()], None);
        let stop = CancellationToken::new();
        let listener = tokio::spawn(listen_pinging(
            redis.clone(),
            cancels.clone(),
            paused,
            stop.clone(),
            Duration::from_millis(50),
        ));

        until("the control channel to be subscribed", || {
            let mut conn = conn.clone();
            async move { subscribers(&mut conn).await.len() == 1 }
        })
        .await;
        let first = subscribers(&mut conn).await;
        // Redis 7 answers a subscribed connection's PING with ["pong", ""].
        until("five pings", || {
            let mut conn = conn.clone();
            async move { pings(&mut conn).await >= 5 }
        })
        .await;
        assert_eq!(
            subscribers(&mut conn).await,
            first,
            "the subscription was rebuilt after a ping"
        );

        // A cancel sent now arrives through the subscription: no sweep
        // runs here, and the job started too recently for the one a
        // resubscription does.
        let job = cancels.register("0123456789abcdef01234567");
        crate::redis::control::cancel(&mut conn, "0123456789abcdef01234567", "me")
            .await
            .expect("cancel");
        tokio::time::timeout(Duration::from_secs(5), job.cancelled())
            .await
            .expect("the cancel was not heard on the control channel");
        assert_eq!(job.requested().map(|request| request.by.as_str()), Some("me"));
        assert_eq!(subscribers(&mut conn).await, first, "the subscription was rebuilt");

        stop.cancel();
        listener.await.expect("the listener ended");
        drop((job, cancels, conn));
        redis.close().await.expect("close");
    }
}
