//! On-disk cache of compiled components.
//!
//! Compiling a component with Cranelift costs about a second per megabyte
//! (an 18 MB Python guest takes ~11 s); loading a precompiled artifact takes
//! well under a millisecond. The cache stores `Component::serialize` output
//! as `<component SHA-256>-<engine hash>.cwasm`, so a changed component or
//! engine never picks up a stale artifact. Artifacts are mapped, not read:
//! only the pages a plugin's jobs touch become resident, shared by every
//! process on the machine.
//!
//! What is in the key, and what is not. The engine hash is Wasmtime's
//! `precompile_compatibility_hash`: the Wasmtime version, the target and
//! its CPU features, Cranelift's flags, the enabled wasm features and the
//! code-generation tunables (fuel metering, epoch interruption, memory
//! reservation and guards, copy-on-write images). It does not cover the
//! instance pool's sizes, which follow `--concurrency`, nor the per-job
//! limits (`--memory`, `--job-timeout`, `--disk`, a manifest's `limits`)
//! or HTTP settings: those are enforced at run time by the pool, the store's
//! limiter and the host, never compiled in. wasmjobs builds its engine the
//! same way in every command (`sandbox::engine`): fuel metering, the one
//! setting that would differ, is confined to a second engine used only for
//! plugins that set `limits.fuel`. So `wasmjobs plugins`, `exec` and `run`
//! (at any concurrency) share one artifact per component, and a plugin
//! asking for fuel has its metered variant instead. A first run that lists
//! the plugins compiles them once, and `run` then starts from the cache.
//!
//! A miss is compiled reusing the functions of the plugin's last compile
//! where they did not change (`plugin::function_pack`): editing a Python or
//! JavaScript job recompiles its few changed functions, not the interpreter.
//!
//! Writes go to a temporary file renamed into place, so concurrent processes
//! sharing a cache directory never see a half-written artifact. An artifact
//! that fails to load (truncated, from a foreign build) is recompiled and
//! replaced, never trusted. Every load marks its artifact as used, and
//! every compile removes artifacts unused for a week ([`prune`]): each
//! plugin version and engine build leaves one, and hot reloading makes many.
//!
//! Safety: loading an artifact runs its machine code, so an artifact is only
//! mapped when nobody but the user running wasmjobs could have written it.
//! The cache directory is created `0700`; before each load it must be owned
//! by the runner's (effective) user and not writable by group or others, or
//! the cache is not used at all: the component is compiled in memory, with
//! a warning (once per cache) and [`CacheUse::Untrusted`]. An existing
//! directory's mode is never changed: if it was writable by others, what it
//! holds cannot be trusted anyway. Each artifact is then opened without
//! following symlinks and must be a regular file with the same owner and no
//! group or other write bit; one that is not is recompiled and replaced.
//! The directory check is what makes the path-based map safe: nobody else
//! can swap a file between the check and the mapping.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Result;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::private_files::{open_own, private_dir, replace};
use crate::sandbox::function_cache::Reuse;

/// How long an artifact may go unused before a compile removes it.
pub const UNUSED_FOR: Duration = Duration::from_secs(7 * 86_400);
/// How old a temporary file (an interrupted write) must be to be removed.
const ABANDONED_AFTER: Duration = Duration::from_secs(86_400);

/// Where compiled components are kept, if anywhere.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    /// Whether the untrusted-directory warning was given.
    warned: Arc<AtomicBool>,
}

/// How a component was obtained, for logs and the plugin listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// Loaded from a cached artifact.
    Hit,
    /// Compiled now (and stored, if the cache is enabled).
    Compiled,
    /// Compiled now, in memory only: the cache directory could be written
    /// by someone else, so it is neither read nor written.
    Untrusted,
}

impl CacheUse {
    /// How the code was loaded, as `wasmjobs plugins` and the dashboard say it.
    pub fn label(self) -> &'static str {
        match self {
            CacheUse::Hit => "cached",
            CacheUse::Compiled => "compiled",
            CacheUse::Untrusted => "compiled (cache not private)",
        }
    }
}

