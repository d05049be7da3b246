//! What a stopped build leaves behind: nothing.
//!
//! `wasmjobs build` (above all `--watch`, stopped with Ctrl-C or `kill`)
//! may be stopped while a tool runs and while the component is written to
//! a hidden temporary file in the plugin's directory. So a SIGINT or
//! SIGTERM is caught ([`on_stop_remove_temporaries`]): the tools running
//! ([`output`]) are killed and waited for, then the temporary files being
//! written ([`Temporary`]) are removed, and the process exits. A build
//! killed outright (SIGKILL) still takes its tools with it, by the
//! kernel's parent-death signal ([`die_with_us`]).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

/// The temporary files being written now.
static WRITING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The tools running now, by process id.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Runs `command` to its end, killed and waited for if the build is
/// stopped meanwhile, and ended with this process ([`die_with_us`]). Its
/// stdin is null; its stdout and stderr are what the caller set (a
/// pipe's is returned), inherited otherwise.
pub(crate) fn output(command: &mut Command) -> std::io::Result<std::process::Output> {
    let child = die_with_us(command).stdin(std::process::Stdio::null()).spawn()?;
    let pid = child.id();
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner).push(pid);
    let output = child.wait_with_output();
    RUNNING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|p| *p != pid);
    output
}

/// Whether process `pid` is gone or a zombie (it can write nothing more).
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// A temporary file being written; removed from the list (not from the
/// disk) when dropped.
pub(super) struct Temporary(PathBuf);

impl Temporary {
    /// Lists `path` for removal if the build is stopped.
    pub(super) fn register(path: &Path) -> Self {
        WRITING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(path.to_path_buf());
        Temporary(path.to_path_buf())
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        WRITING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|p| p != &self.0);
    }
}

/// Catches SIGINT and SIGTERM on a thread of their own: the tools
/// running ([`output`]) are killed and waited for, then the temporary
/// files being written are removed and the process exits (130 or 143, as
/// a shell reports a process ended by the signal).
pub(super) fn on_stop_remove_temporaries() {
    let spawned = std::thread::Builder::new().name("build-stop".into()).spawn(|| {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        let code = runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
                return None;
            };
            tokio::select! {
                _ = int.recv() => Some(130),
                _ = term.recv() => Some(143),
            }
        });
        let Some(code) = code else { return };
        let tools: Vec<u32> = RUNNING.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for pid in &tools {
            if let Ok(pid) = libc::pid_t::try_from(*pid) {
                // SAFETY: signalling a child this process started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // A killed tool writes nothing more once it is a zombie; wait
        // for that (a moment), so it cannot recreate a file removed below.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !tools.iter().all(|pid| ended(*pid)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for path in WRITING.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let _ = std::fs::remove_file(path);
        }
        eprintln!("build stopped");
        std::process::exit(code);
    });
    if let Err(err) = spawned {
        tracing::debug!("cannot watch for Ctrl-C: {err}");
    }
}

/// Makes the process `command` starts end when this one does (the
/// kernel's parent-death signal, SIGTERM), so a stopped build leaves no
/// componentize-py, node or cargo running.
pub(crate) fn die_with_us(command: &mut Command) -> &mut Command {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and
    // calls only async-signal-safe functions (prctl, getppid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}
