//! The first run a newcomer sees (`scripts/demo.sh`): `wasmjobs plugins`,
//! then `exec` and `run` on the same data directory. Every command must
//! reuse the one compiled artifact per component that the first compiled,
//! and the run summary must report start-up apart from the time spent
//! fetching jobs. Real processes, a fresh data directory, real Redis.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmjobs::plugin::cache::sha256_hex;
use wasmjobs_e2e::assert_success;
use wasmjobs_e2e::cli::wasmjobs_in;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{plugins, push};

/// Runs `wasmjobs --data-dir DATA ARGS...` to completion (at most `timeout`).
fn wasmjobs(data_dir: &Path, args: &[&str], timeout: Duration) -> Output {
    let data_dir = data_dir.to_str().expect("utf-8 path");
    let args: Vec<&str> = ["--data-dir", data_dir]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let cwd = std::env::current_dir().expect("current directory");
    wasmjobs_in(&cwd, &args, &[("RUST_LOG", "info")], timeout)
}

/// The SHA-256 of every component under `plugins`.
fn component_hashes(plugins: &Path) -> BTreeSet<String> {
    let mut hashes = BTreeSet::new();
    for plugin in std::fs::read_dir(plugins).expect("read plugins") {
        for file in std::fs::read_dir(plugin.expect("entry").path()).expect("read plugin") {
            let path = file.expect("entry").path();
            if path.extension().is_some_and(|e| e == "wasm") {
                hashes.insert(sha256_hex(&std::fs::read(&path).expect("read component")));
            }
        }
    }
    hashes
}

/// The artifacts in the compile cache under `data_dir`.
fn artifacts(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("cache"))
        .expect("the cache directory exists")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".cwasm"))
        .collect();
    names.sort();
    names
}

