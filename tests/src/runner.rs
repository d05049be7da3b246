//! Running `wasmjobs run` as a separate process, as users do, against a
//! real Redis: start it, wait until it is registered, stop it gracefully
//! or `kill -9` it, and read its log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::Value;
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;

/// The wasmjobs binary built for these tests (the `wasmjobs-under-test`
/// bin target of this package: `runtime/src/main.rs`'s command line with a
/// fault hook, `tests/under_test/main.rs`), found next to
/// the test executable in `target/<profile>/`.
pub fn wasmjobs_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("tests run from target/<profile>/deps");
    profile.join("wasmjobs-under-test")
}

/// A `wasmjobs run` process.
pub struct Runner {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    /// Stopped with SIGTERM on drop (else SIGKILL).
    gentle: bool,
}

impl Runner {
    /// Starts `wasmjobs run --redis URL --plugins DIR` plus `extra` flags.
    pub fn start(redis_url: &str, plugins: &Path, extra: &[&str]) -> Runner {
        Self::start_wrapped(&[], redis_url, plugins, extra)
    }

    /// The same, run through `wrapper` (a command and its arguments that
    /// runs the command line after it, e.g. `unshare --pid --fork ...`);
    /// [`Runner::pid`] and the signals then address the wrapper.
    pub fn start_wrapped(wrapper: &[&str], redis_url: &str, plugins: &Path, extra: &[&str]) -> Runner {
        Self::spawn(wrapper, None, &[], redis_url, plugins, extra)
    }

    /// [`Runner::start`] with the environment variables `env` set.
    pub fn start_with_env(env: &[(&str, &str)], redis_url: &str, plugins: &Path, extra: &[&str]) -> Runner {
        Self::spawn(&[], None, env, redis_url, plugins, extra)
    }

    /// Starts `wasmjobs run --redis URL --plugins PLUGINS` plus `extra`
    /// from the working directory `cwd`, as a user in a shell does:
    /// `plugins` is passed as written (`./plugins`, `.`, a symlink).
    pub fn start_in(cwd: &Path, redis_url: &str, plugins: &str, extra: &[&str]) -> Runner {
        Self::spawn(&[], Some(cwd), &[], redis_url, Path::new(plugins), extra)
    }

