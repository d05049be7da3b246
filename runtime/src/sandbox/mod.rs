//! The sandbox: where a job's code runs.
//!
//! One Wasmtime [`Engine`](wasmtime::Engine) per process ([`engine`]), one
//! pre-linked `InstancePre` per plugin, and a fresh instance per job
//! ([`Executor`]): instantiate, call `perform`, map the result to an
//! [`Outcome`](crate::job::Outcome), drop the store. Nothing survives from one
//! job to the next, so a job cannot see or corrupt another's memory, and a
//! trap, a runaway loop or a memory bomb ends that job only. A plugin may
//! opt into warm instances that serve several jobs one after another
//! ([`warm`]): then its own jobs share its module state, still never
//! another plugin's, and a trap or timeout still ends that instance. A
//! plugin built for the `async-plugin` world may run several of its jobs
//! at once in one instance ([`concurrent`]), each with its own host state.

pub mod concurrent;
pub mod engine;
pub mod executor;
mod failure;
pub(crate) mod function_cache;
pub mod loaded;
pub mod policy;
pub mod state;
pub mod warm;

pub use engine::{EngineConfig, Limits};
pub use executor::{ExecOptions, Execution, Executor};
pub use loaded::Loaded;
pub use policy::{InstancePolicy, JobLimits};
pub use state::JobState;
