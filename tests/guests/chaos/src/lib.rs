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
//! | `["count"]` | add one to a module global and log `count: N` (1 on a fresh instance, N on the instance's Nth such job) |
//! | `["retry" \| "discard" \| "dead", msg]` | fail with that job-error and `msg` |
//! | `["panic", msg]` | `panic!("{msg}")` (a trap, after logging the panic) |
//! | `["trap"]` | execute `unreachable` |
//! | `["loop"]` | spin forever |
//! | `["alloc", bytes]` | allocate and touch `bytes` bytes, log `allocated N bytes` |
//! | `["recurse", depth]` | recurse `depth` frames deep (overflow for a huge depth) |
//! | `["sleep", ms]` | `std::thread::sleep` |
//! | `["read", path]` | log `read: <content>`; I/O error → retry |
//! | `["write", path, content]` | write the file; I/O error → retry |
//! | `["rename", from, to]` | rename a file or directory; I/O error → retry |
//! | `["symlink", target, link]` | create the symlink `link -> target`; I/O error → retry |
//! | `["mkdir", path]` | create a directory (and its parents); I/O error → retry |
//! | `["remove", path]` | remove a file, or a directory with its contents; I/O error → retry |
//! | `["fill", path, bytes]` | write `bytes` zero bytes to a new file in 64 KiB writes, log `filled N bytes`; I/O error → retry naming the bytes written |
//! | `["log", level, msg]` | log `msg` at `level` (trace/debug/info/warn/error) |
//! | `["http", url]` | GET, log `status: N`; non-2xx or transport error → retry |
//! | `["http-echo", url]` | POST `{"n":7}` with `x-test: chaos` (the SDK client), log `x-echo: <the response header>` and `echoed: <the body, newlines as '|'>` |
//! | `["env", name]` | log `env NAME=value` or `env NAME=<unset>` |
//! | `["stdout", text]` | `println!("{text}")` |
//! | `["big-log", bytes]` | log one message of `bytes` bytes |
//! | `["log-lines", n, text]` | log `text` `n` times at info, one call each |
//! | `["big-error", bytes]` | fail (retry) with a message of `bytes` bytes |
//! | `["http-flood", n, authority, path]` | start `n` GETs to `http://authority/path` at once, wait for all, log `flood: ok=A failed=B` |
//! | `["http-hold", n, authority, path]` | send `n` GETs one after another, keeping every response with its body unread; log `hold: ok=A failed=B` and, after a failure, `hold error: <the first error>` |
//! | `["fail-times", n]` | retry error while the job has been retried fewer than `n` times, then succeed |
//! | `["slow-append", file, line, ms]` | sleep `ms`, then append `line\n` to `/data/<file>` (one write) |
//! | `["span", file, key, ms]` | append `start <key> <jid> <epoch ms>` to `/data/<file>`, sleep `ms`, append `end <key> <jid> <epoch ms>` (one write each; for overlap and rate checks) |
//! | `["marked-append", file, line, ms]` | as `slow-append`, the line prefixed with this build's [`MARKER`] and a space |
//! | `["sql", db, statement, params?]` | `sql::query`; log `columns: [..]`, one `row: [..]` per row, `rows: N` |
//! | `["sql-exec", db, statement, params?]` | `sql::execute`; log `affected: N` |
//! | `["sql-typed", db, statement, params?]` | `sql::query` reading columns `i, f, t, b, flag, n` of each row through the SDK's typed getters; log `typed: ...` |
//!
//! SQL params and logged values are JSON: null, booleans, integers, floats
//! and strings map to the SQL value of the same kind, `{"blob": [bytes]}` to
//! a blob. A SQL error fails the job retryably with the SDK's message
//! (`sql <kind> error: ...`).
//!
//! Anything else is a dead error starting with "unknown chaos mode".

use std::hint::black_box;
use std::time::Duration;

use wasmjobs_guest::serde_json::Value;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job, http, log, sql};

/// This build's marker, `wasmjobs-marker-v1`. The hot-reload tests make a
/// second version of the component by replacing these bytes in the binary
/// (`v1` → `v2`), then check which version ran each job.
#[unsafe(no_mangle)]
/// Jobs this instance has run `count` for (`["count"]`).
static JOBS_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub static MARKER: [u8; 18] = *b"wasmjobs-marker-v1";

