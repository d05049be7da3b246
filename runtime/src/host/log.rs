//! Guest logging: the `wasmjobs:job/log` import and the guest's stdout and
//! stderr, routed into the host's `tracing` output.
//!
//! Every line carries the job's `jid`, `class`, plugin and version as fields
//! of its own (the job's `tracing` span is only enabled at debug level: at
//! tens of thousands of jobs a second, formatting a span per job costs more
//! than the sandbox does, and most jobs never log). A [`LogSink`] is shared by
//! the import and the two stdio streams of one job; it can also capture the
//! lines (for `wasmjobs exec` and tests) and keeps the tail of stderr, which
//! is where a Rust guest's panic message goes, so a trap can be explained.
//!
//! Guests are not trusted to be brief: each line is truncated to
//! [`MAX_LINE_BYTES`], and capture stops after [`MAX_CAPTURE_BYTES`]. Each
//! job also has a [`LogBudget`] of lines and bytes (default
//! [`DEFAULT_LOG_LINES`] / [`DEFAULT_LOG_BYTES`], `limits.log` in the
//! manifest), counted across the `log` import, stdout and stderr together:
//! past it, lines are dropped (neither emitted nor captured; stderr still
//! feeds the tail that explains a trap), and when the job ends
//! ([`LogSink::finish`]) one host line says how many were dropped. Without
//! it, one job in a loop could fill the runner's disk or drown every other
//! job's lines.
//!
//! Newlines and other control characters in guest messages are escaped in
//! text logs by the subscriber (`telemetry`), not here: the captured lines
//! keep the guest's text as it wrote it.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::bindings::log::{Host, Level};

/// Longest log line kept; the rest is cut and marked.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Most bytes of log lines captured per job.
pub const MAX_CAPTURE_BYTES: usize = 1024 * 1024;
/// Default most log lines per job.
pub const DEFAULT_LOG_LINES: u64 = 10_000;
/// Default most bytes of log lines per job.
pub const DEFAULT_LOG_BYTES: u64 = 1024 * 1024;
/// How much of the guest's stderr is kept to explain a trap.
const STDERR_TAIL_BYTES: usize = 2 * 1024;

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The `wasmjobs:job/log` import.
    Log,
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
    /// The host, about the guest's output (the dropped-lines count).
    Host,
}

/// How much one job may log, its lines counted after truncation to
/// [`MAX_LINE_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBudget {
    /// Most lines.
    pub lines: u64,
    /// Most bytes (of messages, without the fields a log line adds).
    pub bytes: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        Self {
            lines: DEFAULT_LOG_LINES,
            bytes: DEFAULT_LOG_BYTES,
        }
    }
}

impl std::fmt::Display for LogBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} lines / {} bytes", self.lines, self.bytes)
    }
}

/// One captured line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Severity (stdout lines are `info`, stderr lines `warn`).
    pub level: Level,
    /// Where it came from.
    pub source: Source,
    /// The text, truncated to [`MAX_LINE_BYTES`].
    pub message: String,
}

/// Which job a line belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobLabels {
    /// The job id.
    pub jid: String,
    /// The job class.
    pub class: String,
    /// The plugin's name (shared with the plugin: no copy per job).
    pub plugin: Arc<str>,
    /// The plugin's version id.
    pub version: Arc<str>,
}

/// The per-job destination of guest output.
#[derive(Clone, Default)]
pub struct LogSink(Arc<Mutex<SinkState>>);

#[derive(Default)]
struct SinkState {
    labels: JobLabels,
    capture: Option<Vec<LogLine>>,
    captured_bytes: usize,
    stderr_tail: String,
    budget: LogBudget,
    used: Volume,
    dropped: Volume,
}

/// Lines and bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Volume {
    lines: u64,
    bytes: u64,
}

impl LogSink {
    /// A sink for the job `labels` that emits to `tracing` up to `budget`,
    /// and also captures lines if asked.
    pub fn new(labels: JobLabels, capture: bool, budget: LogBudget) -> Self {
        Self(Arc::new(Mutex::new(SinkState {
            labels,
            capture: capture.then(Vec::new),
            budget,
            ..SinkState::default()
        })))
    }

    /// Starts the sink over for the next job on the same (warm) instance:
    /// its labels, capture and budget; nothing of the previous job's lines,
    /// stderr tail or tallies remains. The guest's stdout and stderr
    /// streams hold this same sink, so they follow.
    pub fn restart(&self, labels: JobLabels, capture: bool, budget: LogBudget) {
        *self.lock() = SinkState {
            labels,
            capture: capture.then(Vec::new),
            budget,
            ..SinkState::default()
        };
    }

