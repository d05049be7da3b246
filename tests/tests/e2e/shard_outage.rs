//! One runner over two Redis shards (real `redis-server`s): while shard
//! `b` refuses connections (stopped) and then hangs (`SIGSTOP`, as when
//! packets are dropped), the default shard's queue keeps **≥ 0.8× its rate
//! before the outage**, in strict and in weighted queue order; `b`'s own
//! jobs run again soon after it answers.
//!
//! The jobs sleep 20 ms each (`ChaosJob ["sleep", 20]`), so the rate is
//! set by the slots, not by how busy the machine is: a ratio measured in
//! one run, as the issue asks, not a speed target.

use std::time::{Duration, Instant};

use serde_json::json;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, plugins, push};

/// Slots, and how long one job sleeps: ~1,000 jobs/s when nothing stalls.
const SLOTS: &str = "20";
const SLEEP_MS: u64 = 20;
/// One window of the rate table.
const WINDOW: Duration = Duration::from_secs(2);
/// Windows measured before the outage, and in each of its two kinds.
const WINDOWS: usize = 2;

/// The default shard's jobs taken per second over each of `windows`
/// windows; the runner must live throughout.
async fn rates(conn: &mut redis::aio::MultiplexedConnection, runner: &mut Runner, windows: usize) -> Vec<f64> {
    let mut queues = [("default", conn.clone())];
    measure(windows, &mut queues, std::slice::from_mut(runner))
        .await
        .remove(0)
}

/// Jobs left in `b`'s queue.
async fn mail_left(b: &TestRedis) -> u64 {
    redis::cmd("LLEN")
        .arg("queue:mail")
        .query_async(&mut b.conn().await)
        .await
        .expect("LLEN")
}

