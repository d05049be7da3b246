//! Warm instances (`[instances] reuse = N`): a plugin's instance serves up
//! to N jobs one after another, only after clean returns, per loaded
//! version, with every job's host state its own.
//!
//! The chaos guest's `["count"]` logs a module global it increments: 1 on
//! a fresh instance, n on an instance's nth such job.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{Execution, Executor};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::{cache, catalog, copy_plugin, executor, executor_with, messages, run, test_guests_dir};

/// A private copy of the chaos guest with `extra` appended to its manifest.
fn chaos_with(extra: &str) -> tempfile::TempDir {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    wasmjobs_e2e::append_to_manifest(&dir, extra);
    temp
}

/// The `count: N` a job logged.
fn count(job: &Execution) -> u64 {
    assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(job));
    messages(job)
        .iter()
        .find_map(|line| line.strip_prefix("count: ")?.parse().ok())
        .unwrap_or_else(|| panic!("no count in {:?}", messages(job)))
}

async fn counts(executor: &Executor, catalog: &Catalog, n: usize) -> Vec<u64> {
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push(count(&run(executor, catalog, "ChaosJob", r#"["count"]"#).await));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_serves_reuse_jobs_then_is_replaced() {
    let executor = executor(4);
    let dir = chaos_with("[instances]\nreuse = 3");
    let chaos = catalog(dir.path(), &executor);
    let created = executor.instances().created.load(Ordering::Relaxed);
    assert_eq!(counts(&executor, &chaos, 7).await, [1, 2, 3, 1, 2, 3, 1]);
    let instances = executor.instances();
    assert_eq!(
        instances.created.load(Ordering::Relaxed) - created,
        3,
        "three instantiations"
    );
    assert_eq!(
        instances.reused.load(Ordering::Relaxed),
        4,
        "four jobs on a warm instance"
    );
    assert_eq!(instances.idle(), 1, "the last instance waits for the next job");
    assert_eq!(chaos.get("ChaosJob").expect("chaos").loaded.warm.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_every_job_gets_a_fresh_instance() {
    let executor = executor(4);
    let dir = chaos_with("");
    let chaos = catalog(dir.path(), &executor);
    assert_eq!(counts(&executor, &chaos, 3).await, [1, 1, 1]);
    assert_eq!(executor.instances().reused.load(Ordering::Relaxed), 0);
    assert_eq!(executor.instances().idle(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_trapped_or_timed_out_is_never_reused() {
    let executor = executor_with(4, Duration::from_millis(300), 64 << 20);
    let dir = chaos_with("[instances]\nreuse = 100");
    let chaos = catalog(dir.path(), &executor);
    assert_eq!(counts(&executor, &chaos, 2).await, [1, 2]);
    let trapped = run(&executor, &chaos, "ChaosJob", r#"["panic", "boom"]"#).await;
    assert!(matches!(trapped.outcome, Outcome::Retry(_)), "{:?}", trapped.outcome);
    assert_eq!(
        counts(&executor, &chaos, 2).await,
        [1, 2],
        "a fresh instance after the trap"
    );
    let spun = run(&executor, &chaos, "ChaosJob", r#"["loop"]"#).await;
    let Outcome::Retry(message) = &spun.outcome else {
        panic!("{:?}", spun.outcome)
    };
    assert!(message.contains("timed out"), "{message}");
    assert_eq!(
        counts(&executor, &chaos, 1).await,
        [1],
        "a fresh instance after the timeout"
    );
    let failed = run(&executor, &chaos, "ChaosJob", r#"["retry", "later"]"#).await;
    assert!(matches!(failed.outcome, Outcome::Retry(_)));
    assert_eq!(
        counts(&executor, &chaos, 1).await,
        [2],
        "an error the guest returned is a clean return: the instance stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_plugin_does_not_use_the_old_versions_instances() {
    let executor = executor(4);
    let dir = chaos_with("[instances]\nreuse = 100");
    let old = catalog(dir.path(), &executor);
    assert_eq!(counts(&executor, &old, 2).await, [1, 2]);
    let manifest = dir.path().join("chaos/wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("{text}# a new version\n")).expect("edit");
    let (new, _) = old.rescan(&dir.path().join("chaos"), &executor, &cache());
    let (old_version, new_version) = (
        &old.get("ChaosJob").unwrap().version,
        &new.get("ChaosJob").unwrap().version,
    );
    assert_ne!(old_version, new_version, "the edit made a new version");
    let job = run(&executor, &new, "ChaosJob", r#"["count"]"#).await;
    assert_eq!(count(&job), 1, "the new version starts fresh");
    assert_eq!(&*job.plugin_version, new_version.as_str());
    drop(old);
    assert_eq!(counts(&executor, &new, 1).await, [2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_instances_expire_and_are_counted() {
    let executor = executor(4);
    let dir = chaos_with("[instances]\nreuse = 100\nidle_timeout = \"200ms\"");
    let chaos = catalog(dir.path(), &executor);
    assert_eq!(counts(&executor, &chaos, 2).await, [1, 2]);
    assert_eq!(executor.instances().idle(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while executor.instances().idle() > 0 {
        assert!(Instant::now() < deadline, "the idle instance was never dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(executor.instances().expired.load(Ordering::Relaxed), 1);
    assert!(chaos.get("ChaosJob").unwrap().loaded.warm.is_empty());
    assert_eq!(counts(&executor, &chaos, 1).await, [1], "fresh after expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_idle_caps_the_instances_kept() {
    let executor = Arc::new(executor(8));
    let dir = chaos_with("[instances]\nreuse = 100\nmax_idle = 2");
    let chaos = Arc::new(catalog(dir.path(), &executor));
    let mut jobs = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (executor, chaos) = (executor.clone(), chaos.clone());
        jobs.spawn(async move { run(&executor, &chaos, "ChaosJob", r#"["sleep", 100]"#).await });
    }
    while let Some(job) = jobs.join_next().await {
        assert_eq!(job.expect("job").outcome, Outcome::Success);
    }
    assert_eq!(chaos.get("ChaosJob").unwrap().loaded.warm.len(), 2);
    assert_eq!(executor.instances().idle(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_on_a_warm_instance_has_its_own_logs_budget_and_http_limit() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let executor = executor(4);
    let dir = chaos_with("[instances]\nreuse = 100\n\n[limits]\nlog = { lines = 3 }");
    let chaos = catalog(dir.path(), &executor);
    std::fs::write(dir.path().join("chaos/data/hello.txt"), "preopened").expect("data file");

    // The first job spends more than its log budget and holds 101 responses.
    let noisy = run(
        &executor,
        &chaos,
        "ChaosJob",
        r#"["log-lines", 10, "first job's line"]"#,
    )
    .await;
    assert_eq!(noisy.outcome, Outcome::Success);
    assert!(
        messages(&noisy).iter().any(|m| m.contains("dropped 7 log lines")),
        "{:?}",
        messages(&noisy)
    );
    let hold = format!(r#"["http-hold", 101, "{}", "/ok"]"#, server.addr);
    for round in 0..2 {
        let held = run(&executor, &chaos, "ChaosJob", &hold).await;
        assert_eq!(held.outcome, Outcome::Success, "{round}: {:?}", messages(&held));
        assert!(
            messages(&held).contains(&"hold: ok=100 failed=1".to_owned()),
            "round {round}: the per-job limit starts afresh: {:?}",
            messages(&held)
        );
    }

    // The next job on the same instance: a budget and a log of its own.
    let quiet = run(&executor, &chaos, "ChaosJob", r#"["log", "info", "second job's line"]"#).await;
    assert_eq!(
        messages(&quiet),
        ["second job's line"],
        "nothing of the first job's lines"
    );
    let read = run(&executor, &chaos, "ChaosJob", r#"["read", "/data/hello.txt"]"#).await;
    assert_eq!(messages(&read), ["read: preopened"], "the plugin's preopen still there");
    let counted = run(&executor, &chaos, "ChaosJob", r#"["count"]"#).await;
    assert_eq!(
        count(&counted),
        1,
        "all those jobs ran on one instance, counting from here"
    );
    assert_eq!(executor.instances().created.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_instances_serve_jobs_in_turn() {
    for (plugin, class) in [("py-noop", "PyNoopJob"), ("js-noop", "JsNoopJob")] {
        let executor = executor(4);
        let temp = tempfile::tempdir().expect("tempdir");
        let dir = copy_plugin(&wasmjobs_e2e::plugins_dir().join(plugin), temp.path());
        wasmjobs_e2e::append_to_manifest(&dir, "[instances]\nreuse = 100");
        let loaded = catalog(temp.path(), &executor);
        for i in 0..5 {
            let job = run(&executor, &loaded, class, "[]").await;
            assert_eq!(job.outcome, Outcome::Success, "{plugin} job {i}: {:?}", messages(&job));
        }
        let instances = executor.instances();
        assert_eq!(instances.created.load(Ordering::Relaxed), 1, "{plugin}: one instance");
        assert_eq!(instances.reused.load(Ordering::Relaxed), 4, "{plugin}");
    }
}

/// `run --keep-resident 16MiB`: memories are reset in place by copying the
/// image back rather than decommitted, and a fresh instance must still
/// start from the image: a module global is 1 on every job, and Python and
/// JS interpreters restored over the pages of the previous job run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_instances_start_from_the_image_when_memory_is_kept_resident() {
    let executor = wasmjobs_e2e::executor_from(&wasmjobs::sandbox::EngineConfig {
        concurrency: 1,
        keep_resident: 16 << 20,
        ..Default::default()
    });
    let dir = chaos_with("");
    let chaos = catalog(dir.path(), &executor);
    assert_eq!(counts(&executor, &chaos, 5).await, [1, 1, 1, 1, 1]);
    for (plugin, class) in [("py-noop", "PyNoopJob"), ("js-noop", "JsNoopJob")] {
        let temp = tempfile::tempdir().expect("tempdir");
        copy_plugin(&wasmjobs_e2e::plugins_dir().join(plugin), temp.path());
        let loaded = catalog(temp.path(), &executor);
        for i in 0..4 {
            let job = run(&executor, &loaded, class, "[]").await;
            assert_eq!(job.outcome, Outcome::Success, "{plugin} job {i}: {:?}", messages(&job));
        }
    }
    assert_eq!(executor.instances().reused.load(Ordering::Relaxed), 0);
}
