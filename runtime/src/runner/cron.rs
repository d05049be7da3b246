//! The cron poller: enqueue each tick of every schedule exactly once,
//! however many processes share the Redis.
//!
//! No leader: every process computes the ticks from its own clock and
//! claims each due tick in Redis ([`redis::cron::claim`], one Lua script
//! that `ZADD`s the tick to the schedule's `:enqueued` set and, only if
//! that added it, pushes the job). The tick's UTC second is the claim's
//! identity, the same member sidekiq-cron writes, so wasmjobs processes
//! and Ruby processes running sidekiq-cron never both enqueue one tick.
//!
//! Which ticks a process claims ([`due`], a pure function):
//! - every tick after it started (or, for a schedule it sees later, after
//!   it first saw it), up to [`GRACE`] late: a process that stalls a few
//!   seconds still enqueues what fell due meanwhile, once;
//! - none from before: ticks that fell due while no process ran are not
//!   enqueued;
//! - unless the schedule says `catch_up = true`: then, when it starts (or
//!   first sees the schedule), a process claims the latest tick at or
//!   before now if no tick at or after it was claimed. That is one run for
//!   the whole outage, not one per missed tick: periodic jobs want the
//!   current state, and an every-second schedule down for an hour would
//!   otherwise flood its queue.
//!
//! The loop sleeps until the next due tick or the next refresh of the
//! schedule list ([`REFRESH`]), never polling in between. Schedules are
//! registered from each plugin's manifest when it loads and re-registered
//! when the reloader swaps a new version in ([`PluginSchedules`]): what a
//! version no longer declares is removed from Redis by the process that
//! loaded it, and a removed plugin's schedules go with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cron::{self, CronExpr};
use crate::metrics::Metrics;
use crate::plugin::Schedule;
use crate::redis::bounded::answered_anyhow;
use crate::redis::cron::{self as store, Claim, CronEntry, Registered};
use crate::redis::{Redis, now_f64};

/// How late a tick may be claimed, seconds (sidekiq-cron's
/// `reschedule_grace_period`).
pub(crate) const GRACE: i64 = 60;
/// How often the schedule list is re-read from Redis (schedules another
/// process or a Ruby app registered, enabled or deleted).
pub(crate) const REFRESH: Duration = Duration::from_secs(10);
/// The first pause after Redis failed, before trying again; it doubles
/// while the failure lasts, up to [`REFRESH`].
const BACKOFF: Duration = Duration::from_secs(1);
/// Most ticks of one schedule claimed in one wake-up.
const MAX_BURST: usize = 100;

/// Whether a queue is on a poller's shard.
pub(crate) type QueueFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What a plugin (re)load means for its schedules.
#[derive(Debug, Clone)]
pub(crate) enum PluginSchedules {
    /// A version of `plugin` loaded: these are its schedules now.
    Loaded {
        /// The plugin's name.
        plugin: String,
        /// What its manifest declares.
        schedules: Vec<Schedule>,
    },
    /// The plugin is gone.
    Removed {
        /// The plugin's name.
        plugin: String,
    },
}

/// A schedule this process follows.
struct Tracked {
    entry: CronEntry,
    expr: CronExpr,
    /// The next tick to consider.
    next: i64,
}

/// The poller.
pub(crate) struct CronPoller {
    /// The PostgreSQL store, when jobs live there (`--source`).
    store: Option<crate::pg::Pg>,
    /// With several shards: whether a schedule's queue is on this
    /// poller's shard (only those are registered here).
    ours: Option<QueueFilter>,
    redis: Redis,
    metrics: Arc<Metrics>,
    tracked: HashMap<String, Tracked>,
    /// Hash keys (with their `cron` text) already reported as unusable.
    warned: HashSet<(String, String)>,
    /// When the poller started (epoch seconds): the schedules of the first
    /// refresh are followed from then, so a tick that falls due while
    /// plugins register theirs is not lost, nor taken for a missed one.
    started: f64,
    /// Whether the schedule list was read once.
    refreshed: bool,
    /// Reading the schedule list fails.
    reading: Streak,
    /// Claiming fails (Redis cannot be reached).
    claiming: Streak,
    /// Schedules whose claims Redis refuses (a key of another type), by
    /// hash key: reported once, skipped until they work again.
    broken: HashSet<String>,
}

