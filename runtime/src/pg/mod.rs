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
    /// The URL as given: a secret no plugin may be handed.
    url: String,
}

/// Where a PostgreSQL configuration connects, and as whom.
struct Place {
    endpoints: Vec<String>,
    user: String,
    database: String,
}

impl Place {
    fn of(config: &tokio_postgres::Config) -> Self {
        let ports = config.get_ports();
        let endpoints = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(at, host)| {
                let port = ports.get(at).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(name) => {
                        format!("{}:{port}", name.trim_end_matches('.').to_ascii_lowercase())
                    }
                    tokio_postgres::config::Host::Unix(dir) => format!("unix:{}:{port}", dir.display()),
                }
            })
            .collect();
        let user = config
            .get_user()
            .map(str::to_owned)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_default();
        let database = config.get_dbname().map_or_else(|| user.clone(), str::to_owned);
        Self {
            endpoints,
            user,
            database,
        }
    }
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
        Ok(Self {
            pool,
            config,
            location,
            url: url.to_owned(),
        })
    }

    /// Whether the PostgreSQL URL `other` reaches this store's database as
    /// its role: a host and port in common, the same database and user
    /// (tokio-postgres's defaults: port 5432, the OS user, a database named
    /// after the user). Host names are compared in lower case, not
    /// resolved, as two shards naming one Redis are (`redis::shards`).
    pub(crate) fn same_database_and_role(&self, other: &str) -> bool {
        let Ok(other) = other.parse::<tokio_postgres::Config>() else {
            return false;
        };
        let (mine, theirs) = (Place::of(&self.config), Place::of(&other));
        mine.user == theirs.user
            && mine.database == theirs.database
            && mine.endpoints.iter().any(|at| theirs.endpoints.contains(at))
    }

    /// The URL as given (it holds the password): for the secrets no
    /// plugin's `env` may pass on, never for a log.
    pub(crate) fn url(&self) -> &str {
        &self.url
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_db_is_the_store_when_it_reaches_its_database_as_its_role() {
        let store = Pg::open("postgres://jobs:pw@DB.internal:5432/app?sslmode=disable").expect("store");
        for same in [
            "postgres://jobs:other@db.internal/app",
            "postgresql://jobs@db.internal.:5432/app?sslmode=disable",
            "postgres://jobs@db.internal/app?application_name=x",
        ] {
            assert!(store.same_database_and_role(same), "{same}");
        }
        for other in [
            "postgres://plugin@db.internal/app",
            "postgres://jobs@db.internal/other",
            "postgres://jobs@db.internal:5433/app",
            "postgres://jobs@replica.internal/app",
            "not a url",
        ] {
            assert!(!store.same_database_and_role(other), "{other}");
        }
        // The database defaults to the user's name.
        let store = Pg::open("postgres://jobs@h").expect("store");
        assert!(store.same_database_and_role("postgres://jobs@h/jobs"));
    }
}