/// Waits until `b`'s queue is shorter than `from` (its jobs are fetched
/// again); returns how long that took.
async fn resumed(b: &TestRedis, from: u64, runner: &Runner) -> Duration {
    let started = Instant::now();
    while mail_left(b).await >= from {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "shard b's jobs were not fetched again after it came back:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// The outage with `-q queues`. With weights, `b`'s queue starts full
/// and shares the slots; in strict order it comes first and is empty (a
/// high-priority queue on another shard: every fetch asks `b` first).
/// After each return, 50 jobs pushed to `b` must be fetched.
async fn outage(queues: &str, weighted: bool) {
    let a = TestRedis::start();
    let mut b = TestRedis::start();
    let mut conn = a.conn().await;
    let jobs = |n: usize| (0..n).map(|_| json!(["sleep", SLEEP_MS])).collect::<Vec<_>>();
    // Enough for ~30 s at the full rate.
    for _ in 0..6 {
        push(&mut conn, "ChaosJob", "default", jobs(5_000)).await;
    }
    if weighted {
        push(&mut b.conn().await, "ChaosJob", "mail", jobs(20_000)).await;
    }

    let dir = plugins(&[], &["chaos"]);
    let shard = format!("b={}", b.url());
    let flags = ["--shard", &shard, "--route", "mail=b", "-q", queues, "-c", SLOTS];
    let mut runner = Runner::start(&a.url(), dir.path(), &flags);
    runner.wait_running();
    // Past the start (instances warm, both shards fetched from).
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before = rates(&mut conn, &mut runner, WINDOWS).await;
    b.stop();
    let refused = rates(&mut conn, &mut runner, WINDOWS).await;
    b.start_again();
    push(&mut b.conn().await, "ChaosJob", "mail", jobs(50)).await;
    let left = mail_left(&b).await;
    let back_after_refusal = resumed(&b, left, &runner).await;
    b.freeze();
    let hung = rates(&mut conn, &mut runner, WINDOWS).await;
    b.thaw();
    push(&mut b.conn().await, "ChaosJob", "mail", jobs(50)).await;
    let left = mail_left(&b).await;
    let back_after_hang = resumed(&b, left, &runner).await;

    let baseline = before.iter().sum::<f64>() / before.len() as f64;
    eprintln!(
        "-q {queues}: default shard jobs/s by {WINDOW:?} window: before {before:.0?}, b refused {refused:.0?}, b hung {hung:.0?}; b's jobs ran again after {back_after_refusal:?} (restart), {back_after_hang:?} (SIGCONT)"
    );
    for (case, windows) in [("refused", &refused), ("hung", &hung)] {
        for (i, rate) in windows.iter().enumerate() {
            assert!(
                *rate >= 0.8 * baseline,
                "-q {queues}: with shard b {case}, window {i} ran {rate:.0} jobs/s, under 0.8x the {baseline:.0} before\n{}",
                runner.log()
            );
        }
    }
    // The bound: a shard that answers again is served within 2 s.
    for back in [back_after_refusal, back_after_hang] {
        assert!(
            back < Duration::from_secs(2),
            "-q {queues}: b's jobs waited {back:?} after it answered again"
        );
    }
    assert!(runner.stop().success(), "{}", runner.log());
    assert!(
        runner.log().contains("shard b does not answer") || runner.log().contains("the queues of shard b wait"),
        "the runner did not say that shard b was down:\n{}",
        runner.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_hung_shard_keeps_the_others_rate_in_strict_order() {
    outage("mail,default", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_hung_shard_keeps_the_others_rate_in_weighted_order() {
    outage("default:1,mail:1", true).await;
}

/// The closing run: 100,000 jobs over three shards and two
/// runners; shard `b` refuses connections for 10 s, then hangs for 10 s.
/// Every id runs, the healthy shards hold ≥ 0.8× their earlier rate in
/// every 2 s window (the table is printed), and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shards_two_runners_through_a_refused_then_hung_shard() {
    const TOTAL: usize = 100_000;
    const OUTAGE_WINDOWS: usize = 5;
    let a = TestRedis::start();
    let mut b = TestRedis::start();
    let c = TestRedis::start();
    let queues = [("default", &a), ("qb", &b), ("qc", &c)];
    // Ids 0.. round-robin over the three queues, each job appending its
    // id to one file the two runners share (one write each).
    for (index, (queue, redis)) in queues.iter().enumerate() {
        let ids: Vec<serde_json::Value> = (index..TOTAL)
            .step_by(queues.len())
            .map(|id| json!(["slow-append", "ids", id, SLEEP_MS]))
            .collect();
        let mut conn = redis.conn().await;
        for chunk in ids.chunks(5_000) {
            push(&mut conn, "ChaosJob", queue, chunk.to_vec()).await;
        }
    }
    let dir = plugins(&[], &["chaos"]);
    let (shard_b, shard_c) = (format!("b={}", b.url()), format!("c={}", c.url()));
    let flags = [
        "--shard",
        &shard_b,
        "--shard",
        &shard_c,
        "--route",
        "qb=b",
        "--route",
        "qc=c",
        "-q",
        "default:1,qb:1,qc:1",
        "-c",
        SLOTS,
    ];
    let mut runners = [
        Runner::start(&a.url(), dir.path(), &flags),
        Runner::start(&a.url(), dir.path(), &flags),
    ];
    for runner in &mut runners {
        runner.wait_running();
    }
    let mut conns = vec![("default", a.conn().await), ("qc", c.conn().await)];
    // Past the start: both runners fetch from every shard.
    measure(1, &mut conns, &mut runners).await;
    let before = measure(2, &mut conns, &mut runners).await;
    b.stop();
    let refused = measure(OUTAGE_WINDOWS, &mut conns, &mut runners).await;
    b.start_again();
    b.freeze();
    let hung = measure(OUTAGE_WINDOWS, &mut conns, &mut runners).await;
    b.thaw();

    eprintln!("| queue (shard) | before | b refused (2 s windows) | b hung (2 s windows) |\n|---|---|---|---|");
    for (i, (queue, _)) in conns.iter().enumerate() {
        eprintln!("| {queue} | {:.0?} | {:.0?} | {:.0?} |", before[i], refused[i], hung[i]);
    }
    for (i, (queue, _)) in conns.iter().enumerate() {
        let baseline = before[i].iter().sum::<f64>() / before[i].len() as f64;
        for (case, windows) in [("refused", &refused[i]), ("hung", &hung[i])] {
            for (w, rate) in windows.iter().enumerate() {
                assert!(
                    *rate >= 0.8 * baseline,
                    "queue {queue}: with b {case}, window {w} ran {rate:.0} jobs/s, under 0.8x the {baseline:.0} before\n{}",
                    runners[0].log()
                );
            }
        }
    }

    // Every id runs (at least once), then nothing is left anywhere.
    let ids = dir.path().join("chaos/data/ids");
    let deadline = Instant::now() + Duration::from_secs(300);
    let seen = loop {
        let text = std::fs::read_to_string(&ids).unwrap_or_default();
        let seen: std::collections::BTreeSet<usize> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if seen.len() == TOTAL {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {TOTAL} ids ran:\n{}",
            seen.len(),
            runners[0].log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(seen.iter().next_back(), Some(&(TOTAL - 1)));
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
    for (name, redis) in [("a", &a), ("b", &b), ("c", &c)] {
        let mut conn = redis.conn().await;
        let held: Vec<String> = redis::cmd("KEYS")
            .arg("wasmjobs:inprogress:*")
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        assert!(held.is_empty(), "shard {name} still holds jobs in {held:?}");
        for queue in ["default", "qb", "qc"] {
            assert_eq!(queue_len(&mut conn, queue).await, 0, "shard {name}, queue {queue}");
        }
    }
}

/// Each of `conns`' queues' jobs taken per second over each of `windows`
/// windows; every runner must live throughout.
async fn measure(
    windows: usize,
    conns: &mut [(&str, redis::aio::MultiplexedConnection)],
    runners: &mut [Runner],
) -> Vec<Vec<f64>> {
    let mut table: Vec<Vec<f64>> = vec![Vec::new(); conns.len()];
    let mut before = Vec::new();
    for (queue, conn) in conns.iter_mut() {
        before.push(queue_len(conn, queue).await);
    }
    for _ in 0..windows {
        let started = Instant::now();
        while started.elapsed() < WINDOW {
            for runner in runners.iter_mut() {
                if let Some(status) = runner.try_status() {
                    panic!("a runner exited ({status}):\n{}", runner.log());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (i, (queue, conn)) in conns.iter_mut().enumerate() {
            let now = queue_len(conn, queue).await;
            assert!(now > 0, "queue {queue} ran dry: push more jobs");
            table[i].push((before[i] - now) as f64 / started.elapsed().as_secs_f64());
            before[i] = now;
        }
    }
    table
}

/// Jobs left in `queue` on one shard.
async fn queue_len(conn: &mut redis::aio::MultiplexedConnection, queue: &str) -> u64 {
    redis::cmd("LLEN")
        .arg(format!("queue:{queue}"))
        .query_async(conn)
        .await
        .expect("LLEN")
}
