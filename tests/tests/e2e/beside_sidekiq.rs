//! A Rails app moving one job class at a time: a real Ruby Sidekiq worker
//! (Debian's ruby-sidekiq, with ruby-activejob's adapter) and wasmjobs
//! runners on the same Redis, neither stealing the other's jobs.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;
use wasmjobs_e2e::eventually;
use wasmjobs_e2e::redis_server::{TestRedis, command_calls};
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, identity_of, lines, plugins, zset};
use wasmjobs_e2e::sidekiq::{SidekiqProcess, ruby};

/// The Ruby side: `RubyJob` (plain Sidekiq) and `RubyActiveJob`
/// (ActiveJob) on `default`, each appending "<class> <n>" to the file
/// that replaces `ENV.fetch("RAN")`.
const WORKER: &str = r#"require "active_job"
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
class RubyJob
  include Sidekiq::Worker
  def perform(n) = File.open(ENV.fetch("RAN"), "a") { |f| f.puts("RubyJob #{n}") }
end
class RubyActiveJob < ActiveJob::Base
  queue_as :default
  def perform(n) = File.open(ENV.fetch("RAN"), "a") { |f| f.puts("RubyActiveJob #{n}") }
end
"#;

/// Pushes from Ruby, as a Rails app would: `n` of each of the four kinds
/// (Ruby plain and ActiveJob on `default`, Wasm plain and ActiveJob on
/// `wasm`, all served by the report guest's `ReportJob`; the plain Wasm
/// jobs take 10 ms each, so a kill finds some running).
fn push_mixed(url: &str, n: usize) {
    ruby(
        url,
        &format!(
            r#"require "active_job"
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
Sidekiq.logger = Logger.new(nil)
class RubyActiveJob < ActiveJob::Base; queue_as :default; end
class ReportJob < ActiveJob::Base; queue_as :wasm; end
n = {n}
Sidekiq::Client.push_bulk("class" => "RubyJob", "queue" => "default", "args" => (1..n).map {{ |i| [i] }})
Sidekiq::Client.push_bulk("class" => "ReportJob", "queue" => "wasm", "args" => (1..n).map {{ |i| ["plain", i, 10] }})
(1..n).each {{ |i| RubyActiveJob.perform_later(i); ReportJob.perform_later("aj", i) }}
"#
        ),
    );
}

/// Each line of `path`, counted.
fn counted(lines: Vec<String>) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(line).or_insert(0) += 1;
    }
    counts
}

/// The Wasm jobs the report guest ran, by "<plain|aj> <n>", counted.
fn wasm_runs(dir: &Path) -> HashMap<String, usize> {
    counted(
        lines(&dir.join("activejob/data/seen.jsonl"))
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|seen| format!("{} {}", seen["args"][0].as_str().unwrap_or("?"), seen["args"][1]))
            .collect(),
    )
}

/// A Redis, the report guest's plugin directory, and a Ruby Sidekiq worker
/// on `default` with `concurrency` threads writing its runs to `ran`.
struct Side {
    redis: TestRedis,
    url: String,
    conn: redis::aio::MultiplexedConnection,
    dir: tempfile::TempDir,
    ran: std::path::PathBuf,
    sidekiq: SidekiqProcess,
}

