//! `wasmjobs-native`: the benchmark suite's native baseline. A plain Rust
//! worker that does what `wasmjobs run --exit-when-empty` does for the
//! noop and HTTP workloads, minus WebAssembly: the physical limit of this
//! design on this machine, measured in the same run as wasmjobs.
//!
//! ```text
//! wasmjobs-native --redis URL [--concurrency C] [--fetch reliable|basic] [--h2] [--jobs N] [--hold]
//! ```
//!
//! The same jobs, the same Redis, the same protocol:
//!
//! - **Fetch** ([`protocol::FETCH`], the runner's own script): one Lua
//!   call moves up to *n* jobs from `queue:default` into a free batch list
//!   of this process, read in the same round trip (reliable), or pops them
//!   (basic). As the runner's
//!   fetch loop does, it holds slots first (a semaphore of C), waits up to
//!   1 ms for half of them to be free, and fetches as many jobs as it holds
//!   slots (at most 500 a call).
//! - **Work**, one task per job: the payload is parsed as the runner parses
//!   it ([`wasmjobs::redis::payload::Payload`]); `NoopJob` does nothing,
//!   `HttpGetJob` (and `AsyncHttpGetJob`, the same job as an async plugin)
//!   GETs its first argument with the client stack the runner's
//!   host uses (hyper 1 through hyper-util's pooled legacy client and
//!   hyper-rustls, HTTP/1.1 keep-alive, `TCP_NODELAY`, as many idle
//!   connections per host as the concurrency; with `--h2`, HTTP/2 with
//!   prior knowledge, as for a manifest rule with `h2 = true`) and reads
//!   the body to the end; a non-2xx status fails the job. Any other class
//!   fails.
//! - **Ack** ([`protocol::ack`]): one writer drains what has finished (up
//!   to 1,000) into one `MULTI`: `LREM` per job from its batch list, or a
//!   `DEL` of a batch list whose last jobs these are (reliable), and, with the first batch 10 ms after they were last
//!   written and at the end, the `stat:processed` / `stat:failed` counters
//!   summed meanwhile with their daily keys, as the runner's outcome writer
//!   does.
//!
//! Left out, so the baseline is a floor: the heartbeat, the in-flight
//! table, metrics, retries (a failure is only counted), the blocking wait
//! of an empty queue (the worker stops at the first empty fetch, once its
//! jobs are acked: it exists to drain a queue filled beforehand; with
//! `--jobs N` it polls an empty queue every few milliseconds until it has
//! taken N jobs, so the suite can read its memory before any job arrives),
//! and orphan recovery (it does not register its list).
//!
//! Logs " running" on stderr when connected, and a " stopped" summary line
//! once every job it took is acked. With `--hold` it then waits for
//! SIGTERM before exiting, so the suite can read its CPU and peak RSS from
//! `/proc` after the last job (an exited process has none).

mod protocol;
mod work;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use protocol::Done;

#[global_allocator]
static ALLOCATOR: wasmjobs::Allocator = wasmjobs::Allocator;

const USAGE: &str =
    "usage: wasmjobs-native --redis URL [--concurrency C] [--fetch reliable|basic] [--h2] [--jobs N] [--hold]";

/// How long the fetch loop waits for a batch's worth of free slots (the
/// runner's `LINGER`).
const LINGER: Duration = Duration::from_millis(1);
/// With `--jobs N`: how long to wait before fetching again from a queue
/// that was empty while fewer than N jobs were taken.
const EMPTY_POLL: Duration = Duration::from_millis(5);

