//! The heartbeat: this process, as Sidekiq's Web UI and API see it.
//!
//! Every [`INTERVAL`] (and once at start) one `MULTI` writes the process
//! hash (Sidekiq's `info`, `busy`, `beat`, `quiet`, `rss`, `rtt_us`, and our
//! `cpu` and `plugins`, which Sidekiq's Web UI ignores) with a 60 s expiry,
//! adds the identity to `processes`, rewrites the `:work` hash of jobs in
//! flight (also under Sidekiq 6's `:workers` name), and pops one command from
//! the `-signals` list the Web UI's Quiet/Stop buttons push to. A process
//! whose hash expired is dead as far as everyone else is concerned; its
//! in-progress jobs are then recovered ([`super::orphans`]). The same
//! transaction renews the cluster concurrency leases the process holds
//! ([`super::limiter`]) and adds the latency counts recorded since the last
//! beat to the cluster's per-minute histograms
//! ([`crate::metrics::published`]) and the jobs it recorded as processed
//! and failed to the per-minute counters the dashboard's chart draws the
//! last hour from ([`crate::redis::history`]; the daily ones are written
//! with each batch of outcomes); the last counts are written when the
//! process stops ([`Heartbeat::clear`]). A hot reload asks for a beat at
//! once (at most one a second), so the plugin versions and report others
//! read are current.
//!
//! Between beats, every [`WORK_TICK`], the `:work` hash and `busy` are
//! brought up to date ([`Heartbeat::show_work`]): the jobs started since
//! the last write and still running are added, those that ended removed,
//! and nothing is written when nothing changed. So a running job shows in
//! the dashboard and Sidekiq's Web UI within a second of its start, at a
//! cost bounded by the jobs in flight at each tick (jobs shorter than a
//! tick never show, as under Sidekiq's 10 s beat), not by the jobs run.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::inflight::{InFlight, InFlightTable};
use super::limiter::Limiter;
use super::outcome::Counters;
use super::reloader::LiveCatalog;
use super::source::JobSource;
use crate::metrics::Metrics;
use crate::metrics::published::Published;
use crate::redis::{Redis, history, keys, latency, now_f64};

/// Time between beats (Sidekiq's).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Time between updates of the `:work` hash and `busy` between beats.
pub const WORK_TICK: Duration = Duration::from_secs(1);
/// Shortest time between beats when a reload asks for one early.
pub const EARLIEST: Duration = Duration::from_secs(1);
/// A heartbeat failing for this long is logged as an error: half the
/// time after which the others count the process dead.
const LOUD_AFTER: Duration = Duration::from_secs(30);

/// Who this process is: `hostname:pid:nonce`, as Sidekiq names processes.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The full identity.
    pub identity: String,
    /// The machine's host name.
    pub hostname: String,
    /// This process's id.
    pub pid: u32,
}

impl Identity {
    /// The identity of the current process (a fresh nonce each start).
    pub fn current() -> Self {
        let hostname = hostname();
        let pid = std::process::id();
        let nonce = hex::encode(rand::random::<[u8; 6]>());
        Self {
            identity: format!("{hostname}:{pid}:{nonce}"),
            hostname,
            pid,
        }
    }
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Resident set size of process `pid` in KiB (0 if unknown).
pub fn rss_kb(pid: u32) -> u64 {
    crate::metrics::process::memory_kb_of(pid).0
}

/// What the Web UI asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop fetching (TSTP).
    Quiet,
    /// Shut down gracefully (TERM).
    Stop,
}

/// What the heartbeat says about this process.
pub(crate) struct About {
    /// The queues it serves.
    pub(crate) queues: Vec<String>,
    /// Its `--tag`.
    pub(crate) tag: String,
    /// Its `--concurrency`.
    pub(crate) concurrency: u32,
    /// Where it reads its jobs: `redis`, or the store's location (no
    /// password), so that pushes into Redis no runner reads are caught
    /// ([`crate::redis::stranded`]).
    pub(crate) store: String,
}

