//! Hot reload end to end: a real `wasmjobs run` whose plugins directory
//! changes under it while jobs run.
//!
//! Version 2 of the chaos component is version 1 with its marker bytes
//! (`wasmjobs-marker-v1`) rewritten to `v2`: a different, valid component
//! whose `marked-append` jobs write which version ran them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, jobs_in_progress, lines, plugins, push, wait_processed, zset};

const MARKER_V1: &[u8] = b"wasmjobs-marker-v1";

/// A way to break the deployed plugin.
type BreakIt<'a> = Box<dyn Fn() + 'a>;

/// The chaos component with its marker rewritten to `marker`.
fn chaos_variant(marker: &[u8]) -> Vec<u8> {
    let original =
        std::fs::read(wasmjobs_e2e::test_guests_dir().join("chaos/chaos_job.wasm")).expect("chaos component");
    let at = original
        .windows(MARKER_V1.len())
        .position(|w| w == MARKER_V1)
        .expect("the marker is in the component");
    let mut bytes = original;
    bytes[at..at + marker.len()].copy_from_slice(marker);
    bytes
}

/// Deploys `bytes` as `path` the documented way: write beside, then rename.
fn deploy(path: &Path, bytes: &[u8]) {
    let staging = path.with_extension("wasm.tmp");
    std::fs::write(&staging, bytes).expect("write staging copy");
    std::fs::rename(&staging, path).expect("rename into place");
}

fn component(dir: &Path) -> PathBuf {
    dir.join("chaos/chaos_job.wasm")
}

/// Pushes `count` marked-append jobs numbered from `first`.
async fn push_marked(conn: &mut redis::aio::MultiplexedConnection, file: &str, first: u32, count: u32, sleep_ms: u64) {
    push(
        conn,
        "ChaosJob",
        "default",
        (first..first + count)
            .map(|i| json!(["marked-append", file, i, sleep_ms]))
            .collect(),
    )
    .await;
}

/// Lines of `file` as (marker, job number).
fn marked(path: &Path) -> Vec<(String, u32)> {
    lines(path)
        .iter()
        .map(|line| {
            let (marker, n) = line.split_once(' ').expect("marker and number");
            (marker.to_owned(), n.parse().expect("job number"))
        })
        .collect()
}

