//! Queues spread over several Redis servers (shards), through the commands
//! a user runs: `enqueue`, `pause`/`resume`, `stats`, `env` route each
//! queue to its shard and read every shard; a shard that is down is
//! reported as down while the others go on; the Rust client's `Sharded`
//! routes the same way. Three real `redis-server`s per test.

use std::process::Command;

use redis::AsyncCommands;
use serde_json::Value;
use wasmjobs_client::Job;
use wasmjobs_client::shards::{Routes, Sharded};
use wasmjobs_e2e::output_text as text;
use wasmjobs_e2e::redis_server::TestRedis;

const WASMJOBS: &str = env!("CARGO_BIN_EXE_wasmjobs-under-test");

/// Three shards: `default` (a), `b` holding `mail` and `reports`, `c`
/// holding `video`.
struct Fleet {
    a: TestRedis,
    b: TestRedis,
    c: TestRedis,
    data: tempfile::TempDir,
}

impl Fleet {
    fn start() -> Self {
        Fleet {
            a: TestRedis::start(),
            b: TestRedis::start(),
            c: TestRedis::start(),
            data: tempfile::tempdir().expect("data dir"),
        }
    }

    /// `wasmjobs ARGS` with the shards given in the environment, as a
    /// deployment sets them once for every command.
    fn wasmjobs(&self, args: &[&str]) -> Command {
        let mut command = Command::new(WASMJOBS);
        command
            .env("REDIS_URL", self.a.url())
            .env("WASMJOBS_SHARDS", format!("b={} c={}", self.b.url(), self.c.url()))
            .env("WASMJOBS_ROUTES", "mail,reports=b video=c")
            .env_remove("RUST_LOG")
            .arg("--data-dir")
            .arg(self.data.path())
            .args(args);
        command
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.wasmjobs(args).output().expect("run wasmjobs");
        assert!(output.status.success(), "{args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn stats(&self) -> Value {
        let out = self.ok(&["stats", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stats --json is not JSON ({e}): {out}"))
    }

    /// `wasmjobs ARGS`, which must exit with status 1 (a shard down); its
    /// stdout.
    fn one_down(&self, args: &[&str]) -> String {
        let output = self.wasmjobs(args).output().expect("run wasmjobs");
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// The jid `enqueue` printed: `... (jid JID)`.
fn jid_in(out: &str) -> String {
    let start = out
        .find("(jid ")
        .map(|i| i + 5)
        .unwrap_or_else(|| panic!("no jid in {out:?}"));
    out[start..].chars().take_while(|c| c.is_ascii_hexdigit()).collect()
}

async fn llen(redis: &TestRedis, key: &str) -> u64 {
    redis.conn().await.llen(key).await.expect("LLEN")
}

async fn members(redis: &TestRedis, key: &str) -> Vec<String> {
    let mut members: Vec<String> = redis.conn().await.smembers(key).await.expect("SMEMBERS");
    members.sort();
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_route_each_queue_to_its_shard_and_read_them_all() {
    let mut fleet = Fleet::start();

    // enqueue: each job lands on its queue's shard, and the output says which.
    let out = fleet.ok(&["enqueue", "--queue", "mail", "MailJob", "[1]"]);
    assert!(out.contains("on queue mail") && out.contains("on shard b"), "{out}");
    let mail_jid = jid_in(&out);
    fleet.ok(&["enqueue", "ReportJob"]);
    fleet.ok(&["enqueue", "--queue", "video", "--count", "5", "VideoJob"]);
    fleet.ok(&[
        "enqueue",
        "--queue",
        "reports",
        "--unique-for",
        "60",
        "ReportJob",
        "[7]",
    ]);
    fleet.ok(&["enqueue", "--queue", "video", "--in", "3600", "VideoJob"]);
    assert_eq!(llen(&fleet.b, "queue:mail").await, 1);
    assert_eq!(llen(&fleet.b, "queue:reports").await, 1);
    assert_eq!(llen(&fleet.a, "queue:default").await, 1);
    assert_eq!(llen(&fleet.c, "queue:video").await, 5);
    for (redis, queues) in [
        (&fleet.a, vec!["default"]),
        (&fleet.b, vec!["mail", "reports"]),
        (&fleet.c, vec!["video"]),
    ] {
        assert_eq!(members(redis, "queues").await, queues);
    }
    let scheduled: u64 = fleet.c.conn().await.zcard("schedule").await.expect("ZCARD");
    assert_eq!(scheduled, 1, "a scheduled job stays on its queue's shard");
    let locks: Vec<String> = fleet.b.conn().await.keys("wasmjobs:unique:*").await.expect("KEYS");
    assert_eq!(locks.len(), 1, "the unique lock lives on the queue's shard");
    let elsewhere: Vec<String> = fleet.a.conn().await.keys("wasmjobs:unique:*").await.expect("KEYS");
    assert!(elsewhere.is_empty(), "{elsewhere:?}");

    // A second push of the unique job is refused by the lock on b.
    let again = fleet
        .wasmjobs(&[
            "enqueue",
            "--queue",
            "reports",
            "--unique-for",
            "60",
            "ReportJob",
            "[7]",
        ])
        .output()
        .expect("run wasmjobs");
    assert_eq!(again.status.code(), Some(3), "{}", text(&again));

    // pause: each queue on its shard; the list covers every shard.
    let out = fleet.ok(&["pause", "mail", "video", "default"]);
    assert!(out.contains("mail: paused (shard b)"), "{out}");
    assert_eq!(members(&fleet.b, "paused").await, vec!["mail"]);
    assert_eq!(members(&fleet.c, "paused").await, vec!["video"]);
    assert_eq!(members(&fleet.a, "paused").await, vec!["default"]);
    let out = fleet.ok(&["resume", "default"]);
    assert!(out.contains("paused now: mail (shard b), video (shard c)"), "{out}");
    assert!(members(&fleet.a, "paused").await.is_empty());

    // stats: the fleet's totals and each shard.
    let stats = fleet.stats();
    assert_eq!(stats["fleet"]["shards"], 3, "{stats:#}");
    assert_eq!(stats["fleet"]["up"], 3, "{stats:#}");
    assert_eq!(stats["fleet"]["enqueued"], 8, "{stats:#}");
    assert_eq!(stats["fleet"]["scheduled"], 1, "{stats:#}");
    let names: Vec<&str> = stats["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| s["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["default", "b", "c"]);
    assert_eq!(stats["shards"][1]["enqueued"], 2, "{stats:#}");
    assert_eq!(stats["shards"][2]["enqueued"], 5, "{stats:#}");

    // cancel: every shard searched; the one holding the job is named.
    let out = fleet.ok(&["cancel", &mail_jid]);
    assert!(out.contains("(shard b)"), "{out}");
    assert_eq!(llen(&fleet.b, "queue:mail").await, 0);
    assert_eq!(fleet.stats()["fleet"]["enqueued"], 7);
    // The request was written on every shard and is done with on every
    // one (found on b): no fetch anywhere goes on looking requests up.
    for shard in [&fleet.a, &fleet.b, &fleet.c] {
        let open: u64 = shard.conn().await.zcard("wasmjobs:cancels:open").await.expect("ZCARD");
        assert_eq!(open, 0, "a request left open");
    }

    // schedule and limits: a section per shard.
    let schedules: Value = serde_json::from_str(&fleet.ok(&["schedule", "--json"])).expect("JSON");
    let shards = schedules["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), 3, "{schedules:#}");
    assert!(
        shards.iter().all(|s| s["up"] == true && s["schedules"].is_array()),
        "{schedules:#}"
    );
    let limits = fleet.ok(&["limits"]);
    assert!(
        limits.contains("== shard b (") && limits.contains("no cluster limits in use"),
        "{limits}"
    );

    // env: another process gets the same routes.
    let env = fleet.ok(&["env"]);
    assert!(
        env.contains(&format!(
            "export WASMJOBS_SHARDS='b={} c={}'",
            fleet.b.url(),
            fleet.c.url()
        )),
        "{env}"
    );
    assert!(env.contains("export WASMJOBS_ROUTES='mail,reports=b video=c'"), "{env}");

    // A shard down: stats says so and shows the others; a push to its
    // queue fails naming it; pushes to the others go on.
    fleet.c.stop();
    let out = fleet.one_down(&["stats", "--json"]);
    let stats: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert_eq!(stats["fleet"]["up"], 2, "{stats:#}");
    assert_eq!(stats["fleet"]["enqueued"], 2, "{stats:#}");
    assert_eq!(stats["shards"][2]["up"], false, "{stats:#}");
    assert!(
        stats["shards"][2]["error"]
            .as_str()
            .is_some_and(|e| e.contains("shard c")),
        "{stats:#}"
    );
    let human = fleet.one_down(&["stats"]);
    assert!(
        human.contains("Fleet: 3 shards, 2 up") && human.contains("== shard c ==") && human.contains("DOWN"),
        "{human}"
    );
    let down = fleet
        .wasmjobs(&["enqueue", "--queue", "video", "VideoJob"])
        .output()
        .expect("run wasmjobs");
    assert!(!down.status.success(), "{}", text(&down));
    assert!(
        String::from_utf8_lossy(&down.stderr).contains("shard c, which holds queue video"),
        "{}",
        text(&down)
    );
    fleet.ok(&["enqueue", "--queue", "mail", "MailJob", "[2]"]);
    assert_eq!(llen(&fleet.b, "queue:mail").await, 1);
    let schedule = fleet.one_down(&["schedule"]);
    assert!(
        schedule.contains("== shard c (") && schedule.contains("DOWN"),
        "{schedule}"
    );
    let unknown = fleet
        .wasmjobs(&["cancel", "--wait", "0", "00000000000000000000000f"])
        .output()
        .expect("run wasmjobs");
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert!(
        String::from_utf8_lossy(&unknown.stdout).contains("not searched: shard c is down"),
        "{}",
        text(&unknown)
    );
    // pause: the queue on the shard that is up is paused, the other said
    // not to be, and the list names the shard it could not read.
    let out = fleet.one_down(&["pause", "reports", "video"]);
    assert!(out.contains("reports: paused (shard b)"), "{out}");
    assert!(out.contains("video: NOT paused: shard c"), "{out}");
    assert!(
        out.contains("paused now: mail (shard b), reports (shard b) (not read: shard c)"),
        "{out}"
    );
    assert_eq!(members(&fleet.b, "paused").await, vec!["mail", "reports"]);
    fleet.c.restart();
    let stats = fleet.stats();
    assert_eq!(stats["fleet"]["up"], 3, "{stats:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shard_maps_are_refused_with_the_reason() {
    let fleet = Fleet::start();
    let refused = |args: &[&str], expected: &str| {
        let output = fleet.wasmjobs(args).output().expect("run wasmjobs");
        assert!(!output.status.success(), "{args:?}: {}", text(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in {}",
            text(&output)
        );
        stderr.into_owned()
    };
    refused(&["stats", "--route", "x=nope"], "not one of the shards (default, b, c)");
    // A flag replaces its env variable.
    let (b, b_twice) = (format!("b={}", fleet.b.url()), format!("d={}", fleet.b.url()));
    refused(
        &["stats", "--shard", &b, "--shard", &b_twice, "--route", "x=d"],
        "shards b and d are one Redis database",
    );
    // The same database written another way.
    let b_again = format!("d={}/0", fleet.b.url());
    refused(
        &["stats", "--shard", &b, "--shard", &b_again, "--route", "x=d"],
        "shards b and d are one Redis database",
    );
    // A URL without its name, its password holding '=': refused unshown.
    let secret = refused(
        &["stats", "--shard", "redis://:c2VjcmV0cGFzcw==@h:6379"],
        "expected NAME=URL",
    );
    assert!(!secret.contains("c2Vj"), "the password is echoed: {secret}");
    refused(&["stats", "--route", "a=b=c"], "cannot hold '='");
    let mut no_default = fleet.wasmjobs(&["stats"]);
    no_default.env_remove("REDIS_URL");
    let output = no_default.output().expect("run wasmjobs");
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("need --redis"),
        "{}",
        text(&output)
    );
    refused(
        &["stats", "--route", "mail=b", "--route", "mail=c"],
        "routed to two shards",
    );
    refused(&["stats", "--shard", "default=redis://127.0.0.1:1"], "is --redis's");
    let secret = refused(&["stats", "--shard", "d=redis://:hunter2@"], "invalid --shard");
    assert!(!secret.contains("hunter2"), "the password is echoed: {secret}");
    // Jobs kept in PostgreSQL do not use shards: refused before anything
    // connects.
    let plugins = tempfile::tempdir().expect("plugins dir");
    let plugins = plugins.path().to_string_lossy().into_owned();
    let pg = "postgres://nobody@127.0.0.1:1/none";
    for args in [
        vec!["run", "--plugins", plugins.as_str(), "--source", pg],
        vec!["web", "--source", pg],
    ] {
        refused(&args, "--shard is for jobs kept in Redis");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_routes_like_the_commands() {
    let fleet = Fleet::start();
    let routes = Routes::new(
        ["default", "b", "c"].map(String::from).to_vec(),
        [("mail", "b"), ("reports", "b"), ("video", "c")].map(|(q, s)| (q.to_owned(), s.to_owned())),
    )
    .expect("routes");
    let urls = [fleet.a.url(), fleet.b.url(), fleet.c.url()];
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut client = Sharded::connect(&urls, routes).await.expect("connect");
    client.push(&Job::new("MailJob").queue("mail")).await.expect("push");
    client.push(&Job::new("Other")).await.expect("push");
    let mut payloads: Vec<_> = ["video", "mail", "video", "elsewhere"]
        .iter()
        .map(|queue| Job::new("Bulk").queue(*queue).to_payload(0.0).expect("payload").0)
        .collect();
    let jids: Vec<String> = payloads.iter().map(|p| p.jid().to_owned()).collect();
    client.push_bulk(&mut payloads).await.expect("push_bulk");
    let after: Vec<String> = payloads.iter().map(|p| p.jid().to_owned()).collect();
    assert_eq!(after, jids, "the payloads come back in the caller's order");
    assert_eq!(llen(&fleet.b, "queue:mail").await, 2);
    assert_eq!(llen(&fleet.c, "queue:video").await, 2);
    assert_eq!(llen(&fleet.a, "queue:default").await, 1);
    assert_eq!(llen(&fleet.a, "queue:elsewhere").await, 1);

    // What the client pushed, the commands see where they look.
    let stats = fleet.stats();
    assert_eq!(stats["fleet"]["enqueued"], 6, "{stats:#}");
}