/// See the crate docs for the modes.
pub struct ChaosJob;

impl Job for ChaosJob {
    type Args = Vec<Value>;

    fn perform(job: &JobInfo, args: Vec<Value>) -> Result<(), JobError> {
        let args = Args(&args);
        let mode = args.str(0)?;
        match mode {
            "ok" => Ok(()),
            "count" => {
                // A module global: 1 on a fresh instance, more on a warm one.
                let n = JOBS_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                log::info!("count: {n}");
                Ok(())
            }
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
            "big-error" => Err(JobError::retry("e".repeat(args.usize(1)?))),
            "http-flood" => flood(args.usize(1)?, args.str(2)?, args.str(3)?),
            "fail-times" => {
                let times = args.u64(1)?;
                if u64::from(job.retry_count) < times {
                    return Err(JobError::retry(format!(
                        "failing on purpose, attempt {}",
                        job.retry_count + 1
                    )));
                }
                log::info!("succeeded after {} retries", job.retry_count);
                Ok(())
            }
            "slow-append" | "marked-append" => {
                let file = args.str(1)?;
                if file.contains('/') || file.contains("..") {
                    return Err(JobError::dead(format!("bad file name {file:?}")));
                }
                std::thread::sleep(Duration::from_millis(args.u64(3)?));
                let mut line = match args.get(2)? {
                    Value::String(text) => format!("{text}\n"),
                    other => format!("{other}\n"),
                };
                if mode == "marked-append" {
                    // Read through black_box so the bytes stay in the data segment.
                    let marker = black_box(&MARKER);
                    line = format!("{} {line}", String::from_utf8_lossy(marker));
                }
                let mut out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(format!("/data/{file}"))
                    .map_err(|error| JobError::retry(format!("open /data/{file}: {error}")))?;
                std::io::Write::write_all(&mut out, line.as_bytes())
                    .map_err(|error| JobError::retry(format!("append to /data/{file}: {error}")))?;
                Ok(())
            }
            "span" => {
                let (file, key) = (args.str(1)?, args.str(2)?);
                if file.contains('/') || file.contains("..") {
                    return Err(JobError::dead(format!("bad file name {file:?}")));
                }
                let path = format!("/data/{file}");
                let mark = |what: &str| -> Result<(), JobError> {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis());
                    let mut out = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .map_err(|error| JobError::retry(format!("open {path}: {error}")))?;
                    std::io::Write::write_all(&mut out, format!("{what} {key} {} {now}\n", job.jid).as_bytes())
                        .map_err(|error| JobError::retry(format!("append to {path}: {error}")))
                };
                mark("start")?;
                std::thread::sleep(Duration::from_millis(args.u64(3)?));
                mark("end")
            }
            "rename" => {
                let (from, to) = (args.str(1)?, args.str(2)?);
                std::fs::rename(from, to).map_err(|error| JobError::retry(format!("rename {from} {to}: {error}")))
            }
            "symlink" => {
                let (target, link) = (args.str(1)?, args.str(2)?);
                symlink(target, link).map_err(|error| JobError::retry(format!("symlink {link} -> {target}: {error}")))
            }
            "mkdir" => {
                let path = args.str(1)?;
                std::fs::create_dir_all(path).map_err(|error| JobError::retry(format!("mkdir {path}: {error}")))
            }
            "remove" => {
                let path = args.str(1)?;
                let removed = match std::fs::symlink_metadata(path) {
                    Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
                    _ => std::fs::remove_file(path),
                };
                removed.map_err(|error| JobError::retry(format!("remove {path}: {error}")))
            }
            "fill" => fill(args.str(1)?, args.usize(2)?),
            "http-hold" => hold(args.usize(1)?, args.str(2)?, args.str(3)?),
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
            "http-echo" => {
                // POSTs JSON with a header to the test server's `/echo` and
                // logs what came back: the request as the server saw it.
                let response = http::Request::post(args.str(1)?)
                    .header("x-test", "chaos")
                    .json(&wasmjobs_guest::serde_json::json!({ "n": 7 }))
                    .timeout(Duration::from_secs(5))
                    .send()?
                    .error_for_status()?;
                log::info!("x-echo: {}", response.header("X-Echo").unwrap_or("-"));
                log::info!("echoed: {}", response.text().replace('\n', "|"));
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
            "log-lines" => {
                let (n, text) = (args.u64(1)?, args.str(2)?);
                for _ in 0..n {
                    log::info!("{text}");
                }
                Ok(())
            }
            "big-log" => {
                log::info!("{}", "x".repeat(args.usize(1)?));
                Ok(())
            }
            "sql" => {
                let rows = sql::query(args.str(1)?, args.str(2)?, &args.sql_params(3)?)?;
                log::info!("columns: {}", Value::from(rows.columns().to_vec()));
                for row in &rows {
                    let values: Vec<Value> = row.values().iter().map(sql_to_json).collect();
                    log::info!("row: {}", Value::Array(values));
                }
                log::info!("rows: {}", rows.len());
                Ok(())
            }
            "sql-exec" => {
                let affected = sql::execute(args.str(1)?, args.str(2)?, &args.sql_params(3)?)?;
                log::info!("affected: {affected}");
                Ok(())
            }
            "sql-typed" => {
                let rows = sql::query(args.str(1)?, args.str(2)?, &args.sql_params(3)?)?;
                for row in &rows {
                    let i: i64 = row.get("i")?;
                    let f: f64 = row.get(1)?;
                    let t: String = row.get("t")?;
                    let b: Vec<u8> = row.get("b")?;
                    let flag: bool = row.get("flag")?;
                    let n: Option<i64> = row.get("n")?;
                    log::info!("typed: i={i} f={f} t={t:?} b={b:?} flag={flag} n={n:?}");
                }
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

    /// Arg `index` (a JSON array, optional) as SQL parameters.
    fn sql_params(&self, index: usize) -> Result<Vec<sql::Value>, JobError> {
        match self.0.get(index) {
            None => Ok(Vec::new()),
            Some(Value::Array(params)) => params.iter().map(json_to_sql).collect(),
            Some(other) => Err(JobError::dead(format!(
                "chaos: arg {index} must be an array of params, got {other}"
            ))),
        }
    }

    fn usize(&self, index: usize) -> Result<usize, JobError> {
        let value = self.u64(index)?;
        usize::try_from(value).map_err(|_| JobError::dead(format!("chaos: arg {index} is too large: {value}")))
    }
}

/// A JSON param as a SQL value (see the crate docs).
fn json_to_sql(value: &Value) -> Result<sql::Value, JobError> {
    Ok(match value {
        Value::Null => sql::Value::Null,
        Value::Bool(b) => sql::Value::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => sql::Value::Int(i),
            None => sql::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(text) => sql::Value::Text(text.clone()),
        Value::Object(object) => match object.get("blob").and_then(Value::as_array) {
            Some(bytes) => sql::Value::Blob(
                bytes
                    .iter()
                    .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| JobError::dead(format!("chaos: bad blob {value}")))?,
            ),
            None => return Err(JobError::dead(format!("chaos: bad SQL param {value}"))),
        },
        Value::Array(_) => return Err(JobError::dead(format!("chaos: bad SQL param {value}"))),
    })
}

/// A SQL value as JSON (see the crate docs); a non-finite float as a string.
fn sql_to_json(value: &sql::Value) -> Value {
    match value {
        sql::Value::Null => Value::Null,
        sql::Value::Boolean(b) => Value::Bool(*b),
        sql::Value::Int(i) => Value::from(*i),
        sql::Value::Float(f) => wasmjobs_guest::serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string())),
        sql::Value::Text(text) => Value::String(text.clone()),
        sql::Value::Blob(bytes) => wasmjobs_guest::serde_json::json!({ "blob": bytes }),
    }
}

