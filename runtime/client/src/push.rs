//! The producer side: pushing jobs as Sidekiq's `client.rb` does.
//!
//! Whatever pushes here is indistinguishable from `Sidekiq::Client.push`:
//! the queue name goes into `queues` (so the Web UI lists it), the payload
//! is `LPUSH`ed onto `queue:NAME` (workers pop from the right, so jobs run
//! in push order), and `enqueued_at` is set at push time; a job for later
//! goes into the `schedule` sorted set instead, with no `enqueued_at` until
//! the scheduler moves it to its queue. Bulk pushes go in chunks, one round
//! trip each, so millions of jobs take seconds rather than minutes.
//!
//! These push any payload as it is; a unique job goes through
//! [`crate::unique::push`] instead, which takes its lock in the same
//! atomic step.

use std::collections::HashMap;

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;

use crate::keys;
use crate::now_f64;
use crate::payload::Payload;

/// Jobs per round trip in bulk operations.
pub const CHUNK: usize = 1_000;

/// Pushes one job now: sets `enqueued_at` (in the payload's own time style,
/// see [`Payload::set_time`]), `SADD queues`, `LPUSH queue:Q`, in one
/// `MULTI`.
pub async fn push<C>(conn: &mut C, payload: &mut Payload) -> Result<()>
where
    C: ConnectionLike + Send,
{
    push_chunk(conn, std::slice::from_mut(payload), now_f64())
        .await
        .with_context(|| format!("cannot push job {} to Redis", payload.jid()))
}

/// Pushes many jobs now, [`CHUNK`] per round trip, each chunk in one
/// `MULTI` (jobs of one queue in one `LPUSH`). All get the same
/// `enqueued_at`, as with Sidekiq's `push_bulk`.
pub async fn push_bulk<C>(conn: &mut C, payloads: &mut [Payload]) -> Result<()>
where
    C: ConnectionLike + Send,
{
    let now = now_f64();
    let total = payloads.len();
    for (index, chunk) in payloads.chunks_mut(CHUNK).enumerate() {
        push_chunk(conn, chunk, now)
            .await
            .with_context(|| format!("cannot push jobs to Redis ({} of {total} pushed)", index * CHUNK))?;
    }
    Ok(())
}

/// Schedules a job for `at` (epoch seconds): `ZADD schedule at payload`.
/// The payload gets its `enqueued_at` when the scheduler enqueues it.
pub async fn schedule<C>(conn: &mut C, payload: &mut Payload, at: f64) -> Result<()>
where
    C: ConnectionLike + Send,
{
    schedule_bulk(conn, std::slice::from_mut(payload), at)
        .await
        .with_context(|| format!("cannot schedule job {}", payload.jid()))
}

/// Schedules many jobs for `at`, [`CHUNK`] per `ZADD`.
pub async fn schedule_bulk<C>(conn: &mut C, payloads: &mut [Payload], at: f64) -> Result<()>
where
    C: ConnectionLike + Send,
{
    let total = payloads.len();
    for payload in payloads.iter_mut() {
        // A job gets its enqueued_at when it reaches its queue.
        payload.remove("enqueued_at");
    }
    for (index, chunk) in payloads.chunks(CHUNK).enumerate() {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(keys::SCHEDULE);
        for payload in chunk {
            zadd.arg(at).arg(payload.to_json());
        }
        zadd.exec_async(conn)
            .await
            .with_context(|| format!("cannot add jobs to the schedule ({} of {total} added)", index * CHUNK))?;
    }
    Ok(())
}

/// One `MULTI`: per queue in `chunk`, `SADD queues` and one `LPUSH`.
async fn push_chunk<C>(conn: &mut C, chunk: &mut [Payload], now: f64) -> redis::RedisResult<()>
where
    C: ConnectionLike + Send,
{
    let mut by_queue: Vec<(String, Vec<String>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for payload in chunk.iter_mut() {
        payload.set_time("enqueued_at", now);
        let slot = match index.get(payload.queue()) {
            Some(&slot) => slot,
            None => {
                index.insert(payload.queue().to_owned(), by_queue.len());
                by_queue.push((payload.queue().to_owned(), Vec::new()));
                by_queue.len() - 1
            }
        };
        by_queue[slot].1.push(payload.to_json());
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (queue, jobs) in &by_queue {
        pipe.sadd(keys::QUEUES, queue).ignore();
        pipe.lpush(keys::queue(queue), jobs).ignore();
    }
    pipe.exec_async(conn).await
}
