//! `wasmjobs enqueue`: push jobs from the shell, in Sidekiq's format.
//!
//! For scripts, demos and load tests: the jobs are exactly what
//! `Sidekiq::Client.push` would write, so wasmjobs or Sidekiq workers can
//! take them. `--count` pushes many copies (distinct jids) in bulk, fast
//! enough to fill a queue with a million jobs in a few seconds.
//!
//! `--unique-for SECS` makes the job unique (Sidekiq Enterprise's
//! `unique_for`, `docs/unique-jobs.md`): it is pushed with its lock in one
//! atomic step, or refused when a job with the same class, queue and args
//! (or `--unique-key`) holds the lock; the refusal names that job and how
//! long the lock still lives, on stderr, with exit status
//! [`EXIT_DUPLICATE`].
//!
//! A job pushed where nothing fetches its queue looks lost, so after the
//! push the command reads the live processes and says so on stderr when no
//! process that is not quiet listens on the queue (typically: the embedded
//! Redis of a data directory no `wasmjobs run` uses).
//!
//! Before the push it reads them too: when every live process that would
//! serve the queue reads another store (runners on `--source`, which say
//! so in their heartbeats), a job pushed into Redis would wait there
//! unread, so the command refuses and names the store and `--source`
//! (`--to-redis` pushes anyway; [`crate::redis::stranded`]).
//!
//! With shards (`--shard`, `--route`), the jobs go to the shard holding
//! `--queue`, and the output names it.
//!
//! With `--source postgres://…` the jobs go into the PostgreSQL store
//! instead, through `wasmjobs.enqueue` (the SQL function applications
//! call), 1,000 per transaction; `--unique-key` is then unique while the
//! job lives (`docs/postgres.md`).

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use serde_json::Value;

use super::{Cli, RedisArgs};
use crate::job::validate_args;
use crate::redis::api::{self, ProcessInfo};
use crate::redis::payload::Payload;
use crate::redis::shards::ShardMap;
use crate::redis::stranded::serves;
use crate::redis::unique::{Pushed, UniqueUntil};
use crate::redis::{Target, client, now_f64};

/// Payloads built and pushed per batch, so `--count` needs little memory.
const BATCH: u64 = 10 * client::CHUNK as u64;
/// Exit status of an enqueue refused as a duplicate of a unique job.
pub const EXIT_DUPLICATE: u8 = 3;
/// The last second of year 9999: RFC 3339 has four-digit years.
const LATEST: f64 = 253_402_300_799.0;

