//! `wasmjobs exec`: one job, straight through the sandbox, no queue.
//!
//! For trying a plugin while writing it, and for scripts: prints the job's
//! log lines, then the outcome and how long it took. Exit status 0 when the
//! job succeeded, 1 when it failed (whatever the failure kind).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Args;

use super::{Cli, DbArgs, PluginSource};
use crate::host::log::level_name;
use crate::host::sql::Databases;
use crate::job::Job;
use crate::sandbox::{EngineConfig, ExecOptions, Limits};
use crate::size::parse_size;
use crate::telemetry::escape_control;

/// Arguments of `wasmjobs exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub source: PluginSource,
    #[command(flatten)]
    pub db: DbArgs,
    /// Wall-clock limit for the job, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Most linear memory the guest may use (e.g. 64MiB).
    #[arg(long, default_value = "128MiB", value_parser = parse_size)]
    pub memory: usize,
    /// Most bytes the plugin's read-write directories may hold (default and cap of `limits.disk`).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub disk: usize,
    /// Allow a plugin that sets `limits.fuel` (it alone is metered, 10–25% slower).
    #[arg(long)]
    pub fuel: bool,
    /// The job class.
    pub class: String,
    /// The job's arguments, a JSON array.
    #[arg(default_value = "[]")]
    pub args: String,
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &ExecArgs) -> Result<ExitCode> {
    let job = Job::new(&args.class, &args.args)?;
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| anyhow!("--timeout must be a positive number of seconds"))?;
    let limits = Limits {
        memory: args.memory,
        timeout,
    };
    let config = EngineConfig {
        concurrency: 1,
        limits,
        disk: args.disk as u64,
        fuel: args.fuel,
        ..EngineConfig::default()
    };
    let protected = crate::runner::protected_env([], None, &args.db.databases);
    // Only the plugin serving the class is compiled.
    let (executor, catalog) = args
        .source
        .load_serving(&cli.data_dir, &config, protected, Some(&job.class))?;
    let databases = Databases::open_async(args.db.databases.clone(), cli.data_dir.clone()).await?;
    let executor = executor.with_databases(databases);
    let Some(plugin) = catalog.get(&job.class) else {
        // The plugin listing the class may be one that did not load.
        if !catalog.broken().is_empty() {
            let errors: Vec<&str> = catalog.broken().iter().map(|b| b.error.as_str()).collect();
            return Err(anyhow!(
                "no plugin in {} serves class {:?}; these did not load:\n{}",
                args.source.plugins.display(),
                job.class,
                errors.join("\n")
            ));
        }
        let known = crate::plugin::catalog::listed_classes(&args.source.dir()?);
        let mut message = format!(
            "no plugin in {} serves class {:?}",
            args.source.plugins.display(),
            job.class
        );
        if known.is_empty() {
            message.push_str(" (it has no loadable plugins; try `wasmjobs plugins`)");
        } else {
            message.push_str(&format!(" (known classes: {})", known.join(", ")));
        }
        return Err(anyhow!(message));
    };

    let execution = executor
        .execute(&plugin.loaded, &job, &ExecOptions { capture_logs: true })
        .await;
    let mut out = std::io::stdout().lock();
    for line in &execution.logs {
        writeln!(out, "{}", log_line(level_name(line.level), &line.message))?;
    }
    let took = format!("{:.3} ms", execution.duration.as_secs_f64() * 1000.0);
    writeln!(
        out,
        "{} {} ({}@{}, jid {}) in {took}",
        job.class,
        escape_control(&execution.outcome.to_string()),
        plugin.name,
        execution.plugin_version,
        job.jid
    )?;
    if let Some(backtrace) = &execution.backtrace {
        writeln!(out, "{}", backtrace.trim_end())?;
    }
    Ok(if execution.outcome.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A guest's log line as `exec` prints it: `[level] text`, its own line
/// breaks (a Python traceback, a JS stack) continued on lines that start
/// `        | `, every other control character escaped. So the text reads
/// as the guest wrote it, and no guest text can start a line of its own
/// (a forged `[info ]` or outcome line).
fn log_line(level: &str, message: &str) -> String {
    let mut out = format!("[{level:<5}] ");
    for (i, part) in message.split('\n').enumerate() {
        if i > 0 {
            out.push_str("\n        | ");
        }
        out.push_str(&escape_control(part.strip_suffix('\r').unwrap_or(part)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceback_prints_on_its_own_lines_and_cannot_forge_one() {
        let text = log_line(
            "error",
            "Traceback (most recent call last):\r\n  File \"app.py\", line 3\nValueError: \u{1b}[31mboom\n[info ] forged",
        );
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "[error] Traceback (most recent call last):",
                "        |   File \"app.py\", line 3",
                "        | ValueError: \\u{1b}[31mboom",
                "        | [info ] forged",
            ]
        );
        assert_eq!(log_line("info", "hello"), "[info ] hello");
    }
}