/// A failure that lasts: the loop backs off (doubling from [`BACKOFF`] up
/// to [`REFRESH`]) and logs its start and its end, not every retry.
#[derive(Debug, Default)]
struct Streak {
    backoff: Option<Duration>,
}

impl Streak {
    /// Notes a failure; returns how long to wait before trying again.
    fn failed(&mut self, what: &str, err: &anyhow::Error) -> Duration {
        let next = match self.backoff {
            None => {
                tracing::warn!("cron: {what}: {err:#}; retrying with a growing pause (said once until it works)");
                BACKOFF
            }
            Some(last) => {
                tracing::debug!("cron: {what}: {err:#}");
                (last * 2).min(REFRESH)
            }
        };
        self.backoff = Some(next);
        next
    }

    /// Notes a success.
    fn worked(&mut self, what: &str) {
        if self.backoff.take().is_some() {
            tracing::info!("cron: {what} works again");
        }
    }
}

impl CronPoller {
    pub(crate) fn new(redis: Redis, metrics: Arc<Metrics>) -> Self {
        Self {
            store: None,
            ours: None,
            redis,
            metrics,
            tracked: HashMap::new(),
            warned: HashSet::new(),
            started: now_f64(),
            refreshed: false,
            reading: Streak::default(),
            claiming: Streak::default(),
            broken: HashSet::new(),
        }
    }

    /// Enqueues into the PostgreSQL store `pg` (ticks claimed there)
    /// instead of Redis's queues.
    pub(crate) fn with_store(mut self, pg: Option<crate::pg::Pg>) -> Self {
        self.store = pg;
        self
    }

    /// Registers here only the schedules whose queue `ours` accepts: with
    /// several shards, a schedule lives on the shard of its queue (and is
    /// removed from the others), so its ticks are claimed there once.
    pub(crate) fn with_queues(mut self, ours: QueueFilter) -> Self {
        self.ours = Some(ours);
        self
    }

