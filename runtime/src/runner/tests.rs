//! Unit tests of the runner core — the fetch loop, the manager, units of
//! work, the writer and shutdown — against an in-memory job source
//! ([`source::memory::MemorySource`]) and a scripted processor, so they
//! run without Redis or Wasmtime. The protocol on a real Redis is tested
//! end to end in `tests/tests/e2e/run.rs` and `tests/tests/e2e/protocol.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::fetched::Finish;
use super::inflight::InFlightTable;
use super::job_retry::Write;
use super::launcher::{Fetching, Running, shut_down};
use super::manager::Manager;
use super::outcome::{self, Counters};
use super::processor::{Perform, Slots};
use super::source::JobSource;
use super::source::memory::MemorySource;
use super::unit::TypedJob;
use crate::metrics::Metrics;

/// Jobs of class `Block` run until stopped; every other job succeeds; a
/// payload that is not a job goes dead, as in the processor.
struct Scripted;

impl Perform for Scripted {
    fn perform<'a>(
        &'a self,
        job: &'a TypedJob,
        _slots: Slots<'a>,
        _cancel: Option<&'a super::cancel::Registration>,
    ) -> BoxFuture<'a, Write> {
        let blocks = match &job.parsed {
            Ok((job, _)) => job.class == "Block",
            Err(error) => return std::future::ready(job.malformed(error, 1.0)).boxed(),
        };
        async move {
            if blocks {
                std::future::pending::<()>().await;
            }
            Write::Ack
        }
        .boxed()
    }
}

/// A source whose queue holds `jobs`, in order.
fn holding(jobs: &[String]) -> MemorySource {
    MemorySource::with(&jobs.iter().map(String::as_str).collect::<Vec<_>>())
}

