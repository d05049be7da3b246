//! `wasmjobs migrate --source postgres://…`: creates or upgrades the
//! PostgreSQL job store's schema (`wasmjobs`), applying the migrations this
//! binary has and the database lacks. Idempotent and safe to run from
//! several machines at once (`crate::pg::schema`).

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::pg::{Pg, schema};

/// Arguments of `wasmjobs migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The PostgreSQL server (postgres://user:password@host/db).
    #[arg(long = "source", env = "WASMJOBS_SOURCE", hide_env_values = true, value_name = "URL")]
    pub jobs_source: String,
}

/// Runs the command.
pub async fn run(args: &MigrateArgs) -> Result<ExitCode> {
    let pg = Pg::open(&args.jobs_source)?;
    let applied = schema::migrate(&pg).await?;
    match applied.as_slice() {
        [] => println!(
            "{}: the wasmjobs schema is up to date (version {})",
            pg.location,
            schema::VERSION
        ),
        versions => println!(
            "{}: applied migration{} {}; the wasmjobs schema is at version {}",
            pg.location,
            if versions.len() == 1 { "" } else { "s" },
            versions.iter().map(i32::to_string).collect::<Vec<_>>().join(", "),
            schema::VERSION
        ),
    }
    Ok(ExitCode::SUCCESS)
}
