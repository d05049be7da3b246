//! Concurrent instances (`[instances] concurrent = K`, the async-plugin
//! world): one instance runs up to K jobs at once, each with its own
//! outcome, log lines and host state; a trap or a timeout ends the
//! instance and its jobs, and nothing else.
//!
//! The guests are `tests/guests/py-async-chaos` (Python, `async def`),
//! `tests/guests/rust-async` (Rust, plain wit-bindgen) and the example
//! `plugins/http-get-async` (Rust, the SDK's `AsyncJob`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmjobs::host::sql::{Databases, DbSpec};
use wasmjobs::job::{Job, Outcome};
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{ExecOptions, Execution, Executor};
use wasmjobs_e2e::cli::{printed, toolchain_env, wasmjobs_in};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, int, plugins, push, wait_processed};
use wasmjobs_e2e::{
    append_to_manifest, cache, catalog, copy_plugin, executor, executor_with, messages, run, test_guests_dir,
};

/// A private copy of the async chaos guest whose `[instances]` is `instances`.
fn chaos_with(instances: &str) -> tempfile::TempDir {
    guest_with("py-async-chaos", instances)
}

/// A private copy of test guest `name` whose `[instances]` is `instances`.
fn guest_with(name: &str, instances: &str) -> tempfile::TempDir {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join(name), temp.path());
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let text = text.replace("[instances]\nconcurrent = 25\n", &format!("[instances]\n{instances}\n"));
    std::fs::write(&manifest, text).expect("write manifest");
    temp
}

/// Starts `jobs` on the executor at once; the handle resolves to each
/// job with its execution, in order.
fn start(
    executor: &std::sync::Arc<Executor>,
    catalog: &std::sync::Arc<Catalog>,
    jobs: Vec<String>,
) -> tokio::task::JoinHandle<Vec<(Job, Execution)>> {
    start_class(executor, catalog, "AsyncChaosJob", jobs)
}

/// [`start`] for jobs of `class`.
fn start_class(
    executor: &std::sync::Arc<Executor>,
    catalog: &std::sync::Arc<Catalog>,
    class: &'static str,
    jobs: Vec<String>,
) -> tokio::task::JoinHandle<Vec<(Job, Execution)>> {
    let (executor, catalog) = (executor.clone(), catalog.clone());
    tokio::spawn(async move {
        let plugin = catalog.get(class).expect("plugin");
        let runs: Vec<_> = jobs
            .into_iter()
            .map(|args| {
                let job = Job::new(class, &args).expect("job");
                let (executor, plugin) = (executor.clone(), plugin.clone());
                tokio::spawn(async move {
                    let execution = executor
                        .execute(&plugin.loaded, &job, &ExecOptions { capture_logs: true })
                        .await;
                    (job, execution)
                })
            })
            .collect();
        let mut finished = Vec::with_capacity(runs.len());
        for run in runs {
            finished.push(run.await.expect("join"));
        }
        finished
    })
}

