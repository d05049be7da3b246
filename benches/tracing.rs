//! What OpenTelemetry tracing costs (`docs/observability.md`), against the
//! real `wasmjobs run`: N pre-pushed `NoopJob`s drained at C=100 (reliable
//! fetch) with tracing off, on and sampled at 1% (`--otlp-sample 0.01`),
//! on and sampled at 100%, and at 100% towards a collector that is down
//! (a closed port). The set-ups alternate within each round; the figures
//! are the medians over the rounds and the ratios of those medians, all
//! from one run. The collector is a real OTLP/HTTP receiver in this
//! process that counts what it gets without decoding it
//! (`wasmjobs_e2e::otlp`); the jobs carry no `traceparent`, so the ratio
//! alone decides.
//!
//! N is 100,000 in 5 rounds (`BENCH_QUICK=1`: 10,000, one round).
//! Run: `cargo bench -p wasmjobs-benches --bench tracing`.

use anyhow::Result;
use wasmjobs_benches::{Report, noop_rate, percentile};
use wasmjobs_e2e::otlp::OtlpReceiver;
use wasmjobs_e2e::redis_server::TestRedis;

/// The wasmjobs binary built with this package.
const BIN: &str = env!("CARGO_BIN_EXE_wasmjobs-bench-runner");

fn main() -> Result<()> {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let (jobs, rounds) = if quick { (10_000u64, 1) } else { (100_000, 5) };
    let rt = tokio::runtime::Runtime::new()?;
    let redis = TestRedis::start();
    let plugins = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let receiver = rt.block_on(OtlpReceiver::start_counting());
    let sink = receiver.endpoint();
    let down = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", closed.local_addr()?)
    };
    let setups: [(&str, Vec<&str>); 4] = [
        ("off", vec![]),
        (
            "on, 1% sampled",
            vec!["--otlp-endpoint", &sink, "--otlp-sample", "0.01"],
        ),
        ("on, 100% sampled", vec!["--otlp-endpoint", &sink, "--otlp-sample", "1"]),
        (
            "on, 100% sampled, collector down",
            vec!["--otlp-endpoint", &down, "--otlp-sample", "1"],
        ),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    let mut received = vec![0usize; setups.len()];
    for _ in 0..rounds {
        for (i, (_, flags)) in setups.iter().enumerate() {
            let mut extra = vec!["--concurrency", "100"];
            extra.extend_from_slice(flags);
            let before = receiver.requests();
            let rate = rt.block_on(noop_rate(BIN.as_ref(), &redis, plugins.path(), jobs, &extra))?;
            rates[i].push(rate);
            received[i] += receiver.requests() - before;
        }
    }
    for runs in &mut rates {
        runs.sort_by(f64::total_cmp);
    }
    let median = |runs: &[f64]| percentile(runs, 0.5);
    let base = median(&rates[0]);
    let mut report = Report::new("tracing", "OpenTelemetry tracing: its cost on the noop drain");
    for (i, (name, _)) in setups.iter().enumerate() {
        report.row(
            &format!("NoopJob C=100, tracing {name}: jobs/s, median"),
            format!("{:.0}", median(&rates[i])),
            "",
        );
    }
    report.row(
        "tracing on, 1% sampled ÷ off",
        format!("{:.3}", median(&rates[1]) / base),
        "≥ 0.95",
    );
    report.row(
        "tracing on, 100% sampled ÷ off",
        format!("{:.3}", median(&rates[2]) / base),
        "",
    );
    report.row(
        "tracing on, 100% sampled, collector down ÷ off",
        format!("{:.3}", median(&rates[3]) / base),
        "",
    );
    let list = |runs: &[f64]| runs.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    report.row(
        "runs off / 1% / 100% / 100% down (jobs/s)",
        rates.iter().map(|r| list(r)).collect::<Vec<_>>().join(" / "),
        "",
    );
    report.row(
        "OTLP export requests received at 1% / 100%",
        format!("{} / {}", received[1], received[2]),
        "",
    );
    report.note(format!(
        "{jobs} NoopJob per run, reliable fetch, {rounds} round(s), the four set-ups in turn each round; \
         the jobs carry no traceparent."
    ));
    report.note(
        "Spans go through the SDK's batch processor (queue 16,384, batches of 2,048) to the OTLP/HTTP \
         receiver in the benchmark process, which counts requests without decoding them; at 100% the \
         runner drops what its queue cannot hold rather than slow jobs down."
            .into(),
    );
    report.finish()?;
    Ok(())
}
