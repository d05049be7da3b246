//! Files of the compile cache that may be trusted: machine code is loaded
//! from the cache (artifacts, function packs), so a file is used only when
//! nobody but the user running wasmjobs could have written it.
//!
//! The cache directory is created `0700` and must be owned by this
//! process's effective user and not writable by group or others
//! ([`private_dir`]); each file is opened without following symlinks and
//! must be a regular file with the same owner and no group or other write
//! bit ([`open_own`]). The directory check is what makes a later open by
//! path safe: nobody else can swap a file in it.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The effective user id of this process.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Whether `meta` is owned by this process's user and not writable by
/// group or others; the error says which is not.
fn private(meta: &std::fs::Metadata) -> Result<()> {
    if meta.uid() != euid() {
        bail!("owned by uid {}, not by this process's uid {}", meta.uid(), euid());
    }
    if meta.mode() & 0o022 != 0 {
        bail!("writable by group or others (mode {:o})", meta.mode() & 0o7777);
    }
    Ok(())
}

/// Creates `dir` (and missing parents) `0700`, or checks that the existing
/// one is a directory only this user can write.
pub(super) fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot inspect {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    private(&meta).with_context(|| format!("{} could hold machine code planted by another user", dir.display()))
}

/// Opens the cache file at `path` for reading (`None` if there is none):
/// an error if it is a symlink, not a regular file, or writable by someone
/// else.
pub(super) fn open_own(path: &Path) -> Result<Option<std::fs::File>> {
    let file = match std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => bail!("it is a symlink"),
        Err(err) => return Err(err).context("cannot open it"),
    };
    let meta = file.metadata().context("cannot inspect it")?;
    if !meta.is_file() {
        bail!("not a regular file");
    }
    private(&meta)?;
    Ok(Some(file))
}

/// Writes `bytes` as the file at `path` in the private directory `dir`,
/// through a temporary file (created `0600`) renamed over it, so no reader
/// ever sees a half-written file.
pub(super) fn replace(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