fn job(class: &str, n: u32) -> String {
    format!(r#"{{"class":"{class}","args":[{n}],"jid":"j{n}","queue":"q"}}"#)
}

/// A runner core around `source`: writer, manager, fetch loop.
struct Core {
    source: Arc<MemorySource>,
    inflight: Arc<InFlightTable>,
    counters: Arc<Counters>,
    manager: Arc<Manager>,
    fetching: Fetching,
    writer: tokio::task::JoinHandle<()>,
}

impl Core {
    fn start(source: MemorySource, concurrency: u32) -> Self {
        let source = Arc::new(source);
        let dyn_source: Arc<dyn JobSource> = source.clone();
        let inflight = Arc::new(InFlightTable::default());
        let counters = Arc::new(Counters::default());
        let metrics = Arc::new(Metrics::new(false));
        let (completions, writer) = outcome::spawn(dyn_source.clone(), counters.clone(), inflight.clone(), metrics, 16);
        let cancels = super::cancel::Cancels::new(Vec::new(), "test");
        let manager = Manager::new(
            Arc::new(Scripted),
            concurrency,
            vec![Some(completions)],
            inflight.clone(),
            cancels,
        );
        let fetching = Fetching::start(
            dyn_source,
            manager.clone(),
            inflight.clone(),
            CancellationToken::new(),
            None,
        );
        Self {
            source,
            inflight,
            counters,
            manager,
            fetching,
            writer,
        }
    }

    /// Shuts down with a `timeout` for the jobs in flight; returns what the
    /// source requeued at the end.
    async fn shut_down(self, timeout: Duration) -> Option<u64> {
        let source: &dyn JobSource = self.source.as_ref();
        let running = Running {
            source,
            manager: &self.manager,
            fetching: self.fetching,
            stop: &CancellationToken::new(),
            writers: vec![(0, self.writer)],
        };
        shut_down(timeout, running, std::future::pending()).await.requeued
    }
}

/// Waits for `condition`, failing after 10 s.
async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn recorded(source: &MemorySource, finish: &Finish) -> Vec<String> {
    let state = source.state();
    state
        .recorded
        .iter()
        .filter(|(_, f)| f == finish)
        .map(|(raw, _)| raw.clone())
        .collect()
}

#[tokio::test]
async fn shutdown_records_finished_jobs_and_requeues_the_ones_still_running_ahead_of_the_queue() {
    let jobs = [
        job("Quick", 1),
        job("Block", 2),
        job("Quick", 3),
        job("Block", 4),
        job("Later", 5),
    ];
    let core = Core::start(MemorySource::with(&jobs.each_ref().map(String::as_str)[..4]), 4);
    let (source, inflight) = (core.source.clone(), core.inflight.clone());
    until("the quick jobs are recorded and the blocked ones run", || {
        recorded(&source, &Finish::Outcome(Write::Ack)).len() == 2 && inflight.len() == 2
    })
    .await;
    source.push(&jobs[4]);
    let counters = core.counters.clone();
    // Every slot but the blocked two is free, so the last job may start
    // before shutdown; quiet first, then the deadline.
    let requeued = core.shut_down(Duration::from_millis(50)).await;
    assert_eq!(requeued, Some(0), "nothing is left held after the writer is done");
    let state = source.state();
    assert!(state.held.is_empty(), "nothing held: {:?}", state.held);
    let requeued: Vec<&String> = state
        .recorded
        .iter()
        .filter(|(_, f)| *f == Finish::Requeue)
        .map(|(r, _)| r)
        .collect();
    assert_eq!(requeued.len(), 2, "each blocked job is requeued once: {requeued:?}");
    let front: Vec<&String> = state.queue.iter().take(2).collect();
    assert!(
        front.contains(&&jobs[1]) && front.contains(&&jobs[3]),
        "stopped jobs go to the front: {:?}",
        state.queue
    );
    assert_eq!(counters.requeued.load(Ordering::Relaxed), 2);
    assert!(inflight.is_empty());
    let done: Vec<&String> = state.recorded.iter().map(|(r, _)| r).collect();
    for quick in [&jobs[0], &jobs[2]] {
        assert_eq!(done.iter().filter(|r| **r == quick).count(), 1, "{quick} recorded once");
    }
}

#[tokio::test]
async fn quiet_has_taken_effect_when_it_returns() {
    let mut core = Core::start(MemorySource::default(), 4);
    core.source.push(&job("Quick", 1));
    let source = core.source.clone();
    until("the first job is recorded", || source.state().recorded.len() == 1).await;
    core.fetching.quiet().await;
    core.source.push(&job("Quick", 2));
    // The fetch loop has ended: nothing can take the job any more.
    tokio::task::yield_now().await;
    assert_eq!(core.source.state().queue.len(), 1, "a quiet runner takes nothing");
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
    assert_eq!(source.state().queue.len(), 1, "and shutdown leaves the queue alone");
}

#[tokio::test]
async fn jobs_moved_by_a_fetch_whose_reply_was_lost_are_reconciled_and_run_once() {
    let jobs: Vec<String> = (0..5).map(|n| job("Quick", n)).collect();
    let source = holding(&jobs);
    source.lose_next_reply.store(true, Ordering::Release);
    let core = Core::start(source, 8);
    let source = core.source.clone();
    until("every job is recorded", || source.state().recorded.len() == 5).await;
    {
        let state = source.state();
        for raw in &jobs {
            assert_eq!(
                state.recorded.iter().filter(|(r, _)| r == raw).count(),
                1,
                "{raw} ran once"
            );
        }
        assert!(state.held.is_empty() && state.queue.is_empty());
    }
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
}

#[tokio::test]
async fn outcomes_refused_by_the_store_are_retried_until_written_and_none_is_lost() {
    let jobs: Vec<String> = (0..20).map(|n| job("Quick", n)).collect();
    let source = holding(&jobs);
    source.refuse_records.store(3, Ordering::Release);
    let core = Core::start(source, 4);
    let (source, counters) = (core.source.clone(), core.counters.clone());
    until("every outcome is written", || counters.jobs().processed == 20).await;
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
    let state = source.state();
    assert_eq!(state.recorded.len(), 20, "each outcome written once");
    assert!(state.held.is_empty());
    assert_eq!(
        source.refuse_records.load(Ordering::Acquire),
        0,
        "the refusals were hit"
    );
}

/// The writer is supervised (issue 61 item 11): it was spawned bare, so
/// a panic in a store's record call ended it, every later outcome waited
/// forever in its channel and the jobs stayed in flight.
#[tokio::test]
async fn a_writer_that_panics_is_restarted_and_writes_the_batch_it_held_once() {
    let jobs: Vec<String> = (0..20).map(|n| job("Quick", n)).collect();
    let source = holding(&jobs);
    source.panic_records.store(2, Ordering::Release);
    let core = Core::start(source, 4);
    let (source, counters, inflight) = (core.source.clone(), core.counters.clone(), core.inflight.clone());
    until("every outcome is written", || counters.jobs().processed == 20).await;
    until("nothing is left in flight", || inflight.is_empty()).await;
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
    let state = source.state();
    assert_eq!(state.recorded.len(), 20, "each outcome written once");
    assert!(state.held.is_empty());
    assert_eq!(source.panic_records.load(Ordering::Acquire), 0, "the panics were hit");
}

#[tokio::test]
async fn payloads_that_are_not_jobs_are_parsed_once_and_finish_dead_with_their_reason() {
    let core = Core::start(MemorySource::with(&["not json", r#"{"class":"X"}"#]), 2);
    let source = core.source.clone();
    until("both are recorded", || source.state().recorded.len() == 2).await;
    for (raw, finish) in &source.state().recorded {
        let Finish::Outcome(Write::Dead { payload }) = finish else {
            panic!("{raw} should be dead, got {finish:?}");
        };
        assert!(payload.contains("error_message"), "{payload}");
        assert!(
            payload.contains("wasmjobs::MalformedJob") || payload.contains("error_class"),
            "{payload}"
        );
    }
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
}

/// With several shards, one whose outcomes cannot be written (its Redis
/// is down) keeps its own jobs held for recovery, and every other shard
/// is still requeued and left at shutdown (until `392aee5`, nothing was).
#[tokio::test]
async fn a_shard_whose_outcomes_cannot_be_written_does_not_keep_the_others_held() {
    use super::source::sharded::{Part, Sharded};

    let a = Arc::new(MemorySource::named("a"));
    let b = Arc::new(MemorySource::named("b"));
    b.refuse_records.store(u32::MAX, Ordering::Release);
    let part = |shard: u16, source: &Arc<MemorySource>| Part {
        shard,
        name: format!("s{shard}"),
        source: source.clone(),
    };
    let queues = "a,b".parse().expect("queues");
    let sharded: Arc<dyn JobSource> = Arc::new(Sharded::new(vec![part(0, &a), part(1, &b)], queues, |queue| {
        u16::from(queue == "b")
    }));
    let inflight = Arc::new(InFlightTable::default());
    let counters = Arc::new(Counters::default());
    let metrics = Arc::new(Metrics::new(false));
    let writer = |source: &Arc<MemorySource>| {
        let source: Arc<dyn JobSource> = source.clone();
        outcome::spawn(source, counters.clone(), inflight.clone(), metrics.clone(), 16)
    };
    let ((to_a, writer_a), (to_b, writer_b)) = (writer(&a), writer(&b));
    let cancels = super::cancel::Cancels::new(Vec::new(), "test");
    let manager = Manager::new(
        Arc::new(Scripted),
        4,
        vec![Some(to_a), Some(to_b)],
        inflight.clone(),
        cancels,
    );
    let fetching = Fetching::start(
        sharded.clone(),
        manager.clone(),
        inflight.clone(),
        CancellationToken::new(),
        None,
    );
    a.push(&job("Quick", 1));
    b.push(&job("Quick", 2));
    until("a's job is recorded", || a.state().recorded.len() == 1).await;
    until("b's job is taken", || b.state().held.len() == 1).await;
    // A job held for this process on a that nobody runs (a waiter took
    // it): shutdown puts it back.
    a.state().held.push("held".into());
    let running = Running {
        source: sharded.as_ref(),
        manager: &manager,
        fetching,
        stop: &CancellationToken::new(),
        writers: vec![(0, writer_a), (1, writer_b)],
    };
    let stopped = shut_down(Duration::from_millis(50), running, std::future::pending()).await;
    assert_eq!(stopped.stuck, [1], "b's writer could not finish");
    assert_eq!(stopped.requeued, Some(1), "a was requeued");
    assert!(a.state().held.is_empty(), "nothing left held on a");
    assert_eq!(a.state().queue.front().map(String::as_str), Some("held"));
    assert_eq!(b.state().held.len(), 1, "b's job stays held for recovery");
}

/// The writer's counters (`super::owed`): a runner that falls idle
/// writes every count.
#[tokio::test]
async fn every_count_is_written_once_the_runner_falls_idle() {
    let jobs: Vec<String> = (0..50).map(|n| job("Quick", n)).collect();
    let core = Core::start(holding(&jobs), 10);
    let source = core.source.clone();
    until("every job is counted", || source.state().stats.processed == 50).await;
    let state = source.state();
    assert_eq!(state.recorded.len(), 50);
    assert_eq!(state.stats.failed, 0);
}

/// Counts of jobs that end while another runs wait at most the lag, and
/// are written alone when no batch comes to carry them.
#[tokio::test]
async fn counts_are_written_while_a_job_runs_on() {
    let core = Core::start(
        MemorySource::with(&[&job("Block", 1), &job("Quick", 2), &job("Quick", 3)]),
        4,
    );
    let source = core.source.clone();
    until("the quick jobs are counted", || source.state().stats.processed == 2).await;
    assert_eq!(core.inflight.len(), 1, "the blocked job still runs");
    let requeued = core.shut_down(Duration::from_millis(50)).await;
    assert_eq!(requeued, Some(0));
    assert_eq!(source.state().stats.processed, 2, "a requeue is not counted");
}

/// A refused write is retried with the same counters, never adding them
/// twice; what ends meanwhile is counted once too.
#[tokio::test]
async fn refused_writes_count_each_job_once() {
    let jobs: Vec<String> = (0..20).map(|n| job("Quick", n)).collect();
    let source = holding(&jobs);
    source.refuse_records.store(3, Ordering::Release);
    let core = Core::start(source, 4);
    let source = core.source.clone();
    until("every job is recorded", || source.state().recorded.len() == 20).await;
    assert_eq!(source.state().stats.processed, 20);
    assert_eq!(core.shut_down(Duration::from_secs(1)).await, Some(0));
    assert_eq!(source.state().stats.processed, 20, "nothing added at the end");
}

/// While jobs keep ending (one runs on), counters go with one write per
/// lag at most, not with every batch.
#[tokio::test]
async fn counters_go_with_one_write_per_lag_while_jobs_keep_ending() {
    let jobs: Vec<String> = (0..2_000).map(|n| job("Quick", n)).collect();
    let mut all = vec![job("Block", 0)];
    all.extend(jobs);
    let core = Core::start(holding(&all), 8);
    let source = core.source.clone();
    let started = Instant::now();
    until("every quick job is counted", || source.state().stats.processed == 2_000).await;
    let lags = started.elapsed().as_secs_f64() / super::owed::STATS_LAG.as_secs_f64();
    let (writes, counter_writes) = {
        let state = source.state();
        (state.writes, state.counter_writes)
    };
    assert!(
        (counter_writes as f64) <= lags.floor() + 2.0,
        "{counter_writes} of {writes} writes carried counters in {lags:.1} lags"
    );
    assert!(writes >= 2_000 / 8, "{writes} writes of jobs");
    core.shut_down(Duration::from_millis(50)).await;
}
