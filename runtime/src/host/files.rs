//! `wasi:filesystem`: the directories a manifest grants, and nothing else.
//!
//! wasmtime-wasi resolves every guest path relative to a preopened directory
//! handle with `openat`-style calls (cap-std), so `..`, absolute paths and
//! symlinks cannot leave a preopen. This module adds the checks that belong
//! to the host, run once when a plugin loads ([`check`]):
//!
//! - A granted directory must exist (read-write ones are created), and after
//!   resolving symlinks it must still lie inside the plugin root (unless the
//!   manifest says `outside = true`), so a `data -> /etc` symlink dropped
//!   beside a manifest grants nothing.
//! - A read-write grant may not reach what decides the runner's behaviour:
//!   the plugin directory itself, its manifest or component (the reloader
//!   would apply whatever a job writes there), the plugins directory or
//!   another plugin's directory, the compile cache (its artifacts are
//!   loaded as native code), and the runner's data directory (the cache's
//!   parent, `--data-dir`): a grant may not contain it, nor lie in it
//!   unless it also lies in the plugins directory kept there.
//! - Grants may not overlap (one inside another, or the same directory
//!   twice): a guest could otherwise rename a read-only grant away inside a
//!   read-write one.
//! - Each granted directory is opened **once**, here, as a handle
//!   ([`Handles`]), walking its canonical path from `/` one component at a
//!   time with `O_NOFOLLOW`, so a symlink swapped in between the check and
//!   the open fails the load. Every job then gets the directory through
//!   `/proc/self/fd/<n>` ([`preopen`]), a magic link the kernel resolves to
//!   the very inode the handle holds. Renaming the directory away and
//!   putting a symlink in its place changes nothing for later jobs: they
//!   keep seeing the directory that was checked. (wasmtime-wasi 48's
//!   `WasiCtxBuilder::preopened_dir` only takes a path; this is how a path
//!   names a handle.) Linux only, and `/proc` must be mounted.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// One directory made visible to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    /// The host directory (absolute, inside the plugin root).
    pub host: PathBuf,
    /// The path the guest sees (absolute, e.g. `/data`).
    pub guest: String,
    /// Read-only or read-write.
    pub mode: Mode,
    /// Explicitly granted although outside the plugin directory.
    pub outside: bool,
}

/// Access mode of a preopened directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Mode {
    /// The guest may list and read, never create, write or delete.
    #[serde(rename = "ro")]
    ReadOnly,
    /// The guest may also create, write and delete inside the directory.
    #[serde(rename = "rw")]
    ReadWrite,
}

/// What this capability needs of a plugin's manifest: its `files` grants,
/// and where the manifest, the plugin directory and the component are
/// (a read-write grant must keep clear of them; errors name the manifest).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileGrants<'a> {
    pub(crate) manifest: &'a Path,
    pub(crate) root: &'a Path,
    pub(crate) component: &'a Path,
    pub(crate) files: &'a [Preopen],
}

/// The granted directories of one loaded plugin, opened once at load, in
/// the manifest's `files` order. Cheap to clone; the handles close when the
/// last clone (the last job of that plugin version) is gone.
#[derive(Debug, Clone, Default)]
pub struct Handles(Option<Arc<[OwnedFd]>>);

/// What the runner must keep out of every read-write grant, besides the
/// plugin's own directory and files.
#[derive(Debug, Clone, Default)]
pub(crate) struct Protected {
    /// The plugins directory the catalog scans.
    pub(crate) plugins: Option<PathBuf>,
    /// The compile cache's directory; its parent is the runner's data
    /// directory (`<data-dir>/cache`).
    pub(crate) cache: Option<PathBuf>,
}

/// One grant, resolved.
struct Resolved<'a> {
    real: PathBuf,
    guest: &'a str,
    host: &'a Path,
    mode: Mode,
}