impl Side {
    async fn start(concurrency: &str) -> Side {
        let redis = TestRedis::start();
        let url = redis.url();
        let conn = redis.conn().await;
        let dir = plugins(&[], &["activejob"]);
        let ran = dir.path().join("ruby-ran.txt");
        let worker = WORKER.replace(r#"ENV.fetch("RAN")"#, &format!("{:?}", ran.display().to_string()));
        let sidekiq = SidekiqProcess::start_with(&url, &["-q", "default", "-c", concurrency], &worker);
        Side {
            redis,
            url,
            conn,
            dir,
            ran,
            sidekiq,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruby_and_wasm_on_their_own_queues_each_run_their_own_jobs_once_through_a_kill() {
    let Side {
        redis: _redis,
        url,
        mut conn,
        dir,
        ran,
        sidekiq,
    } = Side::start("5").await;
    // Few slots, so the kill finds plain Wasm jobs (10 ms each) running
    // and others waiting, while Ruby is still pushing.
    let mut runner = Runner::start(&url, dir.path(), &["-q", "wasm", "-c", "4"]);
    runner.wait_running();
    let jobs = 500;
    let pusher = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || push_mixed(&url, jobs))
    };

    // Kill the runner mid-run, then start another: nothing may be lost.
    eventually(
        Duration::from_secs(60),
        || runner.log(),
        || async { wasm_runs(dir.path()).values().sum::<usize>() >= 100 },
    )
    .await;
    runner.signal("KILL");
    runner.wait(Duration::from_secs(10));
    let at_kill = wasm_runs(dir.path()).len();
    println!("{at_kill} of {} Wasm jobs had run at the kill -9", 2 * jobs);
    assert!(at_kill < 2 * jobs, "the kill came mid-run");
    let mut second = Runner::start(&url, dir.path(), &["-q", "wasm", "-c", "20"]);
    second.wait_running();
    pusher.await.expect("the Ruby pusher");

    eventually(
        Duration::from_secs(120),
        || {
            format!(
                "ruby ran {} distinct, wasm {} distinct; sidekiq log:\n{}\nrunner log:\n{}",
                counted(lines(&ran)).len(),
                wasm_runs(dir.path()).len(),
                sidekiq.log(),
                second.log()
            )
        },
        || async { counted(lines(&ran)).len() == 2 * jobs && wasm_runs(dir.path()).len() == 2 * jobs },
    )
    .await;
    let ruby_runs = counted(lines(&ran));
    let wasm = wasm_runs(dir.path());
    for i in 1..=jobs {
        for kind in ["RubyJob", "RubyActiveJob"] {
            assert_eq!(ruby_runs.get(&format!("{kind} {i}")), Some(&1), "{kind} {i}");
        }
        for kind in ["plain", "aj"] {
            assert!(wasm.contains_key(&format!("{kind} {i}")), "{kind} {i}");
        }
    }
    let duplicates: usize = wasm.values().map(|n| n - 1).sum();
    println!("wasm jobs run twice after the kill -9 (at-least-once): {duplicates}");
    assert!(
        duplicates <= 20,
        "at most the jobs in flight at the kill run twice: {duplicates}"
    );
    assert!(zset(&mut conn, "retry").await.is_empty(), "nothing in retry");
    assert!(zset(&mut conn, "dead").await.is_empty(), "nothing dead");
    assert!(!sidekiq.log().contains("NameError"), "{}", sidekiq.log());
    assert!(
        !second.log().contains("also fetched by the Ruby Sidekiq"),
        "{}",
        second.log()
    );
    second.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_queue_ruby_jobs_are_handed_back_untouched_and_the_sharing_is_named() {
    let Side {
        redis: _redis,
        url,
        mut conn,
        dir,
        ran,
        sidekiq,
    } = Side::start("2").await;
    let ruby_id = identity_of(&mut conn, sidekiq.pid(), || sidekiq.log()).await;
    let (metrics, web) = (free_addr(), free_addr());
    let mut runner = Runner::start(
        &url,
        dir.path(),
        &["-q", "default", "-c", "20", "--metrics-addr", &metrics, "--web", &web],
    );
    runner.wait_running();
    // It says so at start, naming the Ruby process and the fix.
    runner.wait_for_log("also fetched by the Ruby Sidekiq process", Duration::from_secs(30));
    let log = runner.log();
    assert!(log.contains(&ruby_id) && log.contains("queue_as :wasm"), "{log}");
    let text = http_get(&metrics, "/metrics");
    assert!(
        text.contains("wasmjobs_queue_shared_with_sidekiq{queue=\"default\"} 1"),
        "{text}"
    );
    let page = http_get(&web, "/processes");
    assert!(page.contains("shared-queue") && page.contains(&ruby_id), "{page}");

    let before: u64 = command_calls(&mut conn).await.expect("INFO").values().sum();
    let jobs = 300;
    ruby(
        &url,
        &format!(
            r#"Sidekiq::Client.push_bulk("class" => "RubyJob", "queue" => "default", "args" => (1..{jobs}).map {{ |i| [i] }})"#
        ),
    );
    eventually(
        Duration::from_secs(60),
        || format!("ruby ran {}:\n{}\n{}", lines(&ran).len(), sidekiq.log(), runner.log()),
        || async { counted(lines(&ran)).len() == jobs },
    )
    .await;
    let after: u64 = command_calls(&mut conn).await.expect("INFO").values().sum();
    let ruby_runs = counted(lines(&ran));
    assert!(ruby_runs.values().all(|n| *n == 1), "each Ruby job ran once");
    assert!(zset(&mut conn, "retry").await.is_empty(), "no Ruby job in retry");
    let handed: u64 = http_get(&metrics, "/metrics")
        .lines()
        .find_map(|line| line.strip_prefix("wasmjobs_jobs_handed_back_total ")?.parse().ok())
        .expect("the handed-back counter");
    let per_job = (after - before) as f64 / jobs as f64;
    println!("{handed} of {jobs} Ruby jobs handed back; {per_job:.1} Redis commands a job (Ruby's included)");
    // A fetch-and-hand-back loop would cost hundreds a job.
    assert!(per_job < 30.0, "{per_job:.1} commands a job");
    let stats: Value = serde_json::from_str(&http_get(&metrics, "/stats")).expect("JSON");
    assert_eq!(stats["process"]["handed_back"], handed, "{stats}");
    assert!(
        !stats["classes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["class"] == "(unserved)")),
        "a handed-back job is not counted as run: {stats}"
    );
    runner.stop();
}

/// A Ruby Sidekiq process's record, as Sidekiq 6.4 writes its heartbeat,
/// fetching `queues`: a process that never takes a job (it is busy for
/// good, or its record lies).
async fn write_ruby_record(conn: &mut redis::aio::MultiplexedConnection, identity: &str, queues: &[&str]) {
    let now = wasmjobs::redis::now_f64();
    let info = serde_json::json!({
        "hostname": "rails-1", "started_at": now, "pid": 4242, "tag": "app", "concurrency": 10,
        "queues": queues, "labels": [], "identity": identity, "version": "6.4.1",
    });
    let _: () = redis::pipe()
        .atomic()
        .sadd("processes", identity)
        .ignore()
        .hset_multiple(
            identity,
            &[
                ("info", info.to_string()),
                ("beat", now.to_string()),
                ("busy", "10".to_owned()),
                ("quiet", "false".to_owned()),
            ],
        )
        .ignore()
        .expire(identity, 60)
        .ignore()
        .query_async(conn)
        .await
        .expect("write the process record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ruby_process_that_appears_later_and_never_takes_its_jobs_gets_them_in_schedule_untouched() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["activejob"]);
    let metrics = free_addr();
    let mut runner = Runner::start(&url, dir.path(), &["-q", "default", "--metrics-addr", &metrics]);
    runner.wait_running();
    // The Ruby process starts after the runner read the processes: it is
    // found when its first job comes, not up to ten seconds later.
    write_ruby_record(&mut conn, "rails-1:4242:0a1b2c3d4e5f", &["default"]).await;
    let now = wasmjobs::redis::now_f64();
    let pushed = [
        format!(
            r#"{{"class":"RubyJob","args":[1],"retry":false,"queue":"default","jid":"0123456789abcdef01234501","created_at":{now},"enqueued_at":{now}}}"#
        ),
        format!(
            r#"{{"class":"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper","wrapped":"RubyActiveJob","queue":"default","args":[{{"job_class":"RubyActiveJob","job_id":"5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9","provider_job_id":null,"queue_name":"default","priority":null,"arguments":[2],"executions":0,"exception_executions":{{}},"locale":"en","timezone":"UTC","enqueued_at":"2026-12-06T10:00:00Z"}}],"retry":true,"jid":"0123456789abcdef01234502","created_at":{now},"enqueued_at":{now}}}"#
        ),
    ];
    let _: () = redis::pipe()
        .sadd("queues", "default")
        .ignore()
        .lpush("queue:default", &pushed)
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("push");

    // Handed back to the front a few times, then into `schedule`, as pushed.
    let jobs = pushed.len();
    eventually(
        Duration::from_secs(60),
        || runner.log(),
        || {
            let mut conn = conn.clone();
            async move { zset(&mut conn, "schedule").await.len() == jobs }
        },
    )
    .await;
    let scheduled: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg("schedule")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("ZRANGE");
    for job in &pushed {
        let (_, at) = scheduled
            .iter()
            .find(|(payload, _)| payload == job)
            .unwrap_or_else(|| panic!("not in schedule byte for byte: {job}\n{scheduled:?}"));
        assert!(
            *at > now + 10.0,
            "it waits a while, not a busy loop: due {:.1} s on",
            at - now
        );
    }
    assert!(
        zset(&mut conn, "retry").await.is_empty(),
        "not retried: {}",
        runner.log()
    );
    assert!(zset(&mut conn, "dead").await.is_empty(), "not dead (retry: false)");
    let failed: Option<u64> = conn.get("stat:failed").await.expect("GET");
    assert_eq!(failed.unwrap_or(0), 0, "not counted as failed");
    let text = http_get(&metrics, "/metrics");
    let handed: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("wasmjobs_jobs_handed_back_total ")?.parse().ok())
        .expect("the handed-back counter");
    assert!(handed > pushed.len() as u64, "handed back to the front first: {handed}");
    assert!(runner.log().contains("rails-1:4242:0a1b2c3d4e5f"), "{}", runner.log());
    runner.stop();
}
