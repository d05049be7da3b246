//! `wasmjobs plugins`: what a plugins directory holds, and what is wrong.
//!
//! Loads every plugin exactly as the runner would (manifest, compile or
//! cache, world check, grants) and prints one row per plugin with its
//! version id (the one `run` logs, puts in the heartbeat and in failed
//! jobs' `error_plugin`) and status, then the refused ones' reasons. Exit status 1 if any plugin is broken,
//! so it doubles as a deploy check.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use super::{Cli, PluginSource};
use crate::bindings::WORLD;
use crate::bindings::concurrent::WORLD as ASYNC_WORLD;
use crate::sandbox::engine::MAX_MEMORY;
use crate::sandbox::{EngineConfig, Limits};

/// Arguments of `wasmjobs plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    #[command(flatten)]
    pub source: PluginSource,
}

/// Runs the command.
pub fn run(cli: &Cli, args: &PluginsArgs) -> Result<ExitCode> {
    // Fuel allowed, so plugins that set limits.fuel are checked, not
    // refused (they alone compile for the metered engine; every other
    // plugin gets the artifact `exec` and `run` load); caps as high as they
    // go, since `run --memory/--job-timeout` decides them (a plugin over a
    // runner's caps is refused by that runner).
    let config = EngineConfig {
        concurrency: 1,
        fuel: true,
        limits: Limits {
            memory: MAX_MEMORY,
            timeout: Duration::MAX,
        },
        disk: u64::MAX,
        ..EngineConfig::default()
    };
    let (_executor, catalog) = args.source.load(&cli.data_dir, &config, Default::default())?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<16} {:<12} {:<28} {:<44} {:<8} LOAD",
        "PLUGIN", "VERSION", "CLASSES", "COMPONENT", "STATUS"
    )?;
    for plugin in catalog.plugins() {
        let load = plugin.cache.label();
        writeln!(
            out,
            "{:<16} {:<12} {:<28} {:<44} {:<8} {load} in {:.0} ms",
            plugin.name,
            plugin.version,
            plugin.manifest.classes.join(","),
            plugin.manifest.component.display(),
            "ok",
            plugin.load_time.as_secs_f64() * 1000.0
        )?;
    }
    for broken in catalog.broken() {
        let name = broken.plugin();
        writeln!(out, "{name:<16} {:<12} {:<28} {:<44} {:<8}", "-", "-", "-", "broken")?;
    }
    let concurrent = catalog
        .plugins()
        .iter()
        .filter(|plugin| plugin.manifest.instances.concurrent.is_some())
        .count();
    let serial = catalog.plugins().len() - concurrent;
    match concurrent {
        0 => writeln!(out, "{serial} plugin(s) implement {WORLD}")?,
        _ => writeln!(
            out,
            "{serial} plugin(s) implement {WORLD}, {concurrent} {ASYNC_WORLD} ([instances] concurrent)"
        )?,
    }
    if catalog.broken().is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "\n{} broken plugin(s):", catalog.broken().len())?;
    for broken in catalog.broken() {
        writeln!(out, "  {}", broken.error)?;
    }
    Ok(ExitCode::FAILURE)
}
