//! The non-blocking fetch both modes share: one Lua call
//! ([`super::scripts::FETCH`]) takes up to *n* jobs from the queues in
//! order, moving them into the in-progress list (reliable) or popping them
//! (basic). Jobs over the payload limit are buried by the script itself
//! and never leave Redis.

use std::collections::HashSet;

use anyhow::{Context, Result};
use redis::Script;

use super::MAX_BATCH;
use super::dead::{DeadSet, oversized_buried};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::CancelMark;
use crate::runner::queues::Queues;

/// A job taken: its bytes, its queue, and the fetch script's cancel mark.
pub(super) type Taken = (Vec<u8>, String, CancelMark);

/// What a fetch does with payloads over the limit: bury them in `dead`
/// from inside Redis (0: no limit).
pub(super) struct Oversized<'a> {
    pub(super) dead: &'a DeadSet,
    pub(super) max_payload: usize,
}

/// Takes up to `max` jobs from `queues` (in this fetch's order), into
/// `held_in` when given, leaving out the queues in `paused`. A job over
/// the payload limit is buried instead, logged, and not returned. Cancel
/// requests are looked up at fetch when Ruby clients may write them
/// (`sidekiq_cancels`) or a `wasmjobs cancel` is open (the script's marks).
#[allow(clippy::too_many_arguments)]
pub(super) async fn take(
    redis: &Redis,
    script: &Script,
    queues: &Queues,
    names: &[String],
    held_in: Option<&str>,
    paused: &HashSet<String>,
    oversized: &Oversized<'_>,
    sidekiq_cancels: bool,
    max: usize,
) -> Result<Vec<Taken>> {
    let mut order = queues.fetch_order();
    if !paused.is_empty() {
        order.retain(|&i| !paused.contains(&names[i]));
        if order.is_empty() {
            return Ok(Vec::new());
        }
    }
    let mut invocation = script.prepare_invoke();
    // Basic mode names no list; the script ignores KEYS[1] then.
    invocation.key(held_in.unwrap_or("wasmjobs:unused"));
    invocation.key(keys::CANCELS_OPEN);
    for &i in &order {
        invocation.key(keys::queue(&names[i]));
    }
    invocation
        .arg(max.min(MAX_BATCH))
        .arg(if held_in.is_some() { "1" } else { "0" })
        .arg(if sidekiq_cancels { "1" } else { "0" });
    if oversized.max_payload > 0 {
        invocation.key(keys::DEAD);
        oversized
            .dead
            .cap_args(&mut invocation, oversized.max_payload, now_f64());
    }
    let flat: Vec<Vec<u8>> = invocation
        .invoke_async(&mut redis.conn())
        .await
        .context("fetching jobs")?;
    let mut jobs = Vec::with_capacity(flat.len() / 3);
    let mut flat = flat.into_iter();
    while let (Some(position), Some(raw), Some(mark)) = (flat.next(), flat.next(), flat.next()) {
        let queue = std::str::from_utf8(&position)
            .ok()
            .and_then(|p| p.parse::<usize>().ok())
            .and_then(|p| order.get(p))
            .and_then(|&i| names.get(i))
            .context("the fetch script returned a bad queue index")?;
        if raw.is_empty() && oversized_buried(queue, &mark) {
            continue;
        }
        let mark = CancelMark::from_script(&raw, &mark);
        jobs.push((raw, queue.to_owned(), mark));
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::Target;
    use crate::runner::source::dead::DeadCaps;

    /// Issue 33: the fetch looks cancel requests up only when one could
    /// exist that the process would not hear of (`--sidekiq-cancels`, or
    /// an open `wasmjobs cancel`); otherwise each job's mark is `n` and
    /// the script does no work per job for cancels. Run on a real Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancel_requests_are_looked_up_only_when_one_may_be_unheard() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let mut conn = redis.conn();
        let script = Script::new(super::super::scripts::FETCH);
        let queues: Queues = "default".parse().expect("queues");
        let names = queues.names();
        let dead = DeadSet::new(DeadCaps::default());
        let oversized = Oversized {
            dead: &dead,
            max_payload: 0,
        };
        let paused = HashSet::new();
        let job = r#"{"class":"A","args":[],"jid":"abc","queue":"default"}"#;
        let _: () = redis::cmd("SET")
            .arg(keys::cancel_request("abc"))
            .arg("1")
            .query_async(&mut conn)
            .await
            .expect("SET");
        let asked = CancelMark::Checked {
            jid: "abc".into(),
            request: Some(crate::runner::fetched::CancelFound::Key("1".into())),
        };
        let now = now_f64();
        // (open requests, --sidekiq-cancels, the mark the job gets)
        let open_later = vec![(now + 60.0, "zzz")];
        let expired = vec![(now - 1.0, "zzz")];
        type Open<'a> = &'a [(f64, &'a str)];
        let both = vec![(now - 1.0, "yyy"), (now + 60.0, "zzz")];
        let cases: [(Open<'_>, bool, CancelMark); 5] = [
            (&[], false, CancelMark::Unneeded),
            (expired.as_slice(), false, CancelMark::Unneeded),
            (open_later.as_slice(), false, asked.clone()),
            (both.as_slice(), false, asked.clone()),
            (&[], true, asked.clone()),
        ];
        for (open, sidekiq_cancels, mark) in cases {
            let _: () = redis::pipe()
                .del(keys::CANCELS_OPEN)
                .rpush(keys::queue("default"), job)
                .query_async(&mut conn)
                .await
                .expect("setup");
            for (score, jid) in open {
                let _: () = redis::cmd("ZADD")
                    .arg(keys::CANCELS_OPEN)
                    .arg(score)
                    .arg(jid)
                    .query_async(&mut conn)
                    .await
                    .expect("ZADD");
            }
            let taken = take(
                &redis,
                &script,
                &queues,
                &names,
                None,
                &paused,
                &oversized,
                sidekiq_cancels,
                10,
            )
            .await
            .expect("take");
            assert_eq!(taken.len(), 1);
            assert_eq!(taken[0].2, mark, "open {open:?}, --sidekiq-cancels {sidekiq_cancels}");
            // An expired request is dropped by the fetch that finds it,
            // so the next ones answer with one ZCARD of an empty set.
            let left: Vec<String> = redis::cmd("ZRANGE")
                .arg(keys::CANCELS_OPEN)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .expect("ZRANGE");
            let unexpired = open.iter().filter(|(score, _)| *score > now).count();
            assert_eq!(left.len(), unexpired, "open {open:?}: {left:?}");
        }
        // Someone else's key of another type there: looked up, to be safe.
        let _: () = redis::pipe()
            .set(keys::CANCELS_OPEN, "junk")
            .rpush(keys::queue("default"), job)
            .query_async(&mut conn)
            .await
            .expect("setup");
        let taken = take(&redis, &script, &queues, &names, None, &paused, &oversized, false, 10)
            .await
            .expect("take");
        assert_eq!(taken[0].2, asked);
    }
}
