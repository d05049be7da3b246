//! The accounting behind `limits.disk`: one [`DiskBudget`] per plugin,
//! shared by all its jobs, and one [`JobDisk`] per job.
//!
//! The budget holds two figures under one lock (a [`Ledger`]):
//! - `settled`: the bytes found on disk by the last walk of the plugin's
//!   read-write directories, plus everything charged since by jobs that
//!   have ended;
//! - `live`: everything charged by jobs still running.
//!
//! A write is allowed while `settled + live + len ≤ limit`. Charges are upper
//! bounds (an overwrite or a sparse write counts in full), so the figure
//! drifts high; when a write would cross the limit, the directories are
//! walked again and `settled` replaced by what is really there — at most
//! once per [`REWALK_AFTER`], or sooner if something was deleted or
//! truncated since the last walk (so a delete gives its space back at
//! once). A running job's own charges are never replaced by a walk: it may
//! hold space the walk cannot see (a file it unlinked but keeps open), so
//! they count until the job ends and its files are closed.
//!
//! Every file, directory or link counts at least [`ENTRY_BYTES`], even when
//! empty, so a guest cannot exhaust the filesystem's inodes for free.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// The least a directory entry counts for (one filesystem block).
pub(crate) const ENTRY_BYTES: u64 = 4096;
/// The shortest time between two walks triggered by writes alone.
pub(crate) const REWALK_AFTER: Duration = Duration::from_millis(100);
/// The most entries one walk visits; past it the walk gives up and the
/// charged figure stands (it can only be too high).
pub(crate) const MAX_WALK_ENTRIES: usize = 1_000_000;

/// The figures of one budget (pure logic, unit-tested).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// Bytes on disk at the last walk plus charges of jobs ended since.
    pub(crate) settled: u64,
    /// Charges of running jobs.
    pub(crate) live: u64,
    /// Total ever moved from `live` to `settled`: a walk started when this
    /// was `n` adds what ended during the walk.
    pub(crate) ended_total: u64,
    /// Something may have been deleted or truncated since the last walk.
    pub(crate) freed: bool,
    /// When the last walk finished.
    pub(crate) last_walk: Option<Instant>,
}

impl Ledger {
    /// Charges `bytes` to running jobs if they fit under `limit`.
    pub(crate) fn try_charge(&mut self, bytes: u64, limit: u64) -> bool {
        let fits = self
            .settled
            .checked_add(self.live)
            .and_then(|used| used.checked_add(bytes))
            .is_some_and(|total| total <= limit);
        if fits {
            self.live += bytes;
        }
        fits
    }

    /// Gives back `bytes` a running job charged but did not write.
    pub(crate) fn refund(&mut self, bytes: u64) {
        self.live = self.live.saturating_sub(bytes);
    }

    /// A job that charged `bytes` ended: its charges become settled.
    pub(crate) fn end_job(&mut self, bytes: u64) {
        self.live = self.live.saturating_sub(bytes);
        self.settled = self.settled.saturating_add(bytes);
        self.ended_total = self.ended_total.wrapping_add(bytes);
    }

    /// Whether a write that does not fit may walk the directories now.
    pub(crate) fn may_walk(&self, now: Instant) -> bool {
        self.freed || self.last_walk.is_none_or(|at| now.duration_since(at) >= REWALK_AFTER)
    }

    /// A walk that started when `ended_total` was `ended_at_start` found
    /// `measured` bytes.
    pub(crate) fn settle(&mut self, measured: u64, ended_at_start: u64, now: Instant) {
        let ended_during = self.ended_total.wrapping_sub(ended_at_start);
        self.settled = measured.saturating_add(ended_during);
        self.freed = false;
        self.last_walk = Some(now);
    }
}

/// Why a write was refused, for the job's failure message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The plugin's `limits.disk` is used up.
    Budget,
    /// The filesystem itself said ENOSPC or EDQUOT.
    Filesystem,
}

/// The disk budget of one plugin's read-write directories.
pub struct DiskBudget {
    plugin: String,
    dirs: Vec<PathBuf>,
    limit: AtomicU64,
    ledger: Mutex<Ledger>,
    /// Held during a walk, so concurrent jobs at the limit walk once.
    walking: Mutex<()>,
}

impl std::fmt::Debug for DiskBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBudget")
            .field("plugin", &self.plugin)
            .field("dirs", &self.dirs)
            .field("limit", &self.limit())
            .field("used", &self.used())
            .finish()
    }
}

