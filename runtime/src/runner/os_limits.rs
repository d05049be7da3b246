//! Operating-system limits that high concurrency runs into, checked at
//! start-up so they show up as one clear warning rather than as jobs
//! failing under load.
//!
//! - **Open files.** Every job in flight may hold a socket (an HTTP request,
//!   a database connection) and the runner itself holds Redis connections,
//!   so `--concurrency 10000` needs well over 10,000 descriptors.
//!   Distributions ship a soft limit of 1,024 and a much higher hard limit;
//!   like most servers (nginx, PostgreSQL, Redis itself) the runner raises
//!   its soft limit to the hard one.
//! - **Memory mappings.** Each instance in flight splits its pool slots into
//!   about six mappings (linear memory around its copy-on-write image, the
//!   fiber stack and its guard page): 10,000 jobs in flight made ~60,000,
//!   and Linux refuses new mappings past `vm.max_map_count` (65,530 by
//!   default), which would make instantiation fail. A job of a concurrent
//!   plugin (`[instances] concurrent`) adds two while it waits (Wasmtime
//!   keeps a fiber stack and its guard page per waiting guest task), within
//!   the same allowance.

/// Descriptors the runner keeps for itself: Redis connections, the plugin
/// directory, log files, the compile cache.
const RESERVED: u64 = 256;

/// Memory mappings one job in flight may add, measured (see module docs)
/// with some room.
const MAPPINGS_PER_JOB: u64 = 8;
/// Mappings the process has without any job: binary, libraries, heaps,
/// the pools' reservations.
const MAPPINGS_BASE: u64 = 2_000;

/// Checks every limit for `concurrency` jobs in flight: raises the open-file
/// limit, warns about what it cannot fix.
pub fn prepare_for(concurrency: u32) {
    raise_open_files(concurrency);
    check_map_count(concurrency);
}

/// Warns if `vm.max_map_count` is too low for `concurrency` instances.
pub fn check_map_count(concurrency: u32) {
    let Some(max) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return;
    };
    if let Some(warning) = map_count_warning(concurrency, max) {
        tracing::warn!(max_map_count = max, needed = mappings_needed(concurrency), "{warning}");
    }
}

/// What to tell the user when `max` (`vm.max_map_count`) is below what
/// `concurrency` jobs in flight may need.
fn map_count_warning(concurrency: u32, max: u64) -> Option<String> {
    let needed = mappings_needed(concurrency);
    (max < needed).then(|| {
        format!(
            "vm.max_map_count is below what {concurrency} jobs in flight may need; raise it \
             (`sysctl -w vm.max_map_count={needed}`) or instantiations may fail when the runner is busy"
        )
    })
}

/// Memory mappings `concurrency` instances in flight may need.
fn mappings_needed(concurrency: u32) -> u64 {
    MAPPINGS_BASE + u64::from(concurrency) * MAPPINGS_PER_JOB
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new
/// soft limit; warns if it is below what `concurrency` jobs may need.
pub fn raise_open_files(concurrency: u32) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // `None` is no limit.
    let limit = getrlimit(Resource::Nofile);
    let mut soft = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if soft < hard {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => soft = hard,
            Err(err) => tracing::warn!("cannot raise the open-file limit: {err}"),
        }
    }
    let needed = u64::from(concurrency) + RESERVED;
    if soft < needed {
        tracing::warn!(
            limit = soft,
            needed,
            "the open-file limit is below what {concurrency} concurrent jobs may need; raise it \
             (`ulimit -n`, LimitNOFILE= in a systemd unit) or jobs may fail with \"too many open files\""
        );
    }
    soft
}

#[cfg(test)]
mod tests {
    #[test]
    fn ten_thousand_jobs_need_more_than_the_default_map_count() {
        assert!(super::mappings_needed(10_000) > 65_530);
        assert!(super::mappings_needed(100) < 65_530);
    }

    #[test]
    fn the_map_count_warning_says_what_to_run() {
        assert_eq!(super::map_count_warning(100, 65_530), None);
        let warning = super::map_count_warning(10_000, 65_530).expect("a warning");
        assert!(
            warning.contains("raise it (`sysctl -w vm.max_map_count=82000`) or"),
            "{warning}"
        );
        assert!(!warning.contains("  "), "{warning:?}");
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let soft = super::raise_open_files(1);
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(Some(soft), limit.current.or(Some(u64::MAX)));
        assert_eq!(limit.current, limit.maximum);
    }
}