/// What the heartbeat reads from, each beat.
pub(crate) struct Parts {
    /// The jobs in flight (the `:work` hash, `busy`).
    pub(crate) inflight: Arc<InFlightTable>,
    /// The job source of the shard beaten on, which registers the
    /// process with each beat (none on a default shard that holds none of
    /// the process's queues).
    pub(crate) source: Option<Arc<dyn JobSource>>,
    /// The plugins loaded (their versions, in `info`).
    pub(crate) catalog: LiveCatalog,
    /// Cancelled once the process is quiet.
    pub(crate) quiet: CancellationToken,
    /// The outcomes written (processed and failed, per minute).
    pub(crate) counters: Arc<Counters>,
}

/// The heartbeat of one process.
pub struct Heartbeat {
    redis: Redis,
    identity: Identity,
    info: serde_json::Value,
    inflight: Arc<InFlightTable>,
    source: Option<Arc<dyn JobSource>>,
    catalog: LiveCatalog,
    quiet: CancellationToken,
    metrics: Option<Arc<Metrics>>,
    /// Whose concurrency leases each beat renews.
    limiter: Option<Arc<Limiter>>,
    /// The shard written to, when there are several: its index (the jobs
    /// taken from it make its `:work`) and name. What is the process's
    /// rather than a shard's (latency and per-minute counts, leases,
    /// `/metrics`' round trip) is written to the default shard only.
    shard: Option<(u16, String)>,
    /// Whether the last beat failed (said once per failure and recovery).
    failing: std::sync::atomic::AtomicBool,
    /// The round trip of the previous beat's transaction, µs (Sidekiq's
    /// `rtt_us`), written with the next beat: one round trip per beat
    /// instead of a separate `PING`, since every wake-up of an idle
    /// runner costs CPU.
    rtt_us: AtomicU64,
    /// The latency counts already published.
    published: Published,
    /// The outcomes written.
    counters: Arc<Counters>,
    /// Of those, the processed and failed counts already published.
    counted: Mutex<(u64, u64)>,
    /// CPU use since the previous beat (the `cpu` field).
    cpu: CpuSince,
    /// Notified when a plugin changed: beat now, not in up to 10 s.
    reloaded: Arc<Notify>,
    /// The jobs the `:work` hash shows, by in-flight id, as last written.
    shown: Mutex<HashSet<u64>>,
    /// When a beat was last written: a tick writes only while the process
    /// hash it updates is alive.
    beaten: Mutex<Option<Instant>>,
}

/// Percent of one core a process used between two readings.
struct CpuSince(std::sync::Mutex<(Instant, u64)>);

impl CpuSince {
    /// Readings closer together than this say nothing (the clock counts
    /// hundredths of a second): the first beat, at start, has no figure.
    const SHORTEST: Duration = Duration::from_secs(1);

    fn new() -> Self {
        Self(std::sync::Mutex::new((
            Instant::now(),
            crate::metrics::process::cpu_ticks(),
        )))
    }

    /// Percent of one core used since the previous reading (100: one core
    /// busy all the time); `None` when that was less than [`Self::SHORTEST`]
    /// ago, and the previous reading is then kept.
    fn percent(&self) -> Option<f64> {
        let now = (Instant::now(), crate::metrics::process::cpu_ticks());
        let mut last = self.0.lock().ok()?;
        let wall = now.0.duration_since(last.0);
        if wall < Self::SHORTEST {
            return None;
        }
        let ticks = now.1.saturating_sub(last.1);
        *last = now;
        // Ticks are 1/100 s: ticks / seconds is a percentage.
        Some(ticks as f64 / wall.as_secs_f64())
    }
}

