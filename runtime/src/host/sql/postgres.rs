//! PostgreSQL: tokio-postgres connections in a deadpool pool.
//!
//! - **Async and pooled**: a job waiting on the server is a suspended task,
//!   not a thread; the pool (`?pool=N`, see [`super::config`]) is created
//!   once per runner and connections are reused across jobs. Waiting for a
//!   free connection is bounded by the statement timeout.
//! - **Prepared, cached**: each statement is prepared (so parameters are
//!   bound by the protocol, never spliced into text, and the server tells
//!   us their types, see [`super::pg_values`]) and the prepared statement
//!   is cached per connection (at most [`STATEMENT_CACHE`] of them), so a
//!   job class repeating one statement costs one round trip.
//! - **Timeouts on both sides**: `statement_timeout` is set on every
//!   connection, so the server stops a statement even if the job that sent
//!   it is gone; the host also gives up after the same timeout. A
//!   connection whose statement did not finish normally (timeout, result
//!   too large, job dropped mid-statement) is never reused: its statement
//!   is cancelled and the connection closed ([`Lease`]).
//! - **Nothing left for the next job**: jobs of every plugin share the
//!   pool, and a statement can change its session without looking like it
//!   (`SELECT set_config(..)`, a `DO` block, `pg_advisory_lock`, `CREATE
//!   TEMP TABLE`). So a connection goes back to the pool only after
//!   [`RESET_SESSION`] ran on it, in the background once the guest has its
//!   result (one round trip, off the job's path; the connection is not
//!   idle until it is clean). A connection that cannot be reset is closed.
//!   `DISCARD ALL` would also drop the prepared-statement cache, so the
//!   reset is its other parts.
//! - **Read-only grants** run each statement in a `READ ONLY` transaction,
//!   ended by the reset's `ROLLBACK`: the server refuses writes, and the
//!   guest cannot turn it off (`SET TRANSACTION READ WRITE` fails after
//!   the transaction's first query, and a changed session default applies
//!   only to later transactions, after the reset).
//! - **Sessions say which plugin they serve**: `application_name` is
//!   `wasmjobs/<plugin>` (unless the URL sets one). A plugin's own pool
//!   (`--db NAME@PLUGIN=URL`) sets it when connecting; a pool shared by
//!   every plugin connects as `wasmjobs` and sets the name of the plugin
//!   at the start of each statement, in the same flight as the statement
//!   (pipelined, no extra round trip), and the reset sets it back. It is a
//!   label, not an identity: a statement can `set_config` it to anything
//!   until its reset. The role in the URL is what PostgreSQL checks (who
//!   sees a session's query text, who may cancel or end it).
//! - No TLS: `sslmode=require` is refused at start-up rather than failing
//!   every job.

use std::pin::pin;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Statement};

use super::pg_values::{PgParam, PgValue};
use super::{Budget, DbSpec, Output, Settings};
use crate::bindings::sql::{Rows, SqlError, Value};

/// Most prepared statements kept per connection; past it the cache starts
/// over (guests may send any number of distinct statements).
const STATEMENT_CACHE: usize = 256;

/// What a connection runs before it goes back to the pool: what `DISCARD
/// ALL` does (and deadpool's `RecyclingMethod::Clean`), except dropping
/// prepared statements (tokio-postgres's cache of this connection).
const RESET_SESSION: &str = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; \
     SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES";

/// `application_name` of a pool's connections while no plugin's
/// statement runs on them, and the prefix of the plugins' names.
const APPLICATION: &str = "wasmjobs";

/// Longest `application_name` PostgreSQL keeps (`NAMEDATALEN - 1`).
const MAX_APPLICATION_NAME: usize = 63;

/// One PostgreSQL database: its pool and settings.
pub(crate) struct Postgres {
    /// The name plugins use, for the messages they get.
    name: String,
    /// `NAME` or `NAME@PLUGIN`, for logs.
    label: String,
    pool: Pool,
    settings: Settings,
    /// Name each statement's session after its plugin (a pool shared by
    /// every plugin, whose URL sets no `application_name`).
    label_sessions: bool,
}

