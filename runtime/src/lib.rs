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
//! | [`plugin`] | plugins on disk: manifest, compilation (with an on-disk cache), the class → plugin [`plugin::Catalog`] |
//! | [`sandbox`] | the Wasmtime engine and the [`sandbox::Executor`]: a fresh, limited instance per job, outcome mapping |
//! | [`host`] | the capabilities a guest may import (WASI, HTTP, logging), each behind a narrow view of the store state |
//! | [`redis`] | Redis in Sidekiq's format: connection, embedded server, payloads, client (push) and api (read side) |
//! | [`runner`] | the job engine of `wasmjobs run`: launcher, fetch, manager, processor, retry, outcome, scheduler, orphans, heartbeat |
//! | [`cli`] | the `wasmjobs` command line |
//!
//! Design notes for newcomers live in `docs/`.

pub mod bindings;
pub mod cli;
pub mod host;
pub mod job;
pub mod plugin;
pub mod redis;
pub mod runner;
pub mod sandbox;
pub mod telemetry;
pub mod time;
