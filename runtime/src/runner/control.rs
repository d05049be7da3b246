//! Listening on the control channel: what `wasmjobs cancel`, `pause` and
//! `resume` announce reaches every running process in milliseconds.
//!
//! One pub/sub connection per process, subscribed to
//! [`keys::CONTROL_CHANNEL`]. A cancel goes to [`Cancels::heard`]; a change
//! of the paused queues to [`Paused::nudge`]. The messages that arrived
//! together are acted on together (up to [`BATCH_MAX`]): the cancels of
//! one `wasmjobs cancel` of many jobs are looked up in one round trip.
//! It all runs on a thread of its own (`wasmjobs-control`), with its own
//! connections: on the runner's threads, CPU-bound guests take turns of
//! 10 ms each, and a message waiting behind a hundred of them would wait
//! seconds; from here the jobs are stopped within milliseconds. Messages are only nudges:
//! the state they announce is in Redis, and the sweep and the paused
//! poller read it anyway, so a message lost while the connection was down
//! delays an action by a second at most. On every (re)connection both are
//! read again at once. Anyone can publish: text that is not a message is
//! ignored ([`Message::decode`]).
//!
//! A subscription quiet for [`PING_EVERY`] is pinged (a subscribed RESP2
//! connection, Redis 7's, answers `["pong", ""]`, not `PONG`); one that
//! does not answer within [`RESPONSE_TIMEOUT`] is replaced. Reconnections
//! back off from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`], and start over from
//! the first once subscribed again; the first failure of a run of them is
//! logged, and so is the recovery.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::{FutureExt, StreamExt};
use redis::aio::{MultiplexedConnection, PubSub, PubSubSink};
use redis::{Msg, Value};
use tokio_util::sync::CancellationToken;

use super::cancel::Cancels;
use super::source::paused::Paused;
use crate::redis::control::Message;
use crate::redis::{RESPONSE_TIMEOUT, Redis, keys};

/// A subscription with no message for this long is checked with a ping,
/// so a connection that died silently is replaced.
const PING_EVERY: Duration = Duration::from_secs(30);
/// The pause before the first reconnection; it doubles while Redis stays
/// away, up to [`MAX_BACKOFF`], and starts over once subscribed again.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between two reconnections.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Most messages acted on together.
const BATCH_MAX: usize = 1_000;