/// Arguments of `wasmjobs enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Enqueue into the PostgreSQL job store at URL instead of Redis.
    #[arg(long = "source", env = "WASMJOBS_SOURCE", hide_env_values = true, value_name = "URL")]
    pub jobs_source: Option<String>,
    /// The queue to push to.
    #[arg(long, short, default_value = crate::job::DEFAULT_QUEUE)]
    pub queue: String,
    /// Run the job this many seconds from now (scheduled).
    #[arg(long = "in", value_name = "SECS", conflicts_with = "at", value_parser = parse_delay)]
    pub in_secs: Option<f64>,
    /// Run the job at this time: RFC 3339 in UTC (`2026-11-30T12:00:00Z`)
    /// or epoch seconds. A time in the past enqueues now.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub at: Option<f64>,
    /// How many copies to push (each with its own jid).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Sidekiq's retry option: `true` (default retries), `false` (never
    /// retry), or the most retries.
    #[arg(long, value_name = "true|false|N", value_parser = parse_retry)]
    pub retry: Option<Value>,
    /// Make the job unique for SECS seconds (Sidekiq Enterprise's
    /// `unique_for`): not pushed while a job with the same class, queue and
    /// args (or --unique-key) is queued, scheduled, retrying or running,
    /// for at most SECS (after its run time, when scheduled). A refused
    /// duplicate exits with status 3.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=wasmjobs_client::job::MAX_UNIQUE_FOR.as_secs()))]
    pub unique_for: Option<u64>,
    /// Unique on KEY instead of class, queue and args (needs --unique-for;
    /// with --source, the job holds KEY while it lives).
    #[arg(long, value_name = "KEY")]
    pub unique_key: Option<String>,
    /// When the unique lock is released: `success` (the default: when the
    /// job succeeds, is discarded, dies or is dropped) or `start`.
    #[arg(long, value_name = "start|success", requires = "unique_for")]
    pub unique_until: Option<UniqueUntil>,
    /// Push into Redis even when every live runner serving the queue reads
    /// another store (a PostgreSQL `--source`), where the job would wait
    /// unread until a runner on Redis serves its queue.
    #[arg(long, conflicts_with = "jobs_source")]
    pub to_redis: bool,
    /// The job class.
    pub class: String,
    /// The job's arguments, a JSON array.
    #[arg(default_value = "[]")]
    pub args: String,
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &EnqueueArgs) -> Result<ExitCode> {
    if args.class.trim().is_empty() {
        bail!("the job class must not be empty");
    }
    if args.queue.trim().is_empty() {
        bail!("--queue must not be empty");
    }
    validate_args(&args.args)?;
    let job_args: Vec<Value> = serde_json::from_str(&args.args).context("job args are not a JSON array")?;
    let now = now_f64();
    let at = args.at.or(args.in_secs.map(|secs| now + secs)).filter(|at| *at > now);

    if (args.unique_for.is_some() || args.unique_key.is_some()) && args.count > 1 {
        bail!("--count cannot be used with a unique job: only one of the copies could go in");
    }
    if let Some(url) = &args.jobs_source {
        return postgres(args, url, &job_args, at, now).await;
    }
    if args.unique_key.is_some() && args.unique_for.is_none() {
        bail!("--unique-key needs --unique-for SECS (on Redis a unique lock has a lifetime)");
    }

    // The queue's shard (the only one without --shard).
    let map = args.redis.shard_map(&cli.data_dir)?;
    let (_, shard, target) = map.for_queue(&args.queue);
    let redis = match map.is_sharded() {
        true => crate::redis::connect(target)
            .await
            .with_context(|| format!("shard {shard}, which holds queue {}", args.queue))?,
        false => crate::redis::connect(target).await?,
    };
    let mut conn = redis.conn();
    // Best effort: without them the jobs are pushed as before.
    let processes = match api::processes(&mut conn).await {
        Ok(processes) => Some(processes),
        Err(err) => {
            tracing::debug!("cannot read the live processes: {err:#}");
            None
        }
    };
    if !args.to_redis
        && let Some(why) = processes
            .as_deref()
            .and_then(|live| crate::redis::stranded::refusal(&args.queue, live))
    {
        redis.close().await?;
        bail!("{why}");
    }
    if let Some(secs) = args.unique_for {
        let mut job = wasmjobs_client::Job::new(&args.class)
            .args(Value::Array(job_args))
            .queue(&args.queue)
            .unique_for(Duration::from_secs(secs))
            .unique_until(args.unique_until.unwrap_or_default());
        if let Some(key) = &args.unique_key {
            job = job.unique_key(key);
        }
        if let Some(retry) = &args.retry {
            job = job.retry(retry.clone());
        }
        if let Some(at) = at {
            job = job.at(UNIX_EPOCH + Duration::from_secs_f64(at));
        }
        let pushed = wasmjobs_client::Client::from_connection(conn.clone()).push(&job).await;
        let pushed = match pushed {
            Ok(pushed) => pushed,
            Err(err) => {
                redis.close().await?;
                return Err(err);
            }
        };
        if let Pushed::Duplicate { jid, ttl } = &pushed {
            redis.close().await?;
            eprintln!("{}", duplicate(&args.class, &args.queue, jid, *ttl));
            return Ok(ExitCode::from(EXIT_DUPLICATE));
        }
        return finish(&map, args, redis, processes.as_deref(), at, now, pushed.jid()).await;
    }
    let mut pushed = 0;
    let mut last_jid = String::new();
    while pushed < args.count {
        let batch = BATCH.min(args.count - pushed);
        let mut payloads: Vec<Payload> = (0..batch)
            .map(|_| {
                let mut payload = Payload::new(&args.class, job_args.clone(), &args.queue, now);
                if let Some(retry) = &args.retry {
                    payload.set("retry", retry.clone());
                }
                payload
            })
            .collect();
        match at {
            Some(at) => client::schedule_bulk(&mut conn, &mut payloads, at).await?,
            None => client::push_bulk(&mut conn, &mut payloads).await?,
        }
        pushed += batch;
        if let Some(payload) = payloads.last() {
            last_jid = payload.jid().to_owned();
        }
    }
    finish(&map, args, redis, processes.as_deref(), at, now, &last_jid).await
}

