//! The executor against the real example plugins and test guests.

use std::time::{Duration, Instant};

use wasmjobs::job::Outcome;
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::{catalog, copy_plugin, executor, executor_with, messages, plugins_dir, run, test_guests_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noop_job_succeeds() {
    let executor = executor(4);
    let catalog = catalog(&plugins_dir(), &executor);
    let execution = run(&executor, &catalog, "NoopJob", "[]").await;
    assert_eq!(execution.outcome, Outcome::Success);
    let plugin = catalog.get("NoopJob").expect("noop plugin");
    assert_eq!(&*execution.plugin_version, plugin.version);
    assert_eq!(plugin.version.len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fib_job_logs_the_right_value() {
    let executor = executor(4);
    let catalog = catalog(&plugins_dir(), &executor);
    let execution = run(&executor, &catalog, "FibJob", "[25]").await;
    assert_eq!(execution.outcome, Outcome::Success);
    assert!(
        messages(&execution).contains(&"fib(25) = 121393".to_owned()),
        "{:?}",
        execution.logs
    );
    let execution = run(&executor, &catalog, "FibJob", "[10]").await;
    assert!(
        messages(&execution).contains(&"fib(10) = 89".to_owned()),
        "{:?}",
        execution.logs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_job_logs_its_args() {
    let executor = executor(4);
    let catalog = catalog(&plugins_dir(), &executor);
    let execution = run(&executor, &catalog, "EchoJob", r#"["hi", 2, {"k": null}]"#).await;
    assert_eq!(execution.outcome, Outcome::Success);
    assert!(
        messages(&execution).contains(&r#"args: ["hi", 2, {"k": null}]"#.to_owned()),
        "{:?}",
        execution.logs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_get_job_succeeds_on_2xx_and_retries_on_500() {
    let server = HttpServer::start(Duration::from_millis(10)).await;
    let executor = executor(4);
    let catalog = catalog(&plugins_dir(), &executor);

    let ok = run(
        &executor,
        &catalog,
        "HttpGetJob",
        &format!("[\"{}\"]", server.url("/ok")),
    )
    .await;
    assert_eq!(ok.outcome, Outcome::Success, "{:?}", ok.logs);

    let failed = run(
        &executor,
        &catalog,
        "HttpGetJob",
        &format!("[\"{}\"]", server.url("/status/500")),
    )
    .await;
    let Outcome::Retry(message) = &failed.outcome else {
        panic!("expected retry, got {:?}", failed.outcome)
    };
    assert!(message.contains("500"), "{message}");
    assert_eq!(server.hits(), 2);

    // Nothing listens on port 1: a transport error is retryable too.
    let refused = run(&executor, &catalog, "HttpGetJob", "[\"http://127.0.0.1:1/\"]").await;
    assert!(matches!(refused.outcome, Outcome::Retry(_)), "{:?}", refused.outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_append_job_writes_into_its_preopened_dir() {
    let temp = tempfile::tempdir().expect("tempdir");
    let plugin_dir = copy_plugin(&plugins_dir().join("file-append"), temp.path());
    let executor = executor(4);
    let catalog = catalog(&plugin_dir, &executor);

    for id in ["1", "2", "\"three\""] {
        let execution = run(&executor, &catalog, "FileAppendJob", &format!("[\"out.txt\", {id}]")).await;
        assert_eq!(execution.outcome, Outcome::Success, "{:?}", execution.logs);
    }
    let written = std::fs::read_to_string(plugin_dir.join("data/out.txt")).expect("file written in the preopen");
    assert_eq!(written, "1\n2\nthree\n");

    let escape = run(&executor, &catalog, "FileAppendJob", "[\"../escape.txt\", 1]").await;
    assert!(matches!(escape.outcome, Outcome::Dead(_)), "{:?}", escape.outcome);
    assert!(!plugin_dir.join("escape.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_errors_traps_and_bad_args_become_outcomes_and_the_process_keeps_serving() {
    let executor = executor(4);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);
    let examples = catalog(&plugins_dir(), &executor);

    type Case = (&'static str, fn(&Outcome) -> bool, &'static str);
    let cases: &[Case] = &[
        (
            r#"["retry", "try later"]"#,
            |o| matches!(o, Outcome::Retry(_)),
            "try later",
        ),
        (
            r#"["discard", "not needed"]"#,
            |o| matches!(o, Outcome::Discard(_)),
            "not needed",
        ),
        (r#"["dead", "hopeless"]"#, |o| matches!(o, Outcome::Dead(_)), "hopeless"),
        (r#"["trap"]"#, |o| matches!(o, Outcome::Retry(_)), "unreachable"),
        (
            r#"["panic", "boom at line 7"]"#,
            |o| matches!(o, Outcome::Retry(_)),
            "boom at line 7",
        ),
        (
            r#"["no-such-mode"]"#,
            |o| matches!(o, Outcome::Dead(_)),
            "unknown chaos mode",
        ),
    ];
    for (args, expected, text) in cases {
        let execution = run(&executor, &chaos, "ChaosJob", args).await;
        assert!(expected(&execution.outcome), "{args}: {:?}", execution.outcome);
        let message = execution.outcome.message().unwrap_or_default();
        assert!(message.contains(text), "{args}: {message:?} lacks {text:?}");
    }

    let trap = run(&executor, &chaos, "ChaosJob", r#"["trap"]"#).await;
    assert!(trap.backtrace.is_some(), "a trap carries the wasm backtrace");

    // Args of the wrong shape: dead (retrying cannot fix them), with a clear message.
    let bad = run(&executor, &examples, "FibJob", r#"["twenty-five"]"#).await;
    let Outcome::Dead(message) = &bad.outcome else {
        panic!("expected dead, got {:?}", bad.outcome)
    };
    assert!(
        message.contains("invalid args") && message.contains("FibJob"),
        "{message}"
    );
    let missing = run(&executor, &examples, "HttpGetJob", "[]").await;
    assert!(matches!(missing.outcome, Outcome::Dead(_)), "{:?}", missing.outcome);

    // The process still serves.
    assert_eq!(
        run(&executor, &examples, "NoopJob", "[]").await.outcome,
        Outcome::Success
    );
    assert_eq!(
        run(&executor, &chaos, "ChaosJob", r#"["ok"]"#).await.outcome,
        Outcome::Success
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_guests_are_stopped_by_the_limits() {
    let executor = executor_with(4, Duration::from_millis(300), 64 << 20);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);

    let started = Instant::now();
    let looping = run(&executor, &chaos, "ChaosJob", r#"["loop"]"#).await;
    let elapsed = started.elapsed();
    let Outcome::Retry(message) = &looping.outcome else {
        panic!("expected retry, got {:?}", looping.outcome)
    };
    assert!(message.contains("timed out"), "{message}");
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );

    let bomb = run(&executor, &chaos, "ChaosJob", r#"["alloc", 536870912]"#).await;
    let Outcome::Retry(message) = &bomb.outcome else {
        panic!("expected retry, got {:?}", bomb.outcome)
    };
    assert!(message.contains("memory limit of 64.0 MiB exceeded"), "{message}");

    let within = run(&executor, &chaos, "ChaosJob", r#"["alloc", 8388608]"#).await;
    assert_eq!(within.outcome, Outcome::Success, "{:?}", within.logs);

    let deep = run(&executor, &chaos, "ChaosJob", r#"["recurse", 100000000]"#).await;
    let Outcome::Retry(message) = &deep.outcome else {
        panic!("expected retry, got {:?}", deep.outcome)
    };
    assert!(message.contains("stack overflow"), "{message}");

    assert_eq!(
        run(&executor, &chaos, "ChaosJob", r#"["ok"]"#).await.outcome,
        Outcome::Success
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_see_only_their_preopens() {
    let temp = tempfile::tempdir().expect("tempdir");
    let plugin_dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    std::fs::create_dir_all(plugin_dir.join("data")).expect("data dir");
    std::fs::write(plugin_dir.join("data/in.txt"), "inside").expect("seed file");
    std::fs::write(temp.path().join("secret.txt"), "outside").expect("secret file");
    let executor = executor(4);
    let chaos = catalog(&plugin_dir, &executor);

    let read = run(&executor, &chaos, "ChaosJob", r#"["read", "/data/in.txt"]"#).await;
    assert_eq!(read.outcome, Outcome::Success, "{:?}", read.outcome);
    assert!(messages(&read).contains(&"read: inside".to_owned()), "{:?}", read.logs);

    // Symlinks inside the preopen pointing out of it lead nowhere either.
    std::os::unix::fs::symlink(temp.path().join("secret.txt"), plugin_dir.join("data/link.txt")).expect("symlink");
    std::os::unix::fs::symlink(temp.path(), plugin_dir.join("data/up")).expect("symlink");
    for path in [
        "/data/../../secret.txt",
        "/data/../secret.txt",
        "/etc/passwd",
        "secret.txt",
        "/data/link.txt",
        "/data/up/secret.txt",
    ] {
        let escape = run(&executor, &chaos, "ChaosJob", &format!(r#"["read", "{path}"]"#)).await;
        assert!(
            matches!(escape.outcome, Outcome::Retry(_)),
            "{path}: {:?}",
            escape.outcome
        );
        assert!(
            !messages(&escape).iter().any(|m| m.contains("outside")),
            "{path} leaked"
        );
    }
    let overwrite = run(&executor, &chaos, "ChaosJob", r#"["write", "/data/link.txt", "pwned"]"#).await;
    assert!(
        matches!(overwrite.outcome, Outcome::Retry(_)),
        "{:?}",
        overwrite.outcome
    );
    assert_eq!(
        std::fs::read_to_string(temp.path().join("secret.txt")).expect("secret"),
        "outside"
    );

    let written = run(&executor, &chaos, "ChaosJob", r#"["write", "/data/out.txt", "hello"]"#).await;
    assert_eq!(written.outcome, Outcome::Success, "{:?}", written.outcome);
    assert_eq!(
        std::fs::read_to_string(plugin_dir.join("data/out.txt")).expect("written"),
        "hello"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_and_log_levels_reach_the_job_log() {
    let executor = executor(4);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);
    let printed = run(&executor, &chaos, "ChaosJob", r#"["stdout", "printed line"]"#).await;
    assert!(
        messages(&printed).contains(&"printed line".to_owned()),
        "{:?}",
        printed.logs
    );

    let big = run(&executor, &chaos, "ChaosJob", r#"["big-log", 10000000]"#).await;
    assert_eq!(big.outcome, Outcome::Success);
    let longest = big.logs.iter().map(|l| l.message.len()).max().unwrap_or(0);
    assert!(longest < 9 * 1024, "log lines are truncated, got {longest} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_http_jobs_complete_in_one_process() {
    let server = HttpServer::start(Duration::from_millis(200)).await;
    let executor = std::sync::Arc::new(executor(1000));
    let catalog = std::sync::Arc::new(catalog(&plugins_dir(), &executor));
    let args = format!("[\"{}\"]", server.url("/sleep"));

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let (executor, catalog, args) = (executor.clone(), catalog.clone(), args.clone());
        tasks.spawn(async move { run(&executor, &catalog, "HttpGetJob", &args).await.outcome });
    }
    let mut succeeded = 0;
    while let Some(outcome) = tasks.join_next().await {
        let outcome = outcome.expect("task");
        assert_eq!(outcome, Outcome::Success);
        succeeded += 1;
    }
    assert_eq!(succeeded, 1000);
    assert_eq!(server.hits(), 1000);
    // They waited together, not in turn (one at a time would be a peak of
    // 1 and 200 s): most of the 1,000 requests were open at once.
    let peak = server.peak_open_requests();
    assert!(peak >= 500, "only {peak} requests were open at once");
}
