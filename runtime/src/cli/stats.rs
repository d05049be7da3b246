//! `wasmjobs stats`: counters, queues and live processes at a glance.
//!
//! The terminal's answer to "is anything stuck?", without the Web UI: the
//! same numbers as Sidekiq's dashboard, read the way Sidekiq reads them (so
//! it works on a plain Sidekiq deployment too). `--json` for scripts,
//! `--watch` to keep it on screen like `top`. Plugins with cluster limits
//! get a table of their own ([`crate::redis::limits`]; `limits` in the
//! JSON), left out when no limit key exists. Per class, the execution
//! time and queue latency percentiles (p50 / p95 / p99) of the last hour,
//! every process merged, come from the histograms each heartbeat
//! publishes ([`crate::redis::latency`]; `latency` in the JSON).
//!
//! With shards (`--shard`), the fleet's totals come first, then each
//! shard's own report; a shard that cannot be reached is shown as down and
//! the others still are (`--json`: `fleet` and `shards`, each shard's
//! document with `name`, `location`, `up`, or `error`), and the exit status
//! is 1; `--watch` tries a shard that was down again at each refresh.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Args;

use super::{Cli, RedisArgs};
use crate::metrics::published::short_ms;
use crate::redis::api::{self, Stats};
use crate::redis::latency::{ClassLatency, last_hour};
use crate::redis::limits::{LimitStats, limit_stats};
use crate::redis::now_f64;
use crate::redis::shards::{Opened, close_all, open_all, reopen};

