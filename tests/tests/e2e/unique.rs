//! Unique jobs end to end (`docs/unique-jobs.md`): a real `redis-server`,
//! real `wasmjobs run` and `wasmjobs enqueue` processes, the chaos test
//! guest, and the Rust client crate (`wasmjobs-client`).
//!
//! Every wait polls for its condition with a deadline; nothing sleeps to
//! synchronise.

use std::time::{Duration, Instant, SystemTime};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs_client::{Client, Job, Pushed, UniqueUntil};
use wasmjobs_e2e::cli::{printed, wasmjobs_in};
use wasmjobs_e2e::eventually;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{self, Runner};

const CLASS: &str = "ChaosJob";
const DEADLINE: Duration = Duration::from_secs(30);

async fn client(redis: &TestRedis) -> Client<redis::aio::MultiplexedConnection> {
    Client::from_connection(redis.conn().await)
}

fn unique(args: Value) -> Job {
    Job::new(CLASS).args(args).unique_for(Duration::from_secs(60))
}

async fn push(redis: &TestRedis, job: &Job) -> Pushed {
    client(redis).await.push(job).await.expect("push")
}

/// The lock key a payload names, and the payload of the only job in `list`.
async fn only_job(conn: &mut redis::aio::MultiplexedConnection, list: &str) -> Value {
    let jobs: Vec<String> = conn.lrange(list, 0, -1).await.expect("LRANGE");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    serde_json::from_str(&jobs[0]).expect("JSON payload")
}

async fn owner(conn: &mut redis::aio::MultiplexedConnection, lock: &str) -> Option<String> {
    conn.get(lock).await.expect("GET lock")
}

fn enqueue_cli(redis: &TestRedis, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = redis.url();
    let mut args = vec!["enqueue", "--redis", url.as_str()];
    args.extend_from_slice(extra);
    wasmjobs_in(dir.path(), &args, &[("RUST_LOG", "warn")], DEADLINE)
}

/// The issue's test: 100 concurrent enqueues of the same job give one job
/// (from 100 tasks on their own connections, and again from 20 `wasmjobs
/// enqueue` processes at once); once a runner has run it successfully, the
/// next enqueue goes in. `wasmjobs stats` counts the lock meanwhile, and
/// `/metrics` the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_give_one_job_until_it_succeeds() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let job = unique(json!(["ok"]));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let mut client = client(&redis).await;
        let job = job.clone();
        tasks.push(tokio::spawn(async move { client.push(&job).await.expect("push") }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    let enqueued: Vec<&Pushed> = results.iter().filter(|p| !p.is_duplicate()).collect();
    assert_eq!(enqueued.len(), 1, "{results:?}");
    let jid = enqueued[0].jid().to_owned();
    for duplicate in results.iter().filter(|p| p.is_duplicate()) {
        let Pushed::Duplicate { jid: holder, ttl } = duplicate else {
            unreachable!()
        };
        assert_eq!(holder, &jid);
        assert!(
            ttl.is_some_and(|t| t <= Duration::from_secs(60) && t > Duration::from_secs(30)),
            "{ttl:?}"
        );
    }
    let payload = only_job(&mut conn, "queue:default").await;
    assert_eq!(payload["jid"], json!(jid));
    assert_eq!(payload["unique_for"], json!(60));
    let lock = payload["unique_lock"].as_str().expect("lock field").to_owned();
    assert_eq!(owner(&mut conn, &lock).await.as_deref(), Some(jid.as_str()));
    let queues: Vec<String> = conn.smembers("queues").await.expect("SMEMBERS");
    assert_eq!(queues, ["default"]);

    // The same through the command line, 20 processes at once: all refused.
    let cli = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|_| scope.spawn(|| enqueue_cli(&redis, &["--unique-for", "60", CLASS, r#"["ok"]"#])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect::<Vec<_>>()
    });
    for output in &cli {
        assert_eq!(output.status.code(), Some(3), "{}", printed(output));
        let text = printed(output);
        assert!(
            text.contains("not enqueued") && text.contains(&format!("(jid {jid})")),
            "{text}"
        );
    }
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 1);

    let stats = enqueue_stats(&redis);
    assert_eq!(stats["unique_locks"], json!(1), "{stats}");
    assert_eq!(stats["unique_locks_exact"], json!(true), "{stats}");

    let plugins = runner::plugins(&[], &["chaos"]);
    let addr = runner::free_addr();
    let mut run = Runner::start(&redis.url(), plugins.path(), &["--metrics-addr", &addr]);
    run.wait_running();
    runner::wait_processed(&mut conn, 1, DEADLINE, || run.log()).await;
    // Released in the outcome's own transaction.
    assert_eq!(owner(&mut conn, &lock).await, None);
    assert_eq!(runner::int(&mut conn, "stat:failed").await, 0, "{}", run.log());
    let metrics = runner::http_get(&addr, "/metrics");
    assert!(
        metrics.contains("\nwasmjobs_unique_locks_released_total 1\n"),
        "{metrics}"
    );

    let next = push(&redis, &job).await;
    assert!(!next.is_duplicate(), "{next:?}");
    assert_ne!(next.jid(), jid);
    run.stop();
}

fn enqueue_stats(redis: &TestRedis) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = wasmjobs_in(
        dir.path(),
        &["stats", "--json", "--redis", &redis.url()],
        &[("RUST_LOG", "warn")],
        DEADLINE,
    );
    assert!(output.status.success(), "{}", printed(&output));
    serde_json::from_slice(&output.stdout).expect("stats JSON")
}