struct Args {
    redis: String,
    concurrency: usize,
    reliable: bool,
    h2: bool,
    jobs: Option<u64>,
    hold: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        redis: "redis://127.0.0.1:6379".into(),
        concurrency: 10,
        reliable: true,
        h2: false,
        jobs: None,
        hold: false,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        let mut value = || argv.next().with_context(|| format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--redis" => args.redis = value()?,
            "--concurrency" => {
                let c = value()?;
                args.concurrency = c
                    .parse::<u32>()
                    .ok()
                    .map(|c| c as usize)
                    .filter(|&c| c > 0)
                    .with_context(|| format!("--concurrency {c:?}: expected a positive number"))?;
            }
            "--fetch" => {
                args.reliable = match value()?.as_str() {
                    "reliable" => true,
                    "basic" => false,
                    other => bail!("--fetch {other:?}: expected reliable or basic"),
                }
            }
            "--h2" => args.h2 = true,
            "--jobs" => {
                let n = value()?;
                args.jobs = Some(
                    n.parse()
                        .with_context(|| format!("--jobs {n:?}: expected a number of jobs"))?,
                );
            }
            "--hold" => args.hold = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    wasmjobs::runner::os_limits::raise_open_files(u32::try_from(args.concurrency).unwrap_or(u32::MAX));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let client = redis::Client::open(args.redis.as_str()).context("invalid Redis URL")?;
    let conn = redis::aio::ConnectionManager::new(client)
        .await
        .context("connecting to Redis")?;
    let lists = args.reliable.then(|| {
        Arc::new(protocol::Lists::new(format!(
            "wasmjobs:inprogress:native-{}",
            std::process::id()
        )))
    });
    let http = Arc::new(work::http_client(args.concurrency, args.h2));
    let (tx, rx) = mpsc::channel::<Done>(args.concurrency.max(protocol::MAX_ACK_BATCH));
    let writer = tokio::spawn(protocol::write_acks(conn.clone(), lists.clone(), rx));
    let slots = Arc::new(Semaphore::new(args.concurrency));
    let fetch = redis::Script::new(protocol::FETCH);
    protocol::load(&mut conn.clone(), &fetch).await?;
    eprintln!(
        "wasmjobs-native running (concurrency {}, {} fetch, HTTP/{})",
        args.concurrency,
        if args.reliable { "reliable" } else { "basic" },
        if args.h2 { "2" } else { "1.1" }
    );
    let started = Instant::now();
    let mut fetched = 0u64;
    loop {
        let permits = free_slots(&slots, args.concurrency).await?;
        let jobs = protocol::fetch(&mut conn.clone(), &fetch, lists.as_deref(), permits.len()).await?;
        if jobs.is_empty() {
            match args.jobs {
                Some(want) if fetched < want => {
                    drop(permits);
                    tokio::time::sleep(EMPTY_POLL).await;
                    continue;
                }
                _ => break,
            }
        }
        fetched += jobs.len() as u64;
        for ((raw, held), permit) in jobs.into_iter().zip(permits) {
            let (tx, http) = (tx.clone(), http.clone());
            tokio::spawn(async move {
                let ok = work::perform(&http, &raw).await;
                // The writer outlives every job (it ends once all senders are gone).
                let _ = tx.send(Done { raw, ok, held }).await;
                drop(permit);
            });
        }
    }
    // Every job has handed over its outcome once every slot is free again.
    let all = u32::try_from(args.concurrency).context("concurrency too large")?;
    let _all = slots.acquire_many(all).await.context("the slots closed")?;
    drop(tx);
    let (processed, failed) = writer.await.context("the ack writer panicked")??;
    eprintln!(
        "wasmjobs-native stopped: {fetched} fetched, {processed} processed, {failed} failed in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    if processed != fetched {
        bail!("{fetched} jobs fetched but {processed} acked");
    }
    if args.hold {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?
            .recv()
            .await;
    }
    Ok(())
}

/// Waits for a free slot, takes every free one, then waits up to
/// [`LINGER`] for a batch's worth (half the slots) and takes what is free
/// again: the runner's `Manager::slots`, at most [`protocol::MAX_FETCH`].
/// One permit per job to fetch.
async fn free_slots(slots: &Arc<Semaphore>, concurrency: usize) -> Result<Vec<OwnedSemaphorePermit>> {
    let max = concurrency.min(protocol::MAX_FETCH);
    let mut permits = vec![slots.clone().acquire_owned().await.context("the slots closed")?];
    take_free(slots, &mut permits, max);
    let batch = (concurrency / 2).clamp(1, max);
    let held: usize = permits.iter().map(|p| p.num_permits()).sum();
    if held < batch {
        let more = (batch - held) as u32;
        if let Ok(Ok(group)) = tokio::time::timeout(LINGER, slots.clone().acquire_many_owned(more)).await {
            permits.push(group);
        }
        take_free(slots, &mut permits, max);
    }
    let mut single = Vec::with_capacity(max);
    for mut group in permits {
        while group.num_permits() > 1 {
            match group.split(1) {
                Some(one) => single.push(one),
                None => break,
            }
        }
        single.push(group);
    }
    Ok(single)
}

fn take_free(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>, max: usize) {
    let held: usize = permits.iter().map(|p| p.num_permits()).sum();
    let free = slots.available_permits().min(max.saturating_sub(held));
    if free > 0
        && let Ok(group) = slots.clone().try_acquire_many_owned(free as u32)
    {
        permits.push(group);
    }
}
