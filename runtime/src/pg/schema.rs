//! The job store's schema: versioned migrations in the `wasmjobs` schema.
//!
//! `wasmjobs migrate` applies the migrations this binary has and the
//! database lacks, each in the one transaction that records it in
//! `wasmjobs.migrations`, under an advisory lock, so running it twice, or
//! from two machines at once, is harmless. Every other command only checks
//! the version ([`check`]) and says what to run when it differs: a runner
//! never changes the schema behind an application's back.

use anyhow::{Context, Result, bail};
use tokio_postgres::error::SqlState;

use super::Pg;

/// The migrations, in order: (version, name, SQL).
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "jobs", include_str!("migrations/0001_jobs.sql")),
    (2, "cron", include_str!("migrations/0002_cron.sql")),
    (3, "enqueue", include_str!("migrations/0003_enqueue.sql")),
    (4, "finite_run_at", include_str!("migrations/0004_finite_run_at.sql")),
];

/// The schema version this binary works with.
pub const VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Applies what is missing; returns the versions applied now.
pub async fn migrate(pg: &Pg) -> Result<Vec<i32>> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await.context("starting the migration")?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(hashtext('wasmjobs.migrate'));
         CREATE SCHEMA IF NOT EXISTS wasmjobs;
         CREATE TABLE IF NOT EXISTS wasmjobs.migrations (
             version    integer PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .context("creating the wasmjobs schema")?;
    let applied: Vec<i32> = tx
        .query("SELECT version FROM wasmjobs.migrations", &[])
        .await
        .context("reading wasmjobs.migrations")?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if let Some(newest) = applied.iter().copied().max().filter(|&v| v > VERSION) {
        bail!(
            "the database's wasmjobs schema is at version {newest}, newer than this binary's ({VERSION}): upgrade wasmjobs"
        );
    }
    let mut now = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        if applied.contains(&version) {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .with_context(|| format!("applying migration {version} ({name})"))?;
        tx.execute(
            "INSERT INTO wasmjobs.migrations (version, name) VALUES ($1, $2)",
            &[&version, &name],
        )
        .await
        .with_context(|| format!("recording migration {version}"))?;
        now.push(version);
    }
    tx.commit().await.context("committing the migration")?;
    Ok(now)
}

/// Fails, saying what to run, unless the schema is at [`VERSION`].
pub async fn check(pg: &Pg) -> Result<()> {
    let client = pg.client().await?;
    let found: Option<i32> = match client
        .query_one("SELECT max(version) FROM wasmjobs.migrations", &[])
        .await
    {
        Ok(row) => row.get(0),
        Err(err) if matches!(err.code(), Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME) => {
            None
        }
        Err(err) => return Err(err).with_context(|| format!("reading the wasmjobs schema version at {}", pg.location)),
    };
    match found {
        Some(VERSION) => Ok(()),
        Some(v) if v > VERSION => bail!(
            "{}: the wasmjobs schema is at version {v}, newer than this binary's ({VERSION}): upgrade wasmjobs",
            pg.location
        ),
        Some(v) => bail!(
            "{}: the wasmjobs schema is at version {v}, this binary needs {VERSION}: run `wasmjobs migrate --source URL`",
            pg.location
        ),
        None => bail!(
            "{}: no wasmjobs schema: run `wasmjobs migrate --source URL` once (it is idempotent)",
            pg.location
        ),
    }
}