/// After the push: warns if nothing fetches the queue, and says what was pushed.
async fn finish(
    map: &ShardMap,
    args: &EnqueueArgs,
    redis: crate::redis::Redis,
    processes: Option<&[ProcessInfo]>,
    at: Option<f64>,
    now: f64,
    last_jid: &str,
) -> Result<ExitCode> {
    // The processes read before the push, when they could be.
    let warning = processes.and_then(|processes| nobody_fetches(map.for_queue(&args.queue).2, &args.queue, processes));
    redis.close().await?;
    match map.is_sharded() {
        true => println!(
            "{} on shard {}",
            summary(args, at, now, last_jid),
            map.for_queue(&args.queue).1
        ),
        false => println!("{}", summary(args, at, now, last_jid)),
    }
    if let Some(warning) = warning {
        eprintln!("{warning}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Jobs per transaction when enqueueing into PostgreSQL.
const PG_BATCH: u64 = 1_000;

/// `enqueue --source URL`: through `wasmjobs.enqueue`, as an application does.
async fn postgres(args: &EnqueueArgs, url: &str, job_args: &[Value], at: Option<f64>, now: f64) -> Result<ExitCode> {
    if args.unique_for.is_some() {
        bail!(
            "--unique-for: on PostgreSQL a job holds its --unique-key while it is queued, scheduled, retrying or running, with no lifetime: give --unique-key KEY alone"
        );
    }
    if args.unique_until.is_some() {
        bail!(
            "--unique-until: on PostgreSQL the key is released when the job leaves the store (succeeds, dies or is cancelled)"
        );
    }
    let pg = crate::pg::Pg::connect(url).await?;
    let mut job = wasmjobs_client::Job::new(&args.class)
        .args(Value::Array(job_args.to_vec()))
        .queue(&args.queue);
    if let Some(retry) = &args.retry {
        job = job.retry(retry.clone());
    }
    if let Some(at) = at {
        job = job.at(UNIX_EPOCH + Duration::from_secs_f64(at));
    }
    if let Some(key) = &args.unique_key {
        job = job.unique_key(key);
    }
    let mut client = pg.client().await?;
    let mut pushed = 0;
    let mut last_jid = String::new();
    while pushed < args.count {
        let batch = PG_BATCH.min(args.count - pushed);
        let tx = client.transaction().await.context("starting a transaction")?;
        // One statement for the batch: wasmjobs.enqueue over arrays.
        let jobs = vec![job.clone(); batch as usize];
        for jid in wasmjobs_client::pg::push_bulk(&*tx, &jobs).await? {
            match jid {
                Some(jid) => last_jid = jid,
                None => {
                    let key = args.unique_key.as_deref().unwrap_or_default();
                    eprintln!(
                        "not enqueued: a {} job holding the unique key {key:?} is already queued, scheduled, retrying or running",
                        args.class
                    );
                    return Ok(ExitCode::from(EXIT_DUPLICATE));
                }
            }
        }
        tx.commit().await.context("committing the enqueued jobs")?;
        pushed += batch;
    }
    println!("{}", summary(args, at, now, &last_jid));
    Ok(ExitCode::SUCCESS)
}

/// `enqueued job X on queue q (jid …)`, or `scheduled …`.
fn summary(args: &EnqueueArgs, at: Option<f64>, now: f64, last_jid: &str) -> String {
    let jobs = if args.count == 1 {
        "job".to_owned()
    } else {
        format!("{} jobs", args.count)
    };
    let mut line = match at {
        Some(at) => format!(
            "scheduled {jobs} {} on queue {} for {} (in {})",
            args.class,
            args.queue,
            rfc3339(at),
            humantime::format_duration(Duration::from_secs((at - now).round() as u64))
        ),
        None => format!("enqueued {jobs} {} on queue {}", args.class, args.queue),
    };
    if args.count == 1 {
        line.push_str(&format!(" (jid {last_jid})"));
    }
    line
}

/// The message for an enqueue refused as a duplicate.
fn duplicate(class: &str, queue: &str, jid: &str, ttl: Option<Duration>) -> String {
    let ttl = match ttl {
        Some(ttl) => format!(
            "for at most {} more",
            humantime::format_duration(Duration::from_secs(ttl.as_millis().div_ceil(1000) as u64))
        ),
        None => "with no expiry".to_owned(),
    };
    format!(
        "not enqueued: a unique {class} job on queue {queue} is already queued, scheduled, retrying or running (jid {jid}); it holds the unique lock {ttl}"
    )
}

/// Whether live process `p` takes jobs from `queue` (not quiet, and
/// `queue` among its queues, weighted `name:N` or not).
fn fetches(p: &ProcessInfo, queue: &str) -> bool {
    !p.quiet && serves(p, queue)
}

/// The warning for jobs pushed on `queue` where none of the live
/// `processes` fetches them (`None` when one does): no process at all,
/// only quiet ones on that queue (which say so), or processes that fetch
/// other queues (named, with theirs).
fn nobody_fetches(target: &Target, queue: &str, processes: &[ProcessInfo]) -> Option<String> {
    if processes.iter().any(|p| fetches(p, queue)) {
        return None;
    }
    let quiet: Vec<&str> = processes
        .iter()
        .filter(|p| p.quiet && serves(p, queue))
        .map(|p| p.identity.as_str())
        .collect();
    if !quiet.is_empty() {
        return Some(format!(
            "warning: the processes fetching queue \"{queue}\" are quiet (stopping: {}): the job waits until a process that is not quiet fetches it",
            quiet.join(", ")
        ));
    }
    if !processes.is_empty() {
        let others: Vec<String> = processes
            .iter()
            .map(|p| format!("{} ({})", p.identity, p.queues.join(", ")))
            .collect();
        return Some(format!(
            "warning: no live process fetches queue \"{queue}\"; the live ones fetch other queues: {}. The job waits until a process fetching \"{queue}\" starts (`wasmjobs run -q {queue} --plugins DIR`)",
            others.join("; ")
        ));
    }
    Some(match target {
        Target::Embedded(data_dir) => format!(
            "warning: no `wasmjobs run` is using the Redis of {} yet: the job waits in queue \"{queue}\" until one starts there (`wasmjobs run --plugins DIR` in this project)",
            data_dir.display()
        ),
        Target::Url(_) => format!(
            "warning: no live process fetches queue \"{queue}\" on this Redis: the job waits until one does (`wasmjobs stats` lists the processes and their queues)"
        ),
    })
}

/// `at` (epoch seconds, checked to be in range) as RFC 3339.
fn rfc3339(at: f64) -> String {
    match Duration::try_from_secs_f64(at)
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
    {
        Some(time) => humantime::format_rfc3339_seconds(time).to_string(),
        None => format!("{at} (epoch seconds)"),
    }
}

/// `--in`: a non-negative number of seconds.
fn parse_delay(text: &str) -> Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(secs) if (0.0..1e10).contains(&secs) => Ok(secs),
        _ => Err(anyhow!("expected a number of seconds, like 60 or 1.5")),
    }
}

/// `--at`: epoch seconds, or RFC 3339 (UTC) as `humantime` reads it.
fn parse_time(text: &str) -> Result<f64> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if (0.0..=LATEST).contains(&secs) {
            return Ok(secs);
        }
        bail!("epoch seconds must be between 0 and {LATEST}");
    }
    let time = humantime::parse_rfc3339_weak(text)
        .map_err(|e| anyhow!("expected RFC 3339 in UTC (2026-11-30T12:00:00Z) or epoch seconds ({e})"))?;
    let since = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| anyhow!("the time is before 1970"))?;
    Ok(since.as_secs_f64())
}