/// Clears the terminal and homes the cursor, for `--watch`.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Arguments of `wasmjobs stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Also show the jobs of the PostgreSQL job store at URL (queues,
    /// scheduled, retries, running, dead).
    #[arg(long = "source", env = "WASMJOBS_SOURCE", hide_env_values = true, value_name = "URL")]
    pub jobs_source: Option<String>,
    /// Print the stats as JSON (one line per refresh with --watch).
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds (default 2) until Ctrl-C.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2", value_parser = parse_interval)]
    pub watch: Option<f64>,
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &StatsArgs) -> Result<ExitCode> {
    let map = args.redis.shard_map(&cli.data_dir)?;
    let mut shards = open_all(&map).await;
    if !map.is_sharded()
        && let Some(Err(err)) = shards.first().map(|shard| &shard.redis)
    {
        return Err(anyhow!("{err:#}"));
    }
    let store = match &args.jobs_source {
        Some(url) => Some(crate::pg::Pg::connect(url).await?),
        None => None,
    };
    let result = async {
        loop {
            // A shard down at the last look is tried again; all are read at once.
            reopen(&map, &mut shards).await;
            let reads = shards.iter().map(|shard| async move {
                match &shard.redis {
                    Ok(redis) => Reading::read(&mut redis.conn()).await,
                    Err(err) => Err(anyhow!("{err:#}")),
                }
            });
            let mut readings = Vec::with_capacity(shards.len());
            for (shard, reading) in shards.iter().zip(futures_util::future::join_all(reads).await) {
                match (reading, map.is_sharded()) {
                    (Ok(reading), _) => readings.push((shard, Ok(reading))),
                    // One Redis: its error is the command's.
                    (Err(err), false) => return Err(err),
                    (Err(err), true) => readings.push((shard, Err(err))),
                }
            }
            let down = readings.iter().any(|(_, reading)| reading.is_err());
            let in_store = match &store {
                Some(pg) => Some(crate::pg::stats::read(pg).await?),
                None => None,
            };
            let text = match (map.is_sharded(), args.json) {
                (false, true) => {
                    let (_, reading) = only(&readings)?;
                    let mut json = reading.json()?;
                    if let Some(in_store) = &in_store {
                        json["postgres"] = serde_json::to_value(in_store).context("cannot serialise the stats")?;
                    }
                    json_text(&json, args.watch.is_some())?
                }
                (false, false) => {
                    let (shard, reading) = only(&readings)?;
                    reading.render(&shard.location, in_store.as_ref())
                }
                (true, true) => {
                    let mut json = fleet_json(&readings)?;
                    if let Some(in_store) = &in_store {
                        json["postgres"] = serde_json::to_value(in_store).context("cannot serialise the stats")?;
                    }
                    json_text(&json, args.watch.is_some())?
                }
                (true, false) => render_fleet(&readings, in_store.as_ref()),
            };
            let text = match (args.json, args.watch) {
                (false, Some(_)) => format!("{CLEAR}{text}"),
                _ => text,
            };
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).context("cannot write to stdout")?;
            out.flush().context("cannot write to stdout")?;
            drop(out);
            let Some(every) = args.watch else {
                return Ok::<_, anyhow::Error>(down);
            };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs_f64(every)) => {}
                signal = tokio::signal::ctrl_c() => {
                    signal.context("cannot listen for Ctrl-C")?;
                    return Ok(down);
                }
            }
        }
    }
    .await;
    close_all(shards).await?;
    // A shard down makes the status 1, so `stats --json || alert` alerts.
    result.map(|down| if down { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The reading of the one Redis there is without shards.
fn only<'a>(readings: &'a [(&'a Opened, Result<Reading>)]) -> Result<(&'a Opened, &'a Reading)> {
    match readings.first() {
        Some((shard, Ok(reading))) => Ok((shard, reading)),
        Some((_, Err(err))) => Err(anyhow!("{err:#}")),
        None => Err(anyhow!("no Redis to read")),
    }
}

/// A JSON document as printed: pretty, or one line per refresh.
fn json_text(json: &serde_json::Value, watch: bool) -> Result<String> {
    let text = match watch {
        false => serde_json::to_string_pretty(json),
        true => serde_json::to_string(json),
    };
    Ok(text.context("cannot serialise the stats")? + "\n")
}

/// What one Redis (a shard) says.
struct Reading {
    stats: Stats,
    limits: LimitStats,
    schedules: Schedules,
    latency: std::collections::BTreeMap<String, ClassLatency>,
}

impl Reading {
    async fn read(conn: &mut redis::aio::ConnectionManager) -> Result<Self> {
        Ok(Self {
            stats: api::stats(conn).await?,
            limits: limit_stats(conn).await?,
            schedules: Schedules::read(conn).await?,
            latency: last_hour(conn, now_f64()).await?,
        })
    }

    fn json(&self) -> Result<serde_json::Value> {
        let with = WithSchedules {
            stats: &self.stats,
            schedules: self.schedules,
        };
        let mut json = serde_json::to_value(&with).context("cannot serialise the stats")?;
        json["limits"] = serde_json::to_value(&self.limits).context("cannot serialise the stats")?;
        json["latency"] = serde_json::to_value(&self.latency).context("cannot serialise the stats")?;
        Ok(json)
    }

    fn render(&self, location: &str, in_store: Option<&crate::pg::stats::StoreStats>) -> String {
        render(&self.stats, location, now_f64())
            + &in_store.map(crate::pg::stats::StoreStats::render).unwrap_or_default()
            + &render_latency(&self.latency)
            + &self.schedules.render()
            + &render_limits(&self.limits)
    }
}

/// The fleet's totals: every shard's counters and sets summed.
#[derive(Debug, Default, serde::Serialize)]
struct Fleet {
    shards: usize,
    up: usize,
    processed: u64,
    failed: u64,
    discarded: u64,
    enqueued: u64,
    scheduled: u64,
    retries: u64,
    dead: u64,
}

impl Fleet {
    fn of(readings: &[(&Opened, Result<Reading>)]) -> Self {
        let mut fleet = Fleet {
            shards: readings.len(),
            ..Fleet::default()
        };
        for (_, reading) in readings {
            let Ok(Reading { stats, .. }) = reading else { continue };
            fleet.up += 1;
            fleet.processed += stats.processed;
            fleet.failed += stats.failed;
            fleet.discarded += stats.discarded;
            fleet.enqueued += stats.enqueued;
            fleet.scheduled += stats.scheduled;
            fleet.retries += stats.retries;
            fleet.dead += stats.dead;
        }
        fleet
    }
}

/// `--json` with shards: the totals and each shard's document (or error).
fn fleet_json(readings: &[(&Opened, Result<Reading>)]) -> Result<serde_json::Value> {
    let mut shards = Vec::with_capacity(readings.len());
    for (shard, reading) in readings {
        let mut json = match reading {
            Ok(reading) => reading.json()?,
            Err(err) => serde_json::json!({ "error": format!("{err:#}") }),
        };
        json["name"] = shard.name.clone().into();
        json["location"] = shard.location.clone().into();
        json["up"] = reading.is_ok().into();
        shards.push(json);
    }
    let fleet = serde_json::to_value(Fleet::of(readings)).context("cannot serialise the stats")?;
    Ok(serde_json::json!({ "fleet": fleet, "shards": shards }))
}

/// The human report with shards: the totals, then each shard's report.
fn render_fleet(readings: &[(&Opened, Result<Reading>)], in_store: Option<&crate::pg::stats::StoreStats>) -> String {
    let fleet = Fleet::of(readings);
    let mut out = format!(
        "Fleet: {} shards, {} up\nprocessed {}   failed {}   discarded {}\nenqueued {}   scheduled {}   retry {}   dead {}\n",
        fleet.shards,
        fleet.up,
        fleet.processed,
        fleet.failed,
        fleet.discarded,
        fleet.enqueued,
        fleet.scheduled,
        fleet.retries,
        fleet.dead
    );
    if let Some(in_store) = in_store {
        out.push_str(&in_store.render());
    }
    for (shard, reading) in readings {
        let _ = write!(out, "\n== shard {} ==\n", shard.name);
        match reading {
            Ok(reading) => out.push_str(&reading.render(&shard.location, None)),
            Err(err) => {
                let _ = writeln!(out, "Redis: {}\nDOWN: {err:#}", shard.location);
            }
        }
    }
    out
}

/// The stats document plus the cron schedules (`--json`).
#[derive(serde::Serialize)]
struct WithSchedules<'a> {
    #[serde(flatten)]
    stats: &'a Stats,
    schedules: Schedules,
}

/// How many cron schedules Redis holds (`wasmjobs schedule` lists them).
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Schedules {
    /// Every schedule in `cron_jobs:default`.
    total: usize,
    /// Of those, enabled.
    enabled: usize,
    /// Of those, declared by wasmjobs plugins.
    from_plugins: usize,
    /// Members of `cron_jobs:default` that are not readable schedules.
    unreadable: usize,
}

impl Schedules {
    async fn read(conn: &mut redis::aio::ConnectionManager) -> Result<Self> {
        let listing = crate::redis::cron::list(conn).await?;
        let entries = &listing.entries;
        Ok(Self {
            total: entries.len(),
            enabled: entries.iter().filter(|e| e.enabled).count(),
            from_plugins: entries.iter().filter(|e| e.plugin.is_some()).count(),
            unreadable: listing.invalid.len(),
        })
    }

    fn render(&self) -> String {
        let unreadable = match self.unreadable {
            0 => String::new(),
            n => format!("   unreadable {n}"),
        };
        match self.total {
            0 => format!("\nno cron schedules{unreadable}\n"),
            total => format!(
                "\ncron schedules {total}   enabled {}   from plugins {}{unreadable}   (wasmjobs schedule lists them)\n",
                self.enabled, self.from_plugins
            ),
        }
    }
}

/// `--watch`: a positive number of seconds.
fn parse_interval(text: &str) -> Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(secs) if (0.05..=86_400.0).contains(&secs) => Ok(secs),
        _ => Err(anyhow!("expected a number of seconds between 0.05 and 86400")),
    }
}

