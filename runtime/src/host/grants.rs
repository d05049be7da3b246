//! [`Grants`]: what one plugin version may reach, built once when it loads
//! and shared by every job of that version.
//!
//! The capabilities read their grants from here, never from the plugin's
//! manifest: the plugin layer turns a validated manifest into `Grants`
//! (opening the granted directories and measuring the read-write ones on
//! the way), and the host sees only the result. Per-plugin state that
//! outlives a job but not a version (HTTP connections, the disk budget,
//! the HTTP counters, which a hot reload carries over) lives here too.

use std::path::Path;
use std::sync::Arc;

use super::disk::DiskBudget;
use super::files::{Handles, Preopen};
use super::http::{AllowList, HttpStats, PluginPools};
use super::log::LogBudget;

/// Everything one plugin version is granted.
#[derive(Debug)]
pub struct Grants {
    /// The plugin's name (its directory's): log lines, the SQL
    /// `application_name`, which `--db NAME@PLUGIN=URL` it reaches.
    pub plugin: Arc<str>,
    /// Its manifest, named in every refusal.
    pub manifest: Arc<Path>,
    /// Environment variables passed to the guest, with their values as the
    /// runner had them when the plugin loaded.
    pub env: Arc<[(String, String)]>,
    /// The granted directories, in the manifest's order.
    pub files: Vec<Preopen>,
    /// Those directories, opened once when the plugin loaded.
    pub handles: Handles,
    /// The databases it may use, and how.
    pub sql: Arc<SqlGrants>,
    /// Most log lines and bytes per job.
    pub log: LogBudget,
    /// Where it may send HTTP requests (`http.allow`).
    pub http_allow: Arc<AllowList>,
    /// Its outgoing HTTP counters (carried over a reload).
    pub http_stats: Arc<HttpStats>,
    /// Its own HTTP connections (a reloaded version starts afresh).
    pub http_pools: Arc<PluginPools>,
    /// The budget of its read-write directories, if it has any.
    pub disk: Option<Arc<DiskBudget>>,
}

/// A plugin's `sql` grants.
#[derive(Debug, Clone, Default)]
pub struct SqlGrants {
    /// The database names it may use.
    pub names: Vec<String>,
    /// Those of them it may only read.
    pub read_only: Vec<String>,
    /// `limits.concurrency`: most connections of one database at once.
    pub concurrency: Option<usize>,
}
