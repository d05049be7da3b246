//! `wasmjobs build --watch DIR`: build, then build again after each change
//! to the plugin's sources, until Ctrl-C.
//!
//! Changes are seen through the operating system's file events (inotify on
//! Linux, via `notify`), and a build starts once the directory has been
//! quiet for [`QUIET`], so an editor's save (often several writes and a
//! rename) is one build. What decides whether to build is not the event
//! but the sources themselves: a fingerprint of every source file's path,
//! size and modification time ([`fingerprint`], leaving out build output
//! and caches, as the build's staging does, and hidden files such as an
//! editor's swap files and the build's own temporary component). So the
//! component a build writes into the directory, or a `__pycache__` a tool
//! leaves, never starts another build, and an edit made during a build is
//! built next. A failed build prints its error and waits for the next
//! change: the last good component stays in place, and a runner watching
//! the plugins directory keeps running it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use notify::{RecursiveMode, Watcher};

/// How long the directory must be quiet before a build starts.
const QUIET: Duration = Duration::from_millis(300);

/// Each source file's size and modification time, by path.
type Fingerprint = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

/// The sources of the plugin in `dir`, as a [`Fingerprint`].
fn fingerprint(dir: &Path) -> Fingerprint {
    super::sources::visible_sources(dir)
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path().to_path_buf(), (meta.len(), meta.modified().ok())))
        })
        .collect()
}

/// Builds with `build` now and after each change to the sources in `dir`.
pub(super) fn watch(dir: &Path, mut build: impl FnMut() -> Result<()>) -> Result<ExitCode> {
    let (events, changes) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = events.send(event.is_ok());
    })
    .context("cannot watch the plugin directory")?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .with_context(|| format!("cannot watch {}", dir.display()))?;
    let mut built = fingerprint(dir);
    report(build());
    loop {
        println!("watching {} for changes (Ctrl-C to stop)", dir.display());
        loop {
            changes.recv().context("the file watcher stopped")?;
            while changes.recv_timeout(QUIET).is_ok() {}
            let now = fingerprint(dir);
            if now != built {
                built = now;
                break;
            }
        }
        report(build());
    }
}

/// Prints a build's failure; the watch goes on.
fn report(result: Result<()>) {
    if let Err(err) = result {
        eprintln!("build failed: {err:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_sees_sources_not_output_caches_or_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.py"), "x = 1\n").unwrap();
        let before = fingerprint(dir.path());
        assert_eq!(before.len(), 1);
        std::fs::write(dir.path().join("greet.wasm"), "component").unwrap();
        std::fs::write(dir.path().join(".greet.wasm.7.tmp"), "half").unwrap();
        std::fs::create_dir(dir.path().join("__pycache__")).unwrap();
        std::fs::write(dir.path().join("__pycache__/app.pyc"), "cached").unwrap();
        std::fs::write(dir.path().join(".app.py.swp"), "editor").unwrap();
        assert_eq!(fingerprint(dir.path()), before, "no source changed");
        std::fs::write(dir.path().join("app.py"), "x = 22\n").unwrap();
        assert_ne!(fingerprint(dir.path()), before, "an edit is a change");
    }
}