/// The human report.
fn render(stats: &Stats, location: &str, now: f64) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out, "Redis: {location}");
    let _ = writeln!(
        out,
        "processed {}   failed {}   discarded {}",
        stats.processed, stats.failed, stats.discarded
    );
    let _ = writeln!(
        out,
        "enqueued {}   scheduled {}   retry {}   dead {}",
        stats.enqueued, stats.scheduled, stats.retries, stats.dead
    );
    let _ = writeln!(
        out,
        "cancelled {} ({} kept)   paused queues: {}",
        stats.control.cancelled,
        stats.control.cancelled_kept,
        match stats.control.paused.is_empty() {
            true => "none".to_owned(),
            false => stats.control.paused.join(", "),
        }
    );
    if stats.control.cancel_requests_open > 0 {
        let _ = writeln!(
            out,
            "cancel requests open {} (until they close or expire, every fetch looks each job's request up: docs/control.md)",
            stats.control.cancel_requests_open
        );
    }
    if stats.unique_locks > 0 {
        let more = if stats.unique_locks_exact { "" } else { "+" };
        let _ = writeln!(out, "unique locks {}{more}", stats.unique_locks);
    }
    for unreadable in &stats.unreadable {
        let _ = writeln!(
            out,
            "unreadable {}: {} (counted as empty)",
            unreadable.key, unreadable.why
        );
    }
    for stranded in &stats.stranded {
        let _ = writeln!(
            out,
            "WARNING queue {} holds {} jobs in Redis that no runner reads: the live runners read {} (enqueue there with --source URL)",
            stranded.queue,
            stranded.size,
            stranded.read_from.join(", ")
        );
    }

    out.push('\n');
    if stats.queues.is_empty() {
        out.push_str("no queues\n");
    } else {
        let width = stats.queues.iter().map(|q| q.name.len()).max().unwrap_or(0).max(5);
        let _ = writeln!(out, "{:<width$}  {:>10}  {:>9}", "QUEUE", "SIZE", "LATENCY");
        for queue in &stats.queues {
            let latency = if queue.size == 0 {
                "-".to_owned()
            } else {
                age(queue.latency_secs)
            };
            let paused = if queue.paused { "  paused" } else { "" };
            let _ = writeln!(
                out,
                "{:<width$}  {:>10}  {:>9}{paused}",
                queue.name, queue.size, latency
            );
        }
    }

    out.push('\n');
    if stats.processes.is_empty() {
        out.push_str("no live processes\n");
    } else {
        let width = stats
            .processes
            .iter()
            .map(|p| p.identity.len())
            .max()
            .unwrap_or(0)
            .max(7);
        let tag_width = stats.processes.iter().map(|p| p.tag.len()).max().unwrap_or(0).max(3);
        let _ = writeln!(
            out,
            "{:<width$}  {:<tag_width$}  {:>9}  {:>8}  {:>6}  {:<5}  {:>9}",
            "PROCESS", "TAG", "BUSY", "RSS MB", "CPU %", "QUIET", "LAST BEAT"
        );
        for p in &stats.processes {
            let busy = format!("{}/{}", p.busy, p.concurrency);
            let rss = format!("{:.1}", p.rss_kb as f64 / 1024.0);
            let cpu = p.cpu_percent.map_or_else(|| "-".to_owned(), |cpu| format!("{cpu:.1}"));
            let quiet = if p.quiet { "yes" } else { "no" };
            let beat = format!("{} ago", age(now - p.beat));
            let _ = writeln!(
                out,
                "{:<width$}  {:<tag_width$}  {busy:>9}  {rss:>8}  {cpu:>6}  {quiet:<5}  {beat:>9}",
                p.identity, p.tag
            );
            if !p.plugins.is_empty() {
                let plugins: Vec<String> = p
                    .plugins
                    .iter()
                    .map(|(name, version)| format!("{name}@{version}"))
                    .collect();
                let _ = writeln!(out, "  plugins: {}", plugins.join(" "));
            }
        }
    }
    out
}

