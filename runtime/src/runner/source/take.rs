//! The non-blocking fetch both modes share: one Lua call
//! ([`super::scripts::FETCH`]) takes up to *n* jobs from the queues in
//! order, moving them into a batch list (reliable, `super::batches`) or
//! the in-progress list (reliable, when no batch list is free or cancel
//! marks are needed), or popping them (basic). Jobs over the payload limit
//! are buried by the script itself and never leave Redis.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use redis::{Script, Value};

use super::MAX_BATCH;
use super::dead::{DeadSet, oversized_buried};
use crate::redis::{Redis, keys, now_f64};
use crate::runner::fetched::CancelMark;
use crate::runner::queues::Queues;

/// A job taken: its bytes, its queue, and the fetch script's cancel mark.
pub(super) type Taken = (Vec<u8>, Arc<str>, CancelMark);

/// What a fetch took, and whether it is in the batch list it was given.
#[derive(Debug, Default)]
pub(super) struct Took {
    pub(super) jobs: Vec<Taken>,
    /// The jobs are in the batch list (else in the in-progress list, or
    /// popped).
    pub(super) in_batch: bool,
}

/// The fetch script, and whether this process loaded it into Redis (a
/// pipelined call cannot load it on demand; after any failed call it is
/// loaded again, in case Redis restarted empty).
pub(super) struct FetchScript {
    script: Script,
    loaded: AtomicBool,
    /// The queues whose key was found of another type, said once each
    /// (until the key is a queue again).
    wrong: Mutex<HashSet<Arc<str>>>,
}

impl FetchScript {
    pub(super) fn new() -> Self {
        Self {
            script: Script::new(super::scripts::FETCH),
            loaded: AtomicBool::new(false),
            wrong: Mutex::default(),
        }
    }

    /// Says once that `queue`'s key is of another type.
    fn wrong_type(&self, queue: &Arc<str>) {
        let mut wrong = self.wrong.lock().unwrap_or_else(PoisonError::into_inner);
        if wrong.insert(queue.clone()) {
            tracing::error!(
                queue = %queue,
                "the key {} is not a list (another client wrote it): queue {queue} is skipped until it is one; the other queues are fetched",
                keys::queue(queue)
            );
        }
    }

    /// `queue` gave jobs: its key is a list (again).
    fn right_type(&self, queue: &Arc<str>) {
        let mut wrong = self.wrong.lock().unwrap_or_else(PoisonError::into_inner);
        if !wrong.is_empty() && wrong.remove(queue) {
            tracing::info!(queue = %queue, "the key {} is a list again: queue {queue} is fetched", keys::queue(queue));
        }
    }
}

/// Where a fetch keeps what it takes: reliable fetch keeps jobs in a list
/// (the in-progress list `list`, or the empty batch list `batch`); basic
/// fetch pops them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Keep<'a> {
    Pop,
    Hold { list: &'a str, batch: Option<&'a str> },
}

/// What a fetch does with payloads over the limit: bury them in `dead`
/// from inside Redis (0: no limit).
pub(super) struct Oversized<'a> {
    pub(super) dead: &'a DeadSet,
    pub(super) max_payload: usize,
}

