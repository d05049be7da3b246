//! The dashboard as a client sees it: a `wasmjobs web` process of the
//! test's own, plain HTTP/1.0 requests with whatever headers the test
//! chooses (what a browser would never send, or an attacker would), and
//! what a process costs in memory (its `VmHWM`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::TestRedis;
use crate::runner::wasmjobs_bin;

/// What the dashboard logs once it listens; the address follows.
pub const LISTENING: &str = "wasmjobs web: listening on http://";
/// The credentials a non-loopback dashboard takes from the environment.
pub const CREDENTIALS: [&str; 3] = ["WASMJOBS_WEB_TOKEN", "WASMJOBS_WEB_USER", "WASMJOBS_WEB_PASSWORD"];

/// The address in a log's `listening on` line, once the line is whole.
pub fn listening_addr(log: &str) -> Option<String> {
    let rest = log.split(LISTENING).nth(1)?;
    let line = rest.split_once('\n')?.0;
    let addr: String = line
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '/' | '\u{1b}'))
        .collect();
    (!addr.is_empty()).then_some(addr)
}

/// Where to connect for a listening address (`0.0.0.0:P` → `127.0.0.1:P`).
pub fn connectable(addr: &str) -> String {
    match addr.strip_prefix("0.0.0.0:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => addr.to_owned(),
    }
}

/// Waits until `log()` names the address the dashboard listens on; panics
/// with the log if `exited()` says the process ended first, or after 60 s.
pub fn wait_listening(log: impl Fn() -> String, mut exited: impl FnMut() -> Option<ExitStatus>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(addr) = listening_addr(&log()) {
            return addr;
        }
        if let Some(status) = exited() {
            panic!("the dashboard exited ({status}) before listening:\n{}", log());
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard did not listen in 60 s:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `wasmjobs web` process (the dashboard alone).
pub struct Web {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Web {
    /// Starts `wasmjobs web --redis URL --addr ADDR` with none of the
    /// credential variables but those in `env`.
    pub fn spawn(redis: &TestRedis, addr: &str, env: &[(&str, &str)]) -> Web {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("web.log");
        let mut command = Command::new(wasmjobs_bin());
        command
            .args(["web", "--redis", &redis.url(), "--addr", addr])
            .env("RUST_LOG", "info")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for name in CREDENTIALS {
            command.env_remove(name);
        }
        command.env_remove("WASMJOBS_WEB_HOSTS");
        command.envs(env.iter().copied());
        let child = command.spawn().expect("start wasmjobs web");
        Web { child, log, _dir: dir }
    }

    /// Starts it on `addr` and waits until it listens; returns it and the
    /// address to connect to.
    pub fn start(redis: &TestRedis, addr: &str, env: &[(&str, &str)]) -> (Web, String) {
        let mut web = Web::spawn(redis, addr, env);
        let log = web.log.clone();
        let addr = wait_listening(
            || std::fs::read_to_string(&log).unwrap_or_default(),
            || web.child.try_wait().expect("try_wait"),
        );
        (web, connectable(&addr))
    }

    /// What it has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its peak resident memory so far, KiB.
    pub fn peak_rss_kb(&self) -> u64 {
        peak_rss_kb(self.child.id())
    }

    /// Sends `signal` (e.g. "TERM").
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits (at most `timeout`) for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "wasmjobs web still running after {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response, as a plain client sees it.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// One HTTP/1.0 request to `addr` with `headers` and `body`.
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut text = format!("{method} {path} HTTP/1.0\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        text.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// A form POST from a plain client (no cookie, no token unless in `form`).
pub fn post_form(addr: &str, path: &str, form: &str) -> Response {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/x-www-form-urlencoded")],
        form,
    )
}

/// The peak resident memory (`VmHWM`) of the running process `pid`, KiB.
pub fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Runs `wasmjobs ARGS...` (a command that keeps printing, such as
/// `stats --watch 0.2 --json`) until it has printed `lines` lines (at most
/// `timeout`), then kills it; returns what it printed and its peak
/// resident memory, KiB (`VmHWM`, which starts again at `exec`, so the
/// test process's own memory is not counted as it would be by `wait4`).
pub fn wasmjobs_peak_rss(args: &[&str], lines: usize, timeout: Duration) -> (String, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(wasmjobs_bin())
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("start wasmjobs");
    let deadline = Instant::now() + timeout;
    let printed = loop {
        let printed = std::fs::read_to_string(&stdout).unwrap_or_default();
        if printed.matches('\n').count() >= lines {
            break printed;
        }
        let exited = child.try_wait().expect("try_wait");
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "wasmjobs {args:?} printed {} of {lines} lines ({exited:?}):\n{printed}\n{}",
                printed.matches('\n').count(),
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let peak = peak_rss_kb(child.id());
    let _ = child.kill();
    let _ = child.wait();
    (printed, peak)
}
