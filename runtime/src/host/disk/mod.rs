//! `limits.disk`: a size budget for a plugin's read-write directories, and
//! a full disk reaching the guest as an error rather than a trap.
//!
//! The budget is per plugin ([`DiskBudget`], built when the plugin loads by
//! measuring what its rw directories already hold, and carried over a hot
//! reload), shared by all its jobs, each of which gets a [`JobDisk`]. It is
//! enforced while a job runs, write by write: `host::link` replaces
//! wasmtime-wasi's `wasi:filesystem/types` with [`fs::BudgetedFs`], which
//! delegates every method to wasmtime-wasi and charges the ones that grow
//! the disk (writes, streams onto files, `set-size`, new entries) before
//! they happen. A write the budget has no room for fails with
//! `insufficient-space` (ENOSPC) instead of reaching the disk; see
//! [`budget`] for the accounting (upper-bound charges, corrected by
//! re-measuring when the limit is reached).
//!
//! Errors, not traps: a refused write, and an ENOSPC/EDQUOT from the real
//! filesystem, are ordinary WASI errors. Guests built on wasi-libc report
//! every failed file-stream write as EIO without asking the host for the
//! error code, so the job also records why ([`JobDisk::note`]) and the
//! executor appends that to the job's failure message ("… No space left
//! on device").

mod budget;
pub(crate) mod fs;
mod stream;

pub use budget::{DiskBudget, JobDisk};
pub use fs::BudgetedFs;

use anyhow::{Context, Result};

use super::files::{FileGrants, Mode};

/// The runner's default `limits.disk`: 1 GiB per plugin.
pub const DEFAULT_DISK: u64 = 1 << 30;

/// The budget of the plugin `name`'s read-write preopens: `limit` (its
/// `limits.disk`), else `default`; `None` if it has none. Run when the plugin loads, after
/// its directories are checked (it walks them to count what they hold).
pub(crate) fn budget(
    manifest: FileGrants<'_>,
    limit: Option<u64>,
    name: &str,
    default: u64,
) -> Result<Option<DiskBudget>> {
    let mut dirs: Vec<_> = manifest
        .files
        .iter()
        .filter(|preopen| preopen.mode == Mode::ReadWrite)
        .map(|preopen| preopen.host.canonicalize().unwrap_or_else(|_| preopen.host.clone()))
        .collect();
    if dirs.is_empty() {
        return Ok(None);
    }
    dirs.sort();
    dirs.dedup();
    let limit = limit.unwrap_or(default);
    DiskBudget::measure(name, dirs, limit).map(Some).with_context(|| {
        format!(
            "{}: cannot measure the read-write directories",
            manifest.manifest.display()
        )
    })
}
