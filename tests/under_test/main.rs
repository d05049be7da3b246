//! The `wasmjobs` binary as the end-to-end tests run it: the same command
//! line ([`wasmjobs::cli`]) with one addition, a fault hook the tests of
//! the runner's supervision set through the environment:
//! `WASMJOBS_TEST_PANIC_ONCE=heartbeat,cron` makes the first run of each
//! named background service panic (see `runtime/src/runner/supervise.rs`).
//! The shipped binary (`runtime/src/main.rs`) installs no hook.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::{Mutex, OnceLock, PoisonError};

#[global_allocator]
static ALLOCATOR: wasmjobs::Allocator = wasmjobs::Allocator;

/// The services still to fail once.
static TO_FAIL: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();

fn fail_once(service: &'static str) {
    let Some(to_fail) = TO_FAIL.get() else { return };
    let first = to_fail.lock().unwrap_or_else(PoisonError::into_inner).remove(service);
    if first {
        panic!("fault injected into {service} by WASMJOBS_TEST_PANIC_ONCE");
    }
}

fn main() -> ExitCode {
    if let Ok(names) = std::env::var("WASMJOBS_TEST_PANIC_ONCE") {
        let names = names
            .split(',')
            .map(|name| name.trim().to_owned())
            .filter(|n| !n.is_empty());
        let _ = TO_FAIL.set(Mutex::new(names.collect()));
        wasmjobs::runner::set_fault_hook(fail_once);
    }
    wasmjobs::cli::main()
}
