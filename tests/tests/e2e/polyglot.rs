//! Jobs written in Python (componentize-py, `guest-sdk/python`) and
//! JavaScript (componentize-js, `guest-sdk/js`): the example plugins through
//! the real Redis runner, with the outcome for success, a raised exception
//! (a retry whose `error_message` is the exception's) and a forbidden host.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, plugins, push, wait_processed, zset};

/// Pushes one job per (class, args), returning the jids in order.
async fn push_each(conn: &mut redis::aio::MultiplexedConnection, jobs: &[(&str, Value)]) -> Vec<String> {
    let mut jids = Vec::new();
    for (class, args) in jobs {
        jids.extend(push(conn, class, "default", vec![args.clone()]).await);
    }
    jids
}

/// `error_message` of each job in the retry set, by jid.
async fn retry_messages(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, String> {
    zset(conn, "retry")
        .await
        .iter()
        .map(|p| (p.jid().to_owned(), p.str("error_message").unwrap_or("").to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_examples_succeed_raise_and_are_refused_hosts() {
    let redis = TestRedis::start();
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let mut conn = redis.conn().await;
    let dir = plugins(&["py-http-get", "py-report", "js-echo", "js-http-get"], &[]);
    let db = format!("local=sqlite://{}", dir.path().join("local.db").display());
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "8", "--db", &db]);
    runner.wait_running();

    let ok = server.url("/ok");
    let failing = server.url("/status/500");
    let refused = "http://127.0.0.1:1/";
    let forbidden = "http://example.com/";
    let jobs = [
        ("PyHttpGetJob", json!([ok])),
        ("PyHttpGetJob", json!([failing])),
        ("PyHttpGetJob", json!([refused])),
        ("PyHttpGetJob", json!([forbidden])),
        ("JsHttpGetJob", json!([ok])),
        ("JsHttpGetJob", json!([failing])),
        ("JsHttpGetJob", json!([refused])),
        ("JsHttpGetJob", json!([forbidden])),
        ("JsEchoJob", json!(["hello", 42])),
        ("JsEchoJob", json!(["fail", "boom"])),
        (
            "PyReportJob",
            json!(["local", "SELECT 1 AS id, 'x' AS note UNION ALL SELECT 2, NULL", "r.csv"]),
        ),
        ("PyReportJob", json!(["local", "SELECT * FROM missing", "r2.csv"])),
        ("PyReportJob", json!(["main", "SELECT 1", "r3.csv"])),
        ("PyHttpGetJob", json!([1, 2])),
    ];
    let jids = push_each(&mut conn, &jobs).await;
    wait_processed(&mut conn, jobs.len() as u64, Duration::from_secs(180), || runner.log()).await;
    assert!(runner.stop().success(), "{}", runner.log());
    let log = runner.log();

    // Four succeed (jobs 0, 4, 8, 10); the other ten fail.
    assert_eq!(int(&mut conn, "stat:failed").await, 10, "{log}");
    let retries = retry_messages(&mut conn).await;
    let message = |i: usize| {
        retries
            .get(&jids[i])
            .cloned()
            .unwrap_or_else(|| panic!("job {i} not in retry: {log}"))
    };
    for i in [0, 4, 8, 10] {
        assert!(
            !retries.contains_key(&jids[i]),
            "job {i} failed: {:?}\n{log}",
            retries.get(&jids[i])
        );
    }
    assert!(message(1).contains("HTTP 500"), "{}", message(1));
    assert!(message(5).contains("HTTP 500"), "{}", message(5));
    // A raised exception: its type and message.
    assert!(
        message(2).starts_with("HttpError: GET http://127.0.0.1:1/"),
        "{}",
        message(2)
    );
    assert!(
        message(6).starts_with("HttpError: GET http://127.0.0.1:1/"),
        "{}",
        message(6)
    );
    assert_eq!(message(9), "Error: boom");
    assert!(message(11).starts_with("SqlError: query:"), "{}", message(11));
    assert!(message(11).contains("missing"), "{}", message(11));
    assert!(
        message(12).starts_with("SqlError: unknown-database:"),
        "{}",
        message(12)
    );
    // A host the manifest does not allow.
    assert!(
        message(3).contains(r#"request denied: add "example.com" to [http] allow"#),
        "{}",
        message(3)
    );
    assert!(
        message(7).starts_with("HttpError: GET http://example.com/"),
        "{}",
        message(7)
    );
    assert!(log.contains("outgoing HTTP request denied"), "{log}");
    // The runner's log says what would grant it (Python and JS reach HTTP
    // through wasi:http, whose error carries no message).
    assert!(log.contains(r#"add "example.com" to [http] allow"#), "{log}");
    // Args that do not fit the function: dead, not retried.
    let dead = zset(&mut conn, "dead").await;
    assert_eq!(dead.len(), 1, "{log}");
    assert_eq!(dead[0].jid(), jids[13]);
    assert!(
        dead[0]
            .str("error_message")
            .unwrap_or("")
            .contains("invalid args for PyHttpGetJob [1,2]"),
        "{:?}",
        dead[0].str("error_message")
    );

    // What succeeded did its work.
    assert!(
        log.contains(r#"JsEchoJob "#) && log.contains(r#"["hello",42]"#),
        "{log}"
    );
    let csv = std::fs::read_to_string(dir.path().join("py-report/reports/r.csv")).expect("report written");
    assert_eq!(csv.lines().collect::<Vec<_>>(), ["id,note", "1,x", "2,"]);
    assert!(log.contains("/reports/r.csv: 2 rows, 2 columns"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_python_http_jobs_run_at_once() {
    let redis = TestRedis::start();
    let server = HttpServer::start(Duration::from_millis(200)).await;
    let mut conn = redis.conn().await;
    let dir = plugins(&["py-http-get"], &[]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["--concurrency", "1000"]);
    runner.wait_running();
    let url = server.url("/sleep");
    push(
        &mut conn,
        "PyHttpGetJob",
        "default",
        (0..1_000).map(|_| json!([url])).collect(),
    )
    .await;
    wait_processed(&mut conn, 1_000, Duration::from_secs(300), || runner.log()).await;
    assert!(runner.stop().success(), "{}", runner.log());
    assert_eq!(int(&mut conn, "stat:failed").await, 0, "{}", runner.log());
    assert_eq!(server.hits(), 1_000);
}
