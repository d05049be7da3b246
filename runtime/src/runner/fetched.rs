//! What passes between the job source and the rest of the runner: a job
//! as fetched, and a completion (how its unit of work ended) for the
//! outcome writer. Plain data, below every module that moves it.

use tokio::sync::mpsc;

use super::job_retry::Write;

/// A job taken from a queue, exactly as it was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// The payload text (also the in-progress list entry, for the ack).
    pub(crate) raw: String,
    /// The queue it came from.
    pub(crate) queue: String,
    /// What the fetch found out about a cancel of this job.
    pub(crate) cancel: CancelMark,
}

impl Fetched {
    /// A job whose cancel state nobody has looked at.
    pub(crate) fn new(raw: String, queue: String) -> Self {
        Self {
            raw,
            queue,
            cancel: CancelMark::Unchecked,
        }
    }
}

/// Whether a cancel was requested for a job when it was fetched, as the
/// fetch script saw it ([`crate::runner::source`]'s `FETCH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelMark {
    /// Not looked at (taken by a blocking wait, or no jid found).
    Unchecked,
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
    /// Reads the script's mark: `""`, `jid\n`, `jid\nk<value>` or
    /// `jid\ni<value>`.
    pub(crate) fn from_script(mark: &[u8]) -> Self {
        let text = String::from_utf8_lossy(mark);
        let Some((jid, rest)) = text.split_once('\n') else {
            return CancelMark::Unchecked;
        };
        let request = match rest.split_at_checked(1) {
            Some(("k", value)) => Some(CancelFound::Key(value.to_owned())),
            Some(("i", value)) => Some(CancelFound::Iteration(value.to_owned())),
            _ => None,
        };
        CancelMark::Checked {
            jid: jid.to_owned(),
            request,
        }
    }
}

/// How a unit of work ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Finish {
    /// It ran (or could not): record this.
    Outcome(Write),
    /// It was stopped before it finished: back to the front of its queue.
    Requeue,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_as_the_script_writes_them() {
        assert_eq!(CancelMark::from_script(b""), CancelMark::Unchecked);
        assert_eq!(
            CancelMark::from_script(b"abc\n"),
            CancelMark::Checked {
                jid: "abc".into(),
                request: None
            }
        );
        assert_eq!(
            CancelMark::from_script(b"abc\nk{\"by\":\"me\"}"),
            CancelMark::Checked {
                jid: "abc".into(),
                request: Some(CancelFound::Key("{\"by\":\"me\"}".into()))
            }
        );
        assert_eq!(
            CancelMark::from_script(b"abc\ni1700000000"),
            CancelMark::Checked {
                jid: "abc".into(),
                request: Some(CancelFound::Iteration("1700000000".into()))
            }
        );
    }
}

/// One ended job, for the outcome writer.
#[derive(Debug)]
pub(crate) struct Completion {
    /// The job's entry in the in-flight table, removed once written.
    pub(crate) id: u64,
    /// The job exactly as fetched.
    pub(crate) job: Fetched,
    /// What to write.
    pub(crate) finish: Finish,
}

/// The outcome writer's input.
pub(crate) type CompletionSender = mpsc::Sender<Completion>;