    /// The job's labels, for the host's own events about it.
    pub fn labels(&self) -> JobLabels {
        self.lock().labels.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SinkState> {
        // A panic while holding this lock cannot leave it inconsistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Emits one line to `tracing` (in the current span) and captures it,
    /// or counts it as dropped once the job's budget is spent.
    pub fn record(&self, level: Level, source: Source, message: &str) {
        let message = truncate(message);
        let mut state = self.lock();
        if source == Source::Stderr {
            state.stderr_tail.push_str(&message);
            state.stderr_tail.push('\n');
            let excess = state.stderr_tail.len().saturating_sub(STDERR_TAIL_BYTES);
            if excess > 0 {
                let cut = (excess..=state.stderr_tail.len())
                    .find(|&i| state.stderr_tail.is_char_boundary(i))
                    .unwrap_or(state.stderr_tail.len());
                state.stderr_tail.drain(..cut);
            }
        }
        let size = message.len() as u64;
        let within =
            state.used.lines < state.budget.lines && state.used.bytes.saturating_add(size) <= state.budget.bytes;
        if !within {
            state.dropped.lines += 1;
            state.dropped.bytes = state.dropped.bytes.saturating_add(size);
            return;
        }
        state.used.lines += 1;
        state.used.bytes += size;
        emit(&state.labels, level, source, &message);
        state.keep(LogLine { level, source, message });
    }

    /// Ends the job's output: if lines were dropped, emits (and captures)
    /// the one line that says how many, and returns that count. Later
    /// calls report nothing more.
    pub fn finish(&self) -> u64 {
        let mut state = self.lock();
        let dropped = std::mem::take(&mut state.dropped);
        if dropped.lines == 0 {
            return 0;
        }
        let message = format!(
            "dropped {} log lines ({} bytes) past the job's log budget of {} (limits.log in wasmjobs.toml)",
            dropped.lines, dropped.bytes, state.budget
        );
        emit(&state.labels, Level::Warn, Source::Host, &message);
        state.keep(LogLine {
            level: Level::Warn,
            source: Source::Host,
            message,
        });
        dropped.lines
    }

    /// The captured lines so far (empty unless capturing).
    pub fn lines(&self) -> Vec<LogLine> {
        self.lock().capture.clone().unwrap_or_default()
    }

    /// The last lines the guest wrote to stderr, non-blank ones joined with
    /// " | " so the result fits on one line of a log or a dead-set entry.
    pub fn stderr_tail(&self) -> String {
        let state = self.lock();
        let lines: Vec<&str> = state
            .stderr_tail
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines.join(" | ")
    }

    /// A stream for the guest's stdout or stderr.
    pub fn stream(&self, source: Source) -> GuestOutput {
        GuestOutput {
            sink: self.clone(),
            source,
        }
    }
}

impl SinkState {
    /// Captures `line`, if capturing and within [`MAX_CAPTURE_BYTES`].
    fn keep(&mut self, line: LogLine) {
        let captured = self.captured_bytes + line.message.len();
        if captured <= MAX_CAPTURE_BYTES {
            if let Some(lines) = &mut self.capture {
                lines.push(line);
            }
            self.captured_bytes = captured;
        }
    }
}

/// The lowercase name of a level, as printed by `wasmjobs exec`.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

fn truncate(message: &str) -> String {
    if message.len() <= MAX_LINE_BYTES {
        return message.to_owned();
    }
    let cut = (0..=MAX_LINE_BYTES)
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}… [{} bytes cut]", &message[..cut], message.len() - cut)
}

fn emit(labels: &JobLabels, level: Level, source: Source, message: &str) {
    let source = match source {
        Source::Log => "log",
        Source::Stdout => "stdout",
        Source::Stderr => "stderr",
        Source::Host => "host",
    };
    let JobLabels {
        jid,
        class,
        plugin,
        version,
    } = labels;
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(target: "wasmjobs::guest", $level, jid = %jid, class = %class, plugin = %plugin, version = %version, source, "{message}")
        };
    }
    match level {
        Level::Trace => event!(tracing::Level::TRACE),
        Level::Debug => event!(tracing::Level::DEBUG),
        Level::Info => event!(tracing::Level::INFO),
        Level::Warn => event!(tracing::Level::WARN),
        Level::Error => event!(tracing::Level::ERROR),
    }
}