async fn wait_lines(path: &Path, count: usize, runner: &Runner) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(path).len() < count {
        assert!(
            Instant::now() < deadline,
            "{} of {count} lines in {}:\n{}",
            lines(path).len(),
            path.display(),
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_in_flight_finish_on_v1_while_later_jobs_run_on_v2() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let file = dir.path().join("chaos/data/swap.txt");
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "2000"]);
    runner.wait_running();

    // 1,000 jobs, each sleeping 3 s in a host call: all in flight on v1.
    push_marked(&mut conn, "swap.txt", 0, 1_000, 3_000).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = jobs_in_progress(&mut conn).await;
        if held == 1_000 {
            break;
        }
        assert!(Instant::now() < deadline, "only {held} in flight:\n{}", runner.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Moved into the in-progress list means handed to the manager within
    // microseconds; leave a margin for a loaded machine.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(lines(&file).is_empty(), "the v1 jobs are still sleeping");

    deploy(&component(dir.path()), &chaos_variant(b"wasmjobs-marker-v2"));
    runner.wait_for_log("plugin replaced", Duration::from_secs(30));
    push_marked(&mut conn, "swap.txt", 1_000, 1_000, 0).await;

    wait_lines(&file, 2_000, &runner).await;
    wait_processed(&mut conn, 2_000, Duration::from_secs(30), || runner.log()).await;
    assert!(runner.stop().success(), "{}", runner.log());
    let done = marked(&file);
    assert_eq!(done.len(), 2_000);
    for (marker, n) in &done {
        let expected = if *n < 1_000 {
            "wasmjobs-marker-v1"
        } else {
            "wasmjobs-marker-v2"
        };
        assert_eq!(marker, expected, "job {n}");
    }
    assert_eq!(
        int(&mut conn, "stat:failed").await,
        0,
        "no job failed because of the reload"
    );
    assert!(!runner.log().contains("refused"), "{}", runner.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_replacements_are_refused_and_v1_keeps_serving() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let file = dir.path().join("chaos/data/kept.txt");
    let manifest = dir.path().join("chaos/wasmjobs.toml");
    let good_manifest = std::fs::read_to_string(&manifest).expect("manifest");
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();

    let not_a_job = std::fs::read(wasmjobs_e2e::test_guests_dir().join("not-a-job/not_a_job.wasm")).expect("not-a-job");
    let attempts: [(&str, BreakIt); 3] = [
        (
            "is not a WebAssembly component",
            Box::new(|| deploy(&component(dir.path()), b"garbage, not wasm")),
        ),
        (
            "not a wasmjobs plugin",
            Box::new(|| deploy(&component(dir.path()), &not_a_job)),
        ),
        (
            "unknown field",
            Box::new(|| {
                let staging = dir.path().join("chaos/wasmjobs.toml.tmp");
                std::fs::write(&staging, format!("{good_manifest}\nsurprise = 1\n")).expect("write");
                std::fs::rename(&staging, &manifest).expect("rename");
            }),
        ),
    ];
    let mut sent = 0;
    for (reason, break_it) in attempts {
        let refusals = runner.log().matches("new version refused").count();
        break_it();
        let deadline = Instant::now() + Duration::from_secs(30);
        while runner.log().matches("new version refused").count() == refusals {
            assert!(Instant::now() < deadline, "not refused ({reason}):\n{}", runner.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let log = runner.log();
        // The message may span lines (a TOML error shows the line).
        let refusal = &log[log.rfind("new version refused").expect("refusal")..];
        assert!(refusal.contains(reason), "{refusal}");
        assert!(refusal.contains("chaos"), "names the plugin: {refusal}");
        // Version 1 still runs jobs.
        push_marked(&mut conn, "kept.txt", sent, 10, 0).await;
        sent += 10;
        wait_lines(&file, sent as usize, &runner).await;
        // Put v1 back for the next attempt.
        deploy(&component(dir.path()), &chaos_variant(MARKER_V1));
        std::fs::write(&manifest, &good_manifest).expect("restore manifest");
    }
    assert!(runner.stop().success(), "{}", runner.log());
    assert!(marked(&file).iter().all(|(m, _)| m == "wasmjobs-marker-v1"));
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
    assert!(
        !runner.log().contains("plugin replaced"),
        "v1 never left:\n{}",
        runner.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_waiting_in_retry_run_once_their_plugin_appears() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    push_marked(&mut conn, "late.txt", 0, 20, 0).await;
    wait_processed(&mut conn, 20, Duration::from_secs(30), || runner.log()).await;
    let waiting = zset(&mut conn, "retry").await;
    assert_eq!(waiting.len(), 20, "unknown class: retried, not dead");
    assert!(
        waiting
            .iter()
            .all(|p| p.str("error_class") == Some("wasmjobs::NoPlugin"))
    );

    // Deploy a whole plugin atomically: staged, then renamed into place.
    wasmjobs_e2e::deploy_plugin(&wasmjobs_e2e::test_guests_dir().join("chaos"), dir.path());
    runner.wait_for_log("plugin added", Duration::from_secs(30));

    // Released at once, not at their backoff time (15 s or more away).
    let added = Instant::now();
    let file = dir.path().join("chaos/data/late.txt");
    wait_lines(&file, 20, &runner).await;
    assert!(added.elapsed() < Duration::from_secs(10), "took {:?}", added.elapsed());
    runner.wait_for_log("enqueued jobs that were waiting for a plugin", Duration::from_secs(5));
    assert!(runner.stop().success(), "{}", runner.log());
    let mut numbers: Vec<u32> = marked(&file).into_iter().map(|(_, n)| n).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..20).collect::<Vec<_>>());
    let retries: u64 = conn.zcard("retry").await.expect("ZCARD");
    assert_eq!(retries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_written_slowly_never_loads_half_written() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();

    // A new plugin: the manifest first, then the component in five chunks
    // over ~1.2 s through one open file, as a slow `cp` would.
    let root = dir.path().join("chaos");
    std::fs::create_dir_all(root.join("data")).expect("plugin dir");
    let source = wasmjobs_e2e::test_guests_dir().join("chaos");
    std::fs::copy(source.join("wasmjobs.toml"), root.join("wasmjobs.toml")).expect("manifest");
    let bytes = std::fs::read(source.join("chaos_job.wasm")).expect("component");
    let mut out = std::fs::File::create(root.join("chaos_job.wasm")).expect("create component");
    for chunk in bytes.chunks(bytes.len().div_ceil(5)) {
        out.write_all(chunk).expect("write chunk");
        out.flush().expect("flush");
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(out);

    runner.wait_for_log("plugin added", Duration::from_secs(30));
    push_marked(&mut conn, "slow.txt", 0, 5, 0).await;
    wait_lines(&root.join("data/slow.txt"), 5, &runner).await;
    assert!(runner.stop().success(), "{}", runner.log());
    let log = runner.log();
    assert!(!log.contains("refused"), "no error for the copy in progress:\n{log}");
    assert_eq!(log.matches("plugin added").count(), 1, "{log}");
    assert!(!log.contains("plugin replaced"), "loaded once, complete:\n{log}");
    assert_eq!(int(&mut conn, "stat:failed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_plugin_sends_its_jobs_to_retry_and_sighup_rescans() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&["noop"], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &[]);
    runner.wait_running();
    let version: String = {
        let processes: Vec<String> = conn.smembers("processes").await.expect("SMEMBERS");
        let info: String = conn.hget(&processes[0], "info").await.expect("HGET info");
        let info: serde_json::Value = serde_json::from_str(&info).expect("info JSON");
        info["plugins"]["chaos"]
            .as_str()
            .expect("chaos version in the heartbeat")
            .to_owned()
    };
    assert_eq!(version.len(), 12);

    std::fs::remove_dir_all(dir.path().join("chaos")).expect("remove plugin");
    runner.wait_for_log("plugin removed", Duration::from_secs(30));
    push_marked(&mut conn, "gone.txt", 0, 3, 0).await;
    wait_processed(&mut conn, 3, Duration::from_secs(30), || runner.log()).await;
    assert_eq!(zset(&mut conn, "retry").await.len(), 3);

    // SIGHUP rescans without waiting for an event.
    runner.signal("HUP");
    runner.wait_for_log("SIGHUP: rescanning", Duration::from_secs(30));
    assert!(runner.stop().success(), "{}", runner.log());
}

/// How the user names the plugins directory on the command line.
enum Named {
    /// `--plugins ./plugins` from the directory holding it (the README's form).
    Relative,
    /// `--plugins ./plugins` where `plugins` is a symlink to a release directory.
    Symlink,
    /// `--plugins .` from inside the plugins directory.
    Dot,
}

/// Hot reload with the plugins directory named as users name it: a
/// relative path, a symlink, `.`. A new plugin moved into place and an
/// edited manifest are both picked up, and the runner says at start which
/// directory it watches (as an absolute path).
async fn reloads_when_named(named: Named) {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let work = tempfile::tempdir().expect("working directory");
    let real = match named {
        Named::Symlink => work.path().join("releases/v1"),
        Named::Relative | Named::Dot => work.path().join("plugins"),
    };
    std::fs::create_dir_all(&real).expect("plugins directory");
    wasmjobs_e2e::copy_plugin(&wasmjobs_e2e::plugins_dir().join("noop"), &real);
    if let Named::Symlink = named {
        std::os::unix::fs::symlink("releases/v1", work.path().join("plugins")).expect("symlink");
    }
    let shown = work.path().join("plugins");
    let (cwd, arg) = match named {
        Named::Relative | Named::Symlink => (work.path().to_path_buf(), "./plugins"),
        Named::Dot => (shown.clone(), "."),
    };
    let mut runner = Runner::start_in(&cwd, &redis.url(), arg, &[]);
    runner.wait_running();

    // A new plugin, staged in a hidden directory and renamed into place.
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(&shown)
        .expect("staging dir");
    wasmjobs_e2e::copy_plugin(&wasmjobs_e2e::test_guests_dir().join("chaos"), staging.path());
    std::fs::rename(staging.path().join("chaos"), shown.join("chaos")).expect("rename plugin dir");
    runner.wait_for_log("plugin added", Duration::from_secs(30));
    push_marked(&mut conn, "relative.txt", 0, 3, 0).await;
    wait_lines(&shown.join("chaos/data/relative.txt"), 3, &runner).await;

    // A manifest edited in place.
    let manifest = shown.join("noop/wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("{text}\n# edited\n")).expect("edit manifest");
    runner.wait_for_log("plugin replaced", Duration::from_secs(30));

    if let Named::Symlink = named {
        // A new release, the symlink re-pointed atomically, then SIGHUP:
        // the new release serves, and is watched from then on.
        let v2 = work.path().join("releases/v2");
        std::fs::create_dir_all(&v2).expect("release v2");
        for plugin in ["noop", "chaos"] {
            wasmjobs_e2e::copy_plugin(&real.join(plugin), &v2);
        }
        std::fs::write(v2.join("noop/wasmjobs.toml"), format!("{text}\n# release 2\n")).expect("v2 manifest");
        let link = work.path().join("plugins.new");
        std::os::unix::fs::symlink("releases/v2", &link).expect("new symlink");
        std::fs::rename(&link, &shown).expect("re-point the symlink");
        let replaced = runner.log().matches("plugin replaced").count();
        runner.signal("HUP");
        wait_for_count(&runner, "plugin replaced", replaced + 1).await;
        std::fs::write(v2.join("noop/wasmjobs.toml"), format!("{text}\n# release 2, edited\n")).expect("edit v2");
        wait_for_count(&runner, "plugin replaced", replaced + 2).await;
    }
    assert!(runner.stop().success(), "{}", runner.log());
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
    let log = runner.log();
    let watching = log
        .lines()
        .find(|l| l.contains("hot reload: watching"))
        .unwrap_or_else(|| panic!("no line saying what is watched:\n{log}"));
    assert!(
        watching.contains(&shown.display().to_string()),
        "names the directory as an absolute path: {watching}"
    );
}

/// Waits until the runner's log holds `needle` `count` times.
async fn wait_for_count(runner: &Runner, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while runner.log().matches(needle).count() < count {
        assert!(
            Instant::now() < deadline,
            "{needle:?} not logged {count} times:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_with_a_relative_plugins_directory() {
    reloads_when_named(Named::Relative).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_with_a_symlinked_plugins_directory() {
    reloads_when_named(Named::Symlink).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_with_dot_from_inside_the_plugins_directory() {
    reloads_when_named(Named::Dot).await;
}
