//! The non-blocking fetch both modes share: one Lua call
//! ([`super::scripts::FETCH`]) takes up to *n* jobs from the queues in
//! order, moving them into the in-progress list (reliable) or popping them
//! (basic). Jobs over the payload limit are buried by the script itself
//! and never leave Redis.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use redis::{Script, Value};

use super::MAX_BATCH;
use super::dead::{DeadSet, oversized_buried};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::CancelMark;
use crate::runner::queues::Queues;

/// A job taken: its bytes, its queue, and the fetch script's cancel mark.
pub(super) type Taken = (Vec<u8>, Arc<str>, CancelMark);

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
    names: &[Arc<str>],
    held_in: Option<&str>,
    paused: &HashSet<String>,
    oversized: &Oversized<'_>,
    sidekiq_cancels: bool,
    max: usize,
) -> Result<Vec<Taken>> {
    let mut order = queues.fetch_order();
    if !paused.is_empty() {
        order.retain(|&i| !paused.contains(&*names[i]));
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
    let reply: Value = invocation
        .invoke_async(&mut redis.conn())
        .await
        .context("fetching jobs")?;
    let entries = read_reply(reply)?;
    let mut jobs = Vec::with_capacity(entries.len());
    for Entry { position, raw, mark } in entries {
        let queue = order
            .get(position)
            .and_then(|&i| names.get(i))
            .context("the fetch script returned a bad queue position")?;
        let mark = match mark {
            None => CancelMark::Unneeded,
            Some(mark) if raw.is_empty() && oversized_buried(queue, &mark) => continue,
            Some(mark) => CancelMark::from_script(&raw, &mark),
        };
        jobs.push((raw, queue.clone(), mark));
    }
    Ok(jobs)
}

/// One job of the fetch script's reply: the position of its queue among
/// the queues fetched, its bytes, and its mark (none: `n`, no cancel to
/// look for).
#[derive(Debug, PartialEq)]
struct Entry {
    position: usize,
    raw: Vec<u8>,
    mark: Option<Vec<u8>>,
}

/// Reads the fetch script's reply, `[runs, marks, job, …]`
/// ([`super::scripts::FETCH`]): `runs` are pairs (queue position, how
/// many jobs in a row), `marks` is `0` or one mark per job. Anything else
/// is an error: a reply that does not add up is never half read.
fn read_reply(reply: Value) -> Result<Vec<Entry>> {
    let Value::Array(items) = reply else {
        bail!("the fetch script's reply is not a list: {reply:?}");
    };
    let mut items = items.into_iter();
    let (Some(Value::Array(runs)), Some(marks)) = (items.next(), items.next()) else {
        bail!("the fetch script's reply does not start with its runs and marks");
    };
    let mut marks = match marks {
        Value::Int(0) => None,
        Value::Array(marks) if marks.len() == items.len() => Some(marks.into_iter()),
        other => bail!("the fetch script's marks are not 0 or one per job: {other:?}"),
    };
    let mut entries = Vec::with_capacity(items.len());
    for run in runs.chunks(2) {
        let &[Value::Int(position), Value::Int(count)] = run else {
            bail!("the fetch script's runs are not pairs of numbers: {runs:?}");
        };
        let position = usize::try_from(position).context("a negative queue position")?;
        for _ in 0..count {
            let Some(Value::BulkString(raw)) = items.next() else {
                bail!("the fetch script's reply has fewer jobs than its runs say");
            };
            let mark = match marks.as_mut().map(Iterator::next) {
                None => None,
                Some(Some(Value::BulkString(mark))) => Some(mark),
                Some(other) => bail!("the fetch script's mark is not text: {other:?}"),
            };
            entries.push(Entry { position, raw, mark });
        }
    }
    if items.next().is_some() {
        bail!("the fetch script's reply has more jobs than its runs say");
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::Target;
    use crate::runner::source::dead::DeadCaps;

    /// An embedded Redis and what `take` needs to fetch from `queues`
    /// with a payload limit of `max_payload`.
    struct Fixture {
        _data: tempfile::TempDir,
        redis: Redis,
        script: Script,
        queues: Queues,
        names: Vec<Arc<str>>,
        dead: DeadSet,
        max_payload: usize,
    }

    impl Fixture {
        /// Takes up to 10 jobs, into `held_in` when given, none paused.
        async fn take(&self, held_in: Option<&str>, sidekiq_cancels: bool) -> Vec<Taken> {
            let oversized = Oversized {
                dead: &self.dead,
                max_payload: self.max_payload,
            };
            take(
                &self.redis,
                &self.script,
                &self.queues,
                &self.names,
                held_in,
                &HashSet::new(),
                &oversized,
                sidekiq_cancels,
                10,
            )
            .await
            .expect("take")
        }
    }

    async fn fixture(queues: &str, max_payload: usize) -> Fixture {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let queues: Queues = queues.parse().expect("queues");
        Fixture {
            _data: data,
            redis,
            script: Script::new(super::super::scripts::FETCH),
            names: queues.shared_names(),
            queues,
            dead: DeadSet::new(DeadCaps::default()),
            max_payload,
        }
    }

    /// The reply's runs: (queue position, count) pairs, flat.
    fn runs(pairs: &[i64]) -> Value {
        Value::Array(pairs.iter().map(|&n| Value::Int(n)).collect())
    }

    fn text(bytes: &str) -> Value {
        Value::BulkString(bytes.as_bytes().to_vec())
    }

    fn entry(position: usize, raw: &str, mark: Option<&str>) -> Entry {
        Entry {
            position,
            raw: raw.into(),
            mark: mark.map(Into::into),
        }
    }

    /// The reply carries each queue once per run and each mark once per
    /// fetch when there are none; read back, every job has its queue
    /// position and its mark.
    #[test]
    fn the_reply_is_read_back_into_one_entry_a_job() {
        let reply = Value::Array(vec![runs(&[]), Value::Int(0)]);
        assert_eq!(read_reply(reply).expect("empty"), []);
        let reply = Value::Array(vec![
            runs(&[0, 2, 2, 1]),
            Value::Int(0),
            text("a"),
            text("b"),
            text("c"),
        ]);
        assert_eq!(
            read_reply(reply).expect("no marks"),
            [entry(0, "a", None), entry(0, "b", None), entry(2, "c", None)]
        );
        let marks = Value::Array(vec![text("n"), text("o99 j")]);
        let reply = Value::Array(vec![runs(&[1, 2]), marks, text("a"), text("")]);
        assert_eq!(
            read_reply(reply).expect("marks"),
            [entry(1, "a", Some("n")), entry(1, "", Some("o99 j"))]
        );
    }

    /// A reply that does not add up is an error, never half read.
    #[test]
    fn a_reply_that_does_not_add_up_is_refused() {
        let bad = [
            ("not a list", text("x")),
            ("too short", Value::Array(vec![runs(&[])])),
            ("runs not a list", Value::Array(vec![Value::Int(0), Value::Int(0)])),
            (
                "runs fewer",
                Value::Array(vec![runs(&[0, 2]), Value::Int(0), text("a")]),
            ),
            (
                "runs more",
                Value::Array(vec![runs(&[0, 1]), Value::Int(0), text("a"), text("b")]),
            ),
            ("odd runs", Value::Array(vec![runs(&[0]), Value::Int(0)])),
            (
                "negative position",
                Value::Array(vec![runs(&[-1, 1]), Value::Int(0), text("a")]),
            ),
            (
                "marks fewer",
                Value::Array(vec![runs(&[0, 2]), Value::Array(vec![text("n")]), text("a"), text("b")]),
            ),
            (
                "marks other",
                Value::Array(vec![runs(&[0, 1]), Value::Int(1), text("a")]),
            ),
            (
                "job not text",
                Value::Array(vec![runs(&[0, 1]), Value::Int(0), Value::Int(7)]),
            ),
        ];
        for (what, reply) in bad {
            assert!(read_reply(reply).is_err(), "{what}");
        }
    }

    /// Jobs from two queues, one over the payload limit between them: on a
    /// real Redis, each job keeps its queue, the large one is buried by
    /// the script and left out, and the others carry no mark.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_keep_their_queue_and_the_oversized_one_is_left_out() {
        let fixture = fixture("a,b", 200).await;
        let mut conn = fixture.redis.conn();
        let job = |jid: &str, pad: usize| format!(r#"{{"class":"A","args":["{}"],"jid":"{jid}"}}"#, "x".repeat(pad));
        // Pushed as Sidekiq pushes (LPUSH), taken oldest first.
        let _: () = redis::pipe()
            .lpush(keys::queue("a"), job("a1", 0))
            .lpush(keys::queue("a"), job("a2", 300))
            .lpush(keys::queue("a"), job("a3", 0))
            .lpush(keys::queue("b"), job("b1", 0))
            .query_async(&mut conn)
            .await
            .expect("setup");
        let taken = fixture.take(Some("held"), false).await;
        // A job's queue is its queue's name, shared, not a copy.
        for (_, queue, _) in &taken {
            assert!(
                fixture.names.iter().any(|name| Arc::ptr_eq(name, queue)),
                "{queue} copied"
            );
        }
        let got: Vec<(String, String, CancelMark)> = taken
            .into_iter()
            .map(|(raw, queue, mark)| (String::from_utf8(raw).expect("utf-8"), queue.to_string(), mark))
            .collect();
        let want: Vec<(String, String, CancelMark)> = [("a1", "a"), ("a3", "a"), ("b1", "b")]
            .iter()
            .map(|(jid, queue)| (job(jid, 0), queue.to_string(), CancelMark::Unneeded))
            .collect();
        assert_eq!(got, want);
        let held: Vec<String> = redis::cmd("LRANGE")
            .arg("held")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("LRANGE");
        assert_eq!(held.len(), 3, "the large job is not held: {held:?}");
        let buried: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys::DEAD)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("ZRANGE");
        assert_eq!(buried.len(), 1);
        assert!(buried[0].contains(r#""jid":"a2""#), "{buried:?}");
    }

    /// Issue 33: the fetch looks cancel requests up only when one could
    /// exist that the process would not hear of (`--sidekiq-cancels`, or
    /// an open `wasmjobs cancel`); otherwise each job's mark is `n` and
    /// the script does no work per job for cancels. Run on a real Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancel_requests_are_looked_up_only_when_one_may_be_unheard() {
        let fixture = fixture("default", 0).await;
        let mut conn = fixture.redis.conn();
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
            let taken = fixture.take(None, sidekiq_cancels).await;
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
        let taken = fixture.take(None, false).await;
        assert_eq!(taken[0].2, asked);
    }
}
