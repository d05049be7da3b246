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