/// Starts `n` requests before waiting for any, to see how the host bounds
/// a guest that opens thousands of connections.
fn flood(n: usize, authority: &str, path: &str) -> Result<(), JobError> {
    use wasmjobs_guest::bindings::wasi::http::outgoing_handler;
    use wasmjobs_guest::bindings::wasi::http::types::{Fields, OutgoingBody, OutgoingRequest, Scheme};
    let mut futures = Vec::with_capacity(n);
    let mut failed = 0usize;
    for _ in 0..n {
        let request = OutgoingRequest::new(Fields::new());
        let ready = request.set_scheme(Some(&Scheme::Http)).is_ok()
            && request.set_authority(Some(authority)).is_ok()
            && request.set_path_with_query(Some(path)).is_ok();
        if !ready {
            return Err(JobError::dead(format!("bad flood target {authority}{path}")));
        }
        let Ok(body) = request.body() else {
            return Err(JobError::dead("request body taken"));
        };
        match outgoing_handler::handle(request, None) {
            Ok(future) => futures.push(future),
            Err(_) => failed += 1,
        }
        if OutgoingBody::finish(body, None).is_err() {
            failed += 1;
        }
    }
    let mut ok = 0usize;
    for future in futures {
        let response = loop {
            match future.get() {
                Some(result) => break result,
                None => future.subscribe().block(),
            }
        };
        match response {
            Ok(Ok(_)) => ok += 1,
            _ => failed += 1,
        }
    }
    log::info!("flood: ok={ok} failed={failed}");
    Ok(())
}

