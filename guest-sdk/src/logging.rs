//! The `log` facade, forwarded to the host's `wasmjobs:job/log` import, and
//! the panic hook that puts a panic's message on one line of stderr.

use std::borrow::Cow;
use std::sync::Once;

use crate::bindings::wasmjobs::job::log as host;

/// Forwards `log` records to the host. The host owns filtering (and
/// truncation), so every level is enabled here.
struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, _metadata: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        // `format_args!` with no arguments needs no allocation.
        let message = match record.args().as_str() {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(record.args().to_string()),
        };
        host::log(level(record.level()), &message);
    }

    fn flush(&self) {}
}

fn level(level: log::Level) -> host::Level {
    match level {
        log::Level::Error => host::Level::Error,
        log::Level::Warn => host::Level::Warn,
        log::Level::Info => host::Level::Info,
        log::Level::Debug => host::Level::Debug,
        log::Level::Trace => host::Level::Trace,
    }
}

static LOGGER: HostLogger = HostLogger;

/// Install the logger and the panic hook, once per instance (the export glue
/// calls this before every `perform`; the host normally uses a fresh instance
/// per job, but nothing breaks if it reuses one).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Fails only if something already installed a logger; keep that one.
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }

        // A panic aborts the instance (wasm has no unwinding) and the host
        // only sees a trap. Write the message and location to stderr as ONE
        // line: the host logs stderr inside the job's span and puts its tail
        // into the failed job's error message, for guests in any language.
        std::panic::set_hook(Box::new(|info| {
            let payload = info.payload_as_str().unwrap_or("Box<dyn Any>");
            let message = match info.location() {
                Some(location) => format!("panicked at {location}: {payload}"),
                None => format!("panicked: {payload}"),
            };
            eprintln!("{}", message.replace('\n', " "));
        }));
    });
}
