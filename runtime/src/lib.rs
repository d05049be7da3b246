//! # wasmjobs
//!
//! A background-job runner whose jobs are WebAssembly components. Each job
//! class is served by a *plugin*: a component targeting the `wasmjobs:job`
//! world (`wit/job.wit`) plus a manifest (`wasmjobs.toml`) that says which
//! classes it serves and what it may touch.
//!
//! The modules follow the path a job travels through the process:
//!
//! | module | role in a job's life |
//! |---|---|
//! | [`job`] | the job as the host sees it, and the [`job::Outcome`] of running it |
//! | [`cron`] | cron expressions and time zones: the ticks of `[[schedule]]` entries and sidekiq-cron schedules |
//! | [`plugin`] | plugins on disk: manifest, compilation (with an on-disk cache), the class → plugin [`plugin::Catalog`] |
//! | [`sandbox`] | the Wasmtime engine and the [`sandbox::Executor`]: a fresh, limited instance per job, outcome mapping |
//! | [`host`] | the capabilities a guest may import (WASI, HTTP, logging), each behind a narrow view of the store state |
//! | [`redis`] | Redis in Sidekiq's format: connection, embedded server, payloads, client (push) and api (read side) |
//! | [`runner`] | the job engine of `wasmjobs run`: launcher, fetch, manager, processor, retry, outcome, scheduler, orphans, heartbeat, reloader, summary |
//! | [`metrics`] | what jobs and the process cost: per-class HDR histograms, RSS/CPU sampling, Prometheus and JSON endpoints |
//! | [`web`] | the dashboard (`wasmjobs web`, `run --web`): server-rendered pages over Redis, CSRF and credentials checked in one place |
//! | [`otel`] | OpenTelemetry traces: the job span, host-call child spans, `traceparent` in and out, OTLP export |
//! | [`cli`] | the `wasmjobs` command line |
//!
//! Design notes for newcomers live in `docs/`.

pub(crate) mod bindings;
pub mod cli;
pub mod cron;
pub mod host;
pub(crate) mod hosts;
pub mod job;
pub mod metrics;
pub(crate) mod otel;
pub mod pg;
pub mod plugin;
#[cfg(test)]
mod proptest_config;
mod redact;
pub mod redis;
pub mod runner;
pub mod sandbox;
pub(crate) mod size;
mod sql_text;
pub(crate) mod telemetry;
pub mod time;
pub(crate) mod web;

/// The memory allocator the `wasmjobs` binary installs (mimalloc).
///
/// Thousands of jobs in flight allocate and free stores, WASI contexts and
/// HTTP connection buffers from both runtime threads at once. glibc's malloc
/// spent ~20% of the runner's CPU on that at 1,000 concurrent HTTP jobs
/// (arena locks, chunk consolidation) and kept fragmented arenas resident
/// after a burst. Exported so every binary built from `src/main.rs` (the
/// real one and the copies the tests and benchmarks build) uses the same
/// allocator; the library itself does not install it.
pub use mimalloc::MiMalloc as Allocator;
