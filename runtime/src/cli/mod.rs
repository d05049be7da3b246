//! The `wasmjobs` command line.
//!
//! - `wasmjobs exec --plugins DIR CLASS [ARGS_JSON]`: run one job through
//!   the executor and print its log lines, outcome and duration ([`exec`]).
//! - `wasmjobs plugins --plugins DIR`: list what a plugins directory holds
//!   and why any plugin was refused ([`plugins`]).
//!
//! Exit status: 0 on success, 1 when a job failed or a plugin is broken,
//! 2 on a usage or setup error.

pub mod exec;
pub mod plugins;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::plugin::{Catalog, CompileCache};
use crate::sandbox::{EngineConfig, Executor, Limits};
use crate::telemetry::{self, LogFormat};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(
    name = "wasmjobs",
    version,
    about = "Background jobs as sandboxed WebAssembly components"
)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Where wasmjobs keeps its state (compilation cache, ...).
    #[arg(long, global = true, env = "WASMJOBS_DATA_DIR", default_value = ".wasmjobs")]
    pub data_dir: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one job through the sandbox and print its logs and outcome.
    Exec(exec::ExecArgs),
    /// List the plugins in a directory and check each one.
    Plugins(plugins::PluginsArgs),
}

/// Where plugins come from; shared by the commands that load them.
#[derive(Debug, Clone, Args)]
pub struct PluginSource {
    /// The plugins directory (each plugin a subdirectory with a wasmjobs.toml).
    #[arg(long, env = "WASMJOBS_PLUGINS", default_value = "./plugins")]
    pub plugins: PathBuf,
    /// Compile every component instead of using the on-disk cache.
    #[arg(long)]
    pub no_cache: bool,
}

impl PluginSource {
    /// The compilation cache under `data_dir`, unless disabled.
    pub fn cache(&self, data_dir: &std::path::Path) -> CompileCache {
        if self.no_cache {
            CompileCache::disabled()
        } else {
            CompileCache::new(data_dir.join("cache"))
        }
    }

    /// An executor sized for `concurrency` and the catalog of this source.
    pub fn load(&self, data_dir: &std::path::Path, concurrency: u32, limits: Limits) -> Result<(Executor, Catalog)> {
        let executor = Executor::new(&EngineConfig { concurrency, limits })?;
        let catalog = Catalog::load(&self.plugins, &executor, &self.cache(data_dir))?;
        Ok((executor, catalog))
    }
}

/// Parses the command line, runs the command, and maps the result to an
/// exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        // `exec` prints the job's log lines and outcome itself.
        Command::Exec(_) => "warn,wasmjobs::guest=off,wasmjobs::sandbox=error",
        Command::Plugins(_) => "warn",
    };
    telemetry::init(cli.log_format, default_filter);
    let result = match &cli.command {
        Command::Exec(args) => runtime().and_then(|rt| rt.block_on(exec::run(&cli, args))),
        Command::Plugins(args) => plugins::run(&cli, args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