/// Takes up to `max` jobs from `queues` (in this fetch's order), kept as
/// `keep` says, leaving out the queues in `paused`. A job over the payload
/// limit is buried instead, logged, and not returned. Cancel requests are
/// looked up at fetch when Ruby clients may write them (`sidekiq_cancels`)
/// or a `wasmjobs cancel` is open (the script's marks); then the jobs go to
/// the in-progress list, never to the batch list.
#[allow(clippy::too_many_arguments)]
pub(super) async fn take(
    redis: &Redis,
    script: &FetchScript,
    queues: &Queues,
    names: &[Arc<str>],
    keep: Keep<'_>,
    paused: &HashSet<String>,
    oversized: &Oversized<'_>,
    sidekiq_cancels: bool,
    max: usize,
) -> Result<Took> {
    let mut order = queues.fetch_order();
    if !paused.is_empty() {
        order.retain(|&i| !paused.contains(&*names[i]));
        if order.is_empty() {
            return Ok(Took::default());
        }
    }
    let (list, batch) = match keep {
        Keep::Pop => (None, None),
        Keep::Hold { list, batch } => (Some(list), batch.filter(|_| !sidekiq_cancels)),
    };
    let mut invocation = script.script.prepare_invoke();
    // Basic mode names no list, and a fetch without a batch list none; the
    // script ignores those keys then.
    invocation.key(list.unwrap_or("wasmjobs:unused"));
    invocation.key(keys::CANCELS_OPEN);
    invocation.key(batch.unwrap_or("wasmjobs:unused"));
    for &i in &order {
        invocation.key(keys::queue(&names[i]));
    }
    invocation
        .arg(max.min(MAX_BATCH))
        .arg(if list.is_some() { "1" } else { "0" })
        .arg(if sidekiq_cancels { "1" } else { "0" })
        .arg(if batch.is_some() { "1" } else { "0" });
    if oversized.max_payload > 0 {
        invocation.key(keys::DEAD);
        oversized
            .dead
            .cap_args(&mut invocation, oversized.max_payload, now_f64());
    }
    let (reply, listed) = match batch {
        None => {
            let reply = invocation
                .invoke_async(&mut redis.conn())
                .await
                .context("fetching jobs")?;
            (reply, None)
        }
        Some(batch) => {
            let (reply, listed) = take_pipelined(redis, script, &invocation, batch).await?;
            (reply, Some(listed))
        }
    };
    let Reply {
        entries,
        in_batch,
        wrong,
    } = read_reply(reply, listed)?;
    let queue_at = |position: usize| {
        order
            .get(position)
            .and_then(|&i| names.get(i))
            .context("the fetch script returned a bad queue position")
    };
    for position in wrong {
        script.wrong_type(queue_at(position)?);
    }
    let mut jobs = Vec::with_capacity(entries.len());
    let mut last = None;
    for Entry { position, raw, mark } in entries {
        let queue = queue_at(position)?;
        if last != Some(position) {
            script.right_type(queue);
            last = Some(position);
        }
        let mark = match mark {
            None => CancelMark::Unneeded,
            Some(mark) if raw.is_empty() && oversized_buried(queue, &mark) => continue,
            Some(mark) => CancelMark::from_script(&raw, &mark),
        };
        jobs.push((raw, queue.clone(), mark));
    }
    Ok(Took { jobs, in_batch })
}

/// Runs the fetch script with the `LRANGE` of the batch list `batch`
/// pipelined behind it (one round trip), loading the script first when
/// this process has not, or may have lost it. A Redis that lost its
/// scripts (a restart) answers `NOSCRIPT` without running anything: then
/// the script is loaded and the fetch asked again, once.
async fn take_pipelined(
    redis: &Redis,
    script: &FetchScript,
    invocation: &redis::ScriptInvocation<'_>,
    batch: &str,
) -> Result<(Value, Value)> {
    let mut retried = false;
    loop {
        let mut pipe = redis::pipe();
        if !script.loaded.swap(true, Ordering::AcqRel) {
            pipe.load_script(&script.script).ignore();
        }
        pipe.invoke_script(invocation);
        pipe.cmd("LRANGE").arg(batch).arg(0).arg(-1);
        match pipe.query_async(&mut redis.conn()).await {
            Ok(replies) => return Ok(replies),
            Err(err) => {
                script.loaded.store(false, Ordering::Release);
                let lost = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript);
                if lost && !retried {
                    retried = true;
                    continue;
                }
                return Err(err).context("fetching jobs");
            }
        }
    }
}

/// One job of the fetch script's reply: the position of its queue among
/// the queues fetched, its bytes, and its mark (none: `n`, no cancel to
/// look for). A job buried as oversized is an empty job with its `o` mark.
#[derive(Debug, PartialEq)]
struct Entry {
    position: usize,
    raw: Vec<u8>,
    mark: Option<Vec<u8>>,
}