impl CompileCache {
    /// A cache in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
            warned: Arc::default(),
        }
    }

    /// No caching: every load compiles.
    pub fn disabled() -> Self {
        Self {
            dir: None,
            warned: Arc::default(),
        }
    }

    /// The cache directory, if enabled.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Compiles `bytes` (a component binary) for `engine`, or loads the cached
    /// artifact. `content_hash` is the SHA-256 of `bytes` in hex; `label`
    /// names the component in the "compiling, first run only" line that a
    /// cache miss logs (target `wasmjobs::compile`, shown by every command).
    pub fn component(
        &self,
        engine: &Engine,
        bytes: &[u8],
        content_hash: &str,
        label: &str,
    ) -> Result<(Component, CacheUse)> {
        let Some(dir) = &self.dir else {
            return Ok((
                Component::new(engine, bytes).map_err(anyhow::Error::from)?,
                CacheUse::Compiled,
            ));
        };
        if let Err(err) = private_dir(dir) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(dir = %dir.display(), "not using the compilation cache, compiling in memory: {err:#}");
            }
            return Ok((
                Component::new(engine, bytes).map_err(anyhow::Error::from)?,
                CacheUse::Untrusted,
            ));
        }
        let path = dir.join(format!("{content_hash}-{:016x}.cwasm", engine_hash(engine)));
        match open_own(&path).map(|file| file.is_some()) {
            Ok(true) => match map(engine, &path) {
                Ok(component) => {
                    mark_used(&path);
                    return Ok((component, CacheUse::Hit));
                }
                Err(err) => tracing::warn!(path = %path.display(), "discarding unusable compiled artifact: {err}"),
            },
            Ok(false) => {}
            Err(err) => tracing::warn!(path = %path.display(), "replacing an untrusted compiled artifact: {err:#}"),
        }
        let pack = dir.join(format!(
            "{}-{:016x}.functions",
            &sha256_hex(label.as_bytes())[..16],
            engine_hash(engine)
        ));
        // A pack is left by an earlier version's compile: this is not the
        // first run, only the first of this version.
        let first = !pack.exists();
        tracing::info!(target: "wasmjobs::compile", "{}", compiling_notice(label, bytes.len(), first));
        let started = std::time::Instant::now();
        let (component, reuse) = super::function_pack::compile(engine, bytes, &pack, label)?;
        tracing::info!(
            target: "wasmjobs::compile",
            "compiled {label} in {:.1} s{}; cached in {}",
            started.elapsed().as_secs_f64(),
            reused_note(reuse),
            dir.display()
        );
        if let Err(err) = store(dir, &path, &component) {
            tracing::warn!(dir = %dir.display(), "cannot write the compilation cache: {err:#}");
            return Ok((component, CacheUse::Compiled));
        }
        // The cache grows only here, so this is where it is trimmed.
        prune(dir, SystemTime::now());
        // Serve the stored artifact rather than the freshly compiled copy,
        // whose code and data images are anonymous memory resident in full.
        match map(engine, &path) {
            Ok(mapped) => Ok((mapped, CacheUse::Compiled)),
            Err(err) => {
                tracing::warn!(path = %path.display(), "cannot map the artifact just written: {err}");
                Ok((component, CacheUse::Compiled))
            }
        }
    }
}

/// What a cache miss says before compiling `len` bytes: that this happens
/// once (on the `first` compile of the component; for a new version of
/// it, once per version), and roughly how long it takes when that is long
/// enough to wonder (Cranelift compiles ~3 MB of component a second on a
/// 2-core machine).
fn compiling_notice(label: &str, len: usize, first: bool) -> String {
    let mb = len as f64 / 1e6;
    let seconds = (mb / 3.0).round();
    let once = if first {
        "first run only"
    } else {
        "once for this version"
    };
    if seconds >= 2.0 {
        format!("compiling {label} ({mb:.0} MB) for this machine, {once}, ~{seconds} s")
    } else {
        format!("compiling {label} for this machine, {once}")
    }
}