/// `wasmjobs/<plugin>`, in the characters PostgreSQL keeps (printable
/// ASCII) and none that need quoting in SQL (others become `_`), at most
/// as long as PostgreSQL keeps.
pub(crate) fn application_name(plugin: &str) -> String {
    let mut name = format!("{APPLICATION}/");
    name.extend(plugin.chars().map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '_'
        }
    }));
    name.truncate(MAX_APPLICATION_NAME);
    name
}

impl Postgres {
    /// Builds the pool for `spec`; connects lazily.
    pub(crate) fn open(spec: &DbSpec) -> Result<Self> {
        let context = || format!("--db {}={}", spec.label(), spec.redacted());
        let mut config: tokio_postgres::Config = spec.target.parse().with_context(context)?;
        if !matches!(config.get_ssl_mode(), SslMode::Disable | SslMode::Prefer) {
            bail!(
                "{}: TLS (sslmode=require) is not supported; connect over a trusted network or a unix socket",
                context()
            );
        }
        let timeout_ms = spec.settings.timeout.as_millis().max(1);
        let options = match config.get_options() {
            Some(options) => format!("{options} -c statement_timeout={timeout_ms}"),
            None => format!("-c statement_timeout={timeout_ms}"),
        };
        config.options(options);
        let label_sessions = config.get_application_name().is_none() && spec.plugin.is_none();
        if config.get_application_name().is_none() {
            match &spec.plugin {
                Some(plugin) => config.application_name(application_name(plugin)),
                None => config.application_name(APPLICATION),
            };
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(spec.settings.timeout);
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(spec.settings.pool)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(spec.settings.timeout))
            .create_timeout(Some(spec.settings.timeout))
            .recycle_timeout(Some(spec.settings.timeout))
            .build()
            .with_context(|| format!("{}: cannot build the connection pool", context()))?;
        Ok(Self {
            name: spec.name.clone(),
            label: spec.label(),
            pool,
            settings: spec.settings,
            label_sessions,
        })
    }

    /// Opens up to `count` connections at once (at most the pool size) and
    /// returns them to the pool idle, so the first wave of jobs does not
    /// queue behind a hundred simultaneous connects. Returns how many
    /// opened; a server that is down is logged, not fatal (jobs retry).
    pub(crate) async fn warm_up(&self, count: usize) -> usize {
        let count = count.min(self.settings.pool);
        let attempts = (0..count).map(|_| self.pool.get());
        let results = futures_util::future::join_all(attempts).await;
        let opened = results.iter().filter(|r| r.is_ok()).count();
        if let Some(Err(err)) = results.iter().find(|r| r.is_err()) {
            tracing::warn!(
                db = %self.label,
                "opened {opened} of {count} connections at start-up: {err}; jobs will connect as they need"
            );
        }
        opened
    }

    /// Runs one statement of the plugin named `plugin`: its rows if
    /// `want_rows`, else the affected count. `read_only` runs it in a
    /// read-only transaction.
    pub(crate) async fn run(
        &self,
        statement: &str,
        params: &[Value],
        want_rows: bool,
        read_only: bool,
        plugin: &str,
    ) -> Result<Output, SqlError> {
        let mut lease = self.lease(read_only).await?;
        let mut retried = false;
        // On a shared pool's connection, a statement's session is named
        // after its plugin first (once: a retry is on the same connection).
        let naming = self
            .label_sessions
            .then(|| format!("SET application_name = '{}'", application_name(plugin)));
        loop {
            lease.healthy = false;
            let label = if retried { None } else { naming.as_deref() };
            let attempt = tokio::time::timeout(
                self.settings.timeout,
                self.after_label(
                    &lease,
                    label,
                    self.attempt(&lease, statement, params, want_rows, read_only, retried),
                ),
            );
            let failure = match attempt.await {
                Ok(Ok(output)) => {
                    lease.healthy();
                    return Ok(output);
                }
                Ok(Err(failure)) => failure,
                Err(_) => {
                    return Err(SqlError::Timeout(format!(
                        "{:?}: the statement took longer than {:?} and was cancelled",
                        self.name, self.settings.timeout
                    )));
                }
            };
            match failure {
                Failure::Postgres(error) => {
                    // The server reported the error, so it is done with the
                    // statement; other errors (a value that cannot be
                    // converted) may leave rows in flight.
                    if error.as_db_error().is_some() {
                        lease.healthy();
                    }
                    // A cached statement the server forgot, or whose result
                    // type changed (ALTER TABLE): start the cache over, once.
                    let stale = matches!(
                        error.code(),
                        Some(&SqlState::FEATURE_NOT_SUPPORTED | &SqlState::INVALID_SQL_STATEMENT_NAME)
                    );
                    if stale && !retried {
                        lease.client().statement_cache.clear();
                        retried = true;
                        continue;
                    }
                    return Err(self.postgres_error(&error));
                }
                // The result is still streaming in: leave the lease unhealthy
                // so that the statement is cancelled and the connection closed.
                Failure::Sql(error) => return Err(error),
            }
        }
    }

