//! ActiveJob jobs end to end: a Rails app's `perform_later` (Debian's
//! ruby-activejob 6.1 with its Sidekiq adapter, ruby-globalid) and the
//! payloads Rails 8.0 + Sidekiq 8.1 write (built in the test, and as they
//! are pushed, from `tests/fixtures/activejob/`), run by a plugin listing
//! the job's own class (`tests/guests/activejob`, which reports what it sees), with
//! Sidekiq's Ruby API reading what is left behind.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::eventually;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get, lines, plugins, zset};
use wasmjobs_e2e::sidekiq::ruby_json;

/// Runs `script` after loading ActiveJob with the Sidekiq adapter pointed
/// at `url`, GlobalID (app `myapp`, a `User` model found by id) and the
/// test's job classes (`ReportJob`, `FailingJob` on queue `wasm`; their
/// Ruby bodies never run here). The script prints JSON.
fn rails(url: &str, script: &str) -> Value {
    ruby_json(
        url,
        &format!(
            r#"require "active_job"; require "global_id"; require "bigdecimal"
require "active_support/core_ext/numeric/time"
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
Sidekiq.logger = Logger.new(nil)
GlobalID.app = "myapp"
class User
  include GlobalID::Identification
  attr_reader :id
  def initialize(id) = @id = id
  def self.find(id) = new(id)
end
class ReportJob < ActiveJob::Base
  queue_as :wasm
  def perform(*args, **kw) = raise("ran in Ruby")
end
class FailingJob < ActiveJob::Base
  queue_as :wasm
  def perform(*args) = raise("ran in Ruby")
end
{script}"#
        ),
    )
}