/// Checks (and for `rw`, creates) the manifest's preopened directories and
/// opens each once. Run once when a plugin loads.
pub(crate) fn check(manifest: FileGrants<'_>, protected: &Protected) -> Result<Handles> {
    let display = manifest.manifest.display();
    let root = manifest
        .root
        .canonicalize()
        .with_context(|| format!("{display}: cannot resolve plugin directory"))?;
    let mut resolved = Vec::new();
    for preopen in manifest.files {
        if preopen.mode == Mode::ReadWrite && !preopen.host.exists() {
            std::fs::create_dir_all(&preopen.host).with_context(|| {
                format!(
                    "{display}: cannot create {} for {}",
                    preopen.host.display(),
                    preopen.guest
                )
            })?;
        }
        let real = preopen
            .host
            .canonicalize()
            .with_context(|| format!("{display}: granted directory {} is missing", preopen.host.display()))?;
        if !real.is_dir() {
            bail!("{display}: granted path {} is not a directory", preopen.host.display());
        }
        if !preopen.outside && !real.starts_with(&root) {
            bail!(
                "{display}: granted directory {} resolves to {}, outside the plugin directory",
                preopen.host.display(),
                real.display()
            );
        }
        resolved.push(Resolved {
            real,
            guest: &preopen.guest,
            host: &preopen.host,
            mode: preopen.mode,
        });
    }
    refuse_overlaps(manifest, &resolved)?;
    let guarded = Guarded::new(manifest, &root, protected)?;
    for grant in resolved.iter().filter(|g| g.mode == Mode::ReadWrite) {
        guarded.check(grant).with_context(|| {
            format!(
                "{display}: files: the read-write grant {} ({} for {})",
                grant.host.display(),
                grant.real.display(),
                grant.guest
            )
        })?;
    }
    let handles = resolved
        .iter()
        .map(|grant| {
            open_no_follow(&grant.real).with_context(|| {
                format!(
                    "{display}: cannot open granted directory {} for {}",
                    grant.real.display(),
                    grant.guest
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Handles(Some(handles.into())))
}

/// Refuses two grants of which one contains (or is) the other.
fn refuse_overlaps(manifest: FileGrants<'_>, resolved: &[Resolved<'_>]) -> Result<()> {
    for (i, a) in resolved.iter().enumerate() {
        for b in &resolved[i + 1..] {
            if a.real.starts_with(&b.real) || b.real.starts_with(&a.real) {
                bail!(
                    "{}: files: the grants for {} ({}) and {} ({}) overlap; grant directories that do not contain one another",
                    manifest.manifest.display(),
                    a.guest,
                    a.real.display(),
                    b.guest,
                    b.real.display()
                );
            }
        }
    }
    Ok(())
}

/// The paths a read-write grant must keep clear of, canonical.
struct Guarded {
    root: PathBuf,
    /// Files and directories a rw grant may not contain, with what they are.
    contained: Vec<(PathBuf, &'static str)>,
    /// Directories a rw grant may be neither inside nor around.
    trees: Vec<(PathBuf, &'static str)>,
    plugins: Option<PathBuf>,
    /// The runner's data directory: a rw grant may not be inside it,
    /// except inside the plugins directory when that lies in it.
    data: Option<PathBuf>,
}

impl Guarded {
    fn new(manifest: FileGrants<'_>, root: &Path, protected: &Protected) -> Result<Self> {
        let display = manifest.manifest.display();
        let mut contained = vec![(root.to_path_buf(), "the plugin directory")];
        let manifest_real = manifest
            .manifest
            .canonicalize()
            .with_context(|| format!("{display}: cannot resolve the manifest"))?;
        contained.push((manifest_real, "the plugin's manifest"));
        let component_real = manifest
            .component
            .canonicalize()
            .with_context(|| format!("{display}: cannot resolve component {}", manifest.component.display()))?;
        contained.push((component_real, "the plugin's component"));
        let plugins = match &protected.plugins {
            Some(dir) => Some(
                dir.canonicalize()
                    .with_context(|| format!("cannot resolve plugins directory {}", dir.display()))?,
            ),
            None => None,
        };
        if let Some(plugins) = &plugins {
            contained.push((plugins.clone(), "the plugins directory"));
        }
        let mut trees = Vec::new();
        let mut data = None;
        if let Some(cache) = &protected.cache {
            let cache = resolve_existing_prefix(cache)?;
            trees.push((cache.clone(), "the compile cache"));
            if let Some(dir) = cache.parent().filter(|p| p.parent().is_some()) {
                contained.push((dir.to_path_buf(), "the runner's data directory"));
                data = Some(dir.to_path_buf());
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            contained,
            trees,
            plugins,
            data,
        })
    }

    fn check(&self, grant: &Resolved<'_>) -> Result<()> {
        let real = &grant.real;
        for (path, what) in &self.trees {
            if real.starts_with(path) || path.starts_with(real) {
                bail!(
                    "reaches {what} ({}): a job could rewrite the runner's state",
                    path.display()
                );
            }
        }
        for (path, what) in &self.contained {
            if path.starts_with(real) {
                bail!(
                    "contains {what} ({}): a job could rewrite what the runner loads; grant it read-only, or a subdirectory",
                    path.display()
                );
            }
        }
        if let Some(data) = &self.data
            && real.starts_with(data)
            && !self.plugins.as_ref().is_some_and(|plugins| real.starts_with(plugins))
        {
            bail!(
                "lies in the runner's data directory {} (the compile cache's parent, with the runner's other state)",
                data.display()
            );
        }
        if let Some(plugins) = &self.plugins
            && real.starts_with(plugins)
            && !real.starts_with(&self.root)
        {
            bail!(
                "lies in the plugins directory {} but outside this plugin's directory: it is (or may become) another plugin's",
                plugins.display()
            );
        }
        Ok(())
    }
}

/// `path` canonicalized as far as it exists, with the missing rest appended
/// (the compile cache is created on first use).
fn resolve_existing_prefix(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))?;
    let mut missing = Vec::new();
    let mut existing = absolute.as_path();
    loop {
        match existing.canonicalize() {
            Ok(real) => return Ok(missing.iter().rev().fold(real, |p, name| p.join(name))),
            Err(_) => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    bail!("cannot resolve {}", path.display());
                };
                missing.push(name.to_owned());
                existing = parent;
            }
        }
    }
}

/// Opens directory `real` (absolute, canonical) as an `O_PATH` handle,
/// walking from `/` one component at a time without following symlinks,
/// so the handle is the directory that `real` named when it was checked,
/// or the open fails.
///
/// `O_PATH` rather than cap-std's `Dir::open_dir_nofollow` (which opens
/// each step for reading): a directory on the way that the runner may
/// only traverse (`0711`, as home directories often are) must not fail
/// the walk. rustix's `openat` is the system call cap-std itself makes.
fn open_no_follow(real: &Path) -> Result<OwnedFd> {
    use rustix::fs::{CWD, Mode, OFlags, openat};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = openat(CWD, "/", flags, Mode::empty()).context("cannot open /")?;
    for component in real.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => {
                dir = openat(&dir, name, flags, Mode::empty())
                    .with_context(|| format!("{:?} (a symlink or not a directory?)", name))?;
            }
            other => bail!("{} is not canonical ({other:?})", real.display()),
        }
    }
    Ok(dir)
}