/// `--retry`: `true`, `false` or a count, as Sidekiq's `retry` option.
fn parse_retry(text: &str) -> Result<Value> {
    match text.trim() {
        "true" => Ok(Value::Bool(true)),
        "false" => Ok(Value::Bool(false)),
        n => n
            .parse::<u64>()
            .map(Value::from)
            .map_err(|_| anyhow!("expected true, false or a number of retries")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_both_forms() {
        assert_eq!(parse_time("1764504000").expect("epoch"), 1_764_504_000.0);
        assert_eq!(parse_time("2025-11-30T12:00:00Z").expect("rfc3339"), 1_764_504_000.0);
        assert_eq!(parse_time("2025-11-30 12:00:00.5").expect("weak"), 1_764_504_000.5);
        assert!(parse_time("tomorrow").is_err());
        assert!(parse_delay("-1").is_err());
        assert_eq!(parse_delay("1.5").expect("delay"), 1.5);
    }

    #[test]
    fn a_queue_is_fetched_only_by_a_live_process_listening_on_it() {
        let process = |queues: &[&str], quiet: bool| ProcessInfo {
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            quiet,
            ..ProcessInfo::default()
        };
        assert!(fetches(&process(&["default"], false), "default"));
        assert!(fetches(&process(&["critical:3", "default:1"], false), "default"));
        assert!(
            !fetches(&process(&["default"], true), "default"),
            "a quiet process fetches nothing"
        );
        assert!(!fetches(&process(&["mail"], false), "default"));
        assert!(!fetches(&process(&["default:x"], false), "default"));
        let target = Target::Embedded("/srv/.wasmjobs".into());
        let warning = nobody_fetches(&target, "default", &[]).unwrap();
        assert!(
            warning.contains("no `wasmjobs run` is using the Redis of /srv/.wasmjobs"),
            "{warning}"
        );
        assert_eq!(
            nobody_fetches(&target, "default", &[process(&["default"], false)]),
            None
        );
        let named = |queues: &[&str], quiet: bool| ProcessInfo {
            identity: "host:1:abc".into(),
            ..process(queues, quiet)
        };
        // A quiet runner is not "no runner"; one on other queues is named.
        let quiet = nobody_fetches(&target, "default", &[named(&["default"], true)]).unwrap();
        assert!(quiet.contains("are quiet") && quiet.contains("host:1:abc"), "{quiet}");
        let other = nobody_fetches(&target, "default", &[named(&["mail", "wasm:2"], false)]).unwrap();
        assert!(
            other.contains("host:1:abc (mail, wasm:2)") && other.contains("-q default"),
            "{other}"
        );
    }

    #[test]
    fn a_duplicate_names_the_holder_and_the_time_left() {
        let text = duplicate("Mailer", "mail", "abc", Some(Duration::from_millis(59_001)));
        assert!(text.contains("not enqueued"), "{text}");
        assert!(text.contains("(jid abc)"), "{text}");
        assert!(text.contains("for at most 1m more"), "{text}");
        assert!(duplicate("M", "q", "j", None).contains("with no expiry"));
    }

    #[test]
    fn retry_takes_sidekiqs_values() {
        assert_eq!(parse_retry("true").expect("true"), Value::Bool(true));
        assert_eq!(parse_retry("false").expect("false"), Value::Bool(false));
        assert_eq!(parse_retry("3").expect("3"), Value::from(3));
        assert!(parse_retry("maybe").is_err());
    }
}
