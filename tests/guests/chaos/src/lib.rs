//! `ChaosJob`: a test guest that misbehaves on request, so that the host's
//! end-to-end tests can check how it copes with errors, panics, traps,
//! runaway loops, memory and stack exhaustion, slow jobs, file and network
//! access, environment variables, stdout and log flooding.
//!
//! The first arg picks the behaviour (`["mode", ...]`):
//!
//! | args | behaviour |
//! | --- | --- |
//! | `["ok"]` | succeed |
//! | `["retry" \| "discard" \| "dead", msg]` | fail with that job-error and `msg` |
//! | `["panic", msg]` | `panic!("{msg}")` (a trap, after logging the panic) |
//! | `["trap"]` | execute `unreachable` |
//! | `["loop"]` | spin forever |
//! | `["alloc", bytes]` | allocate and touch `bytes` bytes, log `allocated N bytes` |
//! | `["recurse", depth]` | recurse `depth` frames deep (overflow for a huge depth) |
//! | `["sleep", ms]` | `std::thread::sleep` |
//! | `["read", path]` | log `read: <content>`; I/O error → retry |
//! | `["write", path, content]` | write the file; I/O error → retry |
//! | `["log", level, msg]` | log `msg` at `level` (trace/debug/info/warn/error) |
//! | `["http", url]` | GET, log `status: N`; non-2xx or transport error → retry |
//! | `["env", name]` | log `env NAME=value` or `env NAME=<unset>` |
//! | `["stdout", text]` | `println!("{text}")` |
//! | `["big-log", bytes]` | log one message of `bytes` bytes |
//! | `["fail-times", n]` | retry error while the job has been retried fewer than `n` times, then succeed |
//! | `["slow-append", file, line, ms]` | sleep `ms`, then append `line\n` to `/data/<file>` (one write) |
//!
//! Anything else is a dead error starting with "unknown chaos mode".

use std::hint::black_box;
use std::time::Duration;

use wasmjobs_guest::serde_json::Value;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job, http, log};

/// See the crate docs for the modes.
pub struct ChaosJob;

impl Job for ChaosJob {
    type Args = Vec<Value>;

    fn perform(job: &JobInfo, args: Vec<Value>) -> Result<(), JobError> {
        let args = Args(&args);
        let mode = args.str(0)?;
        match mode {
            "ok" => Ok(()),
            "retry" => Err(JobError::retry(args.str(1)?)),
            "discard" => Err(JobError::discard(args.str(1)?)),
            "dead" => Err(JobError::dead(args.str(1)?)),
            "panic" => panic!("{}", args.str(1)?),
            "trap" => trap(),
            "loop" => spin(),
            "alloc" => {
                let bytes = args.usize(1)?;
                let memory = alloc_and_touch(bytes);
                log::info!("allocated {} bytes", memory.len());
                Ok(())
            }
            "recurse" => {
                let depth = args.u64(1)?;
                log::info!("recursed {} frames", recurse(depth));
                Ok(())
            }
            "sleep" => {
                std::thread::sleep(Duration::from_millis(args.u64(1)?));
                Ok(())
            }
            "fail-times" => {
                let times = args.u64(1)?;
                if u64::from(job.retry_count) < times {
                    return Err(JobError::retry(format!("failing on purpose, attempt {}", job.retry_count + 1)));
                }
                log::info!("succeeded after {} retries", job.retry_count);
                Ok(())
            }
            "slow-append" => {
                let file = args.str(1)?;
                if file.contains('/') || file.contains("..") {
                    return Err(JobError::dead(format!("bad file name {file:?}")));
                }
                std::thread::sleep(Duration::from_millis(args.u64(3)?));
                let line = match args.get(2)? {
                    Value::String(text) => format!("{text}\n"),
                    other => format!("{other}\n"),
                };
                let mut out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(format!("/data/{file}"))
                    .map_err(|error| JobError::retry(format!("open /data/{file}: {error}")))?;
                std::io::Write::write_all(&mut out, line.as_bytes())
                    .map_err(|error| JobError::retry(format!("append to /data/{file}: {error}")))?;
                Ok(())
            }
            "read" => {
                let path = args.str(1)?;
                let content =
                    std::fs::read_to_string(path).map_err(|error| JobError::retry(format!("read {path}: {error}")))?;
                log::info!("read: {content}");
                Ok(())
            }
            "write" => {
                let path = args.str(1)?;
                std::fs::write(path, args.str(2)?)
                    .map_err(|error| JobError::retry(format!("write {path}: {error}")))?;
                Ok(())
            }
            "log" => {
                let level = match args.str(1)? {
                    "trace" => log::Level::Trace,
                    "debug" => log::Level::Debug,
                    "info" => log::Level::Info,
                    "warn" => log::Level::Warn,
                    "error" => log::Level::Error,
                    other => return Err(JobError::dead(format!("unknown log level {other:?}"))),
                };
                log::log!(level, "{}", args.str(2)?);
                Ok(())
            }
            "http" => {
                let response = http::get(args.str(1)?)?;
                log::info!("status: {}", response.status());
                response.error_for_status()?;
                Ok(())
            }
            "env" => {
                let name = args.str(1)?;
                match std::env::var(name) {
                    Ok(value) => log::info!("env {name}={value}"),
                    Err(_) => log::info!("env {name}=<unset>"),
                }
                Ok(())
            }
            "stdout" => {
                println!("{}", args.str(1)?);
                Ok(())
            }
            "big-log" => {
                log::info!("{}", "x".repeat(args.usize(1)?));
                Ok(())
            }
            other => Err(JobError::dead(format!("unknown chaos mode {other:?}"))),
        }
    }
}