/// The JSON lines the report guest wrote, one per job it ran.
fn seen(dir: &Path) -> Vec<Value> {
    lines(&dir.join("activejob/data/seen.jsonl"))
        .iter()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// Waits until the report guest has written `n` lines.
async fn wait_seen(dir: &Path, n: usize, runner: &Runner) {
    eventually(
        Duration::from_secs(30),
        || format!("{} of {n} jobs seen; runner log:\n{}", seen(dir).len(), runner.log()),
        || async { seen(dir).len() >= n },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_perform_later_runs_as_a_plugin_with_plain_json_arguments() {
    let redis = TestRedis::start();
    let url = redis.url();
    let conn = redis.conn().await;
    let dir = plugins(&[], &["activejob"]);
    let (metrics, web) = (free_addr(), free_addr());
    let mut runner = Runner::start(
        &url,
        dir.path(),
        &[
            "-q",
            "wasm",
            "--poll-interval",
            "0.1",
            "--metrics-addr",
            &metrics,
            "--web",
            &web,
        ],
    );
    runner.wait_running();

    let pushed = rails(
        &url,
        r#"
now = Time.now
job = ReportJob.perform_later("x", 1, User.new(42), :sym, { a: 1, "b" => [2] },
  Time.utc(2026, 12, 3, 10, 20, 30), 5.minutes, BigDecimal("1.5"), Date.new(2026, 1, 2),
  send_at: Time.utc(2026, 1, 1), tag: :vip)
later = ReportJob.set(wait: 2.seconds).perform_later("later")
at = Sidekiq::ScheduledSet.new.first.at.to_f
failing = FailingJob.perform_later("boom")
puts JSON.generate({ job_id: job.job_id, jid: job.provider_job_id, at: at, failing: failing.job_id })
"#,
    );

    wait_seen(dir.path(), 1, &runner).await;
    let first = seen(dir.path()).remove(0);
    assert_eq!(first["class"], "ReportJob", "{first}");
    assert_eq!(first["jid"], pushed["jid"], "{first}");
    assert_eq!(
        first["args"],
        json!([
            "x",
            1,
            "gid://myapp/User/42",
            "sym",
            {"a": 1, "b": [2]},
            "2026-12-03T10:20:30.000000000Z",
            300,
            // Rails 6.1 writes a BigDecimal as its text (7.2+ serializes it).
            "0.15e1",
            "2026-01-02",
            {"send_at": "2026-01-01T00:00:00.000000000Z", "tag": "vip"}
        ]),
        "{first}"
    );
    let context = &first["context"];
    assert_eq!(context["job_id"], pushed["job_id"], "{first}");
    assert_eq!(context["job_class"], "ReportJob");
    assert_eq!(context["executions"], 0);
    assert_eq!(context["locale"], "en");
    assert!(
        context["enqueued_at"].as_str().is_some_and(|t| t.starts_with("20")),
        "{first}"
    );
    assert_eq!(context["scheduled_at"], Value::Null);
    // The raw hash, as Ruby wrote it: markers and serializers still there.
    assert_eq!(first["raw"]["arguments"][2]["_aj_globalid"], "gid://myapp/User/42");
    assert_eq!(first["raw"]["job_class"], "ReportJob");

    // `wait: 2.seconds`: run within a second of its time.
    wait_seen(dir.path(), 2, &runner).await;
    let ran_at = wasmjobs::redis::now_f64();
    let at = pushed["at"].as_f64().expect("at");
    let later = seen(dir.path()).remove(1);
    assert_eq!(later["args"], json!(["later"]), "{later}");
    assert!(
        ran_at >= at && ran_at - at < 1.0,
        "ran {:.3} s after its time",
        ran_at - at
    );

    // A failure is retried on the outer hash, which Ruby still reads.
    eventually(
        Duration::from_secs(30),
        || runner.log(),
        || {
            let mut conn = conn.clone();
            async move { !zset(&mut conn, "retry").await.is_empty() }
        },
    )
    .await;
    let retried = rails(
        &url,
        r#"
entry = Sidekiq::RetrySet.new.first
puts JSON.generate({ display_class: entry.display_class, display_args: entry.display_args,
  klass: entry.klass, item: entry.item })
"#,
    );
    assert_eq!(retried["display_class"], "FailingJob", "{retried}");
    assert_eq!(retried["display_args"], json!(["boom"]), "{retried}");
    assert_eq!(retried["klass"], "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper");
    let item = &retried["item"];
    assert_eq!(item["wrapped"], "FailingJob");
    assert_eq!(item["args"][0]["job_id"], pushed["failing"]);
    assert_eq!(item["args"][0]["arguments"], json!(["boom"]));
    assert_eq!(item["args"][0]["executions"], 0);
    assert_eq!(item["retry_count"], 0);
    assert!(
        item["error_message"].as_str().is_some_and(|m| m.contains("on purpose")),
        "{item}"
    );
    // Sidekiq 6.4 wrote float seconds: the failure times keep that style.
    assert!(item["failed_at"].is_f64() && item["created_at"].is_f64(), "{item}");

    // Everything a person reads names the job's own class, never the wrapper.
    let wrapper = "JobWrapper";
    let text = http_get(&metrics, "/metrics");
    assert!(
        text.contains(r#"class="ReportJob""#) && text.contains(r#"class="FailingJob""#),
        "{text}"
    );
    assert!(!text.contains(wrapper), "{text}");
    let page = http_get(&web, "/retries");
    assert!(
        page.contains("FailingJob") && page.contains("[&quot;boom&quot;]"),
        "{page}"
    );
    assert!(
        !page.contains(wrapper) && !page.contains("job_class"),
        "the job's arguments are shown, not the ActiveJob hash: {page}"
    );
    let log = runner.log();
    assert!(log.contains("class=FailingJob"), "{log}");
    assert!(runner.stop().success(), "{}", runner.log());
    let summary = runner.log();
    assert!(summary.contains("ReportJob") && !summary.contains(wrapper), "{summary}");
}

/// `class`'s worst queue latency on the runner's `/stats` at `addr`: its
/// jobs were enqueued 1.5 s before the runner started, in integer
/// milliseconds; read as seconds, the latency would be years (or negative).
fn assert_queue_latency_from_milliseconds(addr: &str, class: &str) {
    let stats: Value = serde_json::from_str(&http_get(addr, "/stats")).expect("JSON");
    let entry = stats["classes"]
        .as_array()
        .and_then(|classes| classes.iter().find(|c| c["class"] == class))
        .unwrap_or_else(|| panic!("no {class} in {stats}"));
    let latency = entry["queue_latency_ms"]["max"].as_f64().expect("latency");
    assert!(
        (1_400.0..60_000.0).contains(&latency),
        "queue latency {latency} ms: {entry}"
    );
}

/// A Rails 8.0 + Sidekiq 8.1 payload (the ActiveJob reference's example):
/// `Sidekiq::ActiveJob::Wrapper`, integer-millisecond timestamps.
fn sidekiq_8(class: &str, arguments: Value, enqueued_ms: u64, jid: &str) -> String {
    json!({
        "retry": true, "queue": "wasm", "class": "Sidekiq::ActiveJob::Wrapper", "wrapped": class,
        "args": [{
            "job_class": class, "job_id": "8c1e7f52-3a4b-4c5d-9e6f-0a1b2c3d4e5f", "provider_job_id": null,
            "queue_name": "wasm", "priority": 5, "arguments": arguments, "executions": 0,
            "exception_executions": {}, "locale": "en", "timezone": "UTC",
            "enqueued_at": "2026-12-03T10:15:30.123456789Z", "scheduled_at": null
        }],
        "jid": jid, "created_at": enqueued_ms - 1, "enqueued_at": enqueued_ms
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidekiq_8_payloads_run_keep_milliseconds_and_refuse_unknown_serializers() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["activejob"]);
    let now_ms = (wasmjobs::redis::now_f64() * 1000.0) as u64;
    let enqueued_ms = now_ms - 1_500;
    let arguments = json!([
        {"_aj_globalid": "gid://myapp/User/42"},
        {"send_at": {"_aj_serialized": "ActiveJob::Serializers::TimeWithZoneSerializer",
                     "value": "2026-12-03T10:20:30.123456789Z", "time_zone": "Etc/UTC"},
         "price": {"_aj_serialized": "ActiveJob::Serializers::BigDecimalSerializer", "value": "9.99"},
         "window": {"_aj_serialized": "ActiveJob::Serializers::RangeSerializer", "begin": 1, "end": 5, "exclude_end": false},
         "tag": {"_aj_serialized": "ActiveJob::Serializers::SymbolSerializer", "value": "vip"},
         "_aj_ruby2_keywords": ["send_at", "price", "window", "tag"]}
    ]);
    let money = json!([{"_aj_serialized": "MoneySerializer", "cents": 500, "currency": "EUR"}]);
    let payloads = [
        sidekiq_8("ReportJob", arguments, enqueued_ms, "a00000000000000000000001"),
        sidekiq_8("FailingJob", json!(["boom"]), enqueued_ms, "a00000000000000000000002"),
        sidekiq_8("ReportJob", money, enqueued_ms, "a00000000000000000000003"),
    ];
    let _: () = redis::cmd("LPUSH")
        .arg("queue:wasm")
        .arg(&payloads)
        .query_async(&mut conn)
        .await
        .expect("push");
    let _: () = redis::cmd("SADD")
        .arg("queues")
        .arg("wasm")
        .query_async(&mut conn)
        .await
        .expect("sadd");

    let addr = free_addr();
    let mut runner = Runner::start(&url, dir.path(), &["-q", "wasm", "--metrics-addr", &addr]);
    wait_seen(dir.path(), 1, &runner).await;
    let report = seen(dir.path()).remove(0);
    assert_eq!(report["class"], "ReportJob");
    assert_eq!(
        report["args"],
        json!([
            "gid://myapp/User/42",
            {"send_at": "2026-12-03T10:20:30.123456789Z", "price": "9.99",
             "window": {"begin": 1, "end": 5, "exclude_end": false}, "tag": "vip"}
        ]),
        "{report}"
    );
    assert_eq!(
        report["enqueued_at_ms"], enqueued_ms,
        "milliseconds read as milliseconds"
    );
    assert_eq!(report["context"]["priority"], 5);
    assert_eq!(report["context"]["timezone"], "UTC");

    eventually(
        Duration::from_secs(30),
        || runner.log(),
        || {
            let mut conn = conn.clone();
            async move { !zset(&mut conn, "retry").await.is_empty() && !zset(&mut conn, "dead").await.is_empty() }
        },
    )
    .await;
    // Queue latency from the millisecond timestamps: 1.5 s and a little.
    assert_queue_latency_from_milliseconds(&addr, "ReportJob");

    let retry = zset(&mut conn, "retry").await.remove(0);
    assert_eq!(retry.class(), "Sidekiq::ActiveJob::Wrapper");
    assert_eq!(retry.str("wrapped"), Some("FailingJob"));
    assert_eq!(retry.get("created_at"), Some(&json!(enqueued_ms - 1)));
    assert_eq!(retry.get("enqueued_at"), Some(&json!(enqueued_ms)));
    let failed_at = retry
        .get("failed_at")
        .and_then(Value::as_u64)
        .expect("failed_at in integer ms");
    assert!(failed_at >= now_ms && failed_at < now_ms + 60_000, "{failed_at}");
    assert_eq!(retry.get("args").map(|a| &a[0]["arguments"]), Some(&json!(["boom"])));

    let dead = zset(&mut conn, "dead").await.remove(0);
    assert_eq!(dead.jid(), "a00000000000000000000003");
    assert_eq!(dead.str("wrapped"), Some("ReportJob"));
    let message = dead.str("error_message").unwrap_or_default();
    assert!(message.contains("MoneySerializer"), "{message}");
    assert!(
        dead.get("failed_at").is_some_and(Value::is_u64),
        "{:?}",
        dead.get("failed_at")
    );
    assert_eq!(seen(dir.path()).len(), 1, "the refused job never ran");
    runner.stop();
}

/// The payloads in `tests/fixtures/activejob/`, byte for byte as Sidekiq
/// 8.1 with Rails 8.0/8.1 pushes them, their integer-millisecond
/// `created_at`/`enqueued_at` moved to `created_ms`/`enqueued_ms`.
fn fixture(name: &str, created_ms: u64, enqueued_ms: u64) -> String {
    let path = wasmjobs_e2e::guests::repo_root()
        .join("tests/fixtures/activejob")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let moved = text
        .trim_end()
        .replace("1764756930123", &created_ms.to_string())
        .replace("1764756930124", &enqueued_ms.to_string());
    serde_json::from_str::<Value>(&moved).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
    moved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidekiq_8_fixtures_run_decoded_and_what_is_written_back_keeps_milliseconds() {
    let redis = TestRedis::start();
    let url = redis.url();
    let mut conn = redis.conn().await;
    let dir = plugins(&[], &["activejob"]);
    // The reference's example is a `WelcomeJob`: the report guest serves it too.
    let manifest = dir.path().join("activejob/wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let served = text.replace(r#"classes = ["ReportJob","#, r#"classes = ["WelcomeJob", "ReportJob","#);
    assert_ne!(served, text, "the manifest lists its classes");
    std::fs::write(&manifest, served).expect("manifest");

    let now_ms = (wasmjobs::redis::now_f64() * 1000.0) as u64;
    let (created_ms, enqueued_ms) = (now_ms - 2_000, now_ms - 1_500);
    let queued: Vec<String> = [
        "welcome.sidekiq-8.1.json",
        "every-serializer.sidekiq-8.1.json",
        "legacy-wrapper-name.sidekiq-8.1.json",
        "continuation.rails-8.1.json",
        "retried-failing.sidekiq-8.1.json",
    ]
    .iter()
    .map(|name| fixture(name, created_ms, enqueued_ms))
    .collect();
    let scheduled = fixture("scheduled-failing.sidekiq-8.1.json", created_ms, enqueued_ms);
    let at = wasmjobs::redis::now_f64() + 1.0;
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg("queues")
        .arg("default")
        .cmd("LPUSH")
        .arg("queue:default")
        .arg(&queued)
        .cmd("ZADD")
        .arg("schedule")
        .arg(at)
        .arg(&scheduled)
        .query_async(&mut conn)
        .await
        .expect("push");

    let addr = free_addr();
    let mut runner = Runner::start(
        &url,
        dir.path(),
        &["-q", "default", "--poll-interval", "0.1", "--metrics-addr", &addr],
    );
    wait_seen(dir.path(), 4, &runner).await;
    let seen = seen(dir.path());
    let by_jid = |jid: &str| {
        seen.iter()
            .find(|s| s["jid"] == jid)
            .unwrap_or_else(|| panic!("{jid} not run: {seen:?}"))
            .clone()
    };

    let welcome = by_jid("b4a5c6d7e8f90a1b2c3d4e5f");
    assert_eq!(welcome["class"], "WelcomeJob", "{welcome}");
    assert_eq!(
        welcome["args"],
        json!(["gid://myapp/User/42", {"send_at": "2026-12-03T10:20:30.123456789Z", "tag": "vip"}]),
        "{welcome}"
    );
    assert_eq!(
        welcome["enqueued_at_ms"], enqueued_ms,
        "milliseconds read as milliseconds"
    );
    assert_eq!(welcome["context"]["job_id"], "8c1e7f52-3a4b-4c5d-9e6f-0a1b2c3d4e5f");
    assert_eq!(welcome["context"]["priority"], Value::Null);
    assert_eq!(welcome["context"]["enqueued_at"], "2026-12-03T10:15:30.123456789Z");

    let every = by_jid("c1d2e3f405162738495a6b7c");
    assert_eq!(
        every["args"],
        json!([
            "x", 1, 2.5, null, true, [1, [2, "three"]],
            "2026-12-03T10:20:30.123456789Z",
            "2026-12-03T11:20:30.000000000+01:00",
            "2026-12-03",
            300,
            "9.99",
            {"begin": "2026-12-01", "end": "2026-12-31", "exclude_end": true},
            "Admin::Report",
            {"plan": "pro", "seats": 3},
            {"filter": {"since": "yesterday"}},
            {"notify": false}
        ]),
        "{every}"
    );
    assert_eq!(every["context"]["priority"], 10);
    assert_eq!(every["context"]["locale"], "de");
    assert_eq!(every["context"]["timezone"], "Europe/Berlin");

    let legacy = by_jid("d2e3f405162738495a6b7c8d");
    assert_eq!(
        (&legacy["class"], &legacy["args"]),
        (&json!("ReportJob"), &json!(["legacy"]))
    );
    let resumed = by_jid("e3f405162738495a6b7c8d9e");
    assert_eq!(resumed["args"], json!(["resumed"]), "{resumed}");
    assert_eq!(resumed["context"]["executions"], 1);
    assert_eq!(resumed["raw"]["resumptions"], 1, "Rails 8.1's keys reach the raw hash");

    // Queue latency from the millisecond timestamps: 1.5 s and a little.
    assert_queue_latency_from_milliseconds(&addr, "WelcomeJob");

    // Both failing jobs end in `retry`, everything written in milliseconds.
    eventually(
        Duration::from_secs(30),
        || runner.log(),
        || {
            let mut conn = conn.clone();
            async move { zset(&mut conn, "retry").await.len() == 2 }
        },
    )
    .await;
    let retry = zset(&mut conn, "retry").await;
    let entry = |jid: &str| {
        retry
            .iter()
            .find(|p| p.jid() == jid)
            .unwrap_or_else(|| panic!("{jid} not in retry"))
    };
    let integer_ms = |p: &Payload, key: &str| {
        p.get(key)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("{key} not integer milliseconds: {:?}", p.get(key)))
    };
    // Scheduled: the poller's `enqueued_at` and the failure's `failed_at`.
    let was_scheduled = entry("f405162738495a6b7c8d9e0f");
    assert_eq!(was_scheduled.str("wrapped"), Some("FailingJob"));
    assert!(integer_ms(was_scheduled, "enqueued_at") as f64 >= (at * 1000.0).floor());
    assert!(integer_ms(was_scheduled, "failed_at") >= now_ms);
    assert_eq!(integer_ms(was_scheduled, "created_at"), created_ms);
    assert_eq!(was_scheduled.get("retry_count"), Some(&json!(0)));
    // Retried once by Sidekiq: its first `failed_at` stays, `retried_at` is new.
    let again = entry("0516273849a5b6c7d8e9f0a1");
    assert_eq!(again.get("retry_count"), Some(&json!(1)));
    assert_eq!(integer_ms(again, "failed_at"), 1_764_756_930_125);
    assert!(integer_ms(again, "retried_at") >= now_ms);
    assert!(again.str("error_message").is_some_and(|m| m.contains("on purpose")));
    assert_eq!(
        again.get("args").map(|a| &a[0]["arguments"]),
        Some(&json!(["again"])),
        "the ActiveJob hash is written back as it came"
    );
    runner.stop();
}

/// What the polyglot guests logged: the JSON between `seen<<` and `>>`.
fn logged(log: &str) -> Vec<Value> {
    log.split("seen<<")
        .skip(1)
        .filter_map(|rest| rest.split(">>").next())
        .filter_map(|json| serde_json::from_str(json).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_jobs_get_the_decoded_arguments_and_the_context() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = plugins(&[], &["py-activejob", "js-activejob", "py-async-chaos"]);
    let mut runner = Runner::start(&url, dir.path(), &["-q", "wasm"]);
    runner.wait_running();
    let pushed = rails(
        &url,
        r#"
class PyActiveJob < ActiveJob::Base; queue_as :wasm; end
class JsActiveJob < ActiveJob::Base; queue_as :wasm; end
class AsyncChaosJob < ActiveJob::Base; queue_as :wasm; end
ids = {}
ids["PyActiveJob"] = PyActiveJob.perform_later("x", User.new(7), tag: :vip).job_id
ids["JsActiveJob"] = JsActiveJob.perform_later("x", User.new(7), tag: :vip).job_id
ids["AsyncChaosJob"] = AsyncChaosJob.perform_later("activejob").job_id
puts JSON.generate(ids)
"#,
    );
    eventually(
        Duration::from_secs(120),
        || runner.log(),
        || async { logged(&runner.log()).len() >= 3 },
    )
    .await;
    let seen = logged(&runner.log());
    for class in ["PyActiveJob", "JsActiveJob", "AsyncChaosJob"] {
        let job = seen
            .iter()
            .find(|s| s["class"] == class)
            .unwrap_or_else(|| panic!("{class} not seen: {seen:?}"));
        let context = &job["context"];
        assert_eq!(context["job_id"], pushed[class], "{job}");
        assert_eq!(context["job_class"], class, "{job}");
        assert_eq!(context["executions"], 0, "{job}");
        assert_eq!(context["locale"], "en", "{job}");
        assert_eq!(context["priority"], Value::Null, "{job}");
        if class == "AsyncChaosJob" {
            assert_eq!(job["args"], json!(["activejob"]), "{job}");
        } else {
            assert_eq!(job["args"], json!(["x", "gid://myapp/User/7", {"tag": "vip"}]), "{job}");
            assert_eq!(
                job["raw"]["arguments"][1]["_aj_globalid"], "gid://myapp/User/7",
                "{job}"
            );
        }
    }
    runner.stop();
}