/// How much of a compile its last version's functions saved, when any did.
fn reused_note(reuse: Reuse) -> String {
    if reuse.reused == 0 {
        return String::new();
    }
    format!(
        ", reusing {} of {} functions from its last compile",
        reuse.reused,
        reuse.reused + reuse.compiled
    )
}

/// Maps a cached artifact instead of reading it into memory: its pages are
/// loaded on first touch, so a plugin that never runs costs little more
/// than its metadata (the six Python/JS examples made a runner hold ~330 MB
/// when read in), and every process on the machine shares one copy in the
/// page cache.
fn map(engine: &Engine, path: &Path) -> Result<Component> {
    // SAFETY: the artifact was written by `Component::serialize` into the
    // runner's own cache directory, checked private along with the file
    // itself before this call (see the module docs), and its header is
    // checked against this engine by `deserialize_file`. A mapped file must
    // not be changed while in use (a truncation would fault the process):
    // wasmjobs only ever replaces artifacts by renaming a new file over them,
    // which leaves existing mappings on the old file; anyone able to rewrite
    // one in place could as well plant machine code in it.
    unsafe { Component::deserialize_file(engine, path) }.map_err(anyhow::Error::from)
}

/// Records that an artifact is in use (its modification time), so
/// [`prune`] keeps it.
fn mark_used(path: &Path) {
    let touched = std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|file| file.set_modified(SystemTime::now()));
    if let Err(err) = touched {
        tracing::debug!(path = %path.display(), "cannot mark the artifact as used: {err}");
    }
}

/// Removes artifacts no load has used for [`UNUSED_FOR`] (every deploy of
/// a plugin leaves one, ~40 MB for a Python guest), function packs no
/// compile has rewritten for as long, and temporary files a
/// crash left behind mid-write. Deleting an artifact that another process
/// has mapped is safe: its mapping keeps the old file; that process
/// compiles again only on its next start. Errors are logged, never fatal.
pub fn prune(dir: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let limit = if name.ends_with(".cwasm") || name.ends_with(".functions") {
            UNUSED_FOR
        } else if name.starts_with(".tmp") {
            ABANDONED_AFTER
        } else {
            continue;
        };
        let age = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok());
        if age.is_some_and(|age| age > limit) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(file = %entry.path().display(), "pruned the compilation cache: untouched for over {} day(s)", limit.as_secs() / 86_400)
                }
                Err(err) => tracing::warn!(file = %entry.path().display(), "cannot prune the compilation cache: {err}"),
            }
        }
    }
}

/// Writes the artifact through a temporary file (created `0600`) renamed
/// over `path`; the directory was made or checked by [`private_dir`].
fn store(dir: &Path, path: &Path, component: &Component) -> Result<()> {
    let artifact = component.serialize().map_err(anyhow::Error::from)?;
    replace(dir, path, &artifact)
}

/// A stable digest of everything in the engine that affects compiled code.
fn engine_hash(engine: &Engine) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::engine::{self, EngineConfig, Limits};

    #[test]
    fn every_command_compiles_for_the_same_engine_hash_and_fuel_has_its_own() {
        // `plugins` (concurrency 1, caps as high as they go), `exec` and
        // `run` (any concurrency, limits, fuel allowed or not).
        let listing = EngineConfig {
            concurrency: 1,
            fuel: true,
            limits: Limits {
                memory: engine::MAX_MEMORY,
                timeout: Duration::MAX,
            },
            disk: u64::MAX,
            ..EngineConfig::default()
        };
        let runner = EngineConfig {
            concurrency: 1_000,
            limits: Limits {
                memory: 16 << 20,
                timeout: Duration::from_secs(1),
            },
            ..EngineConfig::default()
        };
        let plain = engine_hash(&engine::build(&listing).expect("engine"));
        assert_eq!(plain, engine_hash(&engine::build(&runner).expect("engine")));
        assert_eq!(
            plain,
            engine_hash(&engine::build(&EngineConfig::default()).expect("engine"))
        );
        let metered = engine_hash(&engine::build_metered().expect("metered engine"));
        assert_ne!(
            plain, metered,
            "fuel metering is compiled in, so it needs its own artifact"
        );
    }
}
