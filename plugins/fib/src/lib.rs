//! `FibJob`: a CPU-only job, the naive recursive Fibonacci used by the
//! Sidekiq/Jiggler benchmarks (`fib(25)` takes a few milliseconds).

use wasmjobs_guest::{Job, JobError, JobInfo, export_job, log};

/// `FibJob.perform_async(n)`: computes `fib(n)` and logs
/// `fib(n) = value` at info level.
pub struct FibJob;

impl Job for FibJob {
    type Args = (u32,);

    fn perform(_job: &JobInfo, (n,): Self::Args) -> Result<(), JobError> {
        log::info!("fib({n}) = {}", fib(n));
        Ok(())
    }
}

/// `fib(n) = 1 if n <= 1 else fib(n - 1) + fib(n - 2)`, exactly as in the
/// benchmark: deliberately exponential (no memoisation, no loop) because the
/// job exists to burn CPU. `#[inline(never)]` keeps the recursion a real call
/// chain. Wraps around on overflow (n > 91) rather than panicking.
#[inline(never)]
pub fn fib(n: u32) -> u64 {
    if n <= 1 { 1 } else { fib(n - 1).wrapping_add(fib(n - 2)) }
}

export_job!(FibJob);

#[cfg(test)]
mod tests {
    #[test]
    fn fib_matches_the_benchmark() {
        assert_eq!(super::fib(0), 1);
        assert_eq!(super::fib(1), 1);
        assert_eq!(super::fib(10), 89);
        assert_eq!(super::fib(25), 121_393);
    }
}