impl Heartbeat {
    /// A heartbeat describing this process.
    pub(crate) fn new(redis: Redis, identity: Identity, about: About, parts: Parts) -> Self {
        let About {
            queues,
            tag,
            concurrency,
            store,
        } = about;
        let Parts {
            inflight,
            source,
            catalog,
            quiet,
            counters,
        } = parts;
        let info = json!({
            "hostname": identity.hostname,
            "started_at": now_f64(),
            "pid": identity.pid,
            "tag": tag,
            "concurrency": concurrency,
            "queues": queues,
            "labels": ["wasmjobs"],
            "identity": identity.identity,
            "version": format!("wasmjobs {}", env!("CARGO_PKG_VERSION")),
            "store": store,
        });
        Self {
            redis,
            identity,
            info,
            inflight,
            source,
            catalog,
            quiet,
            metrics: None,
            limiter: None,
            shard: None,
            failing: std::sync::atomic::AtomicBool::new(false),
            rtt_us: AtomicU64::new(0),
            published: Published::default(),
            counters,
            counted: Mutex::new((0, 0)),
            cpu: CpuSince::new(),
            reloaded: Arc::new(Notify::new()),
            shown: Mutex::new(HashSet::new()),
            beaten: Mutex::new(None),
        }
    }

    /// Reports each measured Redis round trip to `metrics` as well.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Writes to shard `index` named `name` of several (see the field).
    pub(crate) fn on_shard(mut self, index: u16, name: &str) -> Self {
        self.shard = Some((index, name.to_owned()));
        self
    }

    fn shard_index(&self) -> u16 {
        self.shard.as_ref().map_or(0, |(index, _)| *index)
    }

    /// Whether this beat writes the process's own figures (see the
    /// `shard` field).
    fn writes_process_figures(&self) -> bool {
        self.shard_index() == 0
    }

    /// Notes whether the last beat worked: logs the change and sets the
    /// shard's `wasmjobs_shard_up`.
    fn answered(&self, up: bool) {
        let was_failing = self.failing.swap(!up, Ordering::Relaxed);
        let Some((_, name)) = &self.shard else { return };
        if let Some(metrics) = &self.metrics {
            metrics.redis_shards.set(name, up);
        }
        if up && was_failing {
            tracing::info!(shard = %name, "shard {name} answers again: its queues are served");
        } else if !up && !was_failing {
            tracing::warn!(shard = %name, "shard {name} does not answer: its queues wait, the other shards' are served");
        }
    }

    /// Renews the concurrency leases `limiter` holds with each beat.
    pub(crate) fn with_limiter(mut self, limiter: Arc<Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Beats every [`INTERVAL`] until `stop`, forwarding the Web UI's
    /// signals to `commands`.
    pub(crate) async fn run(self: Arc<Self>, commands: mpsc::Sender<Command>, stop: CancellationToken) {
        let mut written = Instant::now();
        let mut held = false;
        loop {
            // A vital service down (the fetch loop): the process holds
            // jobs it cannot serve, so it must not look alive for long.
            let down = super::supervise::vital_down();
            if let Some(service) = down
                && !held
            {
                tracing::error!(
                    "{service} is down: the heartbeat is not written until it runs again (other processes recover this one's jobs after {}s)",
                    keys::HEARTBEAT_TTL_SECS
                );
            }
            held = down.is_some();
            let beaten = match down {
                Some(service) => Err(anyhow::anyhow!("{service} is down")),
                None => self.beat().await,
            };
            self.answered(beaten.is_ok());
            match beaten {
                Ok(command) => {
                    written = Instant::now();
                    if let Some(command) = command
                        && commands.send(command).await.is_err()
                    {
                        return;
                    }
                }
                Err(err) => {
                    if let Some(metrics) = &self.metrics {
                        metrics.process.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
                    }
                    let missing = written.elapsed();
                    if missing >= LOUD_AFTER {
                        tracing::error!(
                            "heartbeat: {err:#}; not written for {}s: other processes count this one as dead after {}s and recover its jobs",
                            missing.as_secs(),
                            keys::HEARTBEAT_TTL_SECS
                        );
                    } else if let Some((_, name)) = &self.shard {
                        tracing::warn!(shard = %name, "heartbeat on shard {name}: {err:#}");
                    } else {
                        tracing::warn!("heartbeat: {err:#}");
                    }
                }
            }
            let next = Instant::now() + INTERVAL;
            loop {
                let wake = (Instant::now() + WORK_TICK).min(next);
                tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => {
                        if Instant::now() >= next {
                            break;
                        }
                        if let Err(err) = self.show_work().await {
                            tracing::debug!("heartbeat: updating the jobs in flight: {err:#}");
                        }
                    }
                    () = self.reloaded.notified() => {
                        // At most one extra beat a second, however often
                        // plugins change.
                        tokio::select! {
                            () = tokio::time::sleep_until((next - INTERVAL + EARLIEST).into()) => break,
                            () = stop.cancelled() => return,
                        }
                    }
                    () = stop.cancelled() => return,
                }
            }
        }
    }