    /// `attempt` (an [`Self::attempt`] on `lease`), after `label` (a `SET
    /// application_name`) if any. The `SET` is sent first and the
    /// statement right behind it, without waiting for its answer
    /// (tokio-postgres pipelines requests in the order they are first
    /// polled, and `join` polls in order), so naming the session costs no
    /// round trip. A `SET` that fails while the statement succeeds is
    /// logged, not returned: the statement ran (it may have written), and
    /// a retry would run it again.
    async fn after_label(
        &self,
        lease: &Lease,
        label: Option<&str>,
        attempt: impl Future<Output = Result<Output, Failure>>,
    ) -> Result<Output, Failure> {
        let Some(label) = label else {
            return attempt.await;
        };
        let (labelled, output) = futures_util::future::join(lease.client().batch_execute(label), attempt).await;
        if let (Err(error), Ok(_)) = (&labelled, &output) {
            tracing::warn!(db = %self.label, "naming a session after its plugin failed: {}", chain(error));
        }
        output
    }

    async fn attempt(
        &self,
        lease: &Lease,
        statement: &str,
        params: &[Value],
        want_rows: bool,
        read_only: bool,
        retry: bool,
    ) -> Result<Output, Failure> {
        let client = lease.client();
        if read_only {
            // A retry follows an error, which aborted the first transaction.
            let begin = if retry {
                "ROLLBACK; BEGIN READ ONLY"
            } else {
                "BEGIN READ ONLY"
            };
            client.batch_execute(begin).await?;
        }
        if client.statement_cache.size() >= STATEMENT_CACHE {
            client.statement_cache.clear();
        }
        let prepared: Statement = client.prepare_cached(statement).await?;
        let params = params.iter().map(PgParam);
        if !want_rows {
            return Ok(Output::Affected(client.execute_raw(&prepared, params).await?));
        }
        let columns: Vec<String> = prepared.columns().iter().map(|c| c.name().to_owned()).collect();
        let mut budget = Budget::new(&self.name, self.settings);
        budget.columns(&columns)?;
        let mut stream = pin!(client.query_raw(&prepared, params).await?);
        let mut rows = Vec::new();
        while let Some(row) = stream.next().await {
            let row = row?;
            let values = (0..row.len())
                .map(|i| row.try_get::<_, PgValue>(i).map(|v| v.0))
                .collect::<Result<Vec<Value>, _>>()?;
            budget.row(&values)?;
            rows.push(values);
        }
        Ok(Output::Rows(Rows { columns, rows }))
    }

