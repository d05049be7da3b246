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
    /// Reads the fetch script's mark for the payload `raw`: `""`, `-`,
    /// `k<value>` or `i<value>`, about the jid [`script_jid`] finds.
    pub(crate) fn from_script(raw: &[u8], mark: &[u8]) -> Self {
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

/// The jid the fetch script looks at: the text between the first
/// `"jid":"` of the payload and the next `"`, at most 128 bytes (the
/// script's own rule, byte for byte).
pub(crate) fn script_jid(raw: &[u8]) -> Option<String> {
    const NEEDLE: &[u8] = b"\"jid\":\"";
    let start = raw.windows(NEEDLE.len()).position(|w| w == NEEDLE)? + NEEDLE.len();
    let len = raw[start..].iter().position(|&b| b == b'"')?;
    if len > 128 {
        return None;
    }
    Some(String::from_utf8_lossy(&raw[start..start + len]).into_owned())
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
        // Spaced JSON is not read by the script: the runner looks it up.
        assert_eq!(script_jid(br#"{"jid": "abc"}"#), None);
        let long = format!(r#"{{"jid":"{}"}}"#, "a".repeat(129));
        assert_eq!(script_jid(long.as_bytes()), None);
        let longest = format!(r#"{{"jid":"{}"}}"#, "a".repeat(128));
        assert_eq!(script_jid(longest.as_bytes()).map(|j| j.len()), Some(128));
    }
}
