//! Redis, spoken in Sidekiq's format.
//!
//! wasmjobs keeps all shared state in Redis (or Valkey), laid out exactly as
//! Sidekiq lays it out (`../shared/reference/sidekiq-wire-format.md`), so
//! Sidekiq clients can enqueue, the Sidekiq Web UI can watch, and several
//! wasmjobs processes on several machines share one Redis with no cluster of
//! their own.
//!
//! - [`keys`]: every key name in one place.
//! - [`payload`]: the job payload (JSON), parsed without losing unknown keys,
//!   and the worker's fast path over it ([`job_head`]).
//! - [`embedded`]: the private `redis-server` used when no URL is given.
//! - [`client`]: the write side for producers (`push`, `push_bulk`, scheduling).
//!
//! The producer side (payload, push, unique jobs, their keys) is the
//! `wasmjobs-client` crate (`runtime/client/`), which Rust programs use to
//! enqueue without linking Wasmtime; it is re-exported here under its old
//! names.
//! - [`api`]: the read side (`wasmjobs stats`).
//! - [`admin`]: the dashboard's reads and actions on queues, sets and processes.
//! - [`bounded`]: reads of keys any client can write, tolerant of keys of
//!   another type and never transferring a huge value whole.
//! - [`limits`]: the read side of the cluster-limit keys (`wasmjobs stats`).
//! - [`latency`]: the latency histograms every heartbeat publishes, merged
//!   into per-class percentiles over the last hour (`stats`, `web`).
//! - [`plugins`]: the plugin reports every heartbeat publishes (`web`).
//! - [`cron`]: cron schedules in sidekiq-cron's format: register, list, claim a tick.
//! - [`shards`]: several Redis servers, and which one holds each queue.
//!
//! [`connect`] opens the shared, self-reconnecting connection every
//! component uses for ordinary commands: the fetch's Lua script (which pops
//! a batch of jobs with `RPOP` and `LPUSH`es them onto the in-progress list),
//! outcomes, orphan recovery (`RPOPLPUSH`). Blocking commands (the fetch's
//! `BLMOVE` or `BRPOP` while every queue is empty) get dedicated connections
//! from [`Redis::dedicated`] so they never stall the shared one.

pub mod admin;
pub(crate) mod api;
pub mod bounded;
pub mod control;
pub mod cron;
pub(crate) mod embedded;
pub(crate) mod enqueue;
pub mod history;
pub mod job_head;
pub(crate) mod keys;
pub mod latency;
pub mod limits;
pub mod plugins;
pub mod shards;
pub mod sharing;
pub(crate) mod stranded;

pub use wasmjobs_client::push as client;
pub use wasmjobs_client::{now_f64, unique};

/// The job payload ([`wasmjobs_client::payload`]) and the worker's fast
/// path over it ([`job_head`]).
pub mod payload {
    pub use super::job_head::{job_from_raw, to_job};
    pub use wasmjobs_client::payload::*;
}

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client};

use self::embedded::EmbeddedRedis;

/// How long an ordinary command may take before it counts as failed.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Redis is: a URL, or the embedded private server in a data directory.
/// Its `Debug` leaves a URL's password out.
#[derive(Clone)]
pub enum Target {
    /// `redis://host:port/db`, `rediss://…`, `unix:///path/to/sock`.
    Url(String),
    /// The private `redis-server` under this data directory (started on
    /// demand, shared by every wasmjobs command using the same directory).
    Embedded(std::path::PathBuf),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Url(url) => f.debug_tuple("Url").field(&redact(url)).finish(),
            Target::Embedded(dir) => f.debug_tuple("Embedded").field(dir).finish(),
        }
    }
}

impl Target {
    /// `--redis` / `REDIS_URL` if given, else the embedded server in `data_dir`.
    pub fn from_options(url: Option<&str>, data_dir: &Path) -> Self {
        match url {
            Some(url) if !url.trim().is_empty() => Target::Url(url.trim().to_owned()),
            _ => Target::Embedded(data_dir.to_path_buf()),
        }
    }
}

/// An open connection to Redis, plus the embedded server if we use one.
///
/// Cloning is cheap and shares the connection. [`Redis::close`] leaves the
/// embedded server (stopping it when no other wasmjobs process uses it, see
/// [`embedded`]) even while clones are still held by tasks winding down;
/// without it, dropping the last clone does the same, waiting less.
#[derive(Clone)]
pub struct Redis {
    client: Client,
    conn: ConnectionManager,
    /// Human-readable location, for logs (no password).
    pub(crate) location: String,
    /// Shared by every clone; emptied by [`Redis::close`].
    embedded: Option<Arc<Mutex<Option<EmbeddedRedis>>>>,
}