    async fn lease(&self, read_only: bool) -> Result<Lease, SqlError> {
        match self.pool.get().await {
            Ok(client) => Ok(Lease {
                client: Some(client),
                healthy: false,
                in_transaction: read_only,
                name: self.label.clone(),
                timeout: self.settings.timeout,
            }),
            Err(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => Err(SqlError::Timeout(format!(
                "{:?}: no connection became free within {:?} (all {} in use; raise ?pool=N)",
                self.name, self.settings.timeout, self.settings.pool
            ))),
            Err(PoolError::Backend(error)) => Err(SqlError::Connection(format!(
                "{:?}: cannot connect: {}",
                self.name,
                chain(&error)
            ))),
            Err(error) => Err(SqlError::Connection(format!(
                "{:?}: cannot connect: {error}",
                self.name
            ))),
        }
    }

    fn postgres_error(&self, error: &tokio_postgres::Error) -> SqlError {
        let name = &self.name;
        if let Some(db) = error.as_db_error() {
            let mut message = format!("{name:?}: {} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                message.push_str(&format!("; detail: {detail}"));
            }
            if let Some(hint) = db.hint() {
                message.push_str(&format!("; hint: {hint}"));
            }
            return match *db.code() {
                SqlState::QUERY_CANCELED => SqlError::Timeout(message),
                SqlState::ADMIN_SHUTDOWN | SqlState::CRASH_SHUTDOWN | SqlState::CANNOT_CONNECT_NOW => {
                    SqlError::Connection(message)
                }
                _ => SqlError::Query(message),
            };
        }
        if error.is_closed() {
            return SqlError::Connection(format!("{name:?}: the connection was lost: {}", chain(error)));
        }
        SqlError::Query(format!("{name:?}: {}", chain(error)))
    }
}

/// Why an attempt failed: the server or driver said no, or we stopped it.
enum Failure {
    Postgres(tokio_postgres::Error),
    Sql(SqlError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Failure::Postgres(error)
    }
}

impl From<SqlError> for Failure {
    fn from(error: SqlError) -> Self {
        Failure::Sql(error)
    }
}

/// A pooled connection lent to one statement. Unless marked healthy (the
/// statement ran to its end), dropping it cancels whatever the server is
/// still doing for it and closes the connection instead of returning it to
/// the pool: the next job must not inherit a half-read result or a
/// statement still running. A healthy one goes back to the pool once
/// [`RESET_SESSION`] ran on it (in a task of its own).
struct Lease {
    client: Option<Object>,
    healthy: bool,
    /// Opened a transaction (read-only grants) that the reset must end.
    in_transaction: bool,
    /// The database, for logs.
    name: String,
    /// Bound on the reset, as on a statement.
    timeout: Duration,
}

impl Lease {
    fn client(&self) -> &Object {
        // Only `drop` takes the client out.
        self.client
            .as_ref()
            .unwrap_or_else(|| unreachable!("a lease holds its client until dropped"))
    }

    fn healthy(&mut self) {
        self.healthy = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        let runtime = tokio::runtime::Handle::try_current();
        if self.healthy {
            let Ok(runtime) = runtime else {
                // No runtime to reset it on: close it rather than return it dirty.
                drop(Object::take(client));
                return;
            };
            let reset = if self.in_transaction {
                format!("ROLLBACK; {RESET_SESSION}")
            } else {
                RESET_SESSION.to_owned()
            };
            let name = std::mem::take(&mut self.name);
            let timeout = self.timeout;
            runtime.spawn(async move {
                // On failure the connection is closed, not returned.
                let failure = match tokio::time::timeout(timeout, client.batch_execute(&reset)).await {
                    Ok(Ok(())) => return,
                    Ok(Err(error)) => chain(&error),
                    Err(_) => format!("no answer within {timeout:?}"),
                };
                tracing::warn!(db = %name, "resetting a connection failed, closing it: {failure}");
                drop(Object::take(client));
            });
            return;
        }
        let token = client.cancel_token();
        // Detached from the pool: dropping it closes the connection.
        drop(Object::take(client));
        if let Ok(runtime) = runtime {
            runtime.spawn(async move {
                if let Err(error) = token.cancel_query(NoTls).await {
                    tracing::debug!("cancelling an abandoned statement: {error}");
                }
            });
        }
    }
}

/// An error and its sources, `outer: inner: root`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_names_need_no_quoting_and_fit() {
        assert_eq!(application_name("reports"), "wasmjobs/reports");
        assert_eq!(application_name("a.b_c-9"), "wasmjobs/a.b_c-9");
        assert_eq!(
            application_name("x'; DROP TABLE t; --\\"),
            "wasmjobs/x___DROP_TABLE_t__--_"
        );
        assert_eq!(application_name("caf\u{e9}"), "wasmjobs/caf_");
        let long = application_name(&"p".repeat(300));
        assert_eq!(long.len(), MAX_APPLICATION_NAME);
        assert!(long.starts_with("wasmjobs/ppp"));
    }
}
