//! A unit of work: one fetched job, parsed once, and the way to finish it.
//!
//! The job source hands out [`Fetched`] jobs (the payload exactly as stored,
//! and its queue). When one starts, the manager wraps it in a
//! [`UnitOfWork`]: the payload is parsed once into a [`TypedJob`] (the
//! fields the sandbox needs, read without building the whole JSON map; the
//! raw text is kept for the writes that need it; the whole map is built at
//! most once, if a write needs it; the unique lock it names is read once
//! and travels with the outcome to the writer), the job is listed in the
//! in-flight table, and the unit holds the way back to Redis. It ends in
//! exactly one of two ways, after Sidekiq's `UnitOfWork`:
//!
//! - [`UnitOfWork::finish`]: the outcome (ack, retry, dead, ...) goes to the
//!   outcome writer, which records it in a batch with others;
//! - [`UnitOfWork::requeue`]: the job goes back to the front of its queue
//!   (stopped at a shutdown deadline), also through the writer.
//!
//! Neither knows the fetch mode: what "ack" or "requeue" means in Redis is
//! the job source's business ([`super::source`]).

use std::sync::{Arc, OnceLock};

use super::fetched::{Completion, CompletionSender, Fetched, Finish};
use super::inflight::InFlightTable;
use super::job_retry::Write;
use crate::job::Job;
use crate::redis::payload::{self, Payload};
use crate::redis::unique::{Lock, UniqueUntil};

/// A fetched job, parsed once.
#[derive(Debug)]
pub(crate) struct TypedJob {
    /// The job as stored.
    pub(crate) fetched: Fetched,
    /// The job to run and its enqueue time (epoch seconds, 0 if unknown),
    /// or why the payload is not a job.
    pub(crate) parsed: Result<(Job, f64), String>,
    /// The unique lock the payload names, and until when it is held (one
    /// substring search for a payload without one).
    pub(crate) unique: Option<(Lock, UniqueUntil)>,
    /// The whole payload, parsed the first time a write needs it.
    whole: OnceLock<Result<Payload, String>>,
}

impl TypedJob {
    /// Parses `fetched` (the fast path: only the fields a job needs).
    pub(crate) fn parse(fetched: Fetched) -> Self {
        let parsed = payload::job_from_raw(&fetched.raw);
        let unique = Lock::from_payload(&fetched.raw);
        Self {
            fetched,
            parsed,
            unique,
            whole: OnceLock::new(),
        }
    }

    /// The job's class ("" for a payload that is not a job).
    pub(crate) fn class(&self) -> &str {
        self.parsed.as_ref().map_or("", |(job, _)| job.class.as_str())
    }

    /// The job's jid ("" for a payload that is not a job).
    pub(crate) fn jid(&self) -> &str {
        self.parsed.as_ref().map_or("", |(job, _)| job.jid.as_str())
    }

    /// The whole payload, to write a failure back into (the fast path read
    /// only a few fields; a failure needs all of them kept). Parsed once;
    /// each caller gets its own copy to change.
    pub(crate) fn payload(&self) -> Result<Payload, String> {
        self.whole.get_or_init(|| Payload::parse(&self.fetched.raw)).clone()
    }

    /// The dead-set write for a payload that is not a valid job.
    pub(crate) fn malformed(&self, error: &str, now: f64) -> Write {
        tracing::warn!(queue = %self.fetched.queue, "malformed job sent to the dead set: {error}");
        let dead = payload::malformed(&self.fetched.raw, error, &self.fetched.queue, now);
        Write::Dead {
            payload: dead.to_json(),
        }
    }
}

/// One job being worked on.
pub(crate) struct UnitOfWork {
    id: u64,
    job: TypedJob,
    writer: CompletionSender,
    inflight: Arc<InFlightTable>,
}

/// A unit of work registered as in flight, its payload not parsed yet
/// (parsing happens in the job's own task, not in the fetch loop).
pub(crate) struct Registered {
    id: u64,
    fetched: Fetched,
    writer: CompletionSender,
    inflight: Arc<InFlightTable>,
}

impl Registered {
    /// Parses the payload, once.
    pub(crate) fn parse(self) -> UnitOfWork {
        UnitOfWork {
            id: self.id,
            job: TypedJob::parse(self.fetched),
            writer: self.writer,
            inflight: self.inflight,
        }
    }
}

impl UnitOfWork {
    /// Starts the unit for `fetched`: listed in `inflight` at once (so a
    /// reconcile knows it), parsed later by [`Registered::parse`].
    pub(crate) fn start(fetched: Fetched, writer: CompletionSender, inflight: Arc<InFlightTable>) -> Registered {
        let id = inflight.add(fetched.clone(), crate::redis::now_f64());
        Registered {
            id,
            fetched,
            writer,
            inflight,
        }
    }

    /// The job.
    pub(crate) fn job(&self) -> &TypedJob {
        &self.job
    }

    /// Hands the outcome to the writer. The job stays in the in-flight
    /// table (and in Redis's in-progress list) until it is written.
    pub(crate) async fn finish(self, write: Write) {
        self.hand_over(Finish::Outcome(write)).await;
    }

    /// Sends the job back to the front of its queue (through the writer).
    pub(crate) async fn requeue(self) {
        self.hand_over(Finish::Requeue).await;
    }

    async fn hand_over(self, finish: Finish) {
        if !self.inflight.recording(self.id) {
            // Taken out at a shutdown deadline: it is requeued from there.
            return;
        }
        let completion = Completion {
            id: self.id,
            job: self.job.fetched,
            unique: self.job.unique.map(|(lock, _)| lock),
            finish,
        };
        if self.writer.send(completion).await.is_err() {
            tracing::error!("the outcome writer is gone; the job stays in the in-progress list for recovery");
            self.inflight.remove([self.id]);
        }
    }
}