/// A failing job keeps its lock while it waits in `retry` (a duplicate is
/// refused), and releases it when it dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_job_keeps_its_lock_and_a_dead_one_releases_it() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let job = unique(json!(["retry", "not yet"])).retry(1);
    let jid = push(&redis, &job).await.jid().to_owned();
    let lock = only_job(&mut conn, "queue:default").await["unique_lock"]
        .as_str()
        .expect("lock")
        .to_owned();

    let plugins = runner::plugins(&[], &["chaos"]);
    let mut run = Runner::start(&redis.url(), plugins.path(), &["--poll-interval", "0.05"]);
    run.wait_running();
    eventually(
        DEADLINE,
        || "the job waits in retry".into(),
        || {
            let mut conn = conn.clone();
            async move { conn.zcard::<_, u64>("retry").await.expect("ZCARD") == 1 }
        },
    )
    .await;
    assert_eq!(owner(&mut conn, &lock).await.as_deref(), Some(jid.as_str()));
    let refused = push(&redis, &job).await;
    assert_eq!(
        refused,
        Pushed::Duplicate {
            jid: jid.clone(),
            ttl: refused_ttl(&refused)
        }
    );

    runner::make_retries_due(&mut conn).await;
    eventually(
        DEADLINE,
        || "the job dies".into(),
        || {
            let mut conn = conn.clone();
            async move { conn.zcard::<_, u64>("dead").await.expect("ZCARD") == 1 }
        },
    )
    .await;
    let dead = runner::zset(&mut conn, "dead").await;
    assert_eq!(dead[0].jid(), jid);
    assert_eq!(owner(&mut conn, &lock).await, None, "{}", run.log());
    assert!(!push(&redis, &job).await.is_duplicate());
    run.stop();
}

fn refused_ttl(pushed: &Pushed) -> Option<Duration> {
    match pushed {
        Pushed::Duplicate { ttl, .. } => *ttl,
        Pushed::Enqueued { .. } => panic!("not refused: {pushed:?}"),
    }
}

/// With no worker, the lock expires after `unique_for` and a new job goes in.
#[tokio::test]
async fn the_lock_expires_after_unique_for() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let job = Job::new(CLASS).args(json!(["ok"])).unique_for(Duration::from_secs(1));
    let first = push(&redis, &job).await;
    assert!(!first.is_duplicate());
    let started = Instant::now();
    let refused = push(&redis, &job).await;
    assert!(
        refused_ttl(&refused).is_some_and(|t| t <= Duration::from_secs(1)),
        "{refused:?}"
    );
    eventually(
        DEADLINE,
        || "a push goes in once the lock expired".into(),
        || {
            let redis = &redis;
            let job = &job;
            async move { !push(redis, job).await.is_duplicate() }
        },
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 2);
}

/// A scheduled unique job holds its lock for its delay plus `unique_for`.
#[tokio::test]
async fn a_scheduled_job_holds_its_lock_for_delay_plus_unique_for() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let job = unique(json!(["ok"])).at(SystemTime::now() + Duration::from_secs(100));
    let pushed = push(&redis, &job).await;
    assert!(!pushed.is_duplicate());
    let scheduled = runner::zset(&mut conn, "schedule").await;
    assert_eq!(scheduled.len(), 1);
    assert_eq!(scheduled[0].jid(), pushed.jid());
    assert!(scheduled[0].get("enqueued_at").is_none());
    let lock = scheduled[0].str("unique_lock").expect("lock").to_owned();
    let pttl: i64 = conn.pttl(&lock).await.expect("PTTL");
    assert!((150_000..=160_000).contains(&pttl), "{pttl}");
    // A duplicate to run now is refused too.
    assert!(push(&redis, &unique(json!(["ok"]))).await.is_duplicate());
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 0);
}

