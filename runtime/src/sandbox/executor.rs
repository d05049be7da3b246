//! The executor: runs one job in a fresh, limited instance of its plugin.
//!
//! For each job: take a slot, build the store state, instantiate the
//! plugin's pre-linked component, call `perform` asynchronously, map what
//! came back to an [`Outcome`], drop the store. A plugin with
//! `[instances] reuse = N` instead takes a warm instance when one is idle,
//! readies its per-job state, and puts it back after a clean return
//! ([`super::warm`] has the rules). Guest code waiting on a host
//! call (HTTP, a clock sleep) is a suspended fiber, not a blocked thread, so
//! thousands of jobs wait concurrently on a couple of threads.
//!
//! Failures are contained and explained:
//! - an error returned by the guest maps to retry / discard / dead as it asked;
//! - a trap (panic, `unreachable`, out-of-bounds access, stack overflow) is a
//!   retryable failure whose message carries the trap and the tail of the
//!   guest's stderr (where a Rust panic message lands);
//! - growing memory past the limit traps with "memory limit … exceeded";
//! - running past the timeout is a retryable "timed out" failure.
//!
//! A plugin with `[instances] concurrent = K` (built for the `async-plugin`
//! world) runs instead on an instance that runs up to K jobs at once
//! ([`super::concurrent`] has that path and its rules).
//!
//! Three engines at most: the one every plugin compiles for, with
//! `--fuel` a metered one for the plugins that set `limits.fuel`, and one
//! with component-model async for concurrent plugins
//! ([`engine`](super::engine) says why). A plugin's pre-linked component
//! knows its engine, and each job's store is made on that one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::Semaphore;
use tracing::Instrument;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, WasmBacktrace};

use super::concurrent::{Finished, LaneSpec};
use super::engine::{self, EngineConfig, Limits, TICK};
use super::failure::{Occupancy, describe_trap, with_files_note, with_notes};
use super::loaded::{Loaded, Prepared};
use super::state::JobState;
use super::warm::{Instances, Warm};
use crate::bindings::concurrent::{AsyncPluginPre, WORLD as ASYNC_WORLD};
use crate::bindings::{PluginPre, WORLD};
use crate::host::JobScope;
use crate::host::activejob::ActiveJobView;
use crate::host::http::{HttpClient, HttpLimits, HttpPolicy};
use crate::host::log::{JobLabels, LogLine, LogSink};
use crate::host::sql::{Databases, SqlView};
use crate::job::{Job, Outcome};
use crate::otel::JobTrace;

/// How a plugin becomes an async-plugin component, for the errors that
/// refuse a `concurrent` plugin built for the other world.
const HOW_ASYNC: &str = "in Rust, implement AsyncJob and export it with export_async_job!; in Python, make perform an `async def`; `wasmjobs build` builds Python for the world the manifest asks for";

/// What a component exports as `perform`.
enum Perform {
    /// An `async func`.
    Async,
    /// A blocking `func`.
    Blocking,
    /// Nothing, or something that is not a function.
    Missing,
}

/// What `component` exports as `perform`.
fn perform_kind(component: &Component) -> Perform {
    use wasmtime::component::types::{ComponentExtern, ComponentItem};
    match component.component_type().get_export(component.engine(), "perform") {
        Some(ComponentExtern {
            ty: ComponentItem::ComponentFunc(perform),
            ..
        }) if perform.async_() => Perform::Async,
        Some(ComponentExtern {
            ty: ComponentItem::ComponentFunc(_),
            ..
        }) => Perform::Blocking,
        _ => Perform::Missing,
    }
}

/// How to run one job.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// Keep the job's log lines in [`Execution::logs`] (they always go to
    /// `tracing` as well).
    pub capture_logs: bool,
}

/// What happened when a job ran.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The decision: ack, retry, discard or dead.
    pub outcome: Outcome,
    /// Wall time from instantiation to the end of `perform`.
    pub duration: Duration,
    /// The guest's log lines, if captured.
    pub logs: Vec<LogLine>,
    /// The guest's wasm backtrace, for a trap.
    pub backtrace: Option<String>,
    /// The version of the plugin that ran the job.
    pub plugin_version: Arc<str>,
}

/// An engine and the host capabilities linked for it.
struct Variant {
    engine: Engine,
    linker: Linker<JobState>,
}

impl Variant {
    fn new(engine: Engine) -> Result<Self> {
        let linker = crate::host::link(&engine).context("cannot link host capabilities")?;
        Ok(Self { engine, linker })
    }
}