    /// What a reload notifies so the next beat comes at once (within
    /// [`EARLIEST`] of the last) and the plugin report is current.
    pub(crate) fn reloaded(&self) -> Arc<Notify> {
        self.reloaded.clone()
    }

    /// Writes one heartbeat; returns the Web UI's command, if it sent one.
    pub async fn beat(&self) -> Result<Option<Command>> {
        let mut conn = self.redis.conn();
        let rtt_us = self.rtt_us.load(Ordering::Relaxed);

        let id = &self.identity.identity;
        let work = self.inflight.describe(self.shard_index(), |_| true, work_entry);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in [keys::work(id), keys::workers(id)] {
            pipe.cmd("UNLINK").arg(&key).ignore();
            stage_work(&mut pipe, &key, &work, &[]);
        }
        pipe.cmd("SADD").arg(keys::PROCESSES).arg(id).ignore();
        pipe.cmd("HSET")
            .arg(id)
            .arg("info")
            .arg(self.info().to_string())
            .arg("busy")
            .arg(work.len())
            .arg("beat")
            .arg(now_f64())
            .arg("rtt_us")
            .arg(rtt_us)
            .arg("quiet")
            .arg(if self.quiet.is_cancelled() { "true" } else { "false" })
            .arg("rss")
            .arg(rss_kb(std::process::id()))
            .arg("plugins")
            .arg(self.plugins())
            .ignore();
        if let Some(cpu) = self.cpu.percent() {
            pipe.cmd("HSET").arg(id).arg("cpu").arg(format!("{cpu:.1}")).ignore();
        }
        pipe.cmd("EXPIRE").arg(id).arg(keys::HEARTBEAT_TTL_SECS).ignore();
        if let Some(source) = &self.source {
            source.register(&mut pipe);
        }
        if let Some(limiter) = &self.limiter {
            limiter.renew(&mut pipe);
        }
        let snapshot = self.publish_latency(&mut pipe);
        let counted = self.publish_counts(&mut pipe);
        pipe.cmd("RPOP").arg(keys::signals(id));
        let started = Instant::now();
        // Anyone can push into the signals list: read bytes, not text.
        let (signal,): (Option<Vec<u8>>,) = pipe.query_async(&mut conn).await.context("writing the heartbeat")?;
        if let Some(snapshot) = snapshot {
            self.published.commit(snapshot);
        }
        *lock(&self.counted) = counted;
        *lock(&self.shown) = work.iter().map(|(id, _)| *id).collect();
        *lock(&self.beaten) = Some(Instant::now());
        let signal = signal.map(|s| String::from_utf8_lossy(&s).into_owned());
        let rtt_us = started.elapsed().as_micros() as u64;
        self.rtt_us.store(rtt_us, Ordering::Relaxed);
        if let Some(metrics) = self.metrics.as_ref().filter(|_| self.writes_process_figures()) {
            metrics.process.redis_rtt_us.store(rtt_us, Ordering::Relaxed);
            metrics
                .process
                .heartbeat_at_ms
                .store(crate::job::now_ms(), Ordering::Relaxed);
        }
        Ok(signal.and_then(|s| match s.as_str() {
            "TSTP" | "USR1" => Some(Command::Quiet),
            "TERM" | "INT" => Some(Command::Stop),
            other => {
                tracing::info!("ignoring signal {:?} from the Web UI", crate::job::preview(other));
                None
            }
        }))
    }

