//! # wasmjobs-client
//!
//! Pushes jobs for wasmjobs (or Sidekiq) workers from any Rust program,
//! without linking the WebAssembly runtime: Redis, JSON and SHA-256 only.
//! The jobs are what `Sidekiq::Client.push` writes (`docs/redis-engine.md`),
//! plus unique jobs with Sidekiq Enterprise's `unique_for` semantics
//! (`docs/unique-jobs.md`, [`unique`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use wasmjobs_client::{Client, Job, Pushed};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let mut client = Client::connect("redis://127.0.0.1:6379/0").await?;
//! let job = Job::new("InvoiceMailer")
//!     .args(serde_json::json!([1234]))
//!     .unique_for(Duration::from_secs(3600));
//! match client.push(&job).await? {
//!     Pushed::Enqueued { jid } => println!("enqueued {jid}"),
//!     Pushed::Duplicate { jid, ttl } => println!("job {jid} holds the lock for {ttl:?} more"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`job`] | the [`Job`] builder, job ids |
//! | [`payload`] | the Sidekiq payload, parsed without losing unknown keys |
//! | [`push`] | pushing payloads as they are (bulk, scheduled) |
//! | [`unique`] | unique-job locks: digest, push script, release |
//! | [`shards`] | queues spread over several Redis servers: routes, a client per shard |
//! | [`keys`] | the Redis keys a producer writes |
//! | `pg` | (feature `postgres`) pushing into the PostgreSQL job store inside a transaction |

pub mod activejob;
pub mod fields;
pub mod job;
pub mod keys;
pub mod payload;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod push;
pub mod shards;
pub mod unique;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use redis::aio::{ConnectionLike, ConnectionManager};

pub use job::Job;
pub use payload::Payload;
pub use unique::{Lock, Pushed, UniqueUntil};

/// Seconds since the Unix epoch, as a float (Sidekiq ≤ 7's timestamps).
pub fn now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Pushes [`Job`]s over one Redis connection (any async redis-rs
/// connection; [`Client::connect`] opens a self-reconnecting one). Cheap
/// to clone when the connection is.
#[derive(Clone)]
pub struct Client<C = ConnectionManager> {
    conn: C,
}

impl Client {
    /// Connects to Redis at `url` (`redis://host:6379/0`, `unix:///path`).
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).context("invalid Redis URL")?;
        let conn = ConnectionManager::new(client)
            .await
            .context("cannot connect to Redis")?;
        Ok(Self { conn })
    }
}

impl<C: ConnectionLike + Send> Client<C> {
    /// A client over a connection you already have.
    pub fn from_connection(conn: C) -> Self {
        Self { conn }
    }

    /// Pushes `job`: to its queue, or to the schedule if it has a later
    /// [`at`](Job::at). A unique job takes its lock in the same atomic step,
    /// or is refused as [`Pushed::Duplicate`] with nothing written.
    pub async fn push(&mut self, job: &Job) -> Result<Pushed> {
        let now = now_f64();
        let (mut payload, lock) = job.to_payload(now)?;
        let at = job.run_at(now);
        if let Some(lock) = &lock {
            let secs = payload.get("unique_for").and_then(|v| v.as_u64()).unwrap_or(1);
            return unique::push(&mut self.conn, &mut payload, lock, Duration::from_secs(secs), at).await;
        }
        match at {
            Some(at) => push::schedule(&mut self.conn, &mut payload, at).await?,
            None => push::push(&mut self.conn, &mut payload).await?,
        }
        Ok(Pushed::Enqueued {
            jid: payload.jid().to_owned(),
        })
    }

    /// The connection, for anything else.
    pub fn connection(&mut self) -> &mut C {
        &mut self.conn
    }
}