impl Host for LogSink {
    fn log(&mut self, level: Level, message: String) {
        self.record(level, Source::Log, &message);
    }
}

/// The guest's stdout or stderr: each write is split into lines and
/// recorded. Never blocks and never fails, so a chatty guest cannot stall or
/// crash on `println!`.
pub struct GuestOutput {
    sink: LogSink,
    source: Source,
}

impl GuestOutput {
    fn level(&self) -> Level {
        match self.source {
            Source::Stderr => Level::Warn,
            Source::Log | Source::Stdout | Source::Host => Level::Info,
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(GuestOutput {
            sink: self.sink.clone(),
            source: self.source,
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(GuestOutput {
            sink: self.sink.clone(),
            source: self.source,
        })
    }
}

impl GuestOutput {
    fn write_bytes(&self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        for line in text.trim_end_matches('\n').split('\n') {
            self.sink.record(self.level(), self.source, line.trim_end_matches('\r'));
        }
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !bytes.is_empty() {
            self.write_bytes(&bytes);
        }
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlimited() -> LogBudget {
        LogBudget {
            lines: u64::MAX,
            bytes: u64::MAX,
        }
    }

    #[test]
    fn the_budget_is_shared_by_every_source_and_drops_are_reported_once() {
        let sink = LogSink::new(JobLabels::default(), true, LogBudget { lines: 3, bytes: 1000 });
        sink.record(Level::Info, Source::Log, "one");
        sink.stream(Source::Stdout).write_bytes(b"two\nthree\nfour\n");
        sink.stream(Source::Stderr).write_bytes(b"panicked here\n");
        assert_eq!(sink.finish(), 2);
        assert_eq!(sink.finish(), 0, "reported once");
        let messages: Vec<String> = sink.lines().into_iter().map(|l| l.message).collect();
        assert_eq!(messages[..3], ["one", "two", "three"]);
        assert_eq!(
            messages[3],
            "dropped 2 log lines (17 bytes) past the job's log budget of 3 lines / 1000 bytes (limits.log in wasmjobs.toml)"
        );
        assert_eq!(messages.len(), 4);
        assert_eq!(
            sink.stderr_tail(),
            "panicked here",
            "a dropped stderr line still explains a trap"
        );

        let sink = LogSink::new(JobLabels::default(), true, LogBudget { lines: 100, bytes: 10 });
        for _ in 0..4 {
            sink.record(Level::Info, Source::Log, "abcd");
        }
        assert_eq!(sink.finish(), 2, "the byte budget holds two 4-byte lines");
    }

    #[test]
    fn long_lines_are_cut_and_marked() {
        let long = "x".repeat(MAX_LINE_BYTES + 10);
        let cut = truncate(&long);
        assert!(cut.starts_with(&"x".repeat(MAX_LINE_BYTES)));
        assert!(cut.ends_with("[10 bytes cut]"), "{}", &cut[cut.len() - 30..]);
    }

    #[test]
    fn sink_captures_lines_and_keeps_the_stderr_tail() {
        let sink = LogSink::new(JobLabels::default(), true, unlimited());
        sink.stream(Source::Stdout).write_bytes(b"one\ntwo\n");
        sink.record(Level::Error, Source::Log, "three");
        for i in 0..1000 {
            sink.stream(Source::Stderr).write_bytes(format!("err {i}\n").as_bytes());
        }
        let lines = sink.lines();
        assert_eq!(lines[0].message, "one");
        assert_eq!(
            lines[1],
            LogLine {
                level: Level::Info,
                source: Source::Stdout,
                message: "two".into()
            }
        );
        assert_eq!(lines[2].level, Level::Error);
        let tail = sink.stderr_tail();
        assert!(tail.ends_with("err 998 | err 999"), "{tail}");
        assert!(!tail.contains("err 10 |"), "old stderr lines are dropped: {tail}");
        assert!(tail.len() < 2 * STDERR_TAIL_BYTES);
    }

    #[test]
    fn capture_is_bounded() {
        let sink = LogSink::new(JobLabels::default(), true, unlimited());
        let line = "y".repeat(MAX_LINE_BYTES);
        for _ in 0..(2 * MAX_CAPTURE_BYTES / MAX_LINE_BYTES) {
            sink.record(Level::Info, Source::Log, &line);
        }
        let total: usize = sink.lines().iter().map(|l| l.message.len()).sum();
        assert!(total <= MAX_CAPTURE_BYTES);
        assert!(total > MAX_CAPTURE_BYTES / 2);
    }
}
