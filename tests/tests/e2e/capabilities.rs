//! Host capabilities and per-plugin grants and limits (manifest `[http]`,
//! `env`, `[limits]`), through the real executor and components.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmjobs::host::http::HttpLimits;
use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{EngineConfig, Executor, Limits};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::{cache, catalog, copy_plugin, executor, executor_from, messages, plugins_dir, run, test_guests_dir};

/// A private copy of the chaos guest with `extra` appended to its manifest.
fn chaos_with(extra: &str) -> tempfile::TempDir {
    chaos_edited(|text| format!("{text}\n{extra}\n"))
}

/// A private copy of the chaos guest with its manifest rewritten by `edit`.
fn chaos_edited(edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, edit(&text)).expect("write manifest");
    temp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reaches_allowed_hosts_only() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let executor = executor(4);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);
    let plugin = chaos.get("ChaosJob").expect("chaos");

    let allowed = run(
        &executor,
        &chaos,
        "ChaosJob",
        &format!(r#"["http", "{}"]"#, server.url("/ok")),
    )
    .await;
    assert_eq!(allowed.outcome, Outcome::Success, "{:?}", allowed.logs);
    assert!(messages(&allowed).contains(&"status: 200".to_owned()));

    // 127.0.0.2 is loopback too, but not in the manifest's http.allow.
    let forbidden = format!("http://127.0.0.2:{}/ok", server.addr.port());
    let denied = run(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{forbidden}"]"#)).await;
    let Outcome::Retry(message) = &denied.outcome else {
        panic!("expected retry, got {:?}", denied.outcome)
    };
    assert!(message.to_lowercase().contains("denied"), "{message}");
    assert_eq!(plugin.loaded.grants.http_stats.denied.load(Ordering::Relaxed), 1);
    assert_eq!(server.hits(), 1, "a denied request never leaves the process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_reused_across_jobs() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let executor = executor(8);
    let examples = catalog(&plugins_dir(), &executor);
    for _ in 0..50 {
        let job = run(
            &executor,
            &examples,
            "HttpGetJob",
            &format!(r#"["{}"]"#, server.url("/ok")),
        )
        .await;
        assert_eq!(job.outcome, Outcome::Success);
    }
    assert_eq!(server.hits(), 50);
    assert!(
        server.connections() <= 2,
        "{} connections for 50 sequential jobs",
        server.connections()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_capped() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let executor = executor_from(&EngineConfig {
        concurrency: 4,
        http: HttpLimits {
            max_body: 64 * 1024,
            ..HttpLimits::default()
        },
        ..EngineConfig::default()
    });
    let examples = catalog(&plugins_dir(), &executor);
    let small = run(
        &executor,
        &examples,
        "HttpGetJob",
        &format!(r#"["{}"]"#, server.url("/big/1000")),
    )
    .await;
    assert_eq!(small.outcome, Outcome::Success);
    let big = run(
        &executor,
        &examples,
        "HttpGetJob",
        &format!(r#"["{}"]"#, server.url("/big/1000000")),
    )
    .await;
    let Outcome::Retry(message) = &big.outcome else {
        panic!("expected retry, got {:?}", big.outcome)
    };
    assert!(message.to_lowercase().contains("body"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_open_thousands_of_requests() {
    let server = HttpServer::start(Duration::from_millis(300)).await;
    let executor = executor(4);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);
    let flood = run(
        &executor,
        &chaos,
        "ChaosJob",
        &format!(r#"["http-flood", 2000, "{}", "/sleep"]"#, server.addr),
    )
    .await;
    assert_eq!(flood.outcome, Outcome::Success, "{:?}", flood.outcome);
    let line = messages(&flood)
        .into_iter()
        .find(|m| m.starts_with("flood:"))
        .expect("flood summary");
    assert_eq!(
        line, "flood: ok=100 failed=1900",
        "the host allows 100 requests waiting per job"
    );
    assert!(server.hits() <= 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_limits_override_the_runner_defaults() {
    let dir = chaos_with("[limits]\nmemory = \"32MiB\"\ntimeout = \"300ms\"");
    let executor = executor_with_defaults();
    let chaos = catalog(dir.path(), &executor);

    let started = Instant::now();
    let looping = run(&executor, &chaos, "ChaosJob", r#"["loop"]"#).await;
    assert!(
        matches!(&looping.outcome, Outcome::Retry(m) if m.contains("timed out after 300ms")),
        "{:?}",
        looping.outcome
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    let bomb = run(&executor, &chaos, "ChaosJob", r#"["alloc", 67108864]"#).await;
    assert!(
        matches!(&bomb.outcome, Outcome::Retry(m) if m.contains("memory limit of 32.0 MiB")),
        "{:?}",
        bomb.outcome
    );
}

/// Runner defaults far above the plugin limits under test.
fn executor_with_defaults() -> Executor {
    executor_from(&EngineConfig {
        concurrency: 8,
        limits: Limits {
            memory: 1 << 30,
            timeout: Duration::from_secs(60),
        },
        ..EngineConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_limits_need_metering_and_then_stop_the_guest() {
    let dir = chaos_with("[limits]\nfuel = 10000000");
    let refused = Catalog::load(dir.path(), &executor(1), &cache()).expect("catalog");
    assert_eq!(refused.plugins().len(), 0);
    assert!(
        refused.broken()[0].error.contains("--fuel"),
        "{}",
        refused.broken()[0].error
    );

    let metered = executor_from(&EngineConfig {
        concurrency: 2,
        fuel: true,
        ..EngineConfig::default()
    });
    let chaos = catalog(dir.path(), &metered);
    let spin = run(&metered, &chaos, "ChaosJob", r#"["loop"]"#).await;
    assert!(
        matches!(&spin.outcome, Outcome::Retry(m) if m.contains("fuel")),
        "{:?}",
        spin.outcome
    );
    assert_eq!(
        run(&metered, &chaos, "ChaosJob", r#"["ok"]"#).await.outcome,
        Outcome::Success
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_granted_environment_variables_are_visible() {
    // SAFETY: set before any thread of this test reads the environment.
    unsafe {
        std::env::set_var("CHAOS_TEST_GRANTED", "yes");
        std::env::set_var("CHAOS_TEST_SECRET", "no");
    }
    // Top-level key: before the manifest's tables.
    let dir = chaos_edited(|text| format!("env = [\"CHAOS_TEST_GRANTED\"]\n{text}"));
    let executor = executor(2);
    let chaos = catalog(dir.path(), &executor);
    let granted = run(&executor, &chaos, "ChaosJob", r#"["env", "CHAOS_TEST_GRANTED"]"#).await;
    assert!(
        messages(&granted).contains(&"env CHAOS_TEST_GRANTED=yes".to_owned()),
        "{:?}",
        granted.logs
    );
    let secret = run(&executor, &chaos, "ChaosJob", r#"["env", "CHAOS_TEST_SECRET"]"#).await;
    assert!(
        messages(&secret).contains(&"env CHAOS_TEST_SECRET=<unset>".to_owned()),
        "{:?}",
        secret.logs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_contained_among_healthy_jobs() {
    // 5 s, not less: building and lifting the 100 MB error string takes
    // most of a second on a busy 2-core CI machine, and it must not time out.
    let dir = chaos_with("[limits]\nmemory = \"256MiB\"\ntimeout = \"5s\"");
    // The runner's --memory is a cap: raise it so the plugin may ask for 256 MiB.
    let executor = std::sync::Arc::new(executor_from(&EngineConfig {
        concurrency: 128,
        limits: Limits {
            memory: 256 << 20,
            ..Limits::default()
        },
        ..EngineConfig::default()
    }));
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let hostile: &[(&str, &str)] = &[
        (r#"["loop"]"#, "timed out"),
        (r#"["alloc", 1073741824]"#, "memory limit of 256.0 MiB"),
        (r#"["recurse", 100000000]"#, "stack overflow"),
        (r#"["trap"]"#, "unreachable"),
        (r#"["big-error", 104857600]"#, "eeee"),
    ];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (executor, chaos) = (executor.clone(), chaos.clone());
        tasks.spawn(async move {
            (
                None,
                run(
                    &executor,
                    &chaos,
                    "ChaosJob",
                    &format!(r#"["log", "info", "healthy {i}"]"#),
                )
                .await,
            )
        });
    }
    for (args, expected) in hostile {
        let (executor, chaos) = (executor.clone(), chaos.clone());
        tasks.spawn(async move { (Some(*expected), run(&executor, &chaos, "ChaosJob", args).await) });
    }
    let mut healthy = 0;
    while let Some(result) = tasks.join_next().await {
        let (expected, execution) = result.expect("task");
        match expected {
            None => {
                assert_eq!(execution.outcome, Outcome::Success);
                healthy += 1;
            }
            Some(text) => {
                let Outcome::Retry(message) = &execution.outcome else {
                    panic!("{text}: {:?}", execution.outcome)
                };
                assert!(message.contains(text), "{text}: {}", &message[..message.len().min(300)]);
                assert!(message.len() <= 100 * 1024 * 1024 + 100);
            }
        }
    }
    assert_eq!(healthy, 100);
}