/// Listens until `stop`, reconnecting with backoff, on a thread of its
/// own: the jobs' tasks, CPU-bound guests among them, get the runner's
/// threads 10 ms at a time, and a message (and the lookup it needs)
/// waiting its turn behind a hundred of them would wait seconds.
pub(crate) async fn listen(
    redis: Redis,
    shard: u16,
    cancels: Arc<Cancels>,
    paused: Arc<Paused>,
    stop: CancellationToken,
) {
    let (ended, done) = tokio::sync::oneshot::channel();
    let (thread_redis, thread_cancels, thread_paused, thread_stop) =
        (redis.clone(), cancels.clone(), paused.clone(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("wasmjobs-control".into())
        .spawn(move || {
            let listened = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| {
                    runtime.block_on(listen_pinging(
                        thread_redis,
                        shard,
                        thread_cancels,
                        thread_paused,
                        thread_stop,
                        PING_EVERY,
                    ));
                })
                .context("cannot start its runtime");
            let _ = ended.send(listened);
        });
    let result = match thread {
        Ok(_) => done
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked"))),
        Err(err) => Err(anyhow::Error::from(err).context("cannot start its thread")),
    };
    if let Err(err) = result
        && !stop.is_cancelled()
    {
        tracing::error!(
            "control channel: {err:#}; listening among the jobs instead (cancels and pauses may wait for them)"
        );
        listen_pinging(redis, shard, cancels, paused, stop, PING_EVERY).await;
    }
}

/// [`listen`], pinging a quiet subscription every `ping_every` (tests
/// shorten it).
async fn listen_pinging(
    redis: Redis,
    shard: u16,
    cancels: Arc<Cancels>,
    paused: Arc<Paused>,
    stop: CancellationToken,
    ping_every: Duration,
) {
    let mut backoff = FIRST_BACKOFF;
    let mut failing = false;
    loop {
        let subscribed = tokio::select! {
            subscribed = subscribe(&redis) => subscribed,
            () = stop.cancelled() => return,
        };
        let ended = match subscribed {
            Ok(subscription) => {
                if failing {
                    tracing::info!("control channel: subscribed again");
                }
                failing = false;
                backoff = FIRST_BACKOFF;
                tokio::select! {
                    ended = heed(subscription, shard, &cancels, &paused, ping_every) => ended,
                    () = stop.cancelled() => return,
                }
            }
            Err(err) => err,
        };
        if !failing {
            tracing::warn!(
                "control channel: {ended:#}; reconnecting (cancels and pauses are still read from Redis every second)"
            );
        }
        failing = true;
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A subscription to the control channel, and a connection of its own
/// for the lookups its messages need (on the listener's runtime, like the
/// subscription).
struct Subscription {
    pubsub: PubSub,
    conn: MultiplexedConnection,
}

/// Subscribes to the control channel.
async fn subscribe(redis: &Redis) -> anyhow::Result<Subscription> {
    let mut pubsub = redis.pubsub().await?;
    tokio::time::timeout(RESPONSE_TIMEOUT, pubsub.subscribe(keys::CONTROL_CHANNEL))
        .await
        .map_err(|_| anyhow::anyhow!("cannot subscribe: no answer within {RESPONSE_TIMEOUT:?}"))?
        .map_err(|err| anyhow::anyhow!("cannot subscribe: {err}"))?;
    let conn = redis.dedicated(Duration::ZERO).await?;
    Ok(Subscription { pubsub, conn })
}

/// Acts on the messages of `pubsub` until its connection fails; returns
/// why it did.
async fn heed(
    subscription: Subscription,
    shard: u16,
    cancels: &Cancels,
    paused: &Paused,
    ping_every: Duration,
) -> anyhow::Error {
    let Subscription { pubsub, mut conn } = subscription;
    // Whatever was announced while not subscribed.
    paused.nudge();
    if let Err(err) = cancels.sweep_on(&mut conn, shard).await {
        tracing::debug!("{err:#}");
    }
    let (mut sink, mut messages) = pubsub.split();
    loop {
        let message = tokio::select! {
            message = messages.next() => message,
            () = tokio::time::sleep(ping_every) => {
                if let Err(err) = ping(&mut sink).await {
                    return err;
                }
                continue;
            }
        };
        let Some(message) = message else {
            return anyhow::anyhow!("the subscription's connection closed");
        };
        // And every message already there: a cancel of 200 jobs is one
        // lookup, not 200 one after another.
        let mut batch = vec![message];
        while batch.len() < BATCH_MAX
            && let Some(Some(message)) = messages.next().now_or_never()
        {
            batch.push(message);
        }
        act(&batch, &mut conn, cancels, paused).await;
    }
}

/// Acts on `messages`: the cancels together, one nudge for any number of
/// pauses.
async fn act(messages: &[Msg], conn: &mut MultiplexedConnection, cancels: &Cancels, paused: &Paused) {
    let mut jids = Vec::new();
    let mut nudge = false;
    for message in messages {
        let Ok(text) = message.get_payload::<String>() else {
            continue;
        };
        match Message::decode(&text) {
            Some(Message::Cancel(jid)) => jids.push(jid),
            Some(Message::Paused) => nudge = true,
            None => tracing::debug!("ignoring {:?} on the control channel", crate::job::preview(&text)),
        }
    }
    if nudge {
        paused.nudge();
    }
    if !jids.is_empty() {
        cancels.heard(conn, &jids).await;
    }
}

/// Checks that the subscription still answers.
async fn ping(sink: &mut PubSubSink) -> anyhow::Result<()> {
    let reply = tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<Value>())
        .await
        .map_err(|_| anyhow::anyhow!("the subscription did not answer a ping within {RESPONSE_TIMEOUT:?}"))?
        .map_err(|err| anyhow::anyhow!("the subscription does not answer: {err}"))?;
    if !is_pong(&reply) {
        anyhow::bail!("the subscription answered a ping with {reply:?}");
    }
    Ok(())
}

/// Whether `reply` answers a PING: `PONG`, or on a subscribed RESP2
/// connection (Redis 7, Valkey) the array `["pong", ""]`.
fn is_pong(reply: &Value) -> bool {
    let pong = |value: &Value| match value {
        Value::SimpleString(text) => text.eq_ignore_ascii_case("pong"),
        Value::BulkString(bytes) => bytes.eq_ignore_ascii_case(b"pong"),
        _ => false,
    };
    match reply {
        Value::Array(items) => items.first().is_some_and(pong),
        other => pong(other),
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

    #[test]
    fn pong_is_read_in_every_shape() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        assert!(is_pong(&Value::SimpleString("PONG".into())));
        assert!(is_pong(&bulk("PONG")));
        assert!(is_pong(&Value::Array(vec![bulk("pong"), bulk("")])));
        for other in [
            Value::Nil,
            Value::Array(Vec::new()),
            Value::Array(vec![bulk("message"), bulk("pong")]),
            bulk("pang"),
            Value::Int(1),
        ] {
            assert!(!is_pong(&other), "{other:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_subscription_outlives_its_pings_and_still_hears_cancels() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let mut conn = redis.conn();
        let cancels = Cancels::new(vec![redis.clone()], "test");
        let paused = Paused::new(vec!["default".into()], None);
        let stop = CancellationToken::new();
        let listener = tokio::spawn(listen_pinging(
            redis.clone(),
            0,
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
        let job = cancels.register("0123456789abcdef01234567", 0);
        crate::redis::control::cancel(&mut conn, "0123456789abcdef01234567", "me")
            .await
            .expect("cancel");
        tokio::time::timeout(Duration::from_secs(5), job.cancelled())
            .await
            .expect("the cancel was not heard on the control channel");
        assert_eq!(job.requested().map(|request| request.by.as_str()), Some("me"));
        assert_eq!(job.via(), Some(super::super::cancel::Via::Message));
        assert_eq!(subscribers(&mut conn).await, first, "the subscription was rebuilt");

        stop.cancel();
        listener.await.expect("the listener ended");
        drop((job, cancels, conn));
        redis.close().await.expect("close");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancels_sent_together_are_all_heard_and_a_stray_message_is_not_obeyed() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let mut conn = redis.conn();
        let cancels = Cancels::new(vec![redis.clone()], "test");
        let stop = CancellationToken::new();
        let listener = tokio::spawn(listen(
            redis.clone(),
            0,
            cancels.clone(),
            Paused::new(Vec::new(), None),
            stop.clone(),
        ));
        until("the control channel to be subscribed", || {
            let mut conn = conn.clone();
            async move { subscribers(&mut conn).await.len() == 1 }
        })
        .await;
        let jids: Vec<String> = (0..300).map(|n| format!("{n:024}")).collect();
        let jobs: Vec<_> = jids.iter().map(|jid| cancels.register(jid, 0)).collect();
        // And one published by someone else, with no request behind it.
        let _: () = redis::cmd("PUBLISH")
            .arg(keys::CONTROL_CHANNEL)
            .arg("cancel 999999999999999999999999")
            .query_async(&mut conn)
            .await
            .expect("PUBLISH");
        let stray = cancels.register("999999999999999999999999", 0);
        let request = crate::redis::control::CancelRequest::now("me");
        let found = crate::redis::control::cancel_all(&mut conn, &jids, &request)
            .await
            .expect("cancel");
        assert_eq!(found.len(), jids.len());
        for job in &jobs {
            tokio::time::timeout(Duration::from_secs(5), job.cancelled())
                .await
                .expect("every cancel is heard");
            assert_eq!(job.requested(), Some(&request));
            assert_eq!(job.via(), Some(super::super::cancel::Via::Message));
        }
        assert!(
            stray.requested().is_none(),
            "a message with no request behind it cancels nothing"
        );
        stop.cancel();
        listener.await.expect("the listener ended");
        drop((jobs, stray, cancels, conn));
        redis.close().await.expect("close");
    }
}
