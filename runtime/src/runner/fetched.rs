//! What passes between the job source and the rest of the runner: a job
//! as fetched, and a completion (how its unit of work ended) for the
//! outcome writer. Plain data, below every module that moves it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

use super::job_retry::Write;
use crate::redis::unique::Lock;

/// A job taken from a queue, exactly as it was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// The payload text (also the in-progress list entry, for the ack).
    pub(crate) raw: String,
    /// The queue it came from (its name shared by the jobs fetched from
    /// it: no copy per job).
    pub(crate) queue: Arc<str>,
    /// What the fetch found out about a cancel of this job.
    pub(crate) cancel: CancelMark,
    /// Its row and claim, when it came from the PostgreSQL store.
    pub(crate) receipt: Option<Receipt>,
    /// The Redis shard it came from (its index in the shard map; 0, the
    /// default shard, with one Redis): its outcome, cancel and unique lock
    /// live there.
    pub(crate) shard: u16,
    /// The batch list it waits in, when a sorted fetch took it (reliable
    /// fetch); else it is in the process's in-progress list.
    pub(crate) held: Option<Held>,
}

impl Fetched {
    /// A job whose cancel state nobody has looked at.
    pub(crate) fn new(raw: String, queue: impl Into<Arc<str>>) -> Self {
        Self {
            raw,
            queue: queue.into(),
            cancel: CancelMark::Unchecked,
            receipt: None,
            shard: 0,
            held: None,
        }
    }
}

/// The batch list one sorted fetch left its jobs in, shared by those
/// jobs: its key, its slot among the process's batch lists, and how many
/// of its jobs have not left it yet (so the transaction that acks the last
/// ones deletes it whole, and its slot is used again once it is empty).
#[derive(Clone)]
pub(crate) struct Held(Arc<BatchList>);

struct BatchList {
    key: Arc<str>,
    slot: usize,
    left: AtomicUsize,
}

impl Held {
    /// The list `key` (slot `slot`), holding `jobs` jobs.
    pub(crate) fn new(key: Arc<str>, slot: usize, jobs: usize) -> Self {
        Self(Arc::new(BatchList {
            key,
            slot,
            left: AtomicUsize::new(jobs),
        }))
    }

    pub(crate) fn key(&self) -> &str {
        &self.0.key
    }

    pub(crate) fn slot(&self) -> usize {
        self.0.slot
    }

    /// How many of its jobs have not left it yet.
    pub(crate) fn left(&self) -> usize {
        self.0.left.load(Ordering::Acquire)
    }

    /// Counts `jobs` more of its jobs as gone (their removal confirmed by
    /// Redis). Returns whether the list is now empty.
    pub(crate) fn leave(&self, jobs: usize) -> bool {
        let before = self.0.left.fetch_sub(jobs, Ordering::AcqRel);
        debug_assert!(before >= jobs, "more jobs left a batch list than it held");
        before == jobs
    }

    /// Whether `other` is the same list.
    pub(crate) fn same(&self, other: &Held) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for Held {}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({}, {} left)", self.key(), self.left())
    }
}

/// The jobs this process holds and knows of (running, or awaiting their
/// outcome write): what a reconcile after a lost reply leaves alone. A
/// Redis list holds payloads, a PostgreSQL claim is a row.
#[derive(Debug, Default, Clone)]
pub(crate) struct Known {
    /// Their payload texts.
    pub(crate) raws: std::collections::HashSet<String>,
    /// Their rows in `wasmjobs.jobs`, for those that have one.
    pub(crate) rows: std::collections::HashSet<i64>,
}

impl Known {
    /// Adds `job`.
    pub(crate) fn add(&mut self, job: &Fetched) {
        self.raws.insert(job.raw.clone());
        if let Some(receipt) = job.receipt {
            self.rows.insert(receipt.row);
        }
    }
}

/// Which row of `wasmjobs.jobs` a job is, and which claim of it this
/// process holds: its completion is written only if the row is still this
/// claim's (the fencing token), so a process whose lease was taken over
/// cannot write over the job's new holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Receipt {
    /// `wasmjobs.jobs.id`.
    pub(crate) row: i64,
    /// `wasmjobs.jobs.claims` when this process claimed it.
    pub(crate) claim: i32,
}

/// Whether a cancel was requested for a job when it was fetched, as the
/// fetch script saw it ([`crate::runner::source`]'s `FETCH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelMark {
    /// Not looked at (taken by a blocking wait, or no jid found).
    Unchecked,
    /// Not looked for, as no request could exist that this process would
    /// not hear of on the control channel: no Ruby client cancels (no
    /// `run --sidekiq-cancels`) and no `wasmjobs cancel` is unresolved.
    Unneeded,
    /// Looked at for `jid` (which the runner compares with the jid it
    /// parses): `request` is the cancel request found, if any.
    Checked { jid: String, request: Option<CancelFound> },
}

/// A cancel request as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelFound {
    /// The value of `cancelled-<jid>`.
    Key(String),
    /// The `cancelled` field of `it-<jid>`.
    Iteration(String),
}

