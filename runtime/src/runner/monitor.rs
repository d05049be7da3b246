//! Watching the runner from outside: the once-a-second process sampler, the
//! `--metrics-addr` endpoint, and the `--exit-when-empty` drain check.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::by_shard::ByShard;
use super::inflight::InFlightTable;
use super::limiter::policy::OVERRATED;
use super::source::JobSource;
use super::supervise::{Loop, Maker};
use crate::metrics::{Metrics, ProcessSampler, server};
use crate::redis::{Redis, keys};
use crate::sandbox::Executor;

/// How often `--exit-when-empty` checks the queues.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// Prepares the sampler (and binds the metrics endpoint, if `addr` is
/// set) and returns them as named services for the caller to supervise;
/// both stop when `stop` turns true. Fails only if `addr` cannot be bound.
pub(crate) async fn start(
    metrics: Arc<Metrics>,
    executor: Arc<Executor>,
    inflight: Arc<InFlightTable>,
    concurrency: u32,
    addr: Option<SocketAddr>,
    stop: CancellationToken,
) -> Result<Vec<(&'static str, Maker)>> {
    let gauges = &metrics.process;
    gauges.concurrency.store(u64::from(concurrency), Ordering::Relaxed);
    gauges.sample_memory_and_cpu();
    gauges
        .start_rss_kb
        .store(gauges.rss_kb.load(Ordering::Relaxed), Ordering::Relaxed);
    gauges
        .started_at_ms
        .store((crate::redis::now_f64() * 1000.0) as u64, Ordering::Relaxed);
    let mut services: Vec<(&'static str, Maker)> = Vec::new();
    if let Some(addr) = addr {
        let (bound, server) = server::bind(addr, metrics.clone(), stop.clone()).await?;
        tracing::info!(%bound, "metrics at http://{bound}/metrics and /stats");
        services.push(("metrics server", Box::new(move || Box::pin(server.serve()))));
    }
    let sample = move || -> Loop {
        let (metrics, executor, inflight, stop) = (metrics.clone(), executor.clone(), inflight.clone(), stop.clone());
        Box::pin(async move {
            let refresh = |gauges: &crate::metrics::ProcessGauges| {
                gauges.in_flight.store(inflight.len() as u64, Ordering::Relaxed);
                gauges
                    .live_instances
                    .store(executor.live_instances() as u64, Ordering::Relaxed);
                let instances = executor.instances();
                let copy = |to: &std::sync::atomic::AtomicU64, from: &std::sync::atomic::AtomicU64| {
                    to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
                };
                gauges.idle_instances.store(instances.idle() as u64, Ordering::Relaxed);
                copy(&gauges.instances_created, &instances.created);
                copy(&gauges.instances_reused, &instances.reused);
                copy(&gauges.instances_expired, &instances.expired);
            };
            ProcessSampler::run(&metrics.process, refresh, stop).await;
        })
    };
    services.push(("process sampler", Box::new(sample)));
    Ok(services)
}

/// Resolves once no due job waits in `source`'s queues, no job is in flight and
/// no job kept back by a cluster limit waits in `schedule` for its turn,
/// seen on two checks in a row (a job can be between the queue and the
/// in-flight table during one check).
pub(crate) async fn drained(redis: ByShard<Redis>, source: Arc<dyn JobSource>, inflight: Arc<InFlightTable>) {
    let mut empty_checks = 0;
    loop {
        tokio::time::sleep(DRAIN_CHECK).await;
        let busy_before = inflight.len();
        let waiting = match source.waiting().await {
            Ok(waiting) => waiting,
            Err(err) => {
                tracing::debug!("--exit-when-empty: cannot read the queues: {err:#}");
                empty_checks = 0;
                continue;
            }
        };
        let idle = busy_before == 0 && inflight.is_empty() && waiting == 0;
        if idle && !limited_waiting_on_any(&redis).await {
            empty_checks += 1;
            if empty_checks >= 2 {
                return;
            }
        } else {
            empty_checks = 0;
        }
    }
}

/// Whether `schedule` holds a job a cluster limit sent back to wait for its
/// turn (its payload counts `overrated`). Read with `ZSCAN`, so a large
/// schedule costs rounds of this check, never a long command in Redis; a
/// schedule that cannot be read (a key of another type) holds none.
async fn limited_waiting_on_any(redis: &ByShard<Redis>) -> bool {
    for shard in redis.all() {
        if limited_waiting(shard).await {
            return true;
        }
    }
    false
}

async fn limited_waiting(redis: &Redis) -> bool {
    let mut cursor = 0u64;
    loop {
        let page: Result<(u64, Vec<Vec<u8>>), _> = ::redis::cmd("ZSCAN")
            .arg(keys::SCHEDULE)
            .arg(cursor)
            .arg("MATCH")
            // The mark a cluster limit leaves in the payloads it reschedules.
            .arg(format!("*\"{OVERRATED}\":*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut redis.conn())
            .await;
        match page {
            Ok((_, found)) if !found.is_empty() => return true,
            Ok((0, _)) => return false,
            Ok((next, _)) => cursor = next,
            Err(err) => {
                tracing::debug!("--exit-when-empty: cannot read the schedule: {err}");
                return false;
            }
        }
    }
}