    /// Registers `initial` (the plugins loaded at start), then runs until
    /// `stop`, taking plugin changes from `changes`.
    pub(crate) async fn run(
        mut self,
        initial: Vec<PluginSchedules>,
        changes: &mut mpsc::UnboundedReceiver<PluginSchedules>,
        stop: CancellationToken,
    ) {
        self.started = now_f64();
        // Plugin changes Redis did not take (it was down): written again
        // after each refresh that works.
        let mut unsynced: Vec<PluginSchedules> = Vec::new();
        for change in initial {
            self.sync_or_keep(change, &mut unsynced).await;
        }
        let mut refresh_in = Duration::ZERO;
        let mut open = true;
        loop {
            let pause = if refresh_in.is_zero() {
                match self.refresh().await {
                    Ok(()) => {
                        self.reading.worked("reading the schedules");
                        refresh_in = REFRESH;
                        for change in std::mem::take(&mut unsynced) {
                            self.sync_or_keep(change, &mut unsynced).await;
                        }
                        self.claim_due().await
                    }
                    Err(err) => {
                        // Not again at once: after the pause.
                        refresh_in = self.reading.failed("cannot read the schedules", &err);
                        Some(refresh_in)
                    }
                }
            } else {
                self.claim_due().await
            };
            let until_tick = self
                .tracked
                .values()
                .map(|t| t.next)
                .min()
                .map(|next| Duration::from_secs_f64((next as f64 - now_f64()).max(0.0)) + Duration::from_millis(1));
            // After a failure, the pause holds even if a tick is due (the
            // tick is still claimed within its grace period).
            let wait = pause.unwrap_or_else(|| {
                [Some(refresh_in), until_tick]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(REFRESH)
            });
            let started = tokio::time::Instant::now();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                change = changes.recv(), if open => match change {
                    Some(change) => {
                        self.sync_or_keep(change, &mut unsynced).await;
                        refresh_in = Duration::ZERO;
                        continue;
                    }
                    // The reloader stopped: keep running on the schedules we have.
                    None => open = false,
                },
            }
            refresh_in = refresh_in.saturating_sub(started.elapsed());
        }
    }

    /// [`CronPoller::sync`]; a change Redis did not take is kept in
    /// `unsynced` (replacing an older one of the same plugin) to be
    /// written again.
    async fn sync_or_keep(&self, change: PluginSchedules, unsynced: &mut Vec<PluginSchedules>) {
        let plugin = |change: &PluginSchedules| match change {
            PluginSchedules::Loaded { plugin, .. } | PluginSchedules::Removed { plugin } => plugin.clone(),
        };
        let name = plugin(&change);
        unsynced.retain(|kept| plugin(kept) != name);
        if !self.sync(&change).await {
            unsynced.push(change);
        }
    }

    /// Writes a plugin's schedules to Redis and removes those it no longer
    /// declares; whether Redis took every write (a schedule refused for
    /// its name is not retried).
    async fn sync(&self, change: &PluginSchedules) -> bool {
        let mut conn = self.redis.conn();
        let (plugin, schedules): (&str, &[Schedule]) = match change {
            PluginSchedules::Loaded { plugin, schedules } => (plugin, schedules),
            PluginSchedules::Removed { plugin } => (plugin, &[]),
        };
        let schedules: Vec<&Schedule> = schedules
            .iter()
            .filter(|schedule| self.ours.as_ref().is_none_or(|ours| ours(&schedule.queue)))
            .collect();
        let now = now_f64();
        // Where the cluster keeps schedules: read once for all of them.
        let layout = if schedules.is_empty() {
            store::Layout::V2
        } else {
            match store::Layout::of_cluster(&mut conn).await {
                Ok(layout) => layout,
                Err(err) => {
                    tracing::error!(
                        plugin,
                        "cron: {err:#}; schedules not registered (tried again once Redis answers)"
                    );
                    return false;
                }
            }
        };
        let mut taken = true;
        for &schedule in &schedules {
            match store::register(&mut conn, layout, plugin, schedule, now).await {
                Ok(Registered::Written { moved_from: None }) => {
                    tracing::debug!(plugin, schedule = %schedule.name, cron = %schedule.cron.sidekiq_field(), "schedule registered");
                }
                Ok(Registered::Written {
                    moved_from: Some(previous),
                }) => tracing::warn!(
                    plugin,
                    schedule = %schedule.name,
                    previous = %previous,
                    "schedule now declared by this plugin (it was another plugin's)"
                ),
                Ok(Registered::Taken) => tracing::error!(
                    plugin,
                    schedule = %schedule.name,
                    "schedule not registered: a schedule of that name that wasmjobs did not write (sidekiq-cron's) exists; give ours another `name`"
                ),
                Err(err) => {
                    taken = false;
                    tracing::error!(plugin, "cron: {err:#}");
                }
            }
        }
        let keep: Vec<String> = schedules.iter().map(|s| s.name.clone()).collect();
        match store::remove_stale(&mut conn, plugin, &keep).await {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => tracing::info!(plugin, ?removed, "schedules the plugin no longer declares removed"),
            Err(err) => {
                taken = false;
                tracing::error!(
                    plugin,
                    "cron: cannot remove the schedules it no longer declares: {err:#}"
                );
            }
        }
        if !schedules.is_empty() && taken {
            tracing::info!(plugin, schedules = schedules.len(), "schedules registered");
        }
        taken
    }

    /// Re-reads the schedule list; starts following new schedules (a
    /// catch-up claim for those that ask), drops deleted ones.
    async fn refresh(&mut self) -> Result<()> {
        let listing = store::list(&mut self.redis.conn()).await?;
        let now = now_f64();
        // New schedules are followed from now; at start, from the start.
        let from = if self.refreshed { now } else { self.started };
        self.refreshed = true;
        if listing.truncated {
            self.warn_once("(list)", "", || {
                tracing::warn!(
                    "cron: more than {} schedules in Redis; only the first are run",
                    store::MAX_SCHEDULES
                )
            });
        }
        for (key, why) in &listing.invalid {
            self.warn_once(key, why, || tracing::warn!(key = %key, "cron: schedule skipped: {why}"));
        }
        let mut seen = HashSet::new();
        let mut new = Vec::new();
        for entry in listing.entries {
            seen.insert(entry.key.clone());
            if let Some(tracked) = self.tracked.get_mut(&entry.key)
                && tracked.entry.cron == entry.cron
            {
                tracked.entry = entry;
                continue;
            }
            let expr = match CronExpr::parse_sidekiq(&entry.cron) {
                Ok(expr) => expr,
                Err(err) => {
                    let (key, text) = (entry.key.clone(), entry.cron.clone());
                    self.warn_once(
                        &key,
                        &text,
                        || tracing::warn!(schedule = %entry.name, cron = %text, "cron: schedule skipped: {err:#}"),
                    );
                    self.tracked.remove(&entry.key);
                    continue;
                }
            };
            let Some(next) = expr.next_after(from.floor() as i64) else {
                continue;
            };
            if entry.catch_up && !self.tracked.contains_key(&entry.key) {
                new.push(entry.key.clone());
            }
            self.tracked.insert(entry.key.clone(), Tracked { entry, expr, next });
        }
        self.tracked.retain(|key, _| seen.contains(key));
        for key in new {
            if let Some(tracked) = self.tracked.get(&key)
                && let Some(tick) = tracked.expr.latest_at_or_before(from.floor() as i64)
            {
                let entry = tracked.entry.clone();
                match self.claim(&entry, tick, true).await {
                    Ok(Claim::Enqueued) => {
                        tracing::info!(schedule = %entry.name, tick = %cron::iso8601(tick), "cron: caught up on a missed tick")
                    }
                    Ok(_) => {}
                    Err(err) if answered_anyhow(&err) => self.refused(&entry, &err),
                    Err(err) => {
                        // Seen as new again at the next try, so the catch-up is not lost.
                        self.tracked.remove(&key);
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// Claims every due tick. Returns a pause before trying again if Redis
    /// could not be reached; a schedule whose claims Redis refuses (one of
    /// its keys is of another type) loses its tick, said once, and the
    /// others go on.
    async fn claim_due(&mut self) -> Option<Duration> {
        let now = now_f64();
        let keys: Vec<String> = self.tracked.keys().cloned().collect();
        let mut claimed = false;
        for key in keys {
            let Some(tracked) = self.tracked.get(&key) else {
                continue;
            };
            let (ticks, next) = due(&tracked.expr, tracked.next, now);
            let entry = tracked.entry.clone();
            for tick in ticks {
                match self.claim(&entry, tick, false).await {
                    Ok(Claim::Gone) => {
                        self.tracked.remove(&key);
                        break;
                    }
                    Ok(_) => {
                        claimed = true;
                        if self.broken.remove(&key) {
                            tracing::info!(schedule = %entry.name, "cron: the schedule's ticks are claimed again");
                        }
                    }
                    Err(err) if answered_anyhow(&err) => self.refused(&entry, &err),
                    Err(err) => return Some(self.claiming.failed("cannot claim a tick", &err)),
                }
                if let Some(tracked) = self.tracked.get_mut(&key) {
                    tracked.next = tracked.expr.next_after(tick).unwrap_or(i64::MAX);
                }
            }
            if let Some(tracked) = self.tracked.get_mut(&key) {
                tracked.next = tracked.next.max(next);
            }
        }
        if claimed {
            self.claiming.worked("claiming ticks");
        }
        None
    }

    /// Redis refused a claim of `entry` (a key of another type, say): said
    /// once per schedule, until one of its claims works again.
    fn refused(&mut self, entry: &CronEntry, err: &anyhow::Error) {
        if self.broken.insert(entry.key.clone()) {
            tracing::warn!(
                schedule = %entry.name,
                key = %entry.key,
                "cron: the schedule's ticks are skipped while Redis refuses its claims (said once): {err:#}"
            );
        }
    }

    /// Claims one tick; counts and logs the result.
    async fn claim(&self, entry: &CronEntry, tick: i64, catch_up: bool) -> Result<Claim> {
        if !entry.enabled {
            return Ok(Claim::Disabled);
        }
        let now = now_f64();
        let payload = entry.payload(tick, now);
        let (claim, jid) = match &self.store {
            // The job goes into the PostgreSQL store, claimed there.
            Some(pg) => match crate::pg::cron::claim(pg, &entry.key, tick, payload, catch_up).await? {
                Some(jid) => (Claim::Enqueued, jid),
                None => (Claim::Lost, String::new()),
            },
            None => {
                let jid = payload.jid().to_owned();
                let claim = store::claim(&mut self.redis.conn(), entry, tick, &payload, now, catch_up).await?;
                (claim, jid)
            }
        };
        let counters = &self.metrics.process;
        match claim {
            Claim::Enqueued => {
                counters.cron_enqueued.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    schedule = %entry.name,
                    class = %entry.class,
                    queue = %entry.queue,
                    jid = %jid,
                    tick = %cron::iso8601(tick),
                    "cron: enqueued"
                );
            }
            Claim::Lost if !catch_up => {
                counters.cron_lost.fetch_add(1, Ordering::Relaxed);
            }
            Claim::Lost | Claim::Disabled => {}
            Claim::Gone => tracing::debug!(schedule = %entry.name, "cron: schedule deleted"),
        }
        Ok(claim)
    }

    fn warn_once(&mut self, key: &str, what: &str, warn: impl FnOnce()) {
        if self.warned.insert((key.to_owned(), what.to_owned())) {
            warn();
        }
    }
}

/// The ticks of `expr` to claim now, from `next` (the first not yet
/// considered) up to `now`, skipping those more than [`GRACE`] late; and
/// the first tick to consider afterwards. At most [`MAX_BURST`] ticks.
pub(crate) fn due(expr: &CronExpr, next: i64, now: f64) -> (Vec<i64>, i64) {
    let now_secs = now.floor() as i64;
    let mut tick = next;
    if tick < now_secs - GRACE {
        // Too late for those: start from the oldest tick still in grace.
        tick = expr.next_after(now_secs - GRACE - 1).unwrap_or(i64::MAX);
    }
    let mut ticks = Vec::new();
    while tick <= now_secs && ticks.len() < MAX_BURST {
        ticks.push(tick);
        tick = expr.next_after(tick).unwrap_or(i64::MAX);
    }
    if tick <= now_secs {
        tick = expr.next_after(now_secs).unwrap_or(i64::MAX);
    }
    (ticks, tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_796_180_640; // 2026-12-02T03:04:00Z

    #[test]
    fn nothing_is_due_before_the_next_tick() {
        let minutely = CronExpr::parse("* * * * *", None).unwrap();
        assert_eq!(due(&minutely, T + 60, (T + 30) as f64), (vec![], T + 60));
    }

    #[test]
    fn a_due_tick_is_claimed_once_and_the_next_follows() {
        let minutely = CronExpr::parse("* * * * *", None).unwrap();
        assert_eq!(due(&minutely, T, T as f64 + 0.002), (vec![T], T + 60));
        let secondly = CronExpr::parse("* * * * * *", None).unwrap();
        // A process that stalled 3 s claims the 3 ticks it missed.
        assert_eq!(
            due(&secondly, T + 1, (T + 3) as f64 + 0.5),
            (vec![T + 1, T + 2, T + 3], T + 4)
        );
    }

    #[test]
    fn ticks_past_the_grace_period_are_skipped() {
        let secondly = CronExpr::parse("* * * * * *", None).unwrap();
        let (ticks, next) = due(&secondly, T, (T + 1000) as f64);
        assert_eq!(ticks.first(), Some(&(T + 1000 - GRACE)));
        assert_eq!(ticks.len(), GRACE as usize + 1);
        assert_eq!(next, T + 1001);
        let minutely = CronExpr::parse("* * * * *", None).unwrap();
        // An hour asleep: only the tick within the last minute.
        assert_eq!(due(&minutely, T, (T + 3600) as f64 + 5.0), (vec![T + 3600], T + 3660));
    }

    #[test]
    fn a_burst_is_bounded() {
        let secondly = CronExpr::parse("* * * * * *", None).unwrap();
        let (ticks, next) = due(&secondly, T - 5, (T + 200) as f64);
        assert!(ticks.len() <= MAX_BURST);
        assert!(next > T + 200);
    }
}
