//! Building the repo's guest components before a test uses them.
//!
//! Shared (by `#[path]`) with the runtime crate's CLI tests. The build runs
//! `scripts/build-plugins.sh` once per test process; it is a no-op cargo
//! build when nothing changed, and copies components into place atomically,
//! so test processes running in parallel are safe.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crate lives one level below the repository root")
        .to_path_buf()
}

/// Builds every guest (example plugins and test guests) once per process.
///
/// Set `WASMJOBS_SKIP_GUEST_BUILD=1` when the script has already run (as
/// `scripts/test.sh` does) to skip even the no-op build.
pub fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        if std::env::var_os("WASMJOBS_SKIP_GUEST_BUILD").is_some() {
            return;
        }
        let script = repo_root().join("scripts/build-plugins.sh");
        let output = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} failed:\n{}\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    });
}

/// `plugins/`, with its components built.
pub fn plugins_dir() -> PathBuf {
    ensure_built();
    repo_root().join("plugins")
}

/// `tests/guests/`, with its components built.
pub fn test_guests_dir() -> PathBuf {
    ensure_built();
    repo_root().join("tests/guests")
}