/// An explicit key: different classes, queues and args are duplicates when
/// they share it; the command line takes it too.
#[tokio::test]
async fn an_explicit_key_is_unique_across_classes_and_queues() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let first = push(&redis, &unique(json!(["ok"])).unique_key("user-7")).await;
    assert!(!first.is_duplicate());
    let other = Job::new("Other")
        .args(json!([1, 2]))
        .queue("low")
        .unique_for(Duration::from_secs(5))
        .unique_key("user-7");
    assert!(push(&redis, &other).await.is_duplicate());
    let output = enqueue_cli(
        &redis,
        &["--unique-for", "9", "--unique-key", "user-7", "-q", "mail", "Mailer"],
    );
    assert_eq!(output.status.code(), Some(3), "{}", printed(&output));
    assert!(printed(&output).contains(first.jid()), "{}", printed(&output));
    // Without the key, the same job is not a duplicate of the keyed one.
    assert!(!push(&redis, &unique(json!(["ok"]))).await.is_duplicate());
    let output = enqueue_cli(&redis, &["--unique-for", "9", "--unique-key", "user-8", "Mailer"]);
    assert!(output.status.success(), "{}", printed(&output));
    assert!(printed(&output).contains("enqueued job Mailer"), "{}", printed(&output));
    assert_eq!(conn.llen::<_, u64>("queue:default").await.expect("LLEN"), 3);
    let bad = enqueue_cli(&redis, &["--unique-key", "k", "Mailer"]);
    assert_eq!(bad.status.code(), Some(2), "{}", printed(&bad));
    let bad = enqueue_cli(&redis, &["--unique-for", "5", "--count", "2", "Mailer"]);
    assert_eq!(bad.status.code(), Some(2), "{}", printed(&bad));
}

/// `unique_until: start`: the lock goes when the job starts, so a new one
/// goes in while the first still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_until_start_releases_the_lock_when_the_job_starts() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    let job = unique(json!(["sleep", 20_000])).unique_until(UniqueUntil::Start);
    let jid = push(&redis, &job).await.jid().to_owned();
    let payload = only_job(&mut conn, "queue:default").await;
    assert_eq!(payload["unique_until"], json!("start"));
    let lock = payload["unique_lock"].as_str().expect("lock").to_owned();
    assert!(push(&redis, &job).await.is_duplicate());

    let plugins = runner::plugins(&[], &["chaos"]);
    let mut run = Runner::start(&redis.url(), plugins.path(), &["-c", "1"]);
    run.wait_running();
    eventually(
        DEADLINE,
        || "the lock is released as the job starts".into(),
        || {
            let mut conn = conn.clone();
            let lock = lock.clone();
            async move { owner(&mut conn, &lock).await.is_none() }
        },
    )
    .await;
    // Still running: nothing recorded, the job in the in-progress list.
    assert_eq!(runner::int(&mut conn, "stat:processed").await, 0, "{}", run.log());
    assert_eq!(runner::jobs_in_progress(&mut conn).await, 1);
    let second = push(&redis, &job).await;
    assert!(!second.is_duplicate());
    assert_eq!(owner(&mut conn, &lock).await.as_deref(), Some(second.jid()));
    assert_ne!(second.jid(), jid);
}

/// A payload's lock field is hostile input: a forged one names a key
/// outside our prefix, a malformed lock key, or another job's lock; when
/// the job ends, none of those keys is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_lock_field_deletes_nothing_else() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    // Another job's genuine lock, and keys that are not locks at all.
    let victim = push(&redis, &unique(json!(["victim"]))).await;
    let victim_lock = only_job(&mut conn, "queue:default").await["unique_lock"]
        .as_str()
        .expect("lock")
        .to_owned();
    let _: () = conn.del("queue:default").await.expect("DEL");
    let odd_lock = format!("wasmjobs:unique:{}", "Z".repeat(64));
    for (key, value) in [
        ("secret", "forged-1"),
        (odd_lock.as_str(), "forged-2"),
        ("stat:processed", "0"),
    ] {
        let _: () = conn.set(key, value).await.expect("SET");
    }
    let forged = [
        json!({"class": CLASS, "args": ["ok"], "jid": "forged-1", "unique_for": 60, "unique_lock": "secret"}),
        json!({"class": CLASS, "args": ["ok"], "jid": "forged-2", "unique_for": 60, "unique_lock": odd_lock}),
        json!({"class": CLASS, "args": ["ok"], "jid": "forged-3", "unique_for": 60, "unique_lock": victim_lock}),
        json!({"class": CLASS, "args": ["ok"], "jid": "forged-4", "unique_until": "start", "unique_lock": "stat:processed"}),
    ];
    for payload in &forged {
        let _: () = conn.lpush("queue:default", payload.to_string()).await.expect("LPUSH");
    }
    let plugins = runner::plugins(&[], &["chaos"]);
    let mut run = Runner::start(&redis.url(), plugins.path(), &[]);
    run.wait_running();
    runner::wait_processed(&mut conn, forged.len() as u64, DEADLINE, || run.log()).await;
    assert_eq!(owner(&mut conn, "secret").await.as_deref(), Some("forged-1"));
    assert_eq!(owner(&mut conn, &odd_lock).await.as_deref(), Some("forged-2"));
    assert_eq!(owner(&mut conn, &victim_lock).await.as_deref(), Some(victim.jid()));
    assert_eq!(runner::int(&mut conn, "stat:failed").await, 0, "{}", run.log());
    run.stop();
}