/// Runs jobs. One per process, shared by every worker.
pub struct Executor {
    /// What every plugin not metering fuel compiles for and runs on.
    plain: Variant,
    /// With fuel metering, for plugins that set `limits.fuel`; only when
    /// the executor allows fuel.
    metered: Option<Variant>,
    /// With component-model async, for `[instances] concurrent` plugins.
    concurrent: Variant,
    limits: Limits,
    disk: u64,
    http: Arc<HttpClient>,
    databases: Arc<Databases>,
    slots: Arc<Semaphore>,
    concurrency: usize,
    ticker: EpochTicker,
    /// Instance counters and the process's budget of idle warm instances.
    instances: Arc<Instances>,
    /// Secrets no plugin's `env` grant may pass on (see `plugin::caps`).
    protected_env: crate::redact::Secrets,
}

impl Executor {
    /// An executor sized for `config.concurrency` jobs at once.
    pub fn new(config: &EngineConfig) -> Result<Self> {
        let plain = Variant::new(engine::build(config).context("cannot configure the Wasmtime engine")?)?;
        let metered = match config.fuel {
            true => Some(Variant::new(
                engine::build_metered().context("cannot configure the fuel-metering Wasmtime engine")?,
            )?),
            false => None,
        };
        let concurrent_engine =
            engine::build_concurrent().context("cannot configure the Wasmtime engine for concurrent instances")?;
        let concurrent = Variant {
            linker: crate::host::link_concurrent(&concurrent_engine)
                .context("cannot link host capabilities for concurrent instances")?,
            engine: concurrent_engine,
        };
        let engines = std::iter::once(&plain)
            .chain(&metered)
            .chain(std::iter::once(&concurrent))
            .map(|variant| variant.engine.clone())
            .collect();
        let ticker = EpochTicker::start(engines)?;
        Ok(Self {
            plain,
            metered,
            concurrent,
            limits: config.limits,
            disk: config.disk,
            http: Arc::new(HttpClient::new(HttpLimits {
                // Every job in flight may hold a connection to the same host:
                // keeping fewer idle would close (and later reopen) the rest
                // after each burst, ~3 new connections per job at 10,000.
                idle_per_host: config.http.idle_per_host.max(config.concurrency as usize),
                ..config.http
            })),
            databases: Databases::empty(),
            slots: Arc::new(Semaphore::new(config.concurrency.max(1) as usize)),
            concurrency: config.concurrency.max(1) as usize,
            ticker,
            instances: Arc::new(Instances::new(engine::warm_budget(config.concurrency) as usize)),
            protected_env: crate::redact::Secrets::default(),
        })
    }

    /// The same executor with the runner's SQL databases (`--db`); without
    /// this it has none. Shared by every job, so pools live as long as the
    /// executor.
    pub fn with_databases(mut self, databases: Arc<Databases>) -> Self {
        self.databases = databases;
        self
    }

    /// The same executor protecting `secrets` (the runner's Redis and
    /// database URLs and their passwords): a plugin whose `env` grants a
    /// variable holding one of them is refused at load. Set it before
    /// loading plugins.
    pub fn protect_env(mut self, secrets: crate::redact::Secrets) -> Self {
        self.protected_env = secrets;
        self
    }

    /// The secrets set by [`Executor::protect_env`].
    pub fn protected_env(&self) -> &crate::redact::Secrets {
        &self.protected_env
    }

    /// Instances alive now: one per job between taking an executor slot
    /// and dropping its store, except that the jobs of concurrent plugins
    /// count their instances instead.
    pub fn live_instances(&self) -> usize {
        let jobs = self.concurrency - self.slots.available_permits();
        jobs.saturating_sub(self.instances.concurrent_jobs.load(Ordering::Relaxed)) + self.instances.concurrent()
    }

    /// Instances created, jobs served by warm instances, idle warm
    /// instances now and those dropped for idleness.
    pub fn instances(&self) -> &Instances {
        &self.instances
    }

    /// The engine components are compiled for (unless they meter fuel).
    pub fn engine(&self) -> &Engine {
        &self.plain.engine
    }

    /// The engine a plugin compiles for: the concurrent one if it sets
    /// `[instances] concurrent`, the metered one if it sets `limits.fuel`
    /// (`None` if this executor allows no fuel), the plain one otherwise.
    pub fn engine_for(&self, fuel: bool, concurrent: bool) -> Option<&Engine> {
        match (concurrent, fuel) {
            (true, _) => Some(&self.concurrent.engine),
            (false, false) => Some(&self.plain.engine),
            (false, true) => self.metered.as_ref().map(|variant| &variant.engine),
        }
    }