impl CancelMark {
    /// Reads the fetch script's mark for the payload `raw`: `n`, or `""`,
    /// `-`, `k<value>` or `i<value>` about the jid [`script_jid`] finds.
    pub(crate) fn from_script(raw: &[u8], mark: &[u8]) -> Self {
        if mark == b"n" {
            return CancelMark::Unneeded;
        }
        let Some(jid) = script_jid(raw) else {
            return CancelMark::Unchecked;
        };
        let text = String::from_utf8_lossy(mark);
        let request = match text.split_at_checked(1) {
            Some(("-", "")) => None,
            Some(("k", value)) => Some(CancelFound::Key(value.to_owned())),
            Some(("i", value)) => Some(CancelFound::Iteration(value.to_owned())),
            _ => return CancelMark::Unchecked,
        };
        CancelMark::Checked { jid, request }
    }
}

/// The jid the fetch script looks at (its `jid_of`, byte for byte): after
/// the first `"jid"` that is followed by a colon (whitespace around it
/// allowed, as Lua's `%s` reads it) and a `"`, the text up to the next
/// `"`, at most 128 bytes.
pub(crate) fn script_jid(raw: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"jid\"";
    // Lua's `%s` in the C locale.
    let space = |b: &u8| b" \t\n\x0b\x0c\r".contains(b);
    let mut from = 0;
    while let Some(found) = memchr::memmem::find(&raw[from..], KEY) {
        let after = from + found + KEY.len();
        let rest = &raw[after..];
        let colon = rest.iter().position(|b| !space(b));
        if let Some(colon) = colon.filter(|&c| rest[c] == b':') {
            let value = &rest[colon + 1..];
            if let Some(quote) = value.iter().position(|b| !space(b)).filter(|&q| value[q] == b'"') {
                let text = &value[quote + 1..];
                let len = text.iter().position(|&b| b == b'"')?;
                if len > 128 {
                    return None;
                }
                return Some(String::from_utf8_lossy(&text[..len]).into_owned());
            }
        }
        from = after;
    }
    None
}

/// How a unit of work ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Finish {
    /// It ran (or could not): record this.
    Outcome(Write),
    /// It was stopped before it finished: back to the front of its queue.
    Requeue,
}

/// One ended job, for the outcome writer.
#[derive(Debug)]
pub(crate) struct Completion {
    /// The job's entry in the in-flight table, removed once written.
    pub(crate) id: u64,
    /// The job exactly as fetched.
    pub(crate) job: Fetched,
    /// The unique lock its payload names, read once when it was parsed
    /// (`runner::unit::TypedJob`); released with an outcome that ends it.
    pub(crate) unique: Option<Lock>,
    /// What to write.
    pub(crate) finish: Finish,
}

/// The outcome writer's input.
pub(crate) type CompletionSender = mpsc::Sender<Completion>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_as_the_script_writes_them() {
        let raw = br#"{"class":"A","args":[{"jid":"nested"}],"jid":"real"}"#;
        // The script looks at the first "jid":" — here one inside the args,
        // which the runner then does not take for the job's.
        assert_eq!(
            CancelMark::from_script(raw, b"-"),
            CancelMark::Checked {
                jid: "nested".into(),
                request: None
            }
        );
        let raw = br#"{"class":"A","args":[],"jid":"abc"}"#;
        assert_eq!(CancelMark::from_script(raw, b""), CancelMark::Unchecked);
        assert_eq!(CancelMark::from_script(raw, b"n"), CancelMark::Unneeded);
        assert_eq!(
            CancelMark::from_script(raw, b"k{\"by\":\"me\"}"),
            CancelMark::Checked {
                jid: "abc".into(),
                request: Some(CancelFound::Key("{\"by\":\"me\"}".into()))
            }
        );
        assert_eq!(
            CancelMark::from_script(raw, b"i1700000000"),
            CancelMark::Checked {
                jid: "abc".into(),
                request: Some(CancelFound::Iteration("1700000000".into()))
            }
        );
        // Spaced JSON (Python's json.dumps) is read as compact is; a
        // "jid" that is no key is passed over.
        assert_eq!(script_jid(br#"{"jid": "abc"}"#).as_deref(), Some("abc"));
        assert_eq!(script_jid(b"{\"jid\" \t:\n \"abc\"}").as_deref(), Some("abc"));
        assert_eq!(
            script_jid(br#"{"args": ["jid", "jid"], "jid" : "real"}"#).as_deref(),
            Some("real")
        );
        assert_eq!(script_jid(br#"{"jid": 5}"#), None);
        assert_eq!(script_jid(br#"{"jid":"unterminated"#), None);
        let long = format!(r#"{{"jid":"{}"}}"#, "a".repeat(129));
        assert_eq!(script_jid(long.as_bytes()), None);
        let longest = format!(r#"{{"jid":"{}"}}"#, "a".repeat(128));
        assert_eq!(script_jid(longest.as_bytes()).map(|j| j.len()), Some(128));
    }
}
