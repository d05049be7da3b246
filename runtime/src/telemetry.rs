//! Logging setup: `tracing` to stderr, human-readable or JSON lines.
//!
//! The filter comes from `RUST_LOG` when set (e.g.
//! `RUST_LOG=wasmjobs=debug,wasmjobs::guest=trace`), otherwise from the
//! command's default. Guest log lines use the target `wasmjobs::guest` and
//! carry the job span (`jid`, `class`, `plugin`, `version`).

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Output format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber. `default_filter` applies when `RUST_LOG`
/// is unset.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    use std::io::IsTerminal;
    // Colours only for a person at a terminal, not for log files and shippers.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}
