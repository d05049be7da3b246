//! How a job's failure is described: what stopped the guest
//! ([`describe_trap`]) and the notes a failure gets for what the guest
//! could not see (refused disk writes, denied HTTP requests, files outside
//! its grants); and [`Occupancy`], the in-flight counter every way of
//! running a job keeps. Shared by the fresh-instance executor and the
//! concurrent lanes.

use std::sync::atomic::{AtomicUsize, Ordering};

use wasmtime::Trap;

use super::state::JobState;
use crate::host::files::Preopen;
use crate::job::Outcome;
use crate::size::mib;

/// Counts one in `counter` while alive.
pub(crate) struct Occupancy<'a>(&'a AtomicUsize);

impl<'a> Occupancy<'a> {
    pub(crate) fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Occupancy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `outcome` with, for a failure, what the guest could not see: why the
/// job's writes were refused for lack of space (guests on wasi-libc see a
/// refused file-stream write as a bare EIO, "I/O error"), which request
/// `http.allow` refused (a guest sees only `HttpRequestDenied`, which some
/// SDKs report vaguely), that a library tried a socket of its own (the
/// host's HTTP is the way: [`crate::host::net_hint`]) and which
/// `[[files]]` grant a path outside them needs.
pub(super) fn with_notes(outcome: Outcome, state: &JobState, grants: &[Preopen]) -> Outcome {
    let outcome = noted(outcome, |_| state.disk_note());
    let outcome = noted(outcome, |message| state.http_note(message));
    let outcome = noted(outcome, crate::host::net_hint::note);
    with_files_note(outcome, grants)
}

/// `outcome` with, for a failure that looks like a path the plugin was
/// not granted, which grant would allow it ([`crate::host::file_hint`]).
pub(super) fn with_files_note(outcome: Outcome, grants: &[Preopen]) -> Outcome {
    noted(outcome, |message| crate::host::file_hint::note(message, grants))
}

/// A failure's message with `note(message)` appended in parentheses.
fn noted(outcome: Outcome, note: impl FnOnce(&str) -> Option<String>) -> Outcome {
    let with = |message: String| match note(&message) {
        Some(note) => format!("{message} ({note})"),
        None => message,
    };
    match outcome {
        Outcome::Retry(message) => Outcome::Retry(with(message)),
        Outcome::Discard(message) => Outcome::Discard(with(message)),
        Outcome::Dead(message) => Outcome::Dead(with(message)),
        Outcome::Success => Outcome::Success,
    }
}

/// A one-line explanation of why the guest stopped.
pub(crate) fn describe_trap(err: &wasmtime::Error, state: &JobState) -> String {
    let mut message = if let Some(asked) = state.limiter.refused {
        format!(
            "memory limit of {} exceeded: the guest asked for {}",
            mib(state.limiter.limit()),
            mib(asked)
        )
    } else if let Some(trap) = err.downcast_ref::<Trap>() {
        match trap {
            Trap::StackOverflow => "stack overflow (wasm trap: call stack exhausted)".to_owned(),
            Trap::OutOfFuel => "fuel exhausted (wasm trap: all fuel consumed)".to_owned(),
            trap => trap.to_string(),
        }
    } else {
        err.root_cause().to_string()
    };
    if let Some(note) = state.disk_note() {
        message.push_str("; ");
        message.push_str(&note);
    }
    let stderr = state.log.stderr_tail();
    if !stderr.is_empty() {
        message.push_str("; guest stderr: ");
        message.push_str(&stderr);
    }
    message
}
