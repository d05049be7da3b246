//! Keys of the wrong type that any Redis client can write, in the path of
//! a running fetch: a queue key that is a hash, a set or a string is
//! skipped and left as it was, said once, and every other queue is served.

use std::time::Duration;

use serde_json::json;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, plugins, push, wait_processed};

/// The case: `HSET queue:qb x y` with `-q qb,qb2,qa` stopped every
/// queue (the fetch script's `WRONGTYPE` failed the whole fetch, 0 jobs/s).
/// Now the jobs of `qb2` and `qa` all run, in strict and in weighted
/// order and with basic fetch (one `BRPOP` over every queue), the hash is
/// untouched, and the runner says so once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_key_of_another_type_stops_only_that_queue() {
    let cases: [(&str, &[&str]); 3] = [
        ("qb,qb2,qa", &[]),
        ("qb:3,qb2:1,qa:1", &[]),
        ("qb,qb2,qa", &["--fetch", "basic"]),
    ];
    for (queues, extra) in cases {
        let redis = TestRedis::start();
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("HSET")
            .arg("queue:qb")
            .arg("x")
            .arg("y")
            .query_async(&mut conn)
            .await
            .expect("HSET");
        let _: () = redis::cmd("SADD")
            .arg("queues")
            .arg("qb")
            .query_async(&mut conn)
            .await
            .expect("SADD");
        let ok = || (0..500).map(|_| json!(["ok"])).collect::<Vec<_>>();
        push(&mut conn, "ChaosJob", "qb2", ok()).await;
        push(&mut conn, "ChaosJob", "qa", ok()).await;
        let dir = plugins(&[], &["chaos"]);
        let mut flags = vec!["-q", queues, "-c", "10"];
        flags.extend_from_slice(extra);
        let mut runner = Runner::start(&redis.url(), dir.path(), &flags);
        runner.wait_running();
        wait_processed(&mut conn, 1_000, Duration::from_secs(60), || runner.log()).await;
        // Once idle, the runner waits on every queue: a job pushed now to
        // a queue after the bad one runs too.
        push(&mut conn, "ChaosJob", "qa", vec![json!(["ok"])]).await;
        wait_processed(&mut conn, 1_001, Duration::from_secs(30), || runner.log()).await;
        assert_eq!(int(&mut conn, "stat:failed").await, 0);
        let kind: String = redis::cmd("TYPE")
            .arg("queue:qb")
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        assert_eq!(kind, "hash", "the hash is left as it was");
        assert!(runner.stop().success(), "{}", runner.log());
        let log = runner.log();
        let said = log.matches("the key queue:qb is not a list").count();
        assert_eq!(said, 1, "-q {queues} {extra:?}: said once, not {said} times:\n{log}");
    }
}

/// `--exit-when-empty` counts a queue key of another type as empty, as the
/// fetch does (it counted forever: the `LLEN` of the hash failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_when_empty_is_not_held_up_by_a_key_of_another_type() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SET")
        .arg("queue:qb")
        .arg("junk")
        .query_async(&mut conn)
        .await
        .expect("SET");
    push(&mut conn, "ChaosJob", "qa", (0..20).map(|_| json!(["ok"])).collect()).await;
    let dir = plugins(&[], &["chaos"]);
    let mut runner = Runner::start(&redis.url(), dir.path(), &["-q", "qb,qa", "--exit-when-empty"]);
    let status = runner.wait(Duration::from_secs(60));
    assert!(status.success(), "{}", runner.log());
    assert_eq!(int(&mut conn, "stat:processed").await, 20);
}
