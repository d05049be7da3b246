//! [`AsyncJob`] and [`export_async_job!`](crate::export_async_job): jobs
//! that run several at once in one instance (the `async-plugin` world).

use std::future::Future;

use serde::de::DeserializeOwned;

use crate::bindings::wasmjobs::job::types as wit;
use crate::{JobError, JobInfo};

/// A job class whose jobs may run several at once in one instance.
/// Implement it like [`Job`](crate::Job), with an `async fn perform`, and
/// export it with [`export_async_job!`](crate::export_async_job).
///
/// A [`Job`](crate::Job) gets a fresh instance per job and blocks in its
/// host calls: each job in flight holds an instance (its memory, its
/// tables, the stack the host suspends it on) while it waits. An
/// `AsyncJob` is built for the `async-plugin` world instead: its
/// `perform` is an `async fn`, it awaits [`http::Request::send_async`]
/// and [`sql::query_async`] / [`sql::execute_async`], and with
/// `[instances] concurrent = K` in its `wasmjobs.toml` the host runs up
/// to K of its jobs at once in one instance, switching between them while
/// they wait. A thousand jobs waiting on a server then need a thousand / K
/// instances, and no instance is created or torn down per job.
///
/// ```no_run
/// use wasmjobs_guest::{export_async_job, http, AsyncJob, JobError, JobInfo};
///
/// struct FetchJob;
///
/// impl AsyncJob for FetchJob {
///     type Args = (String,);
///
///     async fn perform(_job: &JobInfo, (url,): Self::Args) -> Result<(), JobError> {
///         http::Request::get(url).send_async().await?.error_for_status()?;
///         Ok(())
///     }
/// }
///
/// export_async_job!(FetchJob);
/// ```
///
/// What the jobs of one instance share, and what they do not:
/// - **Memory and statics.** They run in one address space, as threads of
///   one process do: a `static` cache is seen by all of them. They never
///   share anything with another plugin's jobs.
/// - **Failures.** A job's `Err` is its own. A panic, a trap or a job past
///   its timeout ends the instance, and with it every job running in it:
///   the one at fault fails with its cause, the others are retried with a
///   message naming it.
/// - **What to await.** Await the SDK's host calls, and futures built
///   from them (`join`, `select`). A future that another job of the
///   instance completes (an async channel, mutex or once-cell shared
///   through a static) is not supported: the SDK's runtime cannot wake one
///   job from another, and the instance traps. Likewise a
///   `std::sync::Mutex` guard held across an `.await`.
/// - **Blocking calls.** Only the awaited calls let the other jobs run.
///   `std::fs`, `std::thread::sleep`, the blocking [`http::get`] and
///   [`sql::query`] work, but hold the whole instance while they wait, and
///   `wasi:http` is not offered in this world.
///
/// [`http::Request::send_async`]: crate::http::Request::send_async
/// [`http::get`]: crate::http::get
/// [`sql::query_async`]: crate::sql::query_async
/// [`sql::execute_async`]: crate::sql::execute_async
/// [`sql::query`]: crate::sql::query
pub trait AsyncJob {
    /// The job's arguments, decoded from the JSON array the job was enqueued
    /// with, as for [`Job::Args`](crate::Job::Args).
    type Args: DeserializeOwned;

    /// Run the job; write it as `async fn perform(job: &JobInfo, args:
    /// Self::Args) -> Result<(), JobError>`. Outcomes are as for
    /// [`Job::perform`](crate::Job::perform), except that a panic ends
    /// every job of the instance (the others are retried).
    fn perform(job: &JobInfo, args: Self::Args) -> impl Future<Output = Result<(), JobError>>;
}

/// The body of the exported async `perform` for job `J`; called by the code
/// [`export_async_job!`](crate::export_async_job) generates. Not part of the
/// public API.
#[doc(hidden)]
pub async fn __perform_async<J: AsyncJob>(job: wit::Job) -> Result<(), wit::JobError> {
    let (info, args) = crate::start::<J::Args>(job)?;
    J::perform(&info, args).await.map_err(Into::into)
}

/// Export an [`AsyncJob`] implementation as the plugin's async `perform`
/// (the `async-plugin` world).
///
/// Call it once, at the crate root of a `cdylib` crate:
///
/// ```ignore
/// wasmjobs_guest::export_async_job!(FetchJob);
/// ```
///
/// The component it makes runs only with `[instances] concurrent = K` in
/// the plugin's `wasmjobs.toml` (the host refuses it otherwise, saying so).
/// A crate exports either one [`Job`](crate::Job) or one `AsyncJob`, not
/// both.
#[macro_export]
#[rustfmt::skip] // as export_job!
macro_rules! export_async_job {
    ($job:ty) => {
        const _: () = {
            #[doc(hidden)]
            struct __WasmjobsAsyncExport;

            impl $crate::async_bindings::Guest for __WasmjobsAsyncExport {
                async fn perform(
                    job: $crate::bindings::wasmjobs::job::types::Job,
                ) -> ::core::result::Result<(), $crate::bindings::wasmjobs::job::types::JobError> {
                    $crate::__perform_async::<$job>(job).await
                }
            }

            $crate::async_bindings::__export_async_plugin!(
                __WasmjobsAsyncExport with_types_in $crate::async_bindings
            );
        };
    };
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    struct Greet;

    impl AsyncJob for Greet {
        type Args = (String,);

        async fn perform(job: &JobInfo, (name,): Self::Args) -> Result<(), JobError> {
            match name.as_str() {
                "nobody" => Err(JobError::discard(format!("{} has no one to greet", job.class))),
                _ => Ok(()),
            }
        }
    }

    /// `future`'s output, which must be ready at its first poll (nothing
    /// here awaits the host).
    fn ready<F: Future>(future: F) -> F::Output {
        match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("the job waited on nothing"),
        }
    }

    fn job(args: &str) -> wit::Job {
        wit::Job {
            jid: "0123456789abcdef01234567".into(),
            class: "GreetJob".into(),
            queue: "default".into(),
            args: args.into(),
            retry_count: 0,
            enqueued_at_ms: 0,
        }
    }

    #[test]
    fn args_are_decoded_and_outcomes_mapped_as_for_a_blocking_job() {
        assert!(ready(__perform_async::<Greet>(job(r#"["world"]"#))).is_ok());
        assert!(matches!(
            ready(__perform_async::<Greet>(job(r#"["nobody"]"#))),
            Err(wit::JobError::Discard(m)) if m == "GreetJob has no one to greet"
        ));
        assert!(matches!(
            ready(__perform_async::<Greet>(job("[42]"))),
            Err(wit::JobError::Dead(m)) if m.starts_with("invalid args for GreetJob [42]: expected (String,)")
        ));
    }
}
