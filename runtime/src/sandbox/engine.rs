//! The Wasmtime engine configuration.
//!
//! Choices and why (figures from `docs/executor.md`):
//! - **Pooling allocator** sized from the job concurrency: instance, memory,
//!   table and fiber-stack slots are reserved up front and reused, which
//!   makes instantiation a few microseconds instead of a round of `mmap`s.
//!   The pages a job dirtied are reset in place between uses (see
//!   [`KEEP_RESIDENT`]) so the next job does not page-fault its way through
//!   its run.
//! - **Copy-on-write memory images**: a guest's data segments are mapped,
//!   not copied, on every instantiation.
//! - **Epoch interruption**: a ticker bumps the epoch every [`TICK`]; a
//!   running guest yields to the async runtime at each tick (so a CPU-bound
//!   guest cannot starve IO-bound ones) and the job's timeout can fire.
//! - **Fuel only where asked for**: fuel counts instructions but costs
//!   10–25% of guest speed, and it is compiled into the code. So the
//!   engine every plugin runs on ([`build`]) never meters fuel, whatever
//!   the command or its flags; plugins that set `limits.fuel` (allowed by
//!   `--fuel`) get a second, metered engine ([`build_metered`]) and a
//!   compiled variant of their own. Every command (`plugins`, `exec`,
//!   `run`) thus compiles a component to the same artifact, which the
//!   compile cache shares between them (see `plugin::cache`).
//! - `concurrency_support` (component-model async) only where asked for:
//!   it costs ~40% of the instantiation rate and slows every call, and a
//!   WASI p2 guest gains nothing from it (its host calls are async on the
//!   host side only). Plugins with `[instances] concurrent = K` run
//!   several jobs at once in one instance, which needs it, so they get a
//!   third engine ([`build_concurrent`]) and a compiled variant of their
//!   own; the other engines switch it off explicitly (the Cargo feature
//!   would otherwise turn it on for all).

use std::time::Duration;

use crate::host::http::HttpLimits;
use anyhow::Result;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the granularity of timeouts and of
/// cooperative yielding for CPU-bound guests.
pub const TICK: Duration = Duration::from_millis(10);

/// Per-job limits enforced by the host.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most linear memory one instance may grow to, in bytes.
    pub memory: usize,
    /// Wall-clock bound on one job, instantiation included.
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: 128 << 20,
            timeout: Duration::from_secs(300),
        }
    }
}

/// What the engine is sized for.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Most jobs executing at once; sizes the instance pool.
    pub concurrency: u32,
    /// Default per-job limits (plugins may override them).
    pub limits: Limits,
    /// Allow plugins with `limits.fuel`: they run on a metered engine of
    /// their own ([`build_metered`]; 10–25% slower), the others are not
    /// affected.
    pub fuel: bool,
    /// Bounds on the guests' outgoing HTTP.
    pub http: HttpLimits,
    /// Default `limits.disk`: bytes a plugin's read-write directories may
    /// hold, all its jobs together.
    pub disk: u64,
    /// Bytes of each linear memory reset in place between jobs rather than
    /// returned to the kernel ([`KEEP_RESIDENT`] by default; see
    /// [`pagemap_scan_for`]). Raising it to the memory an interpreter
    /// dirties per instance (16 MiB for Python and JS) makes their fresh
    /// instances 1.6–1.7× faster and Rust guests 0.6× as fast (their whole
    /// memory is copied back), so it is for processes that run interpreter
    /// plugins on their own.
    pub keep_resident: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            concurrency: 100,
            limits: Limits::default(),
            fuel: false,
            http: HttpLimits::default(),
            disk: crate::host::disk::DEFAULT_DISK,
            keep_resident: KEEP_RESIDENT,
        }
    }
}

/// The largest linear memory a pool slot holds: all of wasm32's 4 GiB, as
/// Wasmtime reserves that much address space per slot anyway. Per-job
/// limits are enforced below it by the store's limiter.
pub(crate) const MAX_MEMORY: usize = 4 << 30;

