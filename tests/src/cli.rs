//! Running a wasmjobs command to completion as a separate process, the way
//! a user types it: in a working directory of their own, with a deadline;
//! and [`Killed`], for one a test leaves running.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::plugins_dir;
use crate::runner::wasmjobs_bin;

/// Runs `wasmjobs ARGS...` in `cwd` with `envs` added to the environment,
/// and waits at most `timeout` for it (then kills it and panics with what
/// it printed). Its stdout and stderr go through files, so a chatty
/// command cannot block on a full pipe.
pub fn wasmjobs_in<K: AsRef<OsStr>, V: AsRef<OsStr>>(
    cwd: &Path,
    args: &[&str],
    envs: &[(K, V)],
    timeout: Duration,
) -> Output {
    command_in(Command::new(wasmjobs_bin()), cwd, args, envs, timeout)
}

/// [`wasmjobs_in`] for any `command` (a wasmjobs binary, or a wrapper that
/// runs one): `args` are added to it.
pub fn command_in<K: AsRef<OsStr>, V: AsRef<OsStr>>(
    mut command: Command,
    cwd: &Path,
    args: &[&str],
    envs: &[(K, V)],
    timeout: Duration,
) -> Output {
    let out = tempfile::tempdir().expect("tempdir");
    let stdout = out.path().join("stdout");
    let stderr = out.path().join("stderr");
    command
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"));
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("start wasmjobs");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "wasmjobs {args:?} did not finish in {timeout:?}:\n{}\n{}",
                std::fs::read_to_string(&stdout).unwrap_or_default(),
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&stdout).expect("read stdout"),
        stderr: std::fs::read(&stderr).expect("read stderr"),
    }
}

/// What a finished command printed, stdout then stderr, as text.
pub fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The environment for `wasmjobs new` / `wasmjobs build` in tests: the
/// toolchains wasmjobs installs on first use are the ones
/// `scripts/build-plugins.sh` installed (`plugins/target`), where Rust
/// plugins then build too (its `target/`), so a second run rebuilds
/// nothing it need not. `CARGO_TARGET_DIR` is removed: the builds use
/// wasmjobs's default.
pub fn toolchain_env() -> Vec<(&'static str, PathBuf)> {
    // plugins_dir() runs the plugin build, which installs the toolchains.
    vec![
        ("WASMJOBS_TOOLCHAINS", plugins_dir().join("target")),
        ("CARGO_TARGET_DIR", PathBuf::new()),
    ]
}

/// A process a test started and leaves running, killed and reaped when
/// dropped: however the test ends, a failed assertion too, nothing it
/// started is left behind.
pub struct Killed(pub Child);

impl std::ops::Deref for Killed {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