    /// Whether `engine` is the fuel-metering one.
    fn is_metered(&self, engine: &Engine) -> bool {
        self.metered
            .as_ref()
            .is_some_and(|variant| Engine::same(&variant.engine, engine))
    }

    /// The default per-job limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The default `limits.disk` in bytes.
    pub fn disk(&self) -> u64 {
        self.disk
    }

    /// Whether plugins with `limits.fuel` may load (`--fuel`).
    pub fn fuel(&self) -> bool {
        self.metered.is_some()
    }

    /// Links `component` against the host's imports and checks that it
    /// exports the job world's `perform`: the "WIT world check".
    /// `component` must have been compiled for one of [`Executor::engine_for`].
    pub(crate) fn prepare(&self, component: &Component) -> Result<Prepared> {
        if Engine::same(&self.concurrent.engine, component.engine()) {
            // Wasmtime links a blocking `perform` where the world has an
            // async one (the types match but for the flag): such a plugin
            // would run its K jobs one after another in one shared
            // instance, never concurrently, so it is refused here.
            match perform_kind(component) {
                Perform::Async => {}
                Perform::Blocking => bail!(
                    "[instances] concurrent needs a component of the {ASYNC_WORLD} world, whose perform is an `async func`, and this one's perform is a blocking `func` ({HOW_ASYNC})"
                ),
                Perform::Missing => bail!(
                    "[instances] concurrent needs a component of the {ASYNC_WORLD} world, and this one exports no `perform` function"
                ),
            }
            let pre = self.concurrent.linker.instantiate_pre(component).map_err(anyhow::Error::from).with_context(|| {
                format!(
                    "[instances] concurrent needs a component of the {ASYNC_WORLD} world, and this one imports something that world does not offer (it has no wasi:http: async-http replaces it)"
                )
            })?;
            return AsyncPluginPre::new(pre)
                .map(Prepared::Concurrent)
                .map_err(anyhow::Error::from)
                .with_context(|| {
                    format!(
                        "[instances] concurrent needs a component of the {ASYNC_WORLD} world, and this one's perform does not take and return what that world's does"
                    )
                });
        }
        let variant = match &self.metered {
            Some(metered) if Engine::same(&metered.engine, component.engine()) => metered,
            _ => &self.plain,
        };
        let pre = variant
            .linker
            .instantiate_pre(component)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("not a wasmjobs plugin: it imports something the {WORLD} world does not offer"))?;
        PluginPre::new(pre)
            .map(Prepared::Serial)
            .map_err(anyhow::Error::from)
            .with_context(|| {
                format!(
                    "not a wasmjobs plugin: it does not implement the {WORLD} world (a component of the {ASYNC_WORLD} world needs [instances] concurrent in its manifest)"
                )
            })
    }

    /// Runs `job` on a fresh instance of `plugin`. Never fails: every
    /// problem is an [`Outcome`].
    pub async fn execute(&self, plugin: &Loaded, job: &Job, options: &ExecOptions) -> Execution {
        self.execute_traced(plugin, job, options, None).await
    }

    /// [`Executor::execute`], with the job's trace context: its host
    /// calls (HTTP requests, SQL statements, file opens) get child spans,
    /// and its HTTP requests carry a `traceparent` (see `crate::otel`).
    pub(crate) async fn execute_traced(
        &self,
        plugin: &Loaded,
        job: &Job,
        options: &ExecOptions,
        trace: Option<JobTrace>,
    ) -> Execution {
        // Debug level: see the module docs of `host::log` for why every
        // line carries the job's labels itself instead.
        let span = tracing::debug_span!("job", jid = %job.jid, class = %job.class, plugin = %plugin.name, version = %plugin.version);
        self.execute_in_span(plugin, job, options, trace).instrument(span).await
    }

    async fn execute_in_span(
        &self,
        plugin: &Loaded,
        job: &Job,
        options: &ExecOptions,
        trace: Option<JobTrace>,
    ) -> Execution {
        let _slot = self.slots.acquire().await;
        let _running = self.ticker.enter();
        let started = Instant::now();
        let labels = JobLabels {
            jid: job.jid.clone(),
            class: job.class.clone(),
            plugin: plugin.name.clone(),
            version: plugin.version.clone(),
        };
        let budget = plugin.grants.log;
        let policy = plugin.instances;
        let pre = match &plugin.pre {
            Prepared::Serial(pre) => pre,
            Prepared::Concurrent(pre) => {
                let sink = LogSink::new(labels, options.capture_logs, budget);
                return self.execute_concurrent(plugin, pre, job, sink, started, trace).await;
            }
        };
        let warm = match policy.reuses() {
            true => plugin.warm.take(&policy, &self.instances),
            false => None,
        };
        let sink = match &warm {
            Some(warm) => {
                let sink = warm.store.data().log.clone();
                sink.restart(labels, options.capture_logs, budget);
                sink
            }
            None => LogSink::new(labels, options.capture_logs, budget),
        };
        let done = |outcome: Outcome, backtrace: Option<String>| {
            // The job's output ends here: report lines past its log budget.
            sink.finish();
            Execution {
                outcome,
                duration: started.elapsed(),
                logs: sink.lines(),
                backtrace,
                plugin_version: plugin.version.clone(),
            }
        };

        let memory = plugin.limits.memory.unwrap_or(self.limits.memory);
        let timeout = plugin.limits.timeout.unwrap_or(self.limits.timeout);
        let http = self.http_policy(plugin, &sink).with_trace(trace.clone());
        let recorded = trace.and_then(JobTrace::recording);
        let (mut store, exports, served) = match warm {
            Some(mut warm) => {
                let state = warm.store.data_mut();
                state.next_job(&plugin.grants, http, &self.databases);
                state.set_trace(recorded);
                state.activejob = ActiveJobView::new(job.activejob.clone());
                (warm.store, Some(warm.exports), warm.served)
            }
            None => match JobState::new(&plugin.grants, sink.clone(), memory, http, &self.databases) {
                Ok(mut state) => {
                    state.set_trace(recorded);
                    state.activejob = ActiveJobView::new(job.activejob.clone());
                    let mut store = Store::new(pre.engine(), state);
                    store.limiter(|state| &mut state.limiter);
                    store.epoch_deadline_async_yield_and_update(1);
                    (store, None, 0)
                }
                Err(err) => return done(Outcome::Retry(format!("cannot prepare the sandbox: {err:#}")), None),
            },
        };
        store.set_epoch_deadline(1);
        if self.is_metered(pre.engine()) {
            let fuel = plugin.limits.fuel.unwrap_or(u64::MAX);
            if let Err(err) = store.set_fuel(fuel) {
                return done(Outcome::Retry(format!("cannot set the fuel budget: {err}")), None);
            }
        }

        let wit_job = job.to_wit();
        let run = async {
            let exports = match exports {
                Some(exports) => exports,
                None => {
                    self.instances.created.fetch_add(1, Ordering::Relaxed);
                    pre.instantiate_async(&mut store).await?
                }
            };
            let returned = exports.call_perform(&mut store, &wit_job).await?;
            Ok::<_, wasmtime::Error>((exports, returned))
        };
        let result = tokio::time::timeout(timeout, run).await;
        // Only an instance whose `perform` returned may serve another job.
        let (execution, clean) = match result {
            Err(_) => (done(Outcome::Retry(format!("timed out after {timeout:?}")), None), None),
            Ok(Ok((exports, Ok(())))) => (done(Outcome::Success, None), Some(exports)),
            Ok(Ok((exports, Err(job_error)))) => (
                done(with_notes(job_error.into(), store.data(), &plugin.grants.files), None),
                Some(exports),
            ),
            Ok(Err(err)) => {
                let backtrace = err.downcast_ref::<WasmBacktrace>().map(|bt| bt.to_string());
                (done(Outcome::Retry(describe_trap(&err, store.data())), backtrace), None)
            }
        };
        if let Some(exports) = clean
            && served + 1 < policy.reuse
            && store.data().limiter.refused.is_none()
        {
            let warm = Warm {
                store,
                exports,
                served: served + 1,
            };
            plugin.warm.put(warm, &policy, &self.instances);
        }
        log_end(plugin, job, &execution);
        execution
    }
}

