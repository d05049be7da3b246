//! `wasi:filesystem`: the directories a manifest grants, and nothing else.
//!
//! wasmtime-wasi resolves every guest path relative to a preopened directory
//! handle with `openat`-style calls (cap-std), so `..`, absolute paths and
//! symlinks cannot leave a preopen. This module adds the checks that belong
//! to the host: a granted directory must exist (read-write ones are created),
//! and after resolving symlinks it must still lie inside the plugin root
//! (unless the manifest says `outside = true`), so a `data -> /etc` symlink
//! dropped beside a manifest grants nothing.

use anyhow::{Context, Result, bail};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::plugin::manifest::{Manifest, Mode};

/// Checks (and for `rw`, creates) the manifest's preopened directories.
/// Run once when a plugin loads.
pub fn check(manifest: &Manifest) -> Result<()> {
    let root = manifest
        .root
        .canonicalize()
        .with_context(|| format!("{}: cannot resolve plugin directory", manifest.path.display()))?;
    for preopen in &manifest.files {
        if preopen.mode == Mode::ReadWrite && !preopen.host.exists() {
            std::fs::create_dir_all(&preopen.host).with_context(|| {
                format!(
                    "{}: cannot create {} for {}",
                    manifest.path.display(),
                    preopen.host.display(),
                    preopen.guest
                )
            })?;
        }
        let real = preopen.host.canonicalize().with_context(|| {
            format!(
                "{}: granted directory {} is missing",
                manifest.path.display(),
                preopen.host.display()
            )
        })?;
        if !real.is_dir() {
            bail!(
                "{}: granted path {} is not a directory",
                manifest.path.display(),
                preopen.host.display()
            );
        }
        if !preopen.outside && !real.starts_with(&root) {
            bail!(
                "{}: granted directory {} resolves to {}, outside the plugin directory",
                manifest.path.display(),
                preopen.host.display(),
                real.display()
            );
        }
    }
    Ok(())
}

/// Adds the manifest's preopens to a job's WASI context.
pub fn preopen(builder: &mut WasiCtxBuilder, manifest: &Manifest) -> Result<()> {
    for preopen in &manifest.files {
        let perms = match preopen.mode {
            Mode::ReadOnly => FsPerms::ReadOnly,
            Mode::ReadWrite => FsPerms::ReadWrite,
        };
        builder
            .preopened_dir(&preopen.host, &preopen.guest, perms)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot open {} for {}", preopen.host.display(), preopen.guest))?;
    }
    Ok(())
}