    /// Brings the `:work` hash and `busy` up to date with the jobs in
    /// flight (see the module header); writes nothing when nothing
    /// changed since the last write, or when no beat was written lately
    /// (the process hash `busy` lives in may have expired).
    pub(crate) async fn show_work(&self) -> Result<()> {
        let alive = lock(&self.beaten).is_some_and(|at| at.elapsed() < INTERVAL + WORK_TICK * 5);
        if !alive {
            return Ok(());
        }
        let now = self.inflight.ids(self.shard_index());
        let (started, ended): (HashSet<u64>, Vec<u64>) = {
            let shown = lock(&self.shown);
            (
                now.difference(&shown).copied().collect(),
                shown.difference(&now).copied().collect(),
            )
        };
        if started.is_empty() && ended.is_empty() {
            return Ok(());
        }
        let added = self
            .inflight
            .describe(self.shard_index(), |id| started.contains(&id), work_entry);
        let id = &self.identity.identity;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in [keys::work(id), keys::workers(id)] {
            stage_work(&mut pipe, &key, &added, &ended);
        }
        pipe.cmd("HSET").arg(id).arg("busy").arg(now.len()).ignore();
        pipe.query_async::<()>(&mut self.redis.conn())
            .await
            .context("writing the jobs in flight")?;
        let mut shown = lock(&self.shown);
        for gone in &ended {
            shown.remove(gone);
        }
        shown.extend(added.iter().map(|(id, _)| *id));
        Ok(())
    }

    /// Adds the latency counts recorded since the last publication to
    /// `pipe`; returns the snapshot to commit once `pipe` succeeded (none
    /// without metrics).
    fn publish_latency(&self, pipe: &mut redis::Pipeline) -> Option<BTreeMap<String, crate::metrics::ClassStats>> {
        if !self.writes_process_figures() {
            return None;
        }
        let metrics = self.metrics.as_ref().filter(|m| m.enabled())?;
        let (delta, snapshot) = self.published.delta(metrics);
        latency::publish(pipe, latency::minute_of(now_f64()), &delta);
        Some(snapshot)
    }

    /// Adds the jobs recorded as processed and failed since the last
    /// publication to the current minute's counters in `pipe`; returns the
    /// totals to remember once `pipe` succeeded.
    fn publish_counts(&self, pipe: &mut redis::Pipeline) -> (u64, u64) {
        if !self.writes_process_figures() {
            return *lock(&self.counted);
        }
        let jobs = self.counters.jobs();
        let now = (jobs.processed, jobs.failed);
        let before = *lock(&self.counted);
        history::stage_minute(
            pipe,
            now_f64(),
            now.0.saturating_sub(before.0),
            now.1.saturating_sub(before.1),
        );
        now
    }

    /// The `info` field: this process's description, with the version of
    /// every plugin loaded now (`"plugins": {"name": "version"}`), which
    /// changes as plugins are reloaded.
    pub fn info(&self) -> serde_json::Value {
        let mut info = self.info.clone();
        let plugins: serde_json::Map<String, serde_json::Value> = self
            .catalog
            .load()
            .plugins()
            .iter()
            .map(|p| (p.name.clone(), serde_json::Value::String(p.version.clone())))
            .collect();
        info["plugins"] = serde_json::Value::Object(plugins);
        info
    }

    /// The `plugins` field: what this process's plugins are, may do and
    /// did lately ([`crate::plugin::describe`]), read by the dashboard.
    pub fn plugins(&self) -> String {
        serde_json::to_string(&self.catalog.load().describe()).unwrap_or_default()
    }

    /// Removes this process from Redis (on shutdown), publishing the
    /// latency counts recorded since the last beat.
    pub async fn clear(&self) -> Result<()> {
        let id = &self.identity.identity;
        let mut pipe = redis::pipe();
        pipe.atomic();
        let snapshot = self.publish_latency(&mut pipe);
        let counted = self.publish_counts(&mut pipe);
        pipe.cmd("SREM")
            .arg(keys::PROCESSES)
            .arg(id)
            .ignore()
            .cmd("UNLINK")
            .arg(id)
            .arg(keys::work(id))
            .arg(keys::workers(id))
            .arg(keys::signals(id))
            .ignore();
        pipe.query_async::<()>(&mut self.redis.conn())
            .await
            .context("removing the heartbeat")?;
        if let Some(snapshot) = snapshot {
            self.published.commit(snapshot);
        }
        *lock(&self.counted) = counted;
        Ok(())
    }
}

