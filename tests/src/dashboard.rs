//! `wasmjobs web` as a process of its own, read by a plain HTTP client,
//! and what a process costs in memory (its `VmHWM`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::runner::wasmjobs_bin;

/// What the dashboard logs once it listens; the address follows.
const LISTENING: &str = "wasmjobs web: listening on http://";

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

/// Waits (at most 60 s) until `log()` names the address the dashboard
/// listens on.
pub fn wait_listening(log: impl Fn() -> String) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(addr) = listening_addr(&log()) {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard did not listen in 60 s:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `wasmjobs web` process on loopback, without credentials; killed when
/// dropped.
pub struct Dashboard {
    child: Child,
    log: PathBuf,
    /// Where to connect (`127.0.0.1:PORT`).
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Dashboard {
    /// Starts `wasmjobs web --redis URL --addr 127.0.0.1:0` and waits until
    /// it listens.
    pub fn start(redis_url: &str) -> Dashboard {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("web.log");
        let child = Command::new(wasmjobs_bin())
            .args(["web", "--redis", redis_url, "--addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env_remove("WASMJOBS_WEB_TOKEN")
            .env_remove("WASMJOBS_WEB_USER")
            .env_remove("WASMJOBS_WEB_PASSWORD")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start wasmjobs web");
        let read = log.clone();
        let addr = wait_listening(|| std::fs::read_to_string(&read).unwrap_or_default());
        Dashboard {
            child,
            log,
            addr,
            _dir: dir,
        }
    }

    /// `http://ADDR`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its peak resident memory so far, KiB.
    pub fn peak_rss_kb(&self) -> u64 {
        peak_rss_kb(self.child.id())
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// An HTTP response, as a plain client sees it.
#[derive(Debug)]
pub struct Page {
    /// The status code.
    pub status: u16,
    /// The body, as text (invalid UTF-8 replaced).
    pub body: String,
}

/// `GET path` from `addr` over HTTP/1.0, with `Host` the address itself.
pub fn get(addr: &str, path: &str) -> Page {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    Page {
        status,
        body: body.to_owned(),
    }
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