impl Executor {
    /// An HTTP policy for one job (or instance) of `plugin`, logging to `sink`.
    fn http_policy(&self, plugin: &Loaded, sink: &LogSink) -> HttpPolicy {
        HttpPolicy::new(
            self.http.clone(),
            plugin.grants.http_pools.clone(),
            plugin.grants.http_allow.clone(),
            plugin.grants.http_stats.clone(),
            sink.clone(),
        )
    }

    /// Runs `job` on one of `plugin`'s concurrent instances
    /// ([`super::concurrent`]), starting one if none has room.
    async fn execute_concurrent(
        &self,
        plugin: &Loaded,
        pre: &AsyncPluginPre<JobState>,
        job: &Job,
        sink: LogSink,
        started: Instant,
        trace: Option<JobTrace>,
    ) -> Execution {
        let policy = plugin.instances;
        let (concurrent, reuse) = (policy.concurrent.unwrap_or(1).max(1) as usize, policy.reuse.max(1));
        let timeout = plugin.limits.timeout.unwrap_or(self.limits.timeout);
        let scope = JobScope {
            log: sink.clone(),
            http: self.http_policy(plugin, &sink).with_trace(trace.clone()),
            sql: SqlView::new(self.databases.clone(), &plugin.grants).with_trace(trace.and_then(JobTrace::recording)),
            activejob: ActiveJobView::new(job.activejob.clone()),
        };
        let spawn = || {
            let memory = plugin.limits.memory.unwrap_or(self.limits.memory);
            // The instance's own sink: the guest's stdout and stderr, and
            // log lines from outside any job.
            let labels = JobLabels {
                jid: String::new(),
                class: String::new(),
                plugin: plugin.name.clone(),
                version: plugin.version.clone(),
            };
            let instance_sink = LogSink::new(labels, false, plugin.grants.log);
            let http = self.http_policy(plugin, &instance_sink);
            let state = JobState::new(&plugin.grants, instance_sink, memory, http, &self.databases)
                .map_err(|err| format!("cannot prepare the sandbox: {err:#}"))?;
            self.instances.created.fetch_add(1, Ordering::Relaxed);
            Ok(LaneSpec {
                counters: self.instances.clone(),
                pre: pre.clone(),
                state,
                concurrent,
                reuse,
                idle_timeout: policy.idle_timeout,
            })
        };
        let _occupied = Occupancy::new(&self.instances.concurrent_jobs);
        let (finished, reused) = plugin
            .lanes
            .run(job.to_wit(), scope, timeout, concurrent, reuse, spawn)
            .await;
        if reused {
            self.instances.reused.fetch_add(1, Ordering::Relaxed);
        }
        let (outcome, backtrace) = match finished {
            Finished::Returned(Ok(())) => (Outcome::Success, None),
            Finished::Returned(Err(job_error)) => (with_files_note(job_error.into(), &plugin.grants.files), None),
            Finished::Ended { message, backtrace } => (Outcome::Retry(message), backtrace),
        };
        sink.finish();
        let execution = Execution {
            outcome,
            duration: started.elapsed(),
            logs: sink.lines(),
            backtrace,
            plugin_version: plugin.version.clone(),
        };
        log_end(plugin, job, &execution);
        execution
    }
}