/// Locks `mutex`, whatever a panicking holder left in it (a set of ids).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Adds to `pipe` the commands that write the jobs `added` (in-flight id,
/// entry) into the work hash `key` and remove the `ended` ones, and renew
/// its expiry.
fn stage_work(pipe: &mut redis::Pipeline, key: &str, added: &[(u64, String)], ended: &[u64]) {
    if !ended.is_empty() {
        let mut hdel = redis::cmd("HDEL");
        hdel.arg(key);
        for id in ended {
            hdel.arg(format!("{id:x}"));
        }
        pipe.add_command(hdel).ignore();
    }
    if !added.is_empty() {
        let mut hset = redis::cmd("HSET");
        hset.arg(key);
        for (id, entry) in added {
            hset.arg(format!("{id:x}")).arg(entry);
        }
        pipe.add_command(hset).ignore();
        pipe.cmd("EXPIRE").arg(key).arg(keys::HEARTBEAT_TTL_SECS).ignore();
    }
}

/// Largest payload written whole into the `work` hash.
pub(crate) const WORK_PAYLOAD_MAX: usize = 64 << 10;

/// The `work` hash entry of a job in flight: Sidekiq's
/// `{"queue", "payload", "run_at"}`, with the payload whole up to
/// [`WORK_PAYLOAD_MAX`] bytes and a bounded preview beyond (still a job:
/// class, jid, queue, args replaced by a note of the size), so a beat stays
/// small however large the jobs in flight, and Sidekiq's Web UI, the
/// dashboard and `wasmjobs cancel` still read it.
fn work_entry(job: &InFlight) -> String {
    let raw = &job.job.raw;
    let payload = if raw.len() <= WORK_PAYLOAD_MAX {
        std::borrow::Cow::Borrowed(raw.as_str())
    } else {
        std::borrow::Cow::Owned(crate::redis::job_head::preview(raw))
    };
    json!({"queue": &*job.job.queue, "payload": payload, "run_at": job.run_at as i64}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::fetched::Fetched;

    #[test]
    fn work_entries_stay_small_and_still_name_the_job() {
        let small = r#"{"class":"A","args":[1],"jid":"abc","queue":"q"}"#;
        let entry = work_entry(&InFlight {
            job: Fetched::new(small.into(), "q"),
            run_at: 5.0,
        });
        let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
        assert_eq!(entry["payload"], small, "a small payload is written whole");
        assert_eq!(entry["run_at"], 5);

        let big = format!(
            r#"{{"class":"Big","args":["{}"],"jid":"0123456789abcdef01234567","queue":"low"}}"#,
            "x".repeat(10 << 20)
        );
        let entry = work_entry(&InFlight {
            job: Fetched::new(big.clone(), "low"),
            run_at: 5.0,
        });
        assert!(entry.len() < 4096, "{} bytes", entry.len());
        let entry: serde_json::Value = serde_json::from_str(&entry).unwrap();
        let payload: serde_json::Value = serde_json::from_str(entry["payload"].as_str().unwrap()).unwrap();
        assert_eq!(payload["class"], "Big");
        assert_eq!(payload["jid"], "0123456789abcdef01234567");
        assert_eq!(payload["queue"], "low");
        assert!(
            payload["args"][0].as_str().unwrap().contains(&big.len().to_string()),
            "{payload}"
        );
    }

    #[test]
    fn rss_is_measured() {
        assert!(rss_kb(std::process::id()) > 0);
    }

    #[test]
    fn cpu_needs_a_second_between_readings() {
        let cpu = CpuSince::new();
        assert_eq!(cpu.percent(), None, "no figure from a reading just taken");
        if let Ok(mut last) = cpu.0.lock() {
            last.0 -= Duration::from_secs(2);
        }
        let percent = cpu.percent().expect("a figure after two seconds");
        assert!((0.0..=200.0 * 2.0).contains(&percent), "{percent}");
        assert_eq!(cpu.percent(), None, "the reading was renewed");
    }
}
