//! The end-to-end tests, one module per area, linked into one test binary
//! (each binary links Wasmtime and the runner: one link instead of
//! twenty-three). They start real servers (redis-server, PostgreSQL,
//! Sidekiq, Chromium) and the real binary (`wasmjobs-under-test`), and
//! build nothing themselves: `scripts/build-plugins.sh` builds the guests
//! first. Run one area with `cargo test --release -p wasmjobs-e2e --test
//! e2e AREA::`, e.g. `web::` or `trust::files::`.

mod activejob;
mod beside_sidekiq;
mod capabilities;
mod catalog;
mod concurrent;
mod control;
mod cron;
mod doc_snippets;
mod executor;
mod first_plugin;
mod first_run;
mod foreign;
mod instances;
mod limits;
mod observability;
mod packages;
mod polyglot;
mod postgres_source;
mod project_dir;
mod protocol;
mod redis_commands;
mod reload;
mod run;
mod shard_outage;
mod sharded_runs;
mod shards;
mod sidekiq_interop;
mod sql;
mod tracing;
mod trust;
mod unique;
mod web;
mod web_trust;