/// Adds the granted directories `files` to a job's WASI context: each as
/// its handle opened at load, never by its host path again (`manifest`
/// names the grants in an error).
pub(crate) fn preopen(
    builder: &mut WasiCtxBuilder,
    manifest: &Path,
    files: &[Preopen],
    handles: &Handles,
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let Some(handles) = handles.0.as_deref().filter(|h| h.len() == files.len()) else {
        bail!(
            "{}: the granted directories were not opened when the plugin loaded",
            manifest.display()
        );
    };
    for (preopen, handle) in files.iter().zip(handles) {
        let perms = match preopen.mode {
            Mode::ReadOnly => FsPerms::ReadOnly,
            Mode::ReadWrite => FsPerms::ReadWrite,
        };
        builder
            .preopened_dir(format!("/proc/self/fd/{}", handle.as_raw_fd()), &preopen.guest, perms)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot open {} for {}", preopen.host.display(), preopen.guest))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_refuses_a_symlink_anywhere() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().canonicalize().unwrap();
        std::fs::create_dir_all(real.join("a/b")).unwrap();
        std::os::unix::fs::symlink(real.join("a"), real.join("link")).unwrap();
        assert!(open_no_follow(&real.join("a/b")).is_ok());
        let err = open_no_follow(&real.join("link/b")).unwrap_err();
        assert!(format!("{err:#}").contains("\"link\""), "{err:#}");
        assert!(open_no_follow(&real.join("link")).is_err());
        assert!(open_no_follow(&real.join("a/../a")).is_err());
    }

    #[test]
    fn the_magic_link_follows_the_handle_not_the_name() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("cfg")).unwrap();
        std::fs::write(real.join("cfg/marker"), "original").unwrap();
        let handle = open_no_follow(&real.join("cfg")).unwrap();
        std::fs::rename(real.join("cfg"), real.join("moved")).unwrap();
        std::os::unix::fs::symlink("/", real.join("cfg")).unwrap();
        let through = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
        assert_eq!(std::fs::read_to_string(through.join("marker")).unwrap(), "original");
        assert!(!through.join("etc").exists());
    }

    #[test]
    fn a_missing_tail_is_appended_to_the_existing_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().canonicalize().unwrap();
        assert_eq!(
            resolve_existing_prefix(&tmp.path().join("x/y")).unwrap(),
            real.join("x/y")
        );
    }
}