impl Redis {
    /// The shared connection: multiplexed, reconnects by itself after errors.
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// A new connection of its own, for blocking commands. `block` is the
    /// longest the caller will block server-side; the response timeout is
    /// set above it.
    pub async fn dedicated(&self, block: Duration) -> Result<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_response_timeout(Some(block + RESPONSE_TIMEOUT));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .with_context(|| format!("cannot connect to Redis at {}", self.location))
    }

    /// A connection of its own for pub/sub (the control channel).
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub> {
        tokio::time::timeout(RESPONSE_TIMEOUT, self.client.get_async_pubsub())
            .await
            .map_err(|_| anyhow::anyhow!("timed out connecting to Redis at {}", self.location))?
            .with_context(|| format!("cannot connect to Redis at {}", self.location))
    }

    /// Leaves the embedded server, stopping it if no other wasmjobs process
    /// uses it; a no-op for a Redis given by URL. Called on orderly
    /// shutdown, and effective for every clone: tasks still holding one
    /// (a poller between ticks) must not keep the server alive. Unlike the
    /// drop of the last clone, this waits for a concurrent start or stop by
    /// another process and for the server to exit, and reports errors.
    pub async fn close(self) -> Result<()> {
        let Redis { embedded, conn, .. } = self;
        drop(conn);
        let server = embedded.and_then(|shared| shared.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(server) = server {
            server.release().await?;
        }
        Ok(())
    }
}

/// How often a runner on the embedded server checks that it still runs.
const EMBEDDED_CHECK: Duration = Duration::from_secs(1);

impl Redis {
    /// Whether this is the embedded server (no URL given).
    pub(crate) fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// Keeps the embedded server running while this process uses it, until
    /// `stop`: one that stopped under us (killed, crashed) is started
    /// again within [`EMBEDDED_CHECK`], and the connections reconnect by
    /// themselves. Returns at once for a Redis given by URL: that server
    /// is its operator's to run.
    pub(crate) async fn keep_embedded_up(self, stop: tokio_util::sync::CancellationToken) {
        let Some(shared) = self.embedded.clone() else {
            return stop.cancelled().await;
        };
        let mut failing_since: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep(EMBEDDED_CHECK) => {}
                () = stop.cancelled() => return,
            }
            let paths = shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .map(|server| (server.dir().to_path_buf(), server.socket().to_path_buf()));
            // Released: the runner is stopping.
            let Some((dir, socket)) = paths else { return };
            let revived = tokio::task::spawn_blocking(move || embedded::revive(&dir, &socket))
                .await
                .context("the task checking the embedded redis-server failed")
                .and_then(|revived| revived);
            match revived {
                Ok(false) => failing_since = None,
                Ok(true) => {
                    failing_since = None;
                    tracing::warn!(
                        location = %self.location,
                        "the embedded redis-server had stopped while in use (killed or crashed?); started it again from its append-only file"
                    );
                }
                Err(err) => {
                    if failing_since.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
                        failing_since = Some(std::time::Instant::now());
                        tracing::error!(
                            location = %self.location,
                            "the embedded redis-server stopped and cannot be started again: {err:#}; trying every {EMBEDDED_CHECK:?}"
                        );
                    }
                }
            }
        }
    }
}

/// Opens Redis at `target`, starting the embedded server if needed.
pub(crate) async fn connect(target: &Target) -> Result<Redis> {
    open(target, true).await
}

/// Like [`connect`], but a Redis given by URL is connected to on first
/// use: a shard that is down when the runner starts is picked up when it
/// comes, its connection retried with each call like any connection
/// lost later.
pub(crate) async fn connect_lazy(target: &Target) -> Result<Redis> {
    open(target, false).await
}

async fn open(target: &Target, eager: bool) -> Result<Redis> {
    let (client, location, embedded) = match target {
        Target::Url(url) => {
            let location = redact(url);
            let client = Client::open(url.as_str()).with_context(|| format!("invalid Redis URL {location}"))?;
            (client, location, None)
        }
        Target::Embedded(data_dir) => {
            let server = EmbeddedRedis::acquire(data_dir).await?;
            let location = format!("embedded redis-server ({})", server.socket().display());
            let client = Client::open(server.addr()).with_context(|| format!("cannot use the {location}"))?;
            (client, location, Some(Arc::new(Mutex::new(Some(server)))))
        }
    };
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(RESPONSE_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(2))
        .set_number_of_retries(3);
    let conn = match eager || embedded.is_some() {
        true => ConnectionManager::new_with_config(client.clone(), config).await,
        false => ConnectionManager::new_lazy_with_config(client.clone(), config),
    }
    .with_context(|| format!("cannot connect to Redis at {location}"))?;
    Ok(Redis {
        client,
        conn,
        location,
        embedded,
    })
}