/// Bytes of each memory slot reset in place (instead of `madvise`d away)
/// between uses. With `PAGEMAP_SCAN` (Linux ≥ 6.7) only the pages the guest
/// dirtied are reset, wherever they are, up to this budget; that removed ~4
/// page faults and a TLB shootdown per job (NoopJob 43k/s → 128k/s on one
/// core). Kept small because those pages stay resident per pool slot, which
/// is what RSS looks like after a burst at high concurrency.
pub(crate) const KEEP_RESIDENT: usize = 64 << 10;
/// Above this `keep_resident`, dirty pages are found without
/// `PAGEMAP_SCAN`: see [`pagemap_scan_for`].
const PAGEMAP_SCAN_UP_TO: usize = 1 << 20;

/// Whether to find the dirty pages to reset with `PAGEMAP_SCAN` for a
/// `keep_resident` budget. For a small budget, yes: a Rust guest dirties a
/// few scattered pages, and the scan resets just those. Wasmtime's scan
/// stops at its 32nd dirty region, though, and the ~8 MB a Python
/// instance dirties lie in more regions than that, so the rest is
/// decommitted and faulted in again by the next job: with a
/// 16 MiB budget, PyNoopJob ran at 450–474 jobs/s with the scan and
/// 737–782 without it (the whole budget reset by copying from the image),
/// against 392–435 with the default (`docs/polyglot.md`).
pub(crate) fn pagemap_scan_for(keep_resident: usize) -> Enabled {
    if keep_resident <= PAGEMAP_SCAN_UP_TO {
        Enabled::Auto
    } else {
        Enabled::No
    }
}
/// Most core modules instantiated by one component. Rust guests use 3–4
/// (the program plus wit-component's shims); interpreters for other
/// languages use more (a componentize-py guest: CPython and its libraries
/// linked as ~12 shared objects). The pool's total is this times the
/// slots: for core instances it is only a counter (no memory is reserved
/// per core instance), and with 6 per slot 1,000 Python jobs at once ran
/// out ("maximum concurrent limit ... for core instances reached").
const CORE_INSTANCES_PER_COMPONENT: u32 = 50;
/// Linear memories one pool slot holds: the pool reserves this many per
/// slot in all, so a component needing more would take other jobs' share
/// and make their instantiation fail; with the per-component maximum set to
/// the same figure, Wasmtime refuses such a component when it is compiled
/// or loaded from the cache ("The component transitively contains 3 Wasm
/// linear memories, which exceeds the configured maximum of 2"), so the
/// plugin is refused at load with that reason. Every guest in this repository has 1, Rust,
/// componentize-py and componentize-js alike (`Component::resources_required`).
pub(crate) const MEMORIES_PER_SLOT: u32 = 2;
/// Tables one pool slot holds (see [`MEMORIES_PER_SLOT`]). Every guest in
/// this repository has 2.
pub(crate) const TABLES_PER_SLOT: u32 = 4;

/// Builds the process-wide engine every plugin runs on, unless it asks for
/// fuel. Nothing in `config` changes the compiled code: the pool sizes and
/// per-job limits are enforced at run time, so a component compiled by
/// `wasmjobs plugins` (concurrency 1) is the artifact `run -c 10000` loads.
pub fn build(config: &EngineConfig) -> Result<Engine> {
    // Running jobs, plus the idle warm instances of plugins that reuse
    // theirs (each holds its slots while idle), plus a margin.
    let slots = config
        .concurrency
        .max(1)
        .saturating_add(warm_budget(config.concurrency))
        .saturating_add(16);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(slots.saturating_mul(MEMORIES_PER_SLOT))
        .total_tables(slots.saturating_mul(TABLES_PER_SLOT))
        .total_stacks(slots)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_SLOT)
        .max_tables_per_component(TABLES_PER_SLOT)
        .max_memory_size(MAX_MEMORY)
        .pagemap_scan(pagemap_scan_for(config.keep_resident))
        .linear_memory_keep_resident(config.keep_resident)
        .table_keep_resident(KEEP_RESIDENT)
        .async_stack_keep_resident(KEEP_RESIDENT);

    let mut wasm = common()?;
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&wasm).map_err(anyhow::Error::from)
}