/// Waits until `condition` holds, failing after `limit`.
async fn wait_for(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `n` requests wait at `server`'s gate.
async fn wait_at_gate(server: &HttpServer, n: usize) {
    wait_for(&format!("{n} jobs at the gate"), Duration::from_secs(60), || {
        server.gate_hits() >= n
    })
    .await;
}

/// Opens `server`'s gate and waits for every job of `running`.
async fn open_and_finish(
    server: &HttpServer,
    running: tokio::task::JoinHandle<Vec<(Job, Execution)>>,
) -> Vec<(Job, Execution)> {
    server.open_gate();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the jobs finish")
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_jobs_in_flight_share_four_instances_each_with_its_own_outcome() {
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor(100));
    let dir = chaos_with("concurrent = 25");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let created = executor.instances().created.load(Ordering::Relaxed);

    // Every job waits at the gate; every tenth then gives up as dead.
    let jobs = (0..100)
        .map(|n| {
            let mode = if n % 10 == 0 { "dead-after" } else { "get" };
            format!(r#"["{mode}", "{}?n={n}"]"#, server.url("/gate"))
        })
        .collect();
    let running = start(&executor, &chaos, jobs);
    wait_at_gate(&server, 100).await;
    assert_eq!(server.open_requests(), 100, "all 100 requests in flight at once");
    assert_eq!(
        executor.instances().created.load(Ordering::Relaxed) - created,
        4,
        "100 jobs in flight on four instances of 25"
    );
    assert_eq!(chaos.get("AsyncChaosJob").expect("plugin").loaded.lanes.len(), 4);
    assert_eq!(
        executor.live_instances(),
        4,
        "wasmjobs_instances_live counts instances, not jobs"
    );
    let finished = open_and_finish(&server, running).await;
    for (n, (job, execution)) in finished.iter().enumerate() {
        let url = format!("{}?n={n}", server.url("/gate"));
        if n % 10 == 0 {
            assert_eq!(
                execution.outcome,
                Outcome::Dead(format!("{} gave up", job.jid)),
                "job {n}"
            );
        } else {
            assert_eq!(
                execution.outcome,
                Outcome::Success,
                "job {n}: {:?}",
                messages(execution)
            );
            // Its own line, and only its own: the log import found its job.
            assert_eq!(messages(execution), [format!("{} {url} 200", job.jid)], "job {n}");
        }
    }
    assert_eq!(
        executor.instances().created.load(Ordering::Relaxed) - created,
        4,
        "no instance was added"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_async_component_runs_a_hundred_jobs_on_four_instances() {
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor(100));
    let dir = guest_with("rust-async", "concurrent = 25");
    let plugins = std::sync::Arc::new(catalog(dir.path(), &executor));
    let created = executor.instances().created.load(Ordering::Relaxed);
    let urls: Vec<String> = (0..100).map(|n| format!("{}?n={n}", server.url("/gate"))).collect();
    let jobs = urls.iter().map(|url| format!(r#"["{url}"]"#)).collect();
    let running = start_class(&executor, &plugins, "RustAsyncJob", jobs);
    wait_at_gate(&server, 100).await;
    assert_eq!(executor.instances().created.load(Ordering::Relaxed) - created, 4);
    let finished = open_and_finish(&server, running).await;
    for ((job, execution), url) in finished.iter().zip(&urls) {
        assert_eq!(execution.outcome, Outcome::Success, "{:?}", messages(execution));
        assert_eq!(messages(execution), [format!("{} {url} 200", job.jid)]);
    }
}

/// The Rust SDK's `AsyncJob` (`plugins/http-get-async`): a hundred GETs
/// in flight in one instance of `concurrent = 100`, then `HttpGetJob`'s
/// outcomes for a bad status and a bad URL on the same instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_async_http_get_runs_a_hundred_jobs_in_one_instance_with_http_get_jobs_outcomes() {
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor(100));
    let dir = plugins(&["http-get-async"], &[]);
    let plugins = std::sync::Arc::new(catalog(dir.path(), &executor));
    let created = executor.instances().created.load(Ordering::Relaxed);
    let urls: Vec<String> = (0..100).map(|n| format!("{}?n={n}", server.url("/gate"))).collect();
    let jobs = urls.iter().map(|url| format!(r#"["{url}"]"#)).collect();
    let running = start_class(&executor, &plugins, "AsyncHttpGetJob", jobs);
    wait_at_gate(&server, 100).await;
    assert_eq!(server.open_requests(), 100, "all 100 requests in flight at once");
    assert_eq!(
        executor.instances().created.load(Ordering::Relaxed) - created,
        1,
        "100 jobs in flight in one instance"
    );
    for (job, execution) in open_and_finish(&server, running).await {
        assert_eq!(
            execution.outcome,
            Outcome::Success,
            "{}: {:?}",
            job.jid,
            messages(&execution)
        );
    }

    let failing = vec![
        format!(r#"["{}"]"#, server.url("/status/503")),
        r#"["ftp://127.0.0.1/file"]"#.to_owned(),
    ];
    let finished = tokio::time::timeout(
        Duration::from_secs(60),
        start_class(&executor, &plugins, "AsyncHttpGetJob", failing),
    )
    .await
    .expect("the jobs finish")
    .expect("join");
    match &finished[0].1.outcome {
        Outcome::Retry(message) => assert!(message.contains("returned HTTP 503"), "{message}"),
        other => panic!("a 503 is retried: {other:?}"),
    }
    match &finished[1].1.outcome {
        Outcome::Dead(message) => assert!(message.contains("invalid URL"), "{message}"),
        other => panic!("a URL the client cannot use is dead: {other:?}"),
    }
    assert_eq!(
        executor.instances().created.load(Ordering::Relaxed) - created,
        1,
        "their errors are values: the instance lives on and serves them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_serves_reuse_jobs_then_is_replaced_and_shares_its_globals() {
    let executor = executor(4);
    let dir = chaos_with("concurrent = 4\nreuse = 3");
    let chaos = catalog(dir.path(), &executor);
    let created = executor.instances().created.load(Ordering::Relaxed);
    let mut seen = Vec::new();
    for _ in 0..7 {
        let job = run(&executor, &chaos, "AsyncChaosJob", r#"["count"]"#).await;
        assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(&job));
        seen.push(messages(&job)[0].clone());
    }
    assert_eq!(
        seen,
        [
            "seen: 1", "seen: 2", "seen: 3", "seen: 1", "seen: 2", "seen: 3", "seen: 1"
        ]
    );
    assert_eq!(executor.instances().created.load(Ordering::Relaxed) - created, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_ends_its_instance_the_others_are_retried_and_the_next_job_gets_a_fresh_one() {
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor(20));
    let dir = chaos_with("concurrent = 10");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let gate = server.url("/gate");
    let mut jobs: Vec<String> = (0..5).map(|_| format!(r#"["get", "{gate}"]"#)).collect();
    jobs.push(format!(r#"["trap", "{}"]"#, server.url("/ok")));
    let finished = tokio::time::timeout(Duration::from_secs(60), start(&executor, &chaos, jobs))
        .await
        .expect("the jobs end")
        .expect("join");
    let (trapped_job, trapped) = &finished[5];
    let Outcome::Retry(message) = &trapped.outcome else {
        panic!("the trapping job: {:?}", trapped.outcome)
    };
    assert!(
        message.contains("unreachable") || message.contains("wasm trap"),
        "{message}"
    );
    for (job, execution) in &finished[..5] {
        let Outcome::Retry(message) = &execution.outcome else {
            panic!("{}: {:?}", job.jid, execution.outcome)
        };
        assert!(message.contains("the instance"), "{message}");
        assert!(message.contains("retried"), "{message}");
        assert!(
            !message.contains(&job.jid),
            "blamed on the trapping job, not this one: {message}"
        );
        assert!(
            message.contains(&trapped_job.jid) || message.contains("stopped"),
            "{message}"
        );
    }
    server.open_gate();
    let next = run(&executor, &chaos, "AsyncChaosJob", r#"["count"]"#).await;
    assert_eq!(messages(&next), ["seen: 1"], "a fresh instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_timeout_stops_its_instance_within_the_deadline() {
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor_with(8, Duration::from_millis(500), 256 << 20));
    let dir = chaos_with("concurrent = 8");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let gate = server.url("/gate");
    let jobs = vec![
        format!(r#"["get", "{gate}"]"#),
        format!(r#"["get", "{gate}"]"#),
        r#"["spin"]"#.to_owned(),
    ];
    let started = Instant::now();
    let finished = tokio::time::timeout(Duration::from_secs(30), start(&executor, &chaos, jobs))
        .await
        .expect("a spinning job cannot hold its instance past the timeout")
        .expect("join");
    assert!(started.elapsed() >= Duration::from_millis(500));
    // The job with the earliest deadline is reported as timed out, the
    // others as ended with their instance: all three are retried.
    let mut timed_out = 0;
    for (job, execution) in &finished {
        let Outcome::Retry(message) = &execution.outcome else {
            panic!("{}: {:?}", job.jid, execution.outcome)
        };
        if message.starts_with("timed out after 500ms") {
            timed_out += 1;
        } else {
            assert!(
                message.contains("ran past its timeout") && message.contains("retried"),
                "{message}"
            );
        }
    }
    assert!(timed_out >= 1, "{finished:?}");
    server.open_gate();
    let next = run(&executor, &chaos, "AsyncChaosJob", r#"["count"]"#).await;
    assert_eq!(messages(&next), ["seen: 1"], "a fresh instance after the timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_keeps_its_own_log_budget_in_a_shared_instance() {
    let executor = std::sync::Arc::new(executor(4));
    let dir = chaos_with("concurrent = 4\n\n[limits]\nlog = { lines = 5 }");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let finished = start(
        &executor,
        &chaos,
        vec![r#"["log-flood", 50]"#.into(), r#"["log-flood", 3]"#.into()],
    )
    .await
    .expect("join");
    let (flood, flooded) = &finished[0];
    let (quiet, calm) = &finished[1];
    assert_eq!(calm.outcome, Outcome::Success);
    let calm_lines = messages(calm);
    assert_eq!(calm_lines.len(), 3, "{calm_lines:?}");
    assert!(calm_lines.iter().all(|line| line.ends_with(&quiet.jid)));
    let flood_lines = messages(flooded);
    assert!(
        flood_lines.iter().filter(|l| l.starts_with("line ")).count() <= 5,
        "{flood_lines:?}"
    );
    assert!(
        flood_lines
            .iter()
            .filter(|l| l.starts_with("line "))
            .all(|line| line.ends_with(&flood.jid)),
        "{flood_lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_world_and_the_manifest_must_agree() {
    let executor = executor(2);
    // A plugin-world component asked to run concurrently.
    let broken = refused_as_concurrent(&wasmjobs_e2e::plugins_dir().join("py-noop"), &executor);
    assert!(broken.contains("async-plugin"), "{broken}");

    // A plugin-world component that imports nothing the async world lacks
    // (Rust's NoopJob): Wasmtime would link its blocking perform, and its
    // jobs would run one at a time in a shared instance.
    let broken = refused_as_concurrent(&wasmjobs_e2e::plugins_dir().join("noop"), &executor);
    assert!(broken.contains("this one's perform is a blocking `func`"), "{broken}");
    assert!(broken.contains("export_async_job!"), "{broken}");

    // A component of another world (a `wasi:cli/command`), no perform at all.
    let broken = refused_as_concurrent(&test_guests_dir().join("not-a-job"), &executor);
    assert!(broken.contains("exports no `perform` function"), "{broken}");

    // An async-plugin component without `concurrent`.
    let dir = chaos_with("");
    let loaded = Catalog::load(dir.path(), &executor, &cache()).expect("catalog");
    let broken = &loaded.broken()[0].error;
    assert!(broken.contains("concurrent"), "{broken}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_come_and_go_keep_their_own_scope_when_task_ids_are_reused() {
    // Short jobs replacing each other in a few instances: a finished job's
    // task id is reused by a new job before the old one's result is
    // collected, and the new job's host calls must still find it.
    let server = HttpServer::start(Duration::ZERO).await;
    let executor = std::sync::Arc::new(executor(50));
    let dir = chaos_with("concurrent = 25");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));
    let url = server.url("/ok");
    let jobs = (0..1_000).map(|_| format!(r#"["get", "{url}"]"#)).collect();
    let finished = tokio::time::timeout(Duration::from_secs(120), start(&executor, &chaos, jobs))
        .await
        .expect("the jobs finish")
        .expect("join");
    let failed: Vec<_> = finished
        .iter()
        .filter(|(job, execution)| {
            execution.outcome != Outcome::Success || messages(execution) != [format!("{} {url} 200", job.jid)]
        })
        .map(|(job, execution)| (job.jid.clone(), execution.outcome.clone()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 1,000 jobs lost their scope: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_sql_runs_each_jobs_statement_under_the_plugins_grants() {
    let db = tempfile::tempdir().expect("tempdir");
    let specs: Vec<DbSpec> = [
        format!("main=sqlite://{}", db.path().join("main.db").display()),
        format!("secret=sqlite://{}", db.path().join("secret.db").display()),
    ]
    .iter()
    .map(|spec| spec.parse().expect("valid --db"))
    .collect();
    let databases = Databases::open(&specs, db.path()).expect("open databases");
    let executor = std::sync::Arc::new(executor(50).with_databases(std::sync::Arc::new(databases)));
    let dir = chaos_with("concurrent = 25");
    let chaos = std::sync::Arc::new(catalog(dir.path(), &executor));

    let create = run(
        &executor,
        &chaos,
        "AsyncChaosJob",
        r#"["execute", "main", "CREATE TABLE t (n INTEGER)"]"#,
    )
    .await;
    assert_eq!(create.outcome, Outcome::Success, "{:?}", messages(&create));
    let inserts = (0..50)
        .map(|n| format!(r#"["execute", "main", "INSERT INTO t (n) VALUES (?)", {n}]"#))
        .collect();
    let finished = start(&executor, &chaos, inserts).await.expect("join");
    for (job, execution) in &finished {
        assert_eq!(messages(execution), [format!("{} affected 1", job.jid)]);
    }
    let sum = run(
        &executor,
        &chaos,
        "AsyncChaosJob",
        r#"["sql", "main", "SELECT count(*), sum(n) FROM t"]"#,
    )
    .await;
    assert_eq!(messages(&sum).len(), 1);
    assert!(messages(&sum)[0].ends_with("rows [[50, 1225]]"), "{:?}", messages(&sum));

    // `secret` is configured on the runner but not granted to the plugin.
    let denied = run(&executor, &chaos, "AsyncChaosJob", r#"["sql", "secret", "SELECT 1"]"#).await;
    assert!(
        messages(&denied)[0].ends_with("sql not-granted"),
        "{:?}",
        messages(&denied)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_serves_two_hundred_jobs_from_redis_on_two_instances() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let server = HttpServer::start(Duration::ZERO).await;
    let plugins = plugins(&["py-async-http-get"], &[]);
    let addr = free_addr();
    let mut runner = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr, "-c", "200"]);
    runner.wait_running();
    let gate = server.url("/gate");
    push(
        &mut conn,
        "PyAsyncHttpGetJob",
        "default",
        vec![serde_json::json!([gate]); 200],
    )
    .await;
    wait_for("200 jobs at the gate", Duration::from_secs(60), || {
        server.gate_hits() >= 200
    })
    .await;
    let metric = |name: &str| -> u64 {
        let text = http_get(&addr, "/metrics");
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} "))?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    // The gauges are refreshed once a second: wait for the next sample.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric("wasmjobs_instances_live") != 2 {
        assert!(Instant::now() < deadline, "200 jobs of 100 per instance: two instances");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric("wasmjobs_instances_created_total"), 2);
    server.open_gate();
    wait_processed(&mut conn, 200, Duration::from_secs(60), || runner.log()).await;
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
}

#[test]
fn wasmjobs_build_refuses_concurrent_where_the_toolchain_cannot_build_the_async_world() {
    let home = tempfile::tempdir().expect("tempdir");
    let dir = new_concurrent_plugin(home.path(), "js");
    let build = wasmjobs_in(home.path(), &["build", "js"], &toolchain_env(), Duration::from_secs(60));
    assert!(!build.status.success(), "{}", printed(&build));
    assert!(
        printed(&build).contains("componentize-js 0.23 cannot build async exports"),
        "{}",
        printed(&build)
    );
    assert!(!dir.join("js.wasm").exists());
}

/// A Rust plugin with `concurrent`: the SDK's blocking [`Job`] template
/// is refused with how to make it async; an `AsyncJob` builds and runs,
/// its SQL through `async-sql`.
#[test]
fn wasmjobs_build_makes_a_rust_async_job_of_the_sdk_for_a_concurrent_plugin() {
    let home = tempfile::tempdir().expect("tempdir");
    let dir = new_concurrent_plugin(home.path(), "rust");
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("sql = [\"main\"]\n{text}")).expect("grant sql");
    append_to_manifest(&dir, "[http]\nallow = [\"127.0.0.1:*\"]");
    let db = format!("main=sqlite://{}", home.path().join("greet.db").display());
    // `/sleep` answers after 5 s: longer than the job's 300 ms timeout.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let server = runtime.block_on(HttpServer::start(Duration::from_secs(5)));
    let blocking = wasmjobs_in(
        home.path(),
        &["build", "rust"],
        &toolchain_env(),
        Duration::from_secs(600),
    );
    assert!(!blocking.status.success(), "{}", printed(&blocking));
    assert!(
        printed(&blocking).contains("implement AsyncJob and export it with export_async_job!"),
        "{}",
        printed(&blocking)
    );

    std::fs::write(
        dir.join("src/lib.rs"),
        r#"use std::time::Duration;
use wasmjobs_guest::{AsyncJob, JobError, JobInfo, export_async_job, http, log, params, sql};

pub struct RustJob;

impl AsyncJob for RustJob {
    type Args = (String,);

    async fn perform(job: &JobInfo, (name,): Self::Args) -> Result<(), JobError> {
        if name == "nobody" {
            return Err(JobError::dead(format!("no one to greet in {}", job.jid)));
        }
        if let Some(server) = name.strip_prefix("server ") {
            let echo = http::Request::post(format!("{server}/echo"))
                .header("x-greeting", "hello")
                .json(&["ping", "pong"])
                .timeout(Duration::from_secs(10))
                .send_async()
                .await?;
            let echoed = echo.text().replace('\n', "|");
            log::info!("echo {} x-echo={}: {echoed}", echo.status(), echo.header("x-echo").unwrap_or("-"));
            let slow = http::Request::get(format!("{server}/sleep"))
                .timeout(Duration::from_millis(300))
                .send_async()
                .await;
            match slow {
                Err(err) if err.is_timeout() => log::info!("slow: timed out ({err})"),
                other => return Err(JobError::dead(format!("/sleep did not time out: {other:?}"))),
            }
            return Ok(());
        }
        sql::execute_async("main", "CREATE TABLE IF NOT EXISTS greeted (name TEXT)", &[]).await?;
        sql::execute_async("main", "INSERT INTO greeted (name) VALUES (?)", &params![name.as_str()]).await?;
        let rows = sql::query_async("main", "SELECT count(*) FROM greeted WHERE name = ?", &params![name.as_str()]).await?;
        let times: i64 = match rows.first() {
            Some(row) => row.get(0)?,
            None => 0,
        };
        log::info!("hello, {name}, asynchronously ({times} times)");
        Ok(())
    }
}

export_async_job!(RustJob);
"#,
    )
    .expect("write lib.rs");
    let build = wasmjobs_in(
        home.path(),
        &["build", "rust"],
        &toolchain_env(),
        Duration::from_secs(600),
    );
    wasmjobs_e2e::assert_success(&build, "wasmjobs build");
    for times in 1..=2 {
        let exec = wasmjobs_in(
            home.path(),
            &["exec", "--plugins", ".", "--db", &db, "RustJob", r#"["world"]"#],
            &toolchain_env(),
            Duration::from_secs(60),
        );
        wasmjobs_e2e::assert_success(&exec, "wasmjobs exec");
        assert!(
            printed(&exec).contains(&format!("hello, world, asynchronously ({times} times)")),
            "{}",
            printed(&exec)
        );
    }
    // `send_async` with a method, a header, a JSON body and a timeout.
    let args = serde_json::json!([format!("server {}", server.url("").trim_end_matches('/'))]).to_string();
    let http = wasmjobs_in(
        home.path(),
        &["exec", "--plugins", ".", "RustJob", &args],
        &toolchain_env(),
        Duration::from_secs(60),
    );
    wasmjobs_e2e::assert_success(&http, "wasmjobs exec (http)");
    for part in [
        "echo 200 x-echo=yes: POST|",
        "|x-greeting: hello|",
        "|content-type: application/json|",
        r#"||["ping","pong"]"#,
    ] {
        assert!(printed(&http).contains(part), "{part:?} in {}", printed(&http));
    }
    assert!(printed(&http).contains("slow: timed out"), "{}", printed(&http));
    let dead = wasmjobs_in(
        home.path(),
        &["exec", "--plugins", ".", "RustJob", r#"["nobody"]"#],
        &toolchain_env(),
        Duration::from_secs(60),
    );
    assert!(!dead.status.success(), "{}", printed(&dead));
    assert!(printed(&dead).contains("no one to greet in"), "{}", printed(&dead));
    let bad_args = wasmjobs_in(
        home.path(),
        &["exec", "--plugins", ".", "RustJob", "[42]"],
        &toolchain_env(),
        Duration::from_secs(60),
    );
    assert!(
        printed(&bad_args).contains("invalid args for RustJob [42]: expected (String,)"),
        "{}",
        printed(&bad_args)
    );
}

/// Why a copy of the plugin in `source` with `[instances] concurrent = 4`
/// added is refused (it must be, with none of its classes loaded).
fn refused_as_concurrent(source: &std::path::Path, executor: &Executor) -> String {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(source, temp.path());
    append_to_manifest(&dir, "[instances]\nconcurrent = 4");
    let loaded = Catalog::load(temp.path(), executor, &cache()).expect("catalog");
    assert_eq!(
        loaded.classes().count(),
        0,
        "{} was loaded as concurrent",
        source.display()
    );
    loaded.broken()[0].error.clone()
}

/// `wasmjobs new LANGUAGE LANGUAGE` in `home`, with `[instances]
/// concurrent = 4` added to its manifest; returns the plugin directory.
fn new_concurrent_plugin(home: &std::path::Path, language: &str) -> std::path::PathBuf {
    let new = wasmjobs_in(
        home,
        &["new", language, language],
        &toolchain_env(),
        Duration::from_secs(60),
    );
    wasmjobs_e2e::assert_success(&new, "wasmjobs new");
    let dir = home.join(language);
    append_to_manifest(&dir, "[instances]\nconcurrent = 4");
    dir
}

/// The `seen: N` a job logged.
fn seen(job: &Execution) -> String {
    assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(job));
    messages(job)[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_plugin_gets_new_instances_and_the_old_ones_go_with_the_old_version() {
    let executor = executor(4);
    let dir = chaos_with("concurrent = 4");
    let old = catalog(dir.path(), &executor);
    let alive = executor.instances().concurrent();
    assert_eq!(
        seen(&run(&executor, &old, "AsyncChaosJob", r#"["count"]"#).await),
        "seen: 1"
    );
    assert_eq!(
        seen(&run(&executor, &old, "AsyncChaosJob", r#"["count"]"#).await),
        "seen: 2"
    );
    let manifest = dir.path().join("py-async-chaos/wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("{text}# a new version\n")).expect("edit");
    let (new, _) = old.rescan(&dir.path().join("py-async-chaos"), &executor, &cache());
    let job = run(&executor, &new, "AsyncChaosJob", r#"["count"]"#).await;
    assert_eq!(seen(&job), "seen: 1", "the new version starts its own instance");
    assert_eq!(&*job.plugin_version, new.get("AsyncChaosJob").expect("plugin").version);
    assert_eq!(executor.instances().concurrent(), alive + 2);
    // Dropping the old version closes its instances' intake: they end now,
    // not after their idle timeout (10 s).
    drop(old);
    wait_for("the old version's instance to end", Duration::from_secs(5), || {
        executor.instances().concurrent() == alive + 1
    })
    .await;
    assert_eq!(
        seen(&run(&executor, &new, "AsyncChaosJob", r#"["count"]"#).await),
        "seen: 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_ends_after_its_idle_timeout() {
    let executor = executor(4);
    let dir = chaos_with("concurrent = 4\nidle_timeout = \"200ms\"");
    let chaos = catalog(dir.path(), &executor);
    let alive = executor.instances().concurrent();
    assert_eq!(
        seen(&run(&executor, &chaos, "AsyncChaosJob", r#"["count"]"#).await),
        "seen: 1"
    );
    assert_eq!(executor.instances().concurrent(), alive + 1);
    wait_for("the idle instance to end", Duration::from_secs(10), || {
        executor.instances().concurrent() == alive
    })
    .await;
    assert!(chaos.get("AsyncChaosJob").expect("plugin").loaded.lanes.is_empty());
    assert_eq!(
        seen(&run(&executor, &chaos, "AsyncChaosJob", r#"["count"]"#).await),
        "seen: 1",
        "a new instance"
    );
}