/// The per-class latency table of the last hour (empty when no process
/// published any).
fn render_latency(latency: &std::collections::BTreeMap<String, ClassLatency>) -> String {
    let mut out = String::new();
    if latency.is_empty() {
        return out;
    }
    let width = latency.keys().map(|c| c.len()).max().unwrap_or(0).max(5);
    let _ = writeln!(
        out,
        "\n{:<width$}  {:>8}  {:>26}  {:>26}",
        "CLASS", "JOBS", "EXECUTION p50/p95/p99", "QUEUE LATENCY p50/p95/p99"
    );
    for (class, l) in latency {
        let three = |s: &crate::metrics::published::Summary| match s.count {
            0 => "-".to_owned(),
            _ => format!("{}/{}/{}", short_ms(s.p50), short_ms(s.p95), short_ms(s.p99)),
        };
        let _ = writeln!(
            out,
            "{class:<width$}  {:>8}  {:>26}  {:>26}",
            l.execution.count.max(l.queue.count),
            three(&l.execution),
            three(&l.queue)
        );
    }
    out.push_str("(last hour, all processes)\n");
    out
}

/// The cluster limits table (empty when no plugin has limit keys).
pub(super) fn render_limits(limits: &LimitStats) -> String {
    let mut out = String::new();
    if limits.plugins.is_empty() {
        return out;
    }
    let width = limits.plugins.iter().map(|p| p.plugin.len()).max().unwrap_or(0).max(6);
    let _ = writeln!(
        out,
        "\n{:<width$}  {:>8}  {:>8}  {:>10}  {:>7}  {:>15}",
        "LIMITS", "STARTS", "KEYS", "KEY STARTS", "LEASES", "OVERRATED R/C"
    );
    for p in &limits.plugins {
        let overrated = format!("{}/{}", p.overrated_rate, p.overrated_concurrency);
        let _ = writeln!(
            out,
            "{:<width$}  {:>8}  {:>8}  {:>10}  {:>7}  {overrated:>15}",
            p.plugin, p.starts, p.keys, p.key_starts, p.leases
        );
    }
    if limits.truncated {
        let _ = writeln!(
            out,
            "(partial: more than {} limit keys)",
            crate::redis::limits::MAX_KEYS
        );
    }
    out
}