/// Writes `bytes` zero bytes to a new file at `path`, 64 KiB at a time.
fn fill(path: &str, bytes: usize) -> Result<(), JobError> {
    let mut out = std::fs::File::create(path).map_err(|error| JobError::retry(format!("create {path}: {error}")))?;
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0usize;
    while written < bytes {
        let n = chunk.len().min(bytes - written);
        std::io::Write::write_all(&mut out, &chunk[..n])
            .map_err(|error| JobError::retry(format!("fill {path}: {error} after {written} bytes")))?;
        written += n;
    }
    log::info!("filled {written} bytes");
    Ok(())
}

/// `symlink(2)` from wasi-libc (which the Rust std of this target links),
/// resolved against the preopens like every other path; std's own
/// `std::os::wasi::fs::symlink_path` is still unstable.
#[cfg(target_os = "wasi")]
fn symlink(target: &str, link: &str) -> std::io::Result<()> {
    use std::ffi::{CString, c_char, c_int};
    unsafe extern "C" {
        fn symlink(target: *const c_char, link: *const c_char) -> c_int;
    }
    let target = CString::new(target).map_err(std::io::Error::other)?;
    let link = CString::new(link).map_err(std::io::Error::other)?;
    // SAFETY: both pointers are valid NUL-terminated strings for the call.
    if unsafe { symlink(target.as_ptr(), link.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "wasi"))]
fn symlink(_target: &str, _link: &str) -> std::io::Result<()> {
    Err(std::io::Error::other("symlinks are only made on the guest target"))
}

/// Sends `n` GETs one after another and keeps each response without reading
/// its body, to see whether the host counts responses held unread.
fn hold(n: usize, authority: &str, path: &str) -> Result<(), JobError> {
    use wasmjobs_guest::bindings::wasi::http::outgoing_handler;
    use wasmjobs_guest::bindings::wasi::http::types::{Fields, OutgoingBody, OutgoingRequest, Scheme};
    let mut held = Vec::with_capacity(n);
    let mut failed = 0usize;
    let mut first_error: Option<String> = None;
    for _ in 0..n {
        let request = OutgoingRequest::new(Fields::new());
        let ready = request.set_scheme(Some(&Scheme::Http)).is_ok()
            && request.set_authority(Some(authority)).is_ok()
            && request.set_path_with_query(Some(path)).is_ok();
        if !ready {
            return Err(JobError::dead(format!("bad hold target {authority}{path}")));
        }
        let Ok(body) = request.body() else {
            return Err(JobError::dead("request body taken"));
        };
        let sent = outgoing_handler::handle(request, None);
        if OutgoingBody::finish(body, None).is_err() {
            failed += 1;
        }
        let outcome = match sent {
            Ok(future) => loop {
                match future.get() {
                    Some(Ok(Ok(response))) => break Ok(response),
                    Some(Ok(Err(code))) => break Err(format!("{code:?}")),
                    Some(Err(())) => break Err("response taken twice".to_owned()),
                    None => future.subscribe().block(),
                }
            },
            Err(code) => Err(format!("{code:?}")),
        };
        match outcome {
            Ok(response) => held.push(response),
            Err(error) => {
                failed += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    log::info!("hold: ok={} failed={failed}", held.len());
    if let Some(error) = first_error {
        log::info!("hold error: {error}");
    }
    drop(held);
    Ok(())
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
