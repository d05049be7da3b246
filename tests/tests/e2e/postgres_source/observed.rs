//! Cluster limits, `/metrics` and OpenTelemetry for jobs claimed from the
//! PostgreSQL store: what happens to a job after its claim does not depend
//! on where it was claimed, and this shows it with two runners on the store
//! (the limiter's leases in the shared Redis, as on the Redis store).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use wasmjobs_e2e::otlp::{OtlpReceiver, text};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, free_addr, http_get};

use super::{connect, count, source_flags, store};
use crate::limits::{Span, chaos_with, max_overlap, spans, wait_ended};

/// The successes of `class` a runner's `/metrics` counts.
fn successes(metrics: &str, class: &str) -> f64 {
    let prefix = format!("wasmjobs_jobs_total{{class=\"{class}\",");
    metrics
        .lines()
        .filter(|line| line.starts_with(&prefix) && line.contains("outcome=\"success\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_metrics_and_traces_hold_for_jobs_in_the_store() {
    let (_pg, url) = store();
    let redis = TestRedis::start();
    let receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    let dir = chaos_with("[limits.per_key]\nkey = \"args.2\"\nconcurrency = 2");
    let file = dir.path().join("chaos/data/conc.log");
    let addrs = [free_addr(), free_addr()];
    let mut runners: Vec<Runner> = addrs
        .iter()
        .map(|addr| {
            let flags = [
                "--concurrency",
                "10",
                "--metrics-addr",
                addr,
                "--otlp-endpoint",
                &endpoint,
            ];
            Runner::start(&redis.url(), dir.path(), &source_flags(&url, &flags))
        })
        .collect();
    for runner in &mut runners {
        runner.wait_running();
    }
    // Twelve jobs of key a and six of key b, 300 ms each, in one statement.
    let db = connect(&url).await;
    let jids: HashSet<String> = db
        .query(
            "SELECT wasmjobs.enqueue('ChaosJob', jsonb_build_array('span', 'conc.log', CASE WHEN i <= 12 THEN 'a' ELSE 'b' END, 300))
             FROM generate_series(1, 18) i",
            &[],
        )
        .await
        .expect("enqueue")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(jids.len(), 18);
    wait_ended(&file, 18, Duration::from_secs(120), &runners).await;

    // The limit held across both runners, and key a used its two slots.
    let ran = spans(&file);
    let by_key: BTreeMap<&str, Vec<&Span>> = ran.iter().fold(BTreeMap::new(), |mut map, s| {
        map.entry(s.key.as_str()).or_default().push(s);
        map
    });
    for (key, spans) in &by_key {
        let most = max_overlap(spans.iter().copied());
        assert!(most <= 2, "{most} jobs of key {key} ran at once: {spans:?}");
    }
    assert_eq!(max_overlap(by_key["a"].iter().copied()), 2, "key a used its 2 slots");
    assert_eq!(
        ran.iter().map(|s| s.jid.clone()).collect::<HashSet<_>>(),
        jids,
        "the store's jobs ran"
    );

    // Each runner's /metrics counts what it ran: 18 in all.
    let counted: f64 = addrs
        .iter()
        .map(|addr| successes(&http_get(addr, "/metrics"), "ChaosJob"))
        .sum();
    assert_eq!(counted, 18.0);
    wasmjobs_e2e::eventually(
        Duration::from_secs(10),
        || "the store to be empty".into(),
        async || count(&db, "SELECT count(*) FROM wasmjobs.jobs").await == 0,
    )
    .await;

    // A clean stop flushes the spans: one job span per job of the store.
    for runner in &mut runners {
        assert!(runner.stop().success(), "{}", runner.log());
    }
    wasmjobs_e2e::eventually(
        Duration::from_secs(10),
        || format!("a span for each of the 18 jobs; got {:#?}", receiver.spans()),
        async || {
            let traced: HashSet<String> = receiver
                .spans()
                .iter()
                .filter_map(|r| text(&r.span.attributes, "messaging.message_id"))
                .collect();
            jids.is_subset(&traced)
        },
    )
    .await;
}