/// A duration for people: `4.2s`, `3m 05s`, `2h 10m`, `3d 4h`.
fn age(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 60.0 {
        return format!("{secs:.1}s");
    }
    let whole = secs as u64;
    match whole {
        0..3_600 => format!("{}m {:02}s", whole / 60, whole % 60),
        3_600..86_400 => format!("{}h {:02}m", whole / 3_600, whole % 3_600 / 60),
        _ => format!("{}d {}h", whole / 86_400, whole % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::api::{ProcessInfo, QueueStats};

    #[test]
    fn the_limits_table_shows_each_plugin() {
        assert_eq!(render_limits(&LimitStats::default()), "");
        let text = render_limits(&LimitStats {
            plugins: vec![crate::redis::limits::PluginLimits {
                plugin: "mailer".into(),
                starts: 42,
                keys: 3,
                key_starts: 9,
                leases: 2,
                overrated_rate: 5,
                overrated_concurrency: 7,
            }],
            truncated: true,
        });
        assert!(
            text.contains("mailer        42         3           9        2              5/7"),
            "{text}"
        );
        assert!(text.contains("partial"), "{text}");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(4.25), "4.2s");
        assert_eq!(age(185.0), "3m 05s");
        assert_eq!(age(7_800.0), "2h 10m");
        assert_eq!(age(3.0 * 86_400.0 + 4.0 * 3_600.0), "3d 4h");
        assert_eq!(age(-1.0), "0.0s");
    }

    #[test]
    fn the_report_shows_queues_and_processes() {
        let stats = Stats {
            processed: 10,
            failed: 2,
            discarded: 1,
            scheduled: 3,
            retries: 4,
            dead: 5,
            enqueued: 7,
            queues: vec![
                QueueStats {
                    name: "default".into(),
                    size: 7,
                    latency_secs: 12.5,
                    paused: false,
                    unreadable: None,
                },
                QueueStats {
                    name: "low".into(),
                    size: 0,
                    latency_secs: 0.0,
                    paused: true,
                    unreadable: None,
                },
            ],
            control: crate::redis::api::ControlStats {
                paused: vec!["low".into()],
                cancelled: 3,
                cancelled_kept: 2,
                cancel_requests_open: 1,
            },
            processes: vec![ProcessInfo {
                identity: "host:1:abc".into(),
                hostname: "host".into(),
                pid: 1,
                tag: "app".into(),
                concurrency: 10,
                queues: vec!["default".into()],
                started_at: 90.0,
                busy: 3,
                beat: 95.0,
                quiet: false,
                rss_kb: 2048,
                rtt_us: 100,
                cpu_percent: Some(12.5),
                version: None,
                plugins: [("fib".to_owned(), "0123456789ab".to_owned())].into(),
                store: None,
                problem: None,
            }],
            unique_locks: 2,
            unique_locks_exact: false,
            unreadable: vec![crate::redis::bounded::Unreadable::new(
                "queue:junk",
                "a hash, not a list",
            )],
            stranded: vec![crate::redis::stranded::Stranded {
                queue: "old".into(),
                size: 4,
                read_from: vec!["postgres://db:5432/app".into()],
            }],
        };
        let text = render(&stats, "redis://x", 100.0);
        assert!(
            text.contains("WARNING queue old holds 4 jobs in Redis that no runner reads: the live runners read postgres://db:5432/app"),
            "{text}"
        );
        assert!(text.contains("processed 10   failed 2   discarded 1"), "{text}");
        assert!(text.contains("plugins: fib@0123456789ab"), "{text}");
        assert!(text.contains("enqueued 7   scheduled 3   retry 4   dead 5"), "{text}");
        assert!(text.contains("unique locks 2+"), "{text}");
        assert!(
            text.contains("unreadable queue:junk: a hash, not a list (counted as empty)"),
            "{text}"
        );
        assert!(text.contains("default           7      12.5s"), "{text}");
        assert!(text.contains("low               0          -  paused"), "{text}");
        assert!(text.contains("cancelled 3 (2 kept)   paused queues: low"), "{text}");
        assert!(text.contains("cancel requests open 1 (until they close"), "{text}");
        assert!(
            text.contains("host:1:abc  app       3/10       2.0    12.5  no      5.0s ago"),
            "{text}"
        );
    }
}