/// Typed access to the args array; a missing or mistyped arg is a dead error.
struct Args<'a>(&'a [Value]);

impl Args<'_> {
    fn get(&self, index: usize) -> Result<&Value, JobError> {
        self.0
            .get(index)
            .ok_or_else(|| JobError::dead(format!("chaos: missing arg {index}")))
    }

    fn str(&self, index: usize) -> Result<&str, JobError> {
        let value = self.get(index)?;
        value
            .as_str()
            .ok_or_else(|| JobError::dead(format!("chaos: arg {index} must be a string, got {value}")))
    }

    fn u64(&self, index: usize) -> Result<u64, JobError> {
        let value = self.get(index)?;
        value.as_u64().ok_or_else(|| {
            JobError::dead(format!(
                "chaos: arg {index} must be a non-negative integer, got {value}"
            ))
        })
    }

    fn usize(&self, index: usize) -> Result<usize, JobError> {
        let value = self.u64(index)?;
        usize::try_from(value).map_err(|_| JobError::dead(format!("chaos: arg {index} is too large: {value}")))
    }
}

/// Execute `unreachable`: an immediate trap without a panic message.
fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}

/// Spin forever. The volatile write and `black_box` keep the optimiser from
/// proving the loop side-effect free (and so removing it).
fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        // SAFETY: `counter` is a live local; a volatile write to it is sound.
        unsafe { std::ptr::write_volatile(&mut counter, counter.wrapping_add(1)) };
        black_box(());
    }
}

/// Allocate `bytes` and write to every page, so that the memory is really
/// committed. An allocation the host's memory limit refuses aborts (a trap).
fn alloc_and_touch(bytes: usize) -> Vec<u8> {
    let mut memory = vec![0u8; bytes];
    for offset in (0..bytes).step_by(4096) {
        memory[offset] = 1;
    }
    black_box(memory)
}

/// Recurse `depth` frames deep; each frame keeps a buffer alive across the
/// call, so the recursion is not a tail call and really uses stack.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let mut frame = [0u8; 64];
    frame[0] = depth as u8;
    black_box(&mut frame);
    if depth == 0 {
        return 0;
    }
    let below = recurse(black_box(depth - 1));
    // Using the frame after the call keeps it (and the call) non-tail.
    black_box(&frame);
    below + 1
}

export_job!(ChaosJob);