    fn spawn(
        wrapper: &[&str],
        cwd: Option<&Path>,
        env: &[(&str, &str)],
        redis_url: &str,
        plugins: &Path,
        extra: &[&str],
    ) -> Runner {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("runner.log");
        let data_dir = crate::repo_root().join("target/wasmjobs-test-data");
        let mut command = match wrapper.split_first() {
            None => Command::new(wasmjobs_bin()),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(wasmjobs_bin());
                command
            }
        };
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let child = command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["run", "--redis", redis_url, "--plugins"])
            .arg(plugins)
            .args(extra)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start wasmjobs run");
        Runner {
            child,
            log,
            _dir: dir,
            gentle: false,
        }
    }

    /// Starts `wasmjobs ARGS` in `cwd` as a user types it: no `--redis`,
    /// no `--data-dir`, none of the test environment's `REDIS_URL` or
    /// `WASMJOBS_DATA_DIR`; stdout and stderr both go to the log. Stopped
    /// with SIGTERM on drop, so an embedded Redis stops with its last user.
    pub fn start_as_user(cwd: &Path, args: &[&str]) -> Runner {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("runner.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(wasmjobs_bin())
            .current_dir(cwd)
            .args(args)
            .env_remove("WASMJOBS_DATA_DIR")
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start wasmjobs");
        Runner {
            child,
            log,
            _dir: dir,
            gentle: true,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// What the runner has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (panics with the log after `timeout`).
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "wasmjobs run exited ({status}) before logging {needle:?}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "wasmjobs run did not log {needle:?} in {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the runner logs "running" (plugins loaded, heartbeat written).
    pub fn wait_running(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains(" running") {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("wasmjobs run exited early ({status}):\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "wasmjobs run did not start:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (e.g. "TERM", "KILL", "TSTP").
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit (at most `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "wasmjobs run did not exit in {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait(Duration::from_secs(60))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.gentle && matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").arg(self.pid().to_string()).status();
        } else {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Pushes one job per args array onto `queue`, Sidekiq-style; returns the jids.
pub async fn push(
    conn: &mut redis::aio::MultiplexedConnection,
    class: &str,
    queue: &str,
    args: Vec<Value>,
) -> Vec<String> {
    let now = wasmjobs::redis::now_f64();
    let mut payloads: Vec<Payload> = args
        .into_iter()
        .map(|a| Payload::new(class, a.as_array().cloned().unwrap_or_default(), queue, now))
        .collect();
    client::push_bulk(conn, &mut payloads).await.expect("push jobs");
    payloads.iter().map(|p| p.jid().to_owned()).collect()
}

/// Reads an integer key (0 if missing).
pub async fn int(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    conn.get::<_, Option<u64>>(key).await.expect("GET").unwrap_or(0)
}

/// Waits until `stat:processed` reaches `n` (panics with the runner's log after `timeout`).
pub async fn wait_processed(
    conn: &mut redis::aio::MultiplexedConnection,
    n: u64,
    timeout: Duration,
    runner_log: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let processed = int(conn, "stat:processed").await;
        if processed >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {processed} of {n} jobs processed in {timeout:?}:\n{}",
            runner_log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Members of a sorted set, parsed.
pub async fn zset(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<Payload> {
    let members: Vec<String> = conn.zrange(key, 0, -1).await.expect("ZRANGE");
    members
        .iter()
        .map(|m| Payload::parse(m).expect("valid payload in set"))
        .collect()
}

/// A private plugins directory holding copies of the named example plugins
/// and test guests (so a test has its own `data/` directories).
pub fn plugins(examples: &[&str], test_guests: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in examples {
        crate::copy_plugin(&crate::plugins_dir().join(name), dir.path());
    }
    for name in test_guests {
        crate::copy_plugin(&crate::test_guests_dir().join(name), dir.path());
    }
    dir
}

/// A chaos run's progress: waits until `file` holds `at` lines, panicking
/// if one of `live` exits or `deadline` passes (its message says how far
/// the `n` jobs got in `timeout`); returns the lines there are.
pub fn wait_for_lines(
    live: &mut [Runner],
    file: &Path,
    at: usize,
    n: usize,
    deadline: Instant,
    timeout: Duration,
) -> usize {
    loop {
        for runner in live.iter_mut() {
            if let Some(status) = runner.try_status() {
                panic!("a runner exited ({status}):\n{}", runner.log());
            }
        }
        let done = lines(file).len();
        if done >= at {
            return done;
        }
        assert!(Instant::now() < deadline, "{done} of {n} lines after {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The lines of a text file (none if it does not exist yet).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Jobs held in every process's in-progress list (taken, outcome not
/// written yet).
pub async fn jobs_in_progress(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let lists: Vec<String> = conn.keys("wasmjobs:inprogress:*").await.expect("KEYS");
    let mut held = 0;
    for list in &lists {
        held += conn.llen::<_, u64>(list).await.expect("LLEN");
    }
    held
}

/// The batch lists a reliable process has beside its in-progress list
/// (the runner's `keys::BATCH_LISTS`).
pub const BATCH_LISTS: usize = 32;

/// Every list the process `identity` may hold jobs in: its in-progress
/// list, then its batch lists.
pub fn held_lists(identity: &str) -> Vec<String> {
    std::iter::once(format!("wasmjobs:inprogress:{identity}"))
        .chain((0..BATCH_LISTS).map(|slot| format!("wasmjobs:inprogress:{identity}:b{slot}")))
        .collect()
}

/// The jobs `identity` holds, in all of its lists.
pub async fn held_by(conn: &mut redis::aio::MultiplexedConnection, identity: &str) -> Vec<String> {
    let mut held = Vec::new();
    for list in held_lists(identity) {
        let jobs: Vec<String> = conn.lrange(&list, 0, -1).await.expect("LRANGE");
        held.extend(jobs);
    }
    held
}

/// Moves every retry to "due now", as the clock would after the backoff.
pub async fn make_retries_due(conn: &mut redis::aio::MultiplexedConnection) {
    let members: Vec<String> = conn.zrange("retry", 0, -1).await.expect("ZRANGE");
    for member in members {
        let _: () = conn.zadd("retry", member, 0).await.expect("ZADD");
    }
}

/// A free loopback address, e.g. for a runner's `--metrics-addr`.
pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

/// `GET path` on `addr` (a runner's metrics endpoint); returns the body
/// (panics on a non-200).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// The identity in `processes` that contains `:PID:`, once one does.
pub async fn identity_of(conn: &mut redis::aio::MultiplexedConnection, pid: u32, log: impl Fn() -> String) -> String {
    let needle = format!(":{pid}:");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let members: Vec<Vec<u8>> = redis::AsyncCommands::smembers(conn, "processes")
            .await
            .expect("SMEMBERS");
        let members = members.into_iter().map(|m| String::from_utf8_lossy(&m).into_owned());
        if let Some(identity) = members.into_iter().find(|m| m.contains(&needle)) {
            return identity;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no process {pid} in `processes`:\n{}",
            log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Jobs waiting in every `queue:*` list of `conn`'s Redis, by queue key
/// (empty ones left out).
pub async fn queued(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let keys: Vec<String> = conn.keys("queue:*").await.expect("KEYS");
    let mut sizes = Vec::new();
    for key in keys {
        let size: u64 = conn.llen(&key).await.expect("LLEN");
        if size > 0 {
            sizes.push((key, size));
        }
    }
    sizes
}

/// A chaos run's file, checked: every id `0..n` is a line of `file` and
/// every line is one of them (panics naming what is not). Returns the
/// lines and how many were duplicates (a job run again after a crash).
pub fn every_id_once_at_least(file: &Path, n: usize) -> (usize, usize) {
    let all = lines(file);
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in &all {
        *counts.entry(line.as_str()).or_insert(0) += 1;
    }
    let missing: Vec<usize> = (0..n)
        .filter(|i| !counts.contains_key(i.to_string().as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids never ran: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    let strangers: Vec<&&str> = counts
        .keys()
        .filter(|line| line.parse::<usize>().map_or(true, |i| i >= n))
        .collect();
    assert!(strangers.is_empty(), "lines that are no job's id: {strangers:?}");
    (all.len(), all.len() - counts.len())
}
