//! Interoperability with the real Sidekiq (Debian's ruby-sidekiq 6.4): jobs
//! pushed by its client run here, and its API reads our state, including
//! the Web UI's Quiet and Stop buttons (the `-signals` list).

use std::time::{Duration, Instant};

use serde_json::Value;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, plugins, wait_processed};
use wasmjobs_e2e::sidekiq::ruby_json;

/// Sidekiq's Ruby API on `url`, with the test's job classes declared; the
/// script prints JSON.
fn sidekiq(url: &str, script: &str) -> Value {
    ruby_json(
        url,
        &format!(
            "class FileAppendJob; include Sidekiq::Worker; end\nclass ChaosJob; include Sidekiq::Worker; end\n{script}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidekiq_clients_enqueue_and_sidekiq_api_reads_our_state() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut conn = redis.conn().await;
    let dir = plugins(&["file-append"], &["chaos"]);
    let file = dir.path().join("file-append/data/ruby.txt");

    let pushed = sidekiq(
        &url,
        r#"
jids = []
jids << Sidekiq::Client.push("class" => "FileAppendJob", "args" => ["ruby.txt", 1])
jids += Sidekiq::Client.push_bulk("class" => "FileAppendJob", "args" => (2..50).map { |i| ["ruby.txt", i] })
jids << FileAppendJob.perform_async("ruby.txt", 51)
jids << FileAppendJob.perform_in(1, "ruby.txt", 52)
jids << ChaosJob.perform_async("retry", "from ruby")
jids << ChaosJob.set(retry: false).perform_async("dead", "gone for good")
puts JSON.generate({jids: jids, enqueued: Sidekiq::Stats.new.enqueued, scheduled: Sidekiq::Stats.new.scheduled_size})
"#,
    );
    assert_eq!(pushed["jids"].as_array().map(Vec::len), Some(54));
    assert_eq!(pushed["enqueued"], 53);
    assert_eq!(pushed["scheduled"], 1);

    let mut runner = Runner::start(
        &url,
        dir.path(),
        &["--poll-interval", "0.2", "--tag", "interop", "--concurrency", "7"],
    );
    runner.wait_running();
    wait_processed(&mut conn, 54, Duration::from_secs(30), || runner.log()).await;

    let state = sidekiq(
        &url,
        r#"
stats = Sidekiq::Stats.new
ps = Sidekiq::ProcessSet.new
process = ps.first
retried = Sidekiq::RetrySet.new.first
dead = Sidekiq::DeadSet.new.first
puts JSON.generate({
  processed: stats.processed, failed: stats.failed, enqueued: stats.enqueued,
  retry_size: stats.retry_size, dead_size: stats.dead_size, processes: ps.size,
  tag: process["tag"], concurrency: process["concurrency"], queues: process["queues"],
  identity: process.identity, stopping: process.stopping?, rss: process["rss"],
  retry_message: retried && retried.item["error_message"], retry_class: retried && retried.klass,
  retry_count: retried && retried.item["retry_count"],
  dead_message: dead && dead.item["error_message"],
  queue_size: Sidekiq::Queue.new("default").size,
})
"#,
    );
    assert_eq!(state["processed"], 54, "{state}");
    assert_eq!(state["failed"], 2, "{state}");
    assert_eq!(state["enqueued"], 0, "{state}");
    assert_eq!(state["retry_size"], 1, "{state}");
    assert_eq!(state["dead_size"], 1, "{state}");
    assert_eq!(state["processes"], 1, "{state}");
    assert_eq!(state["tag"], "interop");
    assert_eq!(state["concurrency"], 7);
    assert_eq!(state["queues"], serde_json::json!(["default"]));
    assert_eq!(state["stopping"], false);
    assert!(state["rss"].as_u64().is_some_and(|kb| kb > 1000), "{state}");
    assert_eq!(state["retry_message"], "from ruby");
    assert_eq!(state["retry_class"], "ChaosJob");
    assert_eq!(state["retry_count"], 0);
    assert_eq!(state["dead_message"], "gone for good");

    let lines = std::fs::read_to_string(&file).expect("file written");
    let mut ids: Vec<u32> = lines.lines().map(|l| l.parse().expect("an id")).collect();
    ids.sort();
    assert_eq!(
        ids,
        (1..=52).collect::<Vec<_>>(),
        "every job from the Ruby client ran once"
    );

    // The Web UI's Quiet button, then its Stop button (delivered by our
    // heartbeat, which polls the -signals list every 10 s).
    let quiet = sidekiq(&url, r#"Sidekiq::ProcessSet.new.first.quiet!; puts "{}""#);
    assert!(quiet.is_object());
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let state = sidekiq(
            &url,
            r#"puts JSON.generate({stopping: Sidekiq::ProcessSet.new.first&.stopping?})"#,
        );
        if state["stopping"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the runner did not go quiet:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sidekiq(&url, r#"Sidekiq::ProcessSet.new.first.stop!; puts "{}""#);
    let status = runner.wait(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let after = sidekiq(&url, r#"puts JSON.generate({processes: Sidekiq::ProcessSet.new.size})"#);
    assert_eq!(after["processes"], 0);
}