/// Reads the fetch script's reply ([`super::scripts::FETCH`]), with the
/// `LRANGE` of the batch list pipelined behind it when there is one
/// (`listed`): `[runs, marks, job, …]` (`runs` are pairs of queue position
/// and how many jobs in a row, `marks` is `0` or one mark per job), or,
/// when the jobs went to the batch list, `[[position, count], -1, note,
/// …]` with the jobs in `listed` and a note per job buried as oversized.
/// A run `(position, -1)` names a queue whose key is of another type,
/// skipped. Anything else is an error: a reply that does not add up is
/// never half read.
fn read_reply(reply: Value, listed: Option<Value>) -> Result<Reply> {
    let Value::Array(items) = reply else {
        bail!("the fetch script's reply is not a list: {reply:?}");
    };
    let mut items = items.into_iter();
    let (Some(Value::Array(runs)), Some(marks)) = (items.next(), items.next()) else {
        bail!("the fetch script's reply does not start with its runs and marks");
    };
    let (wrong, runs) = wrong_of(&runs)?;
    if marks == Value::Int(-1) {
        return read_batch(&runs, items, listed).map(|entries| Reply {
            entries,
            in_batch: true,
            wrong,
        });
    }
    let mut marks = match marks {
        Value::Int(0) => None,
        Value::Array(marks) if marks.len() == items.len() => Some(marks.into_iter()),
        other => bail!("the fetch script's marks are not 0 or one per job: {other:?}"),
    };
    if listed
        .as_ref()
        .is_some_and(|l| !matches!(l, Value::Array(a) if a.is_empty()))
    {
        bail!("the batch list holds jobs the fetch script did not put there: {listed:?}");
    }
    let mut entries = Vec::with_capacity(items.len());
    for run in runs.chunks(2) {
        let (position, count) = run_of(run, &runs)?;
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
    Ok(Reply {
        entries,
        in_batch: false,
        wrong,
    })
}

/// What [`read_reply`] read.
#[derive(Debug, PartialEq)]
struct Reply {
    entries: Vec<Entry>,
    /// The jobs are in the batch list.
    in_batch: bool,
    /// The positions of the queues whose key is of another type.
    wrong: Vec<usize>,
}

/// Splits the runs `(position, -1)` (a key of another type) off the
/// others: (their positions, the other runs, flat).
fn wrong_of(runs: &[Value]) -> Result<(Vec<usize>, Vec<Value>)> {
    if !runs.len().is_multiple_of(2) {
        bail!("the fetch script's runs are not pairs of numbers: {runs:?}");
    }
    let mut wrong = Vec::new();
    let mut rest = Vec::with_capacity(runs.len());
    for run in runs.chunks(2) {
        match run {
            [Value::Int(position), Value::Int(-1)] => {
                wrong.push(usize::try_from(*position).context("a negative queue position")?);
            }
            _ => rest.extend_from_slice(run),
        }
    }
    Ok((wrong, rest))
}

/// The jobs of a sorted fetch: `listed` (the batch list, oldest first),
/// all of the one queue `runs` names, then an entry per oversized job
/// buried (`notes`).
fn read_batch(runs: &[Value], notes: impl Iterator<Item = Value>, listed: Option<Value>) -> Result<Vec<Entry>> {
    let (position, count) = match runs {
        [] => (0, 0),
        [_, _] => run_of(runs, runs)?,
        _ => bail!("the fetch script's runs of a batch are not one pair: {runs:?}"),
    };
    let Some(Value::Array(listed)) = listed else {
        bail!("a sorted fetch without its batch list read: {listed:?}");
    };
    if listed.len() != count {
        bail!(
            "the batch list holds {} jobs, the fetch script says {count}",
            listed.len()
        );
    }
    let mut entries = Vec::with_capacity(count);
    for raw in listed {
        let Value::BulkString(raw) = raw else {
            bail!("a job in the batch list is not text: {raw:?}");
        };
        entries.push(Entry {
            position,
            raw,
            mark: None,
        });
    }
    for note in notes {
        let Value::BulkString(mark) = note else {
            bail!("the fetch script's note is not text: {note:?}");
        };
        entries.push(Entry {
            position,
            raw: Vec::new(),
            mark: Some(mark),
        });
    }
    Ok(entries)
}

/// One run of the reply: (queue position, how many jobs).
fn run_of(run: &[Value], runs: &[Value]) -> Result<(usize, usize)> {
    let &[Value::Int(position), Value::Int(count)] = run else {
        bail!("the fetch script's runs are not pairs of numbers: {runs:?}");
    };
    let position = usize::try_from(position).context("a negative queue position")?;
    let count = usize::try_from(count).context("a negative job count")?;
    Ok((position, count))
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
        script: FetchScript,
        queues: Queues,
        names: Vec<Arc<str>>,
        dead: DeadSet,
        max_payload: usize,
    }

    impl Fixture {
        /// Takes up to 10 jobs, into `held_in` when given, none paused.
        async fn take(&self, held_in: Option<&str>, sidekiq_cancels: bool) -> Vec<Taken> {
            let keep = match held_in {
                Some(list) => Keep::Hold { list, batch: None },
                None => Keep::Pop,
            };
            let took = self.take_into(keep, sidekiq_cancels, 10).await.expect("take");
            assert!(!took.in_batch);
            took.jobs
        }

        /// Takes up to `max` jobs as `keep` says, none paused.
        async fn take_into(&self, keep: Keep<'_>, sidekiq_cancels: bool, max: usize) -> Result<Took> {
            let oversized = Oversized {
                dead: &self.dead,
                max_payload: self.max_payload,
            };
            take(
                &self.redis,
                &self.script,
                &self.queues,
                &self.names,
                keep,
                &HashSet::new(),
                &oversized,
                sidekiq_cancels,
                max,
            )
            .await
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
            script: FetchScript::new(),
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
        assert_eq!(read_reply(reply, None).expect("empty").entries, []);
        let reply = Value::Array(vec![
            runs(&[0, 2, 2, 1]),
            Value::Int(0),
            text("a"),
            text("b"),
            text("c"),
        ]);
        assert_eq!(
            read_reply(reply, None).expect("no marks").entries,
            [entry(0, "a", None), entry(0, "b", None), entry(2, "c", None)]
        );
        let marks = Value::Array(vec![text("n"), text("o99 j")]);
        let reply = Value::Array(vec![runs(&[1, 2]), marks, text("a"), text("")]);
        assert_eq!(
            read_reply(reply, None).expect("marks").entries,
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
            assert!(read_reply(reply, None).is_err(), "{what}");
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
        let held = list(&mut conn, "held").await;
        assert_eq!(held.len(), 3, "the large job is not held: {held:?}");
        let buried = range(&mut conn, "ZRANGE", keys::DEAD).await;
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

    /// The jobs (as text) and the queue of each, of what a fetch took.
    fn texts(took: &Took) -> Vec<(String, String)> {
        took.jobs
            .iter()
            .map(|(raw, queue, _)| (String::from_utf8_lossy(raw).into_owned(), queue.to_string()))
            .collect()
    }

    async fn list(conn: &mut redis::aio::ConnectionManager, key: &str) -> Vec<String> {
        range(conn, "LRANGE", key).await
    }

    /// Pushes `job` onto the queue `queue`, as Sidekiq pushes (`LPUSH`).
    async fn push(conn: &mut redis::aio::ConnectionManager, queue: &str, job: impl redis::ToRedisArgs) {
        let _: () = redis::cmd("LPUSH")
            .arg(keys::queue(queue))
            .arg(job)
            .query_async(conn)
            .await
            .expect("LPUSH");
    }

    /// `LRANGE` or `ZRANGE` `key` `0 -1`.
    async fn range(conn: &mut redis::aio::ConnectionManager, command: &str, key: &str) -> Vec<String> {
        redis::cmd(command)
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .expect(command)
    }

    /// A sorted fetch, on a real Redis: the oldest jobs of the first queue
    /// that has any go to the batch list, oldest first, and off the queue;
    /// one queue a fetch, so the next fetch takes the rest, then the next
    /// queue's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sorted_fetch_moves_the_oldest_jobs_into_the_batch_list() {
        let fixture = fixture("a,b", 0).await;
        let mut conn = fixture.redis.conn();
        for jid in ["a1", "a2", "a3", "a4", "a5"] {
            push(&mut conn, "a", jid).await;
        }
        push(&mut conn, "b", "b1").await;
        let keep = |batch| Keep::Hold {
            list: "held",
            batch: Some(batch),
        };
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(j, q)| ((*j).to_owned(), (*q).to_owned())).collect()
        };
        let first = fixture.take_into(keep("b0"), false, 3).await.expect("take");
        assert!(first.in_batch);
        assert_eq!(texts(&first), owned(&[("a1", "a"), ("a2", "a"), ("a3", "a")]));
        assert!(first.jobs.iter().all(|(_, _, mark)| *mark == CancelMark::Unneeded));
        assert_eq!(list(&mut conn, "b0").await, ["a1", "a2", "a3"], "oldest first");
        assert_eq!(list(&mut conn, &keys::queue("a")).await, ["a5", "a4"]);
        assert!(list(&mut conn, "held").await.is_empty());
        let second = fixture.take_into(keep("b1"), false, 10).await.expect("take");
        assert_eq!(texts(&second), owned(&[("a4", "a"), ("a5", "a")]));
        let third = fixture.take_into(keep("b2"), false, 10).await.expect("take");
        assert_eq!(texts(&third), owned(&[("b1", "b")]));
        let none = fixture.take_into(keep("b3"), false, 10).await.expect("take");
        assert!(none.in_batch && none.jobs.is_empty());
        let exists: bool = redis::cmd("EXISTS")
            .arg("b3")
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        assert!(!exists, "an empty fetch leaves no list");
    }

    /// A sorted fetch buries a job over the payload limit from inside
    /// Redis: it leaves the batch list, the others stay, none is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sorted_fetch_buries_the_oversized_job_and_holds_the_others() {
        let fixture = fixture("a", 200).await;
        let mut conn = fixture.redis.conn();
        let job = |jid: &str, pad: usize| format!(r#"{{"class":"A","args":["{}"],"jid":"{jid}"}}"#, "x".repeat(pad));
        for (jid, pad) in [("a1", 0), ("a2", 300), ("a3", 0)] {
            push(&mut conn, "a", job(jid, pad)).await;
        }
        let took = fixture
            .take_into(
                Keep::Hold {
                    list: "held",
                    batch: Some("b0"),
                },
                false,
                10,
            )
            .await
            .expect("take");
        assert!(took.in_batch);
        let jobs: Vec<String> = texts(&took).into_iter().map(|(raw, _)| raw).collect();
        assert_eq!(jobs, [job("a1", 0), job("a3", 0)]);
        assert_eq!(list(&mut conn, "b0").await, [job("a1", 0), job("a3", 0)]);
        let buried = range(&mut conn, "ZRANGE", keys::DEAD).await;
        assert_eq!(buried.len(), 1);
        assert!(
            buried[0].contains(r#""jid":"a2""#) && buried[0].contains("PayloadTooLarge"),
            "{buried:?}"
        );
    }

    /// Marks are read from payloads, so with a cancel open, or with
    /// `--sidekiq-cancels`, a fetch given a batch list takes its jobs into
    /// the in-progress list the old way, marked; the batch list is not
    /// touched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_marks_to_read_a_fetch_holds_jobs_in_the_in_progress_list() {
        let fixture = fixture("default", 0).await;
        let mut conn = fixture.redis.conn();
        let job = r#"{"class":"A","args":[],"jid":"abc"}"#;
        let keep = Keep::Hold {
            list: "held",
            batch: Some("b0"),
        };
        let checked = CancelMark::Checked {
            jid: "abc".into(),
            request: None,
        };
        let open_later = now_f64() + 60.0;
        for (open, sidekiq_cancels) in [(true, false), (false, true)] {
            let _: () = redis::pipe()
                .del(keys::CANCELS_OPEN)
                .del("held")
                .rpush(keys::queue("default"), job)
                .query_async(&mut conn)
                .await
                .expect("setup");
            if open {
                let _: () = redis::cmd("ZADD")
                    .arg(keys::CANCELS_OPEN)
                    .arg(open_later)
                    .arg("zzz")
                    .query_async(&mut conn)
                    .await
                    .expect("ZADD");
            }
            let took = fixture.take_into(keep, sidekiq_cancels, 10).await.expect("take");
            assert!(!took.in_batch, "open {open}, --sidekiq-cancels {sidekiq_cancels}");
            assert_eq!(took.jobs.len(), 1);
            assert_eq!(took.jobs[0].2, checked);
            assert_eq!(list(&mut conn, "held").await, [job]);
            assert!(list(&mut conn, "b0").await.is_empty());
        }
    }

    /// A queue key that another client made a set, or a hash, or a
    /// string: it is skipped and left as it was (the set whole, no batch
    /// list), the queues after it are fetched, on both paths (sorted into
    /// a batch list, and into the in-progress list); and it is fetched
    /// again once it is a list. (Before, the whole fetch failed with
    /// `WRONGTYPE`: one bad key stopped every queue.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_of_another_type_is_skipped_left_alone_and_the_others_fetched() {
        let fixture = fixture("a,b,c", 0).await;
        let mut conn = fixture.redis.conn();
        let _: () = redis::cmd("SADD")
            .arg(keys::queue("a"))
            .arg("x")
            .arg("y")
            .query_async(&mut conn)
            .await
            .expect("SADD");
        let _: () = redis::cmd("HSET")
            .arg(keys::queue("b"))
            .arg("x")
            .arg("y")
            .query_async(&mut conn)
            .await
            .expect("HSET");
        let sorted = Keep::Hold {
            list: "held",
            batch: Some("b0"),
        };
        let unsorted = Keep::Hold {
            list: "held",
            batch: None,
        };
        for (keep, job) in [(sorted, "j1"), (unsorted, "j2"), (Keep::Pop, "j3")] {
            push(&mut conn, "c", job).await;
            let took = fixture
                .take_into(keep, false, 10)
                .await
                .expect("a set or hash is skipped");
            assert_eq!(texts(&took), [(job.to_owned(), "c".to_owned())], "{keep:?}");
        }
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg(keys::queue("a"))
            .query_async(&mut conn)
            .await
            .expect("SMEMBERS");
        assert_eq!(members.len(), 2, "the set is left as it was");
        let _: () = redis::pipe()
            .del(keys::queue("a"))
            .set(keys::queue("a"), "junk")
            .query_async(&mut conn)
            .await
            .expect("SET");
        push(&mut conn, "c", "j4").await;
        let took = fixture.take_into(sorted, false, 10).await.expect("a string is skipped");
        assert_eq!(texts(&took), [("j4".to_owned(), "c".to_owned())]);
        // And the queue is fetched again once it is a list.
        let _: () = redis::pipe()
            .del(keys::queue("a"))
            .lpush(keys::queue("a"), "j")
            .query_async(&mut conn)
            .await
            .expect("LPUSH");
        let took = fixture.take_into(sorted, false, 10).await.expect("take");
        assert_eq!(texts(&took), [("j".to_owned(), "a".to_owned())]);
    }

    /// A Redis that refuses `MEMORY` or `SORT` (here an ACL; renamed
    /// commands answer alike) still serves fetches and keeps the payload
    /// limit: without `MEMORY USAGE`, Lua looks at each payload's size;
    /// without `SORT`, the jobs go to the in-progress list the old way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_that_refuses_sort_or_memory_still_fetches() {
        let fixture = fixture("a", 200).await;
        let mut conn = fixture.redis.conn();
        let job = |jid: &str, pad: usize| format!(r#"{{"class":"A","args":["{}"],"jid":"{jid}"}}"#, "x".repeat(pad));
        let keep = Keep::Hold {
            list: "held",
            batch: Some("b0"),
        };
        for (refused, small, large, in_batch, buried) in
            [("-memory", "a1", "a2", true, 1), ("-sort", "a3", "a4", false, 2)]
        {
            for (jid, pad) in [(small, 0), (large, 300)] {
                push(&mut conn, "a", job(jid, pad)).await;
            }
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("default")
                .arg(refused)
                .query_async(&mut conn)
                .await
                .expect("ACL SETUSER");
            let took = fixture.take_into(keep, false, 10).await.expect("take");
            assert_eq!(took.in_batch, in_batch, "{refused}");
            assert_eq!(texts(&took), [(job(small, 0), "a".to_owned())], "{refused}");
            let held = if in_batch { "b0" } else { "held" };
            assert_eq!(list(&mut conn, held).await, [job(small, 0)], "{refused}");
            assert_eq!(
                range(&mut conn, "ZRANGE", keys::DEAD).await.len(),
                buried,
                "{refused}: the large one buried"
            );
            let _: () = redis::cmd("DEL").arg("b0").query_async(&mut conn).await.expect("DEL");
        }
    }

    /// A sorted reply whose batch list does not hold what it says, or a
    /// reply with jobs in the batch list it did not use, is refused.
    #[test]
    fn a_batch_reply_that_does_not_add_up_is_refused() {
        let sorted = |count: i64| Value::Array(vec![runs(&[0, count]), Value::Int(-1)]);
        let listed = |jobs: &[&str]| Some(Value::Array(jobs.iter().map(|j| text(j)).collect()));
        let Reply { entries, in_batch, .. } = read_reply(sorted(2), listed(&["a", "b"])).expect("sorted");
        assert!(in_batch);
        assert_eq!(entries, [entry(0, "a", None), entry(0, "b", None)]);
        let with_note = Value::Array(vec![runs(&[0, 1]), Value::Int(-1), text("o999 big")]);
        let entries = read_reply(with_note, listed(&["a"])).expect("a burial noted").entries;
        assert_eq!(entries, [entry(0, "a", None), entry(0, "", Some("o999 big"))]);
        assert!(read_reply(sorted(3), listed(&["a", "b"])).is_err(), "fewer than said");
        assert!(read_reply(sorted(1), None).is_err(), "not read");
        let old = Value::Array(vec![runs(&[0, 1]), Value::Int(0), text("a")]);
        assert!(read_reply(old, listed(&["x"])).is_err(), "a batch list it did not fill");
    }
}
