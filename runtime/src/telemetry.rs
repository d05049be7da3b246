//! Logging setup: `tracing` to stderr, human-readable or JSON lines.
//!
//! The filter comes from `RUST_LOG` when set (e.g.
//! `RUST_LOG=wasmjobs=debug,wasmjobs::guest=trace`), otherwise from the
//! command's default. Guest log lines use the target `wasmjobs::guest` and
//! carry the job's `jid`, `class`, `plugin` and `version`.
//!
//! One event is one line. Much of what is logged comes from outside: guest
//! log messages, guest error strings, and job classes, jids and queue names
//! from Redis. In the human format every field value and message passes
//! through [`escape_control`] ([`EscapedFields`]), so a newline cannot forge
//! a second log line and an ANSI sequence cannot recolour or clear the
//! operator's terminal; this is the one place that sees every field of
//! every event, so nothing that logs needs to remember to escape. The JSON
//! format needs nothing more: its serializer escapes control characters in
//! strings.
//!
//! At a terminal (a person reading, not a file or a pipe), a value's own
//! line breaks — a Python traceback, a JavaScript stack — are shown as
//! line breaks, each continued line starting with `        | ` (as `wasmjobs
//! exec` prints them), so no text can start a line of its own there
//! either; everywhere else an event stays one line, with `\n`.

use std::borrow::Cow;
use std::fmt;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

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
pub(crate) fn init(format: LogFormat, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    use std::io::IsTerminal;
    // Colours only for a person at a terminal, not for log files and shippers.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let multiline = std::io::stderr().is_terminal();
    let result = match format {
        LogFormat::Human => builder.fmt_fields(EscapedFields { multiline }).try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}

/// `tracing-subscriber`'s default field format (`message key=value ...`),
/// with control characters escaped in every name and value; with
/// `multiline`, line breaks are kept, each continued line behind
/// [`CONTINUED`].
///
/// Field names lose their terminal styling (italics) in exchange: the
/// fields are formatted plain, then escaped as a whole.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EscapedFields {
    pub(crate) multiline: bool,
}

/// What starts a continued line of a multi-line value at a terminal.
pub(crate) const CONTINUED: &str = "        | ";

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut plain = String::new();
        DefaultFields::new().format_fields(Writer::new(&mut plain), fields)?;
        if !self.multiline {
            return writer.write_str(&escape_control(&plain));
        }
        for (i, line) in plain.split('\n').enumerate() {
            if i > 0 {
                writer.write_str("\n")?;
                writer.write_str(CONTINUED)?;
            }
            writer.write_str(&escape_control(line.strip_suffix('\r').unwrap_or(line)))?;
        }
        Ok(())
    }
}

/// `text` with every character that could break a line or drive a
/// terminal written as an escape: `\n`, `\r` and `\t` as such, other
/// control characters (C0, DEL, C1 such as `NEL`), the Unicode line and
/// paragraph separators and the bidirectional overrides as `\u{..}`.
/// Everything else, backslashes included, is left as is.
pub(crate) fn escape_control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                use fmt::Write as _;
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape_control("plain C:\\path é"), Cow::Borrowed(_)));
        assert_eq!(escape_control("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(
            escape_control("\x1b[31mred\x07\u{85}\u{2028}\u{202e}"),
            "\\u{1b}[31mred\\u{7}\\u{85}\\u{2028}\\u{202e}"
        );
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(json: bool) -> String {
        logged_as(json, false)
    }

    fn logged_as(json: bool, multiline: bool) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let emit = || {
            let class = "Job\nFORGED class line";
            tracing::warn!(class = %class, jid = ?"j\r1", "message\nFORGED message line\x1b[2J");
        };
        if json {
            tracing::subscriber::with_default(builder.json().finish(), emit);
        } else {
            tracing::subscriber::with_default(builder.fmt_fields(EscapedFields { multiline }).finish(), emit);
        }
        let bytes = buffer
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn one_event_is_one_line_in_both_formats() {
        for json in [false, true] {
            let text = logged(json);
            assert_eq!(text.lines().count(), 1, "{text}");
            assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
            assert!(
                text.contains("FORGED class line") && text.contains("FORGED message line"),
                "{text}"
            );
        }
        let human = logged(false);
        assert!(human.contains("message\\nFORGED message line"), "{human}");
        assert!(human.contains("class=Job\\nFORGED class line"), "{human}");
    }

    /// At a terminal a traceback printed on one line with literal `\n`s;
    /// its lines are now lines, each continued one behind `        | `,
    /// so no text starts a line of its own.
    #[test]
    fn at_a_terminal_line_breaks_are_lines_that_cannot_pass_for_events() {
        let text = logged_as(false, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("message"), "{text}");
        for line in &lines[1..] {
            assert!(line.starts_with(CONTINUED), "{text}");
        }
        assert!(text.contains("        | FORGED message line"), "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
    }
}
