//! PostgreSQL as a job store (`--source postgres://…`).
//!
//! Beside [`crate::redis`], the other place jobs can live: a job is a row of
//! `wasmjobs.jobs` holding the same Sidekiq JSON (in a `jsonb` column), so an
//! application enqueues it inside its own transaction and the job exists
//! if and only if that transaction commits. This module owns the store's
//! side of it and nothing of the runner's:
//!
//! - [`schema`]: the versioned migrations in their own schema, applied by
//!   `wasmjobs migrate` and checked by everything else;
//! - [`Pg`]: the connection pool every statement uses, and the one
//!   dedicated connection a process `LISTEN`s on ([`Pg::listener`]);
//! - [`admin`]: the dashboard's lists of jobs and its actions on them;
//! - [`cancel`]: waiting jobs taken out by `wasmjobs cancel --source`;
//! - [`cron`]: a schedule's tick claimed and enqueued in one transaction;
//! - [`stats`]: what the store holds, for `wasmjobs stats --source`;
//! - the producer side is the SQL function `wasmjobs.enqueue` (migration
//!   1), which any language calls; Rust calls it through
//!   `wasmjobs_client::pg::push`.
//!
//! The work protocol over these tables (claim, lease, complete, recover) is
//! `runner::source::postgres`; `docs/postgres.md` explains the design and
//! when to choose this store over Redis.

pub mod admin;
pub mod cancel;
pub mod cron;
pub mod schema;
pub mod stats;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;
use tokio_postgres::{NoTls, Socket};

/// `application_name` of this store's sessions (seen in `pg_stat_activity`).
const APPLICATION: &str = "wasmjobs";

/// How long a connect, or a wait for a pooled connection, may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Connections one process keeps: claims, completions and the lease loop
/// overlap, each a short statement.
const POOL: usize = 8;

/// The channel `wasmjobs.jobs`' trigger notifies with the queue's name.
pub(crate) const CHANNEL: &str = "wasmjobs_jobs";

/// Whether `text` names a PostgreSQL server (`postgres://`, `postgresql://`).
pub fn is_postgres_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

/// One process's way to the job store: a pool of connections, made lazily.
#[derive(Clone)]
pub struct Pg {
    pool: Pool,
    config: tokio_postgres::Config,
    /// The URL without its password, for logs and errors.
    pub location: String,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pg").field("location", &self.location).finish()
    }
}

/// A dedicated connection and the task driving it: notifications arrive on
/// `messages`.
pub(crate) struct Listener {
    pub(crate) client: tokio_postgres::Client,
    pub(crate) messages: tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::AsyncMessage>,
}

impl Pg {
    /// The pool for `url` (no connection is made yet).
    pub fn open(url: &str) -> Result<Self> {
        let location = crate::redact::postgres_url(url);
        if !is_postgres_url(url) {
            bail!("--source {location}: not a postgres:// URL");
        }
        let mut config: tokio_postgres::Config = url.parse().with_context(|| format!("--source {location}"))?;
        if !matches!(config.get_ssl_mode(), SslMode::Disable | SslMode::Prefer) {
            bail!(
                "--source {location}: TLS (sslmode=require) is not supported; connect over a trusted network or a unix socket"
            );
        }
        if config.get_application_name().is_none() {
            config.application_name(APPLICATION);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(TIMEOUT);
        }
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(TIMEOUT))
            .create_timeout(Some(TIMEOUT))
            .recycle_timeout(Some(TIMEOUT))
            .build()
            .with_context(|| format!("--source {location}: cannot build the connection pool"))?;
        Ok(Self { pool, config, location })
    }

    /// A pooled connection.
    pub(crate) async fn client(&self) -> Result<Object> {
        self.pool
            .get()
            .await
            .with_context(|| format!("cannot connect to PostgreSQL at {}", self.location))
    }

    /// Opens the store and checks that `wasmjobs migrate` has run: the
    /// schema's version is this binary's.
    pub async fn connect(url: &str) -> Result<Self> {
        let pg = Self::open(url)?;
        schema::check(&pg).await?;
        Ok(pg)
    }

    /// A connection of its own (not pooled), for `LISTEN`: its messages are
    /// forwarded to the returned receiver until the connection ends (the
    /// receiver then yields `None`).
    pub(crate) async fn listener(&self) -> Result<Listener> {
        let (client, connection) = self
            .config
            .connect(NoTls)
            .await
            .with_context(|| format!("cannot connect to PostgreSQL at {}", self.location))?;
        let (tx, messages) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(forward(connection, tx));
        Ok(Listener { client, messages })
    }
}

/// Drives `connection`, passing on every notification and notice.
async fn forward(
    mut connection: tokio_postgres::Connection<Socket, tokio_postgres::tls::NoTlsStream>,
    tx: tokio::sync::mpsc::UnboundedSender<tokio_postgres::AsyncMessage>,
) {
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
        match message {
            Ok(message) => {
                if tx.send(message).is_err() {
                    return;
                }
            }
            Err(err) => {
                tracing::debug!("PostgreSQL listener connection: {err}");
                return;
            }
        }
    }
}
