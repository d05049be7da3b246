//! Jobs in Redis that no runner reads.
//!
//! A wasmjobs runner on the PostgreSQL store (`run --source URL`) keeps
//! its heartbeat in Redis like any process, and says there which store it
//! reads: `"store"` in its `info` (`"redis"`, or the store's location with
//! no password). A job pushed into Redis the usual way (`wasmjobs enqueue`
//! without `--source`, Sidekiq's `Client.push`, ActiveJob's
//! `perform_later`) while every live process that would serve its queue
//! reads another store waits there forever. [`stranded`] finds such
//! queues, for `wasmjobs stats` and the dashboard to flag, and `wasmjobs
//! enqueue` refuses to push into one. Sidekiq's own processes say nothing
//! of a store: they read Redis.

use std::collections::BTreeSet;

use serde::Serialize;

use super::api::{ProcessInfo, QueueStats};

/// A Redis queue holding jobs that no live process reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Stranded {
    /// The queue's name.
    pub queue: String,
    /// Jobs waiting in it.
    pub size: u64,
    /// The stores the live processes read instead (their locations).
    pub read_from: Vec<String>,
}

/// Whether `process` reads its jobs from Redis (every Sidekiq process
/// does; a wasmjobs runner says otherwise when it does not).
pub(crate) fn reads_redis(process: &ProcessInfo) -> bool {
    process.store.is_none()
}

/// Whether `queue` is among `process`'s queues (`NAME` or `NAME:WEIGHT`),
/// quiet or not.
pub(crate) fn serves(process: &ProcessInfo, queue: &str) -> bool {
    process.queues.iter().any(|q| {
        q == queue
            || q.rsplit_once(':')
                .is_some_and(|(name, weight)| name == queue && weight.parse::<u32>().is_ok())
    })
}

/// The queues among `queues` with jobs that no live process reads from
/// Redis while some live process reads another store: the fleet has
/// moved, and these jobs were pushed where it no longer looks. With no
/// live process at all, or none reading elsewhere, nothing is flagged
/// here (a queue nobody serves is flagged as such already).
pub(crate) fn stranded(queues: &[QueueStats], processes: &[ProcessInfo]) -> Vec<Stranded> {
    let elsewhere: BTreeSet<&str> = processes.iter().filter_map(|p| p.store.as_deref()).collect();
    if elsewhere.is_empty() {
        return Vec::new();
    }
    queues
        .iter()
        .filter(|q| q.size > 0 && q.unreadable.is_none())
        .filter(|q| !processes.iter().any(|p| reads_redis(p) && serves(p, &q.name)))
        .map(|q| Stranded {
            queue: q.name.clone(),
            size: q.size,
            read_from: elsewhere.iter().map(|s| (*s).to_owned()).collect(),
        })
        .collect()
}

/// Why a job pushed into Redis's `queue` now would be stranded, if it
/// would: for `wasmjobs enqueue` to refuse.
pub(crate) fn refusal(queue: &str, processes: &[ProcessInfo]) -> Option<String> {
    let one = QueueStats {
        name: queue.to_owned(),
        size: 1,
        latency_secs: 0.0,
        paused: false,
        unreadable: None,
    };
    let stranded = stranded(std::slice::from_ref(&one), processes).pop()?;
    Some(format!(
        "no live process reads queue \"{queue}\" from Redis: the live runners read {}, so the job would wait here unread. \
         Enqueue into that store with --source URL (or WASMJOBS_SOURCE), or pass --to-redis to push it into Redis anyway",
        stranded.read_from.join(", ")
    ))
}

/// The jobs waiting in Redis in each of `queues` that holds some (a key
/// of another type counts as empty), in one round trip: what a runner on
/// another store warns of when it starts.
pub(crate) async fn waiting<C>(conn: &mut C, queues: &[String]) -> anyhow::Result<Vec<(String, u64)>>
where
    C: redis::aio::ConnectionLike + Send,
{
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for queue in queues {
        pipe.llen(super::keys::queue(queue));
    }
    let sizes: Vec<redis::Value> = pipe.query_async(conn).await?;
    Ok(queues
        .iter()
        .zip(sizes)
        .filter_map(|(queue, size)| match size {
            redis::Value::Int(n) if n > 0 => Some((queue.clone(), n.unsigned_abs())),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(queues: &[&str], store: Option<&str>) -> ProcessInfo {
        ProcessInfo {
            identity: format!("host:{}", queues.join("+")),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            store: store.map(str::to_owned),
            ..ProcessInfo::default()
        }
    }

    fn queue(name: &str, size: u64) -> QueueStats {
        QueueStats {
            name: name.to_owned(),
            size,
            latency_secs: 0.0,
            paused: false,
            unreadable: None,
        }
    }

    const PG: &str = "postgres://db:5432/app";

    #[test]
    fn a_queue_only_runners_on_another_store_serve_is_stranded() {
        let queues = [queue("default", 5), queue("mail", 0), queue("low", 3)];
        let fleet = [process(&["default", "mail"], Some(PG))];
        let found = stranded(&queues, &fleet);
        assert_eq!(
            found,
            [
                Stranded {
                    queue: "default".into(),
                    size: 5,
                    read_from: vec![PG.into()],
                },
                Stranded {
                    queue: "low".into(),
                    size: 3,
                    read_from: vec![PG.into()],
                },
            ],
            "an empty queue is not flagged; one nobody serves is, the fleet reads elsewhere"
        );
    }

    #[test]
    fn a_redis_reader_of_the_queue_keeps_it_served() {
        let queues = [queue("default", 5), queue("mail", 2)];
        // A Sidekiq process (no store said) on `default:2`, a runner on PostgreSQL.
        let fleet = [process(&["default:2"], None), process(&["default", "mail"], Some(PG))];
        let found = stranded(&queues, &fleet);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].queue, "mail");
    }

    #[test]
    fn nothing_is_flagged_without_a_runner_on_another_store() {
        assert!(stranded(&[queue("default", 5)], &[]).is_empty(), "no process at all");
        assert!(stranded(&[queue("default", 5)], &[process(&["mail"], None)]).is_empty());
    }

    #[test]
    fn enqueue_is_refused_only_where_the_job_would_be_stranded() {
        let fleet = [process(&["default"], Some(PG))];
        let why = refusal("default", &fleet).expect("refused");
        assert!(
            why.contains(PG) && why.contains("--source") && why.contains("--to-redis"),
            "{why}"
        );
        assert!(refusal("default", &[]).is_none());
        assert!(refusal("default", &[process(&["default"], None), fleet[0].clone()]).is_none());
    }
}