/// The job's last line in the host's log: debug for a success, a warning
/// naming the job for a failure.
fn log_end(plugin: &Loaded, job: &Job, execution: &Execution) {
    match &execution.outcome {
        Outcome::Success => tracing::debug!(elapsed_us = execution.duration.as_micros() as u64, "job done"),
        failed => tracing::warn!(
            jid = %job.jid,
            class = %job.class,
            plugin = %plugin.name,
            version = %plugin.version,
            elapsed_us = execution.duration.as_micros() as u64,
            "job failed: {failed}"
        ),
    }
}

/// Advances the engines' epoch every [`TICK`] while any job runs, and sleeps
/// (parked, no wake-ups) while none does, so an idle process costs no CPU.
struct EpochTicker {
    shared: Arc<TickerShared>,
    thread: Option<JoinHandle<()>>,
}

struct TickerShared {
    running: AtomicUsize,
    stop: AtomicBool,
}

/// Marks one job as running for the ticker; dropping it unmarks.
struct Running<'a>(&'a TickerShared);

impl EpochTicker {
    fn start(engines: Vec<Engine>) -> Result<Self> {
        let shared = Arc::new(TickerShared {
            running: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("wasmjobs-epoch".into())
            .spawn(move || {
                while !state.stop.load(Ordering::Acquire) {
                    if state.running.load(Ordering::Acquire) == 0 {
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })
            .context("cannot start the epoch ticker thread")?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    fn enter(&self) -> Running<'_> {
        if self.shared.running.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(thread) = &self.thread
        {
            thread.thread().unpark();
        }
        Running(&self.shared)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