/// `text` without its password, for messages. Parsed exactly as redis-rs
/// parses it ([`redis::parse_redis_url`]): the password of the userinfo is
/// dropped (`redis://user@host`), and the value of any query parameter whose
/// name contains `pass` is shown as `***` (redis-rs reads a unix socket's
/// password from `?pass=`); a `#fragment` is left out. Text redis-rs does
/// not accept shows its scheme at most: where its password would be is
/// anyone's guess.
fn redact(text: &str) -> String {
    let Some(mut url) = redis::parse_redis_url(text) else {
        return crate::redact::scheme_only(text);
    };
    if url.password().is_some() && url.set_password(None).is_err() {
        return crate::redact::scheme_only(text);
    }
    // redis-rs ignores it, and it may be the end of a password with a '#'.
    url.set_fragment(None);
    crate::redact::query_passwords(&mut url);
    url.into()
}

/// Today's date in UTC as `YYYY-MM-DD` (the suffix of Sidekiq's daily stat keys).
pub(crate) fn utc_date(epoch_secs: f64) -> String {
    let days = (epoch_secs / 86_400.0).floor() as i64;
    let (year, month, day) = crate::time::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(utc_date(0.0), "1970-01-01");
        assert_eq!(utc_date(951_782_400.0), "2000-02-29");
        assert_eq!(utc_date(1_796_083_199.0), "2026-11-30");
        assert_eq!(utc_date(1_796_083_200.0), "2026-12-01");
    }

    #[test]
    fn a_target_debugs_without_its_password() {
        let target = Target::Url("redis://:hunter2@10.0.0.1:6379/0".into());
        let shown = format!("{target:?}");
        assert!(!shown.contains("hunter2") && shown.contains("10.0.0.1"), "{shown}");
    }

    #[test]
    fn passwords_are_redacted() {
        let wrong = [
            ("redis://:secret@host:6379/0", "redis://host:6379/0"),
            ("redis://user:secret@host", "redis://user@host"),
            ("redis://host:6379", "redis://host:6379"),
            ("redis://user@host:6379", "redis://user@host:6379"),
            ("rediss://user:p@ss:w%40rd@host/1", "rediss://user@host/1"),
            ("redis://:secret@[::1]:6379/0", "redis://[::1]:6379/0"),
            ("redis://u:secret@host/0?x=a@b", "redis://u@host/0?x=a@b"),
            // redis-rs takes a unix socket's credentials from the query.
            (
                "redis+unix:///run/redis.sock?db=2&user=u&pass=secret",
                "redis+unix:///run/redis.sock?db=2&user=u&pass=***",
            ),
            (
                "unix:///run/redis.sock?pass=%26secret",
                "unix:///run/redis.sock?pass=***",
            ),
            ("unix:///run/redis.sock", "unix:///run/redis.sock"),
            // Not URLs redis-rs accepts: nothing after the scheme is shown.
            ("u:secret@host:6379", "u:***"),
            ("redis://u:secret@host:port/0", "redis://***"),
            ("localhost:6379", "localhost:***"),
            ("u@secret", "***"),
        ]
        .into_iter()
        .filter(|(url, shown)| redact(url) != *shown)
        .map(|(url, shown)| format!("{url}: {} instead of {shown}", redact(url)))
        .collect::<Vec<_>>();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    proptest::proptest! {
        #![proptest_config(crate::proptest_config::config(500))]

        /// Wherever a password goes (where redis-rs reads one or not), it
        /// never shows (it starts with `Zq`, found nowhere else).
        #[test]
        fn a_password_never_shows(
            scheme in "(redis|rediss|unix|redis\\+unix|valkey)://",
            user in "[a-z%:@]{0,4}",
            password in "Zq[a-zA-Z0-9%:@/?#&=]{4,10}",
            host in "(host|\\[::1\\]|/run/r\\.sock)?(:6379)?",
            path in "(/[0-9])?",
            params in "((db=1|pass=|user=u)&){0,2}",
        ) {
            for url in [
                format!("{scheme}{user}:{password}@{host}{path}?{params}"),
                // A raw '&' ends a query value for every parser.
                format!("{scheme}{host}{path}?{params}pass={}", password.replace('&', "%26")),
            ] {
                let shown = redact(&url);
                proptest::prop_assert!(!shown.contains("Zq"), "{url} shown as {shown}");
            }
        }
    }

    #[test]
    fn no_url_means_embedded() {
        assert!(matches!(
            Target::from_options(None, Path::new("d")),
            Target::Embedded(_)
        ));
        assert!(matches!(
            Target::from_options(Some(" "), Path::new("d")),
            Target::Embedded(_)
        ));
        assert!(matches!(
            Target::from_options(Some("redis://x"), Path::new("d")),
            Target::Url(_)
        ));
    }
}
