//! A real `redis-server` per test, so tests never share state or mock Redis.
//!
//! Each [`TestRedis`] has its own temporary directory and TCP port on
//! loopback, with the append-only file on, so a test can stop or restart
//! the server and see what survives, or kill it and see what does not.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to answer `PING` after starting.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` of the test's own; killed when dropped.
pub struct TestRedis {
    dir: TempDir,
    port: u16,
    child: Option<Child>,
}

impl TestRedis {
    /// Starts a server on a free port and waits until it answers `PING`.
    /// Panics with an install hint if `redis-server` is missing.
    pub fn start() -> TestRedis {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let port = free_port();
        let mut redis = TestRedis { dir, port, child: None };
        redis.spawn();
        redis
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server with SIGTERM (Redis flushes the AOF) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
            // SAFETY: signalling the child this struct started and has not reaped.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM redis-server");
            let status = child.wait().expect("wait for redis-server");
            assert!(
                status.success(),
                "redis-server exited with {status}; {}",
                self.log_tail()
            );
        }
    }

    /// Stops the server, then starts it again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Starts a server stopped by [`TestRedis::stop`] again, on the same
    /// port and directory (its AOF is read back).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the test redis-server is still running");
        self.spawn();
    }

    /// Freezes the server with SIGSTOP: connections stay open and nothing
    /// answers, as when packets are dropped.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP, "SIGSTOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT, "SIGCONT");
    }

    fn signal(&self, signal: libc::c_int, name: &str) {
        let child = self.child.as_ref().expect("the test redis-server is running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: signalling the child this struct started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "{name} redis-server");
    }

    /// Kills the server with SIGKILL (no flush) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A new async connection.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test redis at {}: {e}", self.url()))
    }

    /// A connection with no response timeout, for commands that move a
    /// payload of many megabytes.
    pub async fn patient_conn(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test redis at {}: {e}", self.url()))
    }

    fn spawn(&mut self) {
        let dir = self.dir.path();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("redis-server is not on PATH: install it (apt-get install redis-server) to run these tests")
            }
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while !ping(self.port) {
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!("redis-server exited at startup ({status}); {}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING on port {} within {START_TIMEOUT:?}; {}",
                self.port,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join("redis.log"))
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a server on `port` answers `PING` with `PONG`.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// The last lines of a log file, for panic messages.
fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            format!("log:\n{}", lines[lines.len().saturating_sub(15)..].join("\n"))
        }
        Err(e) => format!("no log at {}: {e}", path.display()),
    }
}

/// Calls of each command so far (`INFO commandstats`, commands run by
/// scripts included), by lowercase name.
pub async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<std::collections::BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), stats.split(',').next()?.parse().ok()?))
        })
        .collect())
}