impl DiskBudget {
    /// The budget of `plugin`'s read-write directories `dirs`, with what
    /// they hold now already charged. Blocking (walks the directories).
    pub fn measure(plugin: &str, dirs: Vec<PathBuf>, limit: u64) -> Result<Self> {
        let used = usage(&dirs)?;
        let budget = Self {
            plugin: plugin.to_owned(),
            dirs,
            limit: AtomicU64::new(limit),
            ledger: Mutex::new(Ledger {
                settled: used,
                last_walk: Some(Instant::now()),
                ..Ledger::default()
            }),
            walking: Mutex::new(()),
        };
        if used > limit {
            tracing::warn!(
                plugin = %plugin,
                "the read-write directories already hold {} of a {} disk budget (limits.disk): every write will fail until files are removed",
                size(used),
                size(limit)
            );
        }
        Ok(budget)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit (a reloaded manifest may change it).
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes counted now (on disk at the last walk plus charges since).
    pub fn used(&self) -> u64 {
        let ledger = self.ledger();
        ledger.settled.saturating_add(ledger.live)
    }

    /// The read-write directories it covers.
    pub(crate) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The ledger holds plain numbers, consistent after every statement.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges `bytes` to a running job, walking the directories first if
    /// they do not fit and a walk is due.
    fn charge(&self, bytes: u64) -> bool {
        let limit = self.limit();
        if self.ledger().try_charge(bytes, limit) {
            return true;
        }
        if self.ledger().may_walk(Instant::now()) {
            self.walk();
        }
        self.ledger().try_charge(bytes, limit)
    }

    /// Replaces the settled figure with a fresh walk.
    fn walk(&self) {
        let _walking = self.walking.lock().unwrap_or_else(PoisonError::into_inner);
        let ended_at_start = {
            let ledger = self.ledger();
            // Another job may have walked while this one waited.
            if !ledger.may_walk(Instant::now()) {
                return;
            }
            ledger.ended_total
        };
        match usage(&self.dirs) {
            Ok(measured) => self.ledger().settle(measured, ended_at_start, Instant::now()),
            Err(err) => {
                tracing::warn!(plugin = %self.plugin, "cannot measure the read-write directories: {err:#}");
                let mut ledger = self.ledger();
                ledger.freed = false;
                ledger.last_walk = Some(Instant::now());
            }
        }
    }

    /// Notes that something may have been deleted or truncated.
    fn freed(&self) {
        self.ledger().freed = true;
    }
}

/// One job's share of its plugin's budget. Dropped with the job's store
/// (after its files are closed); its charges then become settled.
#[derive(Debug)]
pub struct JobDisk {
    budget: Arc<DiskBudget>,
    charged: AtomicU64,
    full: OnceLock<Full>,
    logged: AtomicBool,
}

impl JobDisk {
    /// A job's view of `budget`.
    pub fn new(budget: Arc<DiskBudget>) -> Self {
        Self {
            budget,
            charged: AtomicU64::new(0),
            full: OnceLock::new(),
            logged: AtomicBool::new(false),
        }
    }

    /// Charges `bytes` about to be written; `false` (and the refusal noted
    /// and logged once) if the budget has no room for them.
    pub(crate) fn charge(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        if self.budget.charge(bytes) {
            self.charged.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        self.refused(Full::Budget);
        false
    }

    /// Gives back `bytes` charged but not written.
    pub(crate) fn refund(&self, bytes: u64) {
        let bytes = bytes.min(self.charged.load(Ordering::Relaxed));
        self.charged.fetch_sub(bytes, Ordering::Relaxed);
        self.budget.ledger().refund(bytes);
    }

    /// Notes that the job deleted or truncated something.
    pub(crate) fn freed(&self) {
        self.budget.freed();
    }

    /// Records why a write of this job failed for lack of space, and logs
    /// it the first time.
    pub(crate) fn refused(&self, why: Full) {
        let _ = self.full.set(why);
        if !self.logged.swap(true, Ordering::Relaxed) {
            match why {
                Full::Budget => tracing::warn!(
                    plugin = %self.budget.plugin,
                    "disk budget of {} (limits.disk) used up: writes to the read-write directories fail with ENOSPC",
                    size(self.budget.limit())
                ),
                Full::Filesystem => tracing::warn!(
                    plugin = %self.budget.plugin,
                    "the filesystem under the read-write directories is full (ENOSPC)"
                ),
            }
        }
    }

    /// Why the job's writes were refused, as a sentence for its failure
    /// message; `None` if they never were.
    pub fn note(&self) -> Option<String> {
        Some(match self.full.get()? {
            Full::Budget => format!(
                "disk budget of {} (limits.disk) of plugin {} used up: No space left on device",
                size(self.budget.limit()),
                self.budget.plugin
            ),
            Full::Filesystem => format!(
                "the filesystem under plugin {}'s read-write directories is full: No space left on device",
                self.budget.plugin
            ),
        })
    }
}

impl Drop for JobDisk {
    fn drop(&mut self) {
        let charged = *self.charged.get_mut();
        self.budget.ledger().end_job(charged);
    }
}

/// Bytes held under `dirs`: for every entry (not following symlinks, not
/// crossing into other filesystems) its allocated blocks, at least
/// [`ENTRY_BYTES`]. Hard links count once per name.
pub(crate) fn usage(dirs: &[PathBuf]) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut entries = 0usize;
    for dir in dirs {
        for entry in walkdir::WalkDir::new(dir).follow_links(false).same_file_system(true) {
            let entry = match entry {
                Ok(entry) => entry,
                // Removed while walking: it holds nothing any more.
                Err(err) if err.io_error().is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) => continue,
                Err(err) => return Err(anyhow::Error::from(err).context(format!("walking {}", dir.display()))),
            };
            entries += 1;
            if entries > MAX_WALK_ENTRIES {
                bail!("more than {MAX_WALK_ENTRIES} entries under {}", dir.display());
            }
            let bytes = match entry.metadata() {
                Ok(meta) => meta.blocks().saturating_mul(512).max(ENTRY_BYTES),
                Err(_) => ENTRY_BYTES,
            };
            total = total.saturating_add(bytes);
        }
    }
    Ok(total)
}

