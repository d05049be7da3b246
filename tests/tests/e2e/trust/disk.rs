//! Trust tests: disk. A guest with a read-write directory tries to fill the
//! disk: the plugin's `limits.disk` budget must stop it near the budget
//! (during the job, not after it), every job of the plugin shares that
//! budget, deleting files gives the space back, and a filesystem that is
//! really full reaches the guest as an ordinary "no space" error, not a
//! trap or a host panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use wasmjobs::job::Outcome;
use wasmjobs_e2e::{catalog, copy_plugin, executor, messages, run, test_guests_dir};

/// The budget the tests give the chaos guest.
const BUDGET: u64 = 1 << 20;
/// The chaos guest's `fill` writes in chunks of this size: the most a job
/// may have in flight when the budget refuses it.
const CHUNK: u64 = 64 << 10;

/// A private copy of the chaos guest (rw `/data`) with `extra` appended to
/// its manifest; returns the temp dir and the plugin directory.
fn chaos_with(extra: &str) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    wasmjobs_e2e::append_to_manifest(&dir, extra);
    std::fs::create_dir_all(dir.join("data")).expect("data dir");
    (temp, dir)
}

/// The failure message of a job that must have failed retryably.
fn retry_message(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Retry(message) => message,
        other => panic!("expected a retryable failure, got {other:?}"),
    }
}

/// Whether `message` reports ENOSPC: the guest's own error if its libc
/// asks the host for the error code, else the host's note on the job.
fn says_no_space(message: &str) -> bool {
    message.to_lowercase().contains("no space left on device")
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_budget_stops_a_fill_and_comes_back_after_a_delete() {
    let (_temp, dir) = chaos_with("[limits]\ndisk = \"1MiB\"");
    let executor = executor(4);
    let chaos = catalog(&dir, &executor);

    let fill = run(&executor, &chaos, "ChaosJob", r#"["fill", "/data/big", 10485760]"#).await;
    let message = retry_message(&fill.outcome);
    assert!(
        message.starts_with("fill /data/big:") && says_no_space(message) && message.contains("limits.disk"),
        "{message}"
    );
    let held = size(&dir.join("data/big"));
    assert!(
        held <= BUDGET + CHUNK,
        "the guest wrote {held} bytes past a 1 MiB budget"
    );
    assert!(held >= BUDGET / 2, "the budget refused too early: {held} bytes");

    let remove = run(&executor, &chaos, "ChaosJob", r#"["remove", "/data/big"]"#).await;
    assert_eq!(remove.outcome, Outcome::Success, "{:?}", remove.outcome);
    let small = run(&executor, &chaos, "ChaosJob", r#"["fill", "/data/small", 100000]"#).await;
    assert_eq!(
        small.outcome,
        Outcome::Success,
        "the budget did not recover: {:?}",
        small.outcome
    );
    assert!(messages(&small).contains(&"filled 100000 bytes".to_owned()));
    assert_eq!(size(&dir.join("data/small")), 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_jobs_share_the_budget() {
    let (_temp, dir) = chaos_with("[limits]\ndisk = \"1MiB\"");
    let executor = executor(8);
    let chaos = catalog(&dir, &executor);

    // Four jobs of 400,000 bytes at once: any three overflow 1 MiB together.
    let args: Vec<String> = (0..4).map(|i| format!(r#"["fill", "/data/f{i}", 400000]"#)).collect();
    let (a, b, c, d) = tokio::join!(
        run(&executor, &chaos, "ChaosJob", &args[0]),
        run(&executor, &chaos, "ChaosJob", &args[1]),
        run(&executor, &chaos, "ChaosJob", &args[2]),
        run(&executor, &chaos, "ChaosJob", &args[3]),
    );
    let executions = [a, b, c, d];
    let refused: Vec<&str> = executions
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Success => None,
            other => Some(retry_message(other)),
        })
        .collect();
    assert!(!refused.is_empty(), "four 400 kB files fitted in a 1 MiB budget");
    for message in &refused {
        assert!(says_no_space(message), "{message}");
    }
    let total: u64 = (0..4).map(|i| size(&dir.join(format!("data/f{i}")))).sum();
    assert!(
        total <= BUDGET + 4 * CHUNK,
        "jobs together wrote {total} bytes past a 1 MiB budget"
    );
}

/// A 1 MiB tmpfs mounted over a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir)
            .status();
        match status {
            Ok(status) if status.success() => Tmpfs(dir.to_path_buf()),
            other => panic!(
                "this test needs to mount a 1 MiB tmpfs (as root: mount -t tmpfs -o size=1m tmpfs {}) \
                 to fill a real filesystem, and could not: {other:?}",
                dir.display()
            ),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_filesystem_is_a_guest_error_not_a_trap() {
    // No `limits.disk`: the runner's default budget is far above the
    // tmpfs, so the filesystem itself says ENOSPC.
    let (_temp, dir) = chaos_with("");
    let _tmpfs = Tmpfs::mount(&dir.join("data"));
    let executor = executor(4);
    let chaos = catalog(&dir, &executor);

    let fill = run(&executor, &chaos, "ChaosJob", r#"["fill", "/data/big", 10485760]"#).await;
    let message = retry_message(&fill.outcome);
    assert!(
        message.starts_with("fill /data/big:") && says_no_space(message),
        "{message}"
    );
    assert!(fill.backtrace.is_none(), "the guest trapped: {message}");

    // The sandbox and the plugin keep working once space is freed.
    let remove = run(&executor, &chaos, "ChaosJob", r#"["remove", "/data/big"]"#).await;
    assert_eq!(remove.outcome, Outcome::Success, "{:?}", remove.outcome);
    let small = run(&executor, &chaos, "ChaosJob", r#"["fill", "/data/small", 100000]"#).await;
    assert_eq!(small.outcome, Outcome::Success, "{:?}", small.outcome);
}