/// Most pool slots one engine reserves: each takes ~8.06 GiB of address
/// space (the 4 GiB memory plus guards, tables, stack), and the whole pool
/// is one mapping, which must fit the largest free hole of a process's
/// 128 TiB, the ~85 TiB below the executable. 10,016 slots (78 TiB)
/// mapped; 11,040 (87 TiB) did not.
const MAX_POOL_SLOTS: u32 = 10_160;

/// Most idle warm instances (`[instances] reuse`) one process keeps, over
/// every plugin: as many as it runs jobs at once, at most 1,024, and no
/// more than the slots left under [`MAX_POOL_SLOTS`] beside the running
/// jobs (at `-c 10000`: 144).
pub(crate) fn warm_budget(concurrency: u32) -> u32 {
    let left = MAX_POOL_SLOTS.saturating_sub(concurrency.max(1).saturating_add(16));
    concurrency.clamp(1, 1024).min(left)
}

/// Builds the engine for plugins that set `limits.fuel`: the same settings
/// plus fuel metering. It allocates instances on demand rather than from a
/// pool of its own: a second pool would reserve as much address space
/// again (tens of TiB at `-c 10000`) for the few plugins that meter fuel.
pub fn build_metered() -> Result<Engine> {
    let mut wasm = common()?;
    wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .consume_fuel(true);
    Engine::new(&wasm).map_err(anyhow::Error::from)
}

/// The engine for plugins that run several jobs at once in one instance
/// (`[instances] concurrent`): component-model async on, and instances
/// allocated on demand. Such a plugin has few instances, each serving many
/// jobs, so a pool of slots reserved up front would mostly lie idle, and a
/// second pool sized for the runner's concurrency would reserve as much
/// address space again as the first.
pub fn build_concurrent() -> Result<Engine> {
    let mut wasm = common()?;
    wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .concurrency_support(true)
        .wasm_component_model_async(true);
    Engine::new(&wasm).map_err(anyhow::Error::from)
}

/// The settings every engine shares, including the incremental
/// compilation cache (inert outside a compile session of the compile
/// cache; see [`function_cache`](super::function_cache)). Turning that on
/// leaves `precompile_compatibility_hash` and the code as they are.
fn common() -> Result<Config> {
    let mut wasm = Config::new();
    wasm.wasm_component_model(true)
        .concurrency_support(false)
        .memory_init_cow(true)
        .epoch_interruption(true);
    wasm.enable_incremental_compilation(super::function_cache::store())?;
    Ok(wasm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool reserves ~8 GiB of address space per slot; at `-c 10000`
    /// the idle warm instances' share must not push it past what the
    /// process can reserve (87 TiB failed, 78 TiB worked).
    #[test]
    fn ten_thousand_jobs_in_flight_still_get_an_engine() {
        if let Err(err) = build(&EngineConfig {
            concurrency: 10_000,
            ..EngineConfig::default()
        }) {
            panic!("{err:#}");
        }
    }

    #[test]
    fn the_warm_budget_fits_beside_the_running_jobs() {
        assert_eq!(warm_budget(100), 100);
        assert_eq!(warm_budget(5_000), 1_024);
        assert_eq!(warm_budget(10_000), 144);
        assert_eq!(warm_budget(100_000), 0);
    }

    #[test]
    fn large_keep_resident_budgets_copy_rather_than_scan() {
        assert_eq!(pagemap_scan_for(KEEP_RESIDENT), Enabled::Auto);
        assert_eq!(pagemap_scan_for(16 << 20), Enabled::No);
        assert!(
            build(&EngineConfig {
                concurrency: 2,
                keep_resident: 16 << 20,
                ..EngineConfig::default()
            })
            .is_ok()
        );
    }
}