/// Bytes as a short human size, for messages.
pub(crate) fn size(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_up_to_the_limit_and_no_further() {
        let mut ledger = Ledger::default();
        assert!(ledger.try_charge(600, 1000));
        assert!(ledger.try_charge(400, 1000));
        assert!(!ledger.try_charge(1, 1000));
        assert_eq!(ledger.live, 1000);
        ledger.refund(300);
        assert!(ledger.try_charge(300, 1000));
        assert!(!ledger.try_charge(u64::MAX, 1000), "no overflow");
    }

    #[test]
    fn ended_jobs_settle_and_a_walk_replaces_them() {
        let start = Instant::now();
        let mut ledger = Ledger {
            settled: 100,
            ..Ledger::default()
        };
        assert!(ledger.try_charge(500, 1000));
        ledger.end_job(500);
        assert_eq!((ledger.settled, ledger.live), (600, 0));
        // A walk finds less (an overwrite was charged in full).
        let at_start = ledger.ended_total;
        ledger.settle(250, at_start, start);
        assert_eq!(ledger.settled, 250);
        assert!(!ledger.may_walk(start), "rate-limited right after a walk");
        assert!(ledger.may_walk(start + REWALK_AFTER));
    }

    #[test]
    fn jobs_ending_during_a_walk_are_not_lost() {
        let mut ledger = Ledger::default();
        assert!(ledger.try_charge(300, 1000));
        let at_start = ledger.ended_total;
        // The job ends while the walk runs; the walk may have missed its file.
        ledger.end_job(300);
        ledger.settle(40, at_start, Instant::now());
        assert_eq!(ledger.settled, 340);
    }

    #[test]
    fn running_jobs_keep_their_charges_across_walks() {
        let mut ledger = Ledger::default();
        assert!(ledger.try_charge(800, 1000));
        // The walk sees nothing (the job unlinked its file but holds it open).
        ledger.settle(0, ledger.ended_total, Instant::now());
        assert!(!ledger.try_charge(300, 1000));
    }

    #[test]
    fn a_delete_allows_an_early_walk() {
        let now = Instant::now();
        let mut ledger = Ledger::default();
        ledger.settle(0, 0, now);
        assert!(!ledger.may_walk(now));
        ledger.freed = true;
        assert!(ledger.may_walk(now));
    }

    #[test]
    fn usage_counts_blocks_and_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = usage(&[dir.path().to_path_buf()]).expect("usage");
        assert!(empty >= ENTRY_BYTES, "the directory itself counts");
        std::fs::write(dir.path().join("a"), vec![1u8; 100_000]).expect("write");
        std::fs::write(dir.path().join("empty"), b"").expect("write");
        let used = usage(&[dir.path().to_path_buf()]).expect("usage");
        assert!(used >= empty + 100_000 + ENTRY_BYTES, "{used}");
        assert!(used <= empty + 100_000 + 3 * ENTRY_BYTES, "{used}");
    }

    #[test]
    fn a_job_is_refused_past_the_budget_and_its_charges_settle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let budget = Arc::new(DiskBudget::measure("p", vec![dir.path().to_path_buf()], 64 << 10).expect("budget"));
        let base = budget.used();
        let job = JobDisk::new(budget.clone());
        assert!(job.charge(16 << 10));
        assert!(!job.charge(64 << 10));
        assert!(job.note().is_some_and(|n| n.contains("limits.disk")));
        drop(job);
        assert_eq!(budget.used(), base + (16 << 10));
    }
}