/// Runs `wasmjobs run` on the jobs already queued until the queues are
/// empty; returns its summary JSON and its output.
fn run_until_empty(data_dir: &Path, redis: &TestRedis, plugins: &Path) -> (Value, Output) {
    let summary = data_dir.join("summary.json");
    let run = wasmjobs(
        data_dir,
        &[
            "run",
            "--redis",
            &redis.url(),
            "--plugins",
            plugins.to_str().expect("utf-8 path"),
            "--exit-when-empty",
            "--summary-json",
            summary.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(120),
    );
    assert_success(&run, "wasmjobs run");
    let json = std::fs::read_to_string(&summary).expect("summary written");
    (serde_json::from_str(&json).expect("summary JSON"), run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_compiled_artifact_per_component_across_plugins_exec_and_run() {
    let dir = plugins(&["noop", "echo", "fib"], &[]);
    let data = tempfile::tempdir().expect("tempdir");
    let plugins_dir = dir.path().to_str().expect("utf-8 path");
    let components = component_hashes(dir.path());
    assert_eq!(components.len(), 3);

    let listing = wasmjobs(
        data.path(),
        &["plugins", "--plugins", plugins_dir],
        Duration::from_secs(120),
    );
    assert_success(&listing, "wasmjobs plugins");
    let exec = wasmjobs(
        data.path(),
        &["exec", "--plugins", plugins_dir, "FibJob", "[10]"],
        Duration::from_secs(120),
    );
    assert_success(&exec, "wasmjobs exec");
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    push(&mut conn, "NoopJob", "default", vec![json!([]); 20]).await;
    push(&mut conn, "EchoJob", "default", vec![json!(["hi"]); 5]).await;
    let (summary, _) = run_until_empty(data.path(), &redis, dir.path());
    assert_eq!(summary["processed"], 25, "{summary:#}");

    let cached = artifacts(data.path());
    let cached_components: BTreeSet<String> = cached
        .iter()
        .map(|name| name.split('-').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        cached.len(),
        components.len(),
        "one artifact per component after plugins, exec and run; the cache holds {cached:#?}"
    );
    assert_eq!(cached_components, components, "{cached:#?}");
    // And the later commands loaded what `plugins` compiled.
    let listing_again = wasmjobs(
        data.path(),
        &["plugins", "--plugins", plugins_dir],
        Duration::from_secs(120),
    );
    assert_success(&listing_again, "wasmjobs plugins (again)");
    let listing = String::from_utf8_lossy(&listing_again.stdout);
    assert_eq!(listing.matches("cached in").count(), 3, "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_reports_start_up_apart_from_the_time_spent_on_jobs() {
    let dir = plugins(&["noop", "echo", "fib"], &[]);
    // A fresh data directory: start-up includes compiling every component.
    let data = tempfile::tempdir().expect("tempdir");
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    push(&mut conn, "NoopJob", "default", vec![json!([]); 200]).await;
    let started = Instant::now();
    let (summary, run) = run_until_empty(data.path(), &redis, dir.path());
    let elapsed = started.elapsed().as_secs_f64();

    assert_eq!(summary["processed"], 200, "{summary:#}");
    let startup = summary["startup_secs"]
        .as_f64()
        .unwrap_or_else(|| panic!("no startup_secs: {summary:#}"));
    let wall = summary["wall_secs"].as_f64().expect("wall_secs");
    assert!(startup > 0.0 && wall > 0.0, "{summary:#}");
    // The two are apart: together no longer than the process lived.
    assert!(
        startup + wall <= elapsed,
        "start-up {startup} s + jobs {wall} s > {elapsed} s lived"
    );
    let rate = summary["jobs_per_sec"].as_f64().expect("jobs_per_sec");
    assert!(
        (rate - 200.0 / wall).abs() <= 0.01 * rate,
        "jobs/s {rate} is not over the time spent fetching ({wall} s)"
    );
    // The busy window (first job taken → last outcome written) lies
    // within the time spent fetching, and its rate is over it.
    let busy = summary["busy_secs"].as_f64().expect("busy_secs");
    assert!(busy > 0.0 && busy <= wall, "busy {busy} s, fetching {wall} s");
    let busy_rate = summary["busy_jobs_per_sec"].as_f64().expect("busy_jobs_per_sec");
    assert!(
        (busy_rate - 200.0 / busy).abs() <= 0.01 * busy_rate,
        "busy jobs/s {busy_rate} is not over the busy window ({busy} s)"
    );
    let table = String::from_utf8_lossy(&run.stderr);
    let line = table
        .lines()
        .find(|line| line.starts_with("Start-up"))
        .unwrap_or_else(|| panic!("no start-up line in the summary:\n{table}"));
    assert!(line.contains(" s "), "{line}");
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("Jobs ") && line.contains("(busy ") && line.contains("jobs/s)")),
        "no rate over the busy window in the summary:\n{table}"
    );
    assert!(table.contains("MiB at peak"), "{table}");
}

/// What `wasmjobs exec` of one failing job of `class` in a copy of the
/// plugin `plugin` printed (it must have failed).
fn failed_exec(plugin: &str, from_tests: bool, class: &str, args: &str) -> String {
    let data = tempfile::tempdir().expect("data dir");
    let dir = if from_tests {
        plugins(&[], &[plugin])
    } else {
        plugins(&[plugin], &[])
    };
    let plugins_dir = dir.path().to_str().expect("UTF-8 path");
    let exec = wasmjobs(
        data.path(),
        &["exec", "--plugins", plugins_dir, class, args],
        Duration::from_secs(300),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&exec.stdout),
        String::from_utf8_lossy(&exec.stderr)
    );
    assert!(!exec.status.success(), "{text}");
    text
}

/// A job that opens a path its plugin was not granted fails with a message
/// that names the path and the `[[files]]` grant that would allow it (the
/// guest itself only sees WASI's "No such file or directory").
#[test]
fn a_file_outside_the_grants_is_named_with_the_grant_that_would_allow_it() {
    let text = failed_exec("chaos", true, "ChaosJob", r#"["read", "/etc/passwd"]"#);
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(text.contains("/etc/passwd is not granted"), "{text}");
    assert!(text.contains("may use only /data (rw)"), "{text}");
    assert!(text.contains("add a [[files]] grant for /etc"), "{text}");
}

/// A JavaScript job whose `fetch` is refused by `http.allow` sees only a
/// network error; its failure names the host and the rule that grants it.
#[test]
fn a_denied_host_is_named_with_the_rule_that_would_allow_it_whatever_the_sdk() {
    let text = failed_exec(
        "js-http-get",
        false,
        "JsHttpGetJob",
        r#"["http://example.invalid:81/x"]"#,
    );
    assert!(text.contains("the request to example.invalid:81 was denied"), "{text}");
    assert!(text.contains("add \"example.invalid:81\" to [http] allow"), "{text}");
}
