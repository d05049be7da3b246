//! The reliable-fetch protocol between processes, end to end: who may take
//! whose jobs, what every path to the dead set leaves behind, and whether a
//! cluster loses anything while its processes and its Redis are killed and
//! restarted. Real redis-server, real `wasmjobs run` processes, real
//! components; every wait is for a condition, with a deadline.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int, jobs_in_progress, plugins, push};

/// The set of processes with an in-progress list.
const OWNERS: &str = "wasmjobs:inprogress";

/// Waits until `check` holds; panics with `what()` after `timeout`.
async fn eventually<F, Fut>(timeout: Duration, what: impl Fn() -> String, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {timeout:?}: {}", what());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every registered in-progress owner.
async fn owners(conn: &mut MultiplexedConnection) -> Vec<String> {
    conn.smembers(OWNERS).await.expect("SMEMBERS")
}

/// The one owner not in `known`.
async fn new_owner(conn: &mut MultiplexedConnection, known: &[&str]) -> String {
    let fresh: Vec<String> = owners(conn)
        .await
        .into_iter()
        .filter(|o| !known.contains(&o.as_str()))
        .collect();
    assert_eq!(fresh.len(), 1, "one new in-progress owner besides {known:?}: {fresh:?}");
    fresh[0].clone()
}

/// The in-progress list of `identity`.
async fn held_by(conn: &mut MultiplexedConnection, identity: &str) -> Vec<String> {
    conn.lrange(format!("{OWNERS}:{identity}"), 0, -1)
        .await
        .expect("LRANGE")
}

/// Members of a sorted set, as text (lossily).
async fn members(conn: &mut MultiplexedConnection, key: &str) -> Vec<String> {
    let raw: Vec<Vec<u8>> = conn.zrange(key, 0, -1).await.expect("ZRANGE");
    raw.iter().map(|m| String::from_utf8_lossy(m).into_owned()).collect()
}

/// Jobs waiting in any queue, per queue key.
async fn queued(conn: &mut MultiplexedConnection) -> Vec<(String, u64)> {
    let keys: Vec<String> = conn.keys("queue:*").await.expect("KEYS");
    let mut sizes = Vec::new();
    for key in keys {
        let size: u64 = conn.llen(&key).await.expect("LLEN");
        if size > 0 {
            sizes.push((key, size));
        }
    }
    sizes
}

/// Keeps deleting the heartbeat hash `key` (every 2 ms) until the returned
/// flag is set: the process's own beat (every 10 s) re-creates it, and the
/// test needs it gone while another process starts. The task returns how
/// many deletions found the hash there.
fn keep_deleting(conn: &MultiplexedConnection, key: &str) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u32>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut conn = conn.clone();
    let key = key.to_owned();
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut found = 0;
        while !flag.load(Ordering::Relaxed) {
            let deleted: u32 = conn.del(&key).await.expect("DEL");
            found += deleted;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        found
    });
    (stop, task)
}

/// No false death: a process whose heartbeat hash is gone (expired under
/// load, deleted by hand, lost in a Redis failover) but which still runs
/// keeps its jobs; once it is really dead, they run again elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_process_whose_heartbeat_vanished_keeps_its_jobs() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["chaos"]);
    let server = HttpServer::start(Duration::ZERO).await;
    let mut b = Runner::start(&redis.url(), dir.path(), &["--concurrency", "1"]);
    b.wait_running();
    let b_id = new_owner(&mut conn, &[]).await;
    push(
        &mut conn,
        "ChaosJob",
        "default",
        vec![json!(["http", server.url("/gate")])],
    )
    .await;
    eventually(
        Duration::from_secs(30),
        || format!("the job did not start in B:\n{}", b.log()),
        || async { server.gate_hits() == 1 },
    )
    .await;
    assert_eq!(held_by(&mut conn, &b_id).await.len(), 1, "B holds its job");

    // B's heartbeat is gone while A starts and sweeps for orphans.
    let (stop, deleter) = keep_deleting(&conn, &b_id);
    let mut a = Runner::start(&redis.url(), dir.path(), &[]);
    a.wait_running();
    stop.store(true, Ordering::Relaxed);
    let deleted = deleter.await.expect("deleter task");
    assert!(deleted >= 1, "B's heartbeat hash was there to delete");
    let a_id = new_owner(&mut conn, &[&b_id]).await;
    let in_b = held_by(&mut conn, &b_id).await;
    let in_a = held_by(&mut conn, &a_id).await;
    let waiting = queued(&mut conn).await;
    assert!(
        in_b.len() == 1 && in_a.is_empty() && waiting.is_empty(),
        "B ({b_id}, pid {}) still runs its job, yet A's start sweep moved it: B holds {in_b:?}, A holds {in_a:?}, queued {waiting:?}; gate calls: {}; A's log:\n{}",
        b.pid(),
        server.gate_hits(),
        a.log()
    );
    assert_eq!(server.gate_hits(), 1, "the job started once");

    // Now B really dies: a new process's start sweep recovers its job, which
    // runs again (in A or C) and finishes.
    b.signal("KILL");
    b.wait(Duration::from_secs(10));
    let mut c = Runner::start(&redis.url(), dir.path(), &[]);
    c.wait_running();
    eventually(
        Duration::from_secs(30),
        || format!("B's job did not start again:\nA:\n{}\nC:\n{}", a.log(), c.log()),
        || async { server.gate_hits() == 2 },
    )
    .await;
    server.open_gate();
    let probe = conn.clone();
    eventually(
        Duration::from_secs(30),
        || format!("B's job did not finish:\nA:\n{}\nC:\n{}", a.log(), c.log()),
        || {
            let mut conn = probe.clone();
            async move { int(&mut conn, "stat:processed").await == 1 && jobs_in_progress(&mut conn).await == 0 }
        },
    )
    .await;
    assert!(held_by(&mut conn, &b_id).await.is_empty());
    assert!(!owners(&mut conn).await.contains(&b_id), "the dead owner is forgotten");
    assert!(members(&mut conn, "retry").await.is_empty());
    assert!(members(&mut conn, "dead").await.is_empty());
    assert_eq!(server.gate_hits(), 2, "started once in B, once after B died");
    assert!(a.stop().success(), "{}", a.log());
    assert!(c.stop().success(), "{}", c.log());
}
