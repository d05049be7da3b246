//! The private `redis-server` used when no Redis URL is given.
//!
//! Like Faktory, wasmjobs works out of the box on one machine: with no
//! `--redis` / `REDIS_URL`, every command uses a `redis-server` of its own
//! under `<data-dir>/redis/`, started on demand and shared by every wasmjobs
//! process using that data directory.
//!
//! - **Unix socket only** (`--port 0`, mode 700): nothing listens on the
//!   network, and only this user can connect.
//! - **Append-only file** (`appendfsync everysec`): queued jobs survive the
//!   server stopping between commands, or a crash.
//! - **Its own process group**: a Ctrl-C in the terminal reaches wasmjobs
//!   but not Redis, so wasmjobs can still push unfinished jobs back to their
//!   queues while shutting down.
//!
//! Sharing uses two `flock` files in that directory. `start.lock`
//! (exclusive) serialises starting and stopping. Each user holds a shared
//! lock on `users.lock` while it uses the server; the one leaving last (its
//! exclusive `try_lock` succeeds) shuts the server down and waits for it to
//! exit. The kernel drops a killed process's locks; a socket with no
//! server behind it is removed.
//!
//! **A watchdog ends a server nobody uses.** When every user died without
//! leaving (`kill -9`), nobody would stop the server, and if its directory
//! was deleted too (a project removed, a test's temporary directory), it
//! would run forever. So the server runs under a small `bash` loop
//! ([`WATCHDOG`]) that holds the two lock files open and, every
//! [`WATCH_EVERY`], takes `start.lock` and then `users.lock` exclusively
//! without waiting: when both are free, no wasmjobs process uses the
//! server or is starting or stopping it, and the watchdog stops it
//! (`SIGTERM`: Redis flushes the AOF) and exits. A deleted directory falls
//! under the same rule: nobody can open its lock files any more. It exits
//! as soon as the server does. Without `bash` or util-linux's `flock` on
//! the `PATH`, the server is started alone, as before.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use redis::{Client, Connection, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use tracing::{debug, info, warn};

/// The error when the binary is missing: one line, saying what to do.
const NOT_INSTALLED: &str =
    "redis-server is not installed: install it (apt-get install redis-server) or pass --redis URL";
/// How long a new server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `PING` may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long [`EmbeddedRedis::release`] waits for the server to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `Drop` waits: it may run on an async thread.
const DROP_STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// `sun_path` holds 108 bytes, including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;
/// How often the watchdog looks for users.
const WATCH_EVERY: &str = "2";

/// The watchdog: `bash -c WATCHDOG watchdog DIR REDIS-ARGS...`. It keeps
/// the lock files open on fds 8 and 9 (not passed to redis-server), writes
/// its pid to `watchdog.pid`, and runs redis-server in the background;
/// then, each [`WATCH_EVERY`] seconds or when redis-server exits, it exits
/// with redis-server, or stops it once both locks are free.
const WATCHDOG: &str = r#"
exec 8>>"$1/start.lock" 9>>"$1/users.lock"
echo $$ > "$1/watchdog.pid"
shift
redis-server "$@" 8>&- 9>&- &
redis=$!
while :; do
  sleep "$WASMJOBS_WATCH_EVERY" 8>&- 9>&- &
  wait -n
  if ! kill -0 "$redis" 2>/dev/null; then
    wait "$redis"
    exit $?
  fi
  if flock -n -x 8; then
    if flock -n -x 9; then
      kill -TERM "$redis"
      wait "$redis"
      exit 0
    fi
    flock -u 8
  fi
done
"#;

/// A use of the private server; the server lives while any process holds one.
#[derive(Debug)]
pub(crate) struct EmbeddedRedis {
    dir: PathBuf,
    socket: PathBuf,
    /// Our shared lock on `users.lock`; `None` once we left.
    users: Option<File>,
}

impl EmbeddedRedis {
    /// Starts the server for `data_dir`, or joins the one already running there.
    pub(crate) async fn acquire(data_dir: &Path) -> Result<Self> {
        let data_dir = data_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::acquire_blocking(&data_dir))
            .await
            .context("the task starting redis-server failed")?
    }

    /// Where redis-rs connects: the unix socket, as an address rather than
    /// a URL, so any path works as it is.
    pub(crate) fn addr(&self) -> ConnectionAddr {
        ConnectionAddr::Unix(self.socket.clone())
    }

    /// The server's unix socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// The server's directory (`<data-dir>/redis`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leaves the server; if no other wasmjobs process still uses it, shuts
    /// it down cleanly (`SHUTDOWN`, AOF flushed) and waits for it to exit.
    pub(crate) async fn release(mut self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.leave(STOP_TIMEOUT, true))
            .await
            .context("the task stopping redis-server failed")?
    }

    fn acquire_blocking(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join("redis");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", dir.display()))?;
        let socket = dir.join("redis.sock");
        let length = socket.as_os_str().len();
        if length > MAX_SOCKET_PATH {
            bail!(
                "the embedded Redis socket path {} is {length} bytes, over the {MAX_SOCKET_PATH} a unix socket allows: use a shorter --data-dir",
                socket.display()
            );
        }

        let start = lock_file(&dir, "start.lock")?;
        start.lock().context("cannot lock start.lock of the embedded Redis")?;
        let users = lock_file(&dir, "users.lock")?;
        users
            .lock_shared()
            .context("cannot lock users.lock of the embedded Redis")?;
        match probe(&socket)? {
            Probe::Pong => debug!(socket = %socket.display(), "joined the running embedded redis-server"),
            Probe::Loading => {
                debug!("embedded redis-server is up but still loading its data");
                wait_ready(&dir, &socket, None)?;
            }
            Probe::Other(reply) => {
                debug!(%reply, "embedded redis-server is up but not ready yet");
                wait_ready(&dir, &socket, None)?;
            }
            Probe::Down => start_server(&dir, &socket)?,
        }
        drop(start);
        Ok(Self {
            dir,
            socket,
            users: Some(users),
        })
    }

    /// Drops our shared lock; stops the server if we were its last user.
    /// With `wait_turn` false, gives up at once if another process is
    /// starting or stopping it (that process then sees we are gone).
    fn leave(&mut self, stop_timeout: Duration, wait_turn: bool) -> Result<()> {
        let Some(users) = self.users.take() else {
            return Ok(());
        };
        drop(users);
        let start = lock_file(&self.dir, "start.lock")?;
        if wait_turn {
            start.lock().context("cannot lock start.lock of the embedded Redis")?;
        } else if !try_lock(&start)? {
            return Ok(());
        }
        let users = lock_file(&self.dir, "users.lock")?;
        if !try_lock(&users)? {
            debug!("embedded redis-server still in use by another wasmjobs process");
            return Ok(());
        }
        stop_server(&self.dir, &self.socket, stop_timeout)
    }
}

impl Drop for EmbeddedRedis {
    fn drop(&mut self) {
        if let Err(err) = self.leave(DROP_STOP_TIMEOUT, false) {
            warn!("cannot stop the embedded redis-server: {err:#}");
        }
    }
}

/// Starts the server in `dir` again if it is not running (killed,
/// crashed, ended by the kernel's OOM killer) while a process still uses
/// it; returns whether it did. A server that answers, loads or hangs is
/// left alone. What the append-only file held comes back with it (up to
/// its last second of writes, `appendfsync everysec`).
pub(crate) fn revive(dir: &Path, socket: &Path) -> Result<bool> {
    if !matches!(probe(socket)?, Probe::Down) {
        return Ok(false);
    }
    let start = lock_file(dir, "start.lock")?;
    start.lock().context("cannot lock start.lock of the embedded Redis")?;
    if !matches!(probe(socket)?, Probe::Down) {
        // Another user started it meanwhile.
        return Ok(false);
    }
    start_server(dir, socket)?;
    Ok(true)
}

/// Opens (creating) a lock file in `dir`.
fn lock_file(dir: &Path, name: &str) -> Result<File> {
    let path = dir.join(name);
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Takes `file`'s exclusive lock if nobody holds any lock on it.
fn try_lock(file: &File) -> Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(err)) => Err(err).context("cannot lock a file of the embedded Redis"),
    }
}

/// The unix socket of the private server for `data_dir`, and whether a
/// server answers on it now. Starts nothing.
pub(crate) fn status(data_dir: &Path) -> (PathBuf, bool) {
    let socket = data_dir.join("redis").join("redis.sock");
    let up = matches!(probe(&socket), Ok(Probe::Pong | Probe::Loading));
    (socket, up)
}

/// What is behind the socket.
enum Probe {
    /// Nothing: no socket, or a stale one.
    Down,
    /// A server answering `PING`.
    Pong,
    /// A server still loading its data (`-LOADING`): making progress.
    Loading,
    /// A server answering something else, or not at all.
    Other(String),
}

/// A blocking connection to the server behind `socket`, `timeout` on every
/// read and write; `None` if no server listens there. Blocking, because
/// this runs in `Drop` too, where no async connection can be made; with no
/// `CLIENT SETINFO`, so the only commands sent are the caller's.
fn connect(socket: &Path, timeout: Duration) -> Result<Option<Connection>> {
    let context = || format!("cannot connect to {}", socket.display());
    let info = ConnectionAddr::Unix(socket.to_path_buf())
        .into_connection_info()
        .with_context(context)?
        .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name());
    let conn = match Client::open(info).and_then(|client| client.get_connection_with_timeout(timeout)) {
        Ok(conn) => conn,
        // No socket file, or nobody accepting on it.
        Err(err) if err.is_connection_refusal() => return Ok(None),
        Err(err) => return Err(err).with_context(context),
    };
    conn.set_read_timeout(Some(timeout)).with_context(context)?;
    conn.set_write_timeout(Some(timeout)).with_context(context)?;
    Ok(Some(conn))
}

/// Sends `PING` on the socket.
fn probe(socket: &Path) -> Result<Probe> {
    let Some(mut conn) = connect(socket, PROBE_TIMEOUT)? else {
        return Ok(Probe::Down);
    };
    Ok(match redis::cmd("PING").query::<String>(&mut conn) {
        Ok(reply) if reply == "PONG" => Probe::Pong,
        Ok(reply) => Probe::Other(reply),
        Err(err) if err.code() == Some("LOADING") => Probe::Loading,
        Err(err) => Probe::Other(err.to_string()),
    })
}

/// Starts `redis-server` in `dir` and waits until it answers.
fn start_server(dir: &Path, socket: &Path) -> Result<()> {
    if socket.exists() {
        debug!(socket = %socket.display(), "removing a stale socket");
        std::fs::remove_file(socket).with_context(|| format!("cannot remove the stale socket {}", socket.display()))?;
    }
    let log_path = dir.join("redis.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let log_err = log.try_clone().context("cannot share the redis log file")?;
    if !on_path("redis-server") {
        return Err(anyhow!(NOT_INSTALLED));
    }
    let _ = std::fs::remove_file(dir.join("watchdog.pid"));
    let mut command = match on_path("bash") && on_path("flock") {
        true => {
            let mut watched = Command::new("bash");
            watched
                .args(["-c", WATCHDOG, "wasmjobs-redis-watchdog"])
                .arg(dir)
                .env("WASMJOBS_WATCH_EVERY", WATCH_EVERY);
            watched
        }
        false => {
            debug!("no bash or flock on the PATH: the embedded redis-server runs without its watchdog");
            Command::new("redis-server")
        }
    };
    command
        .arg("--port")
        .arg("0")
        .arg("--unixsocket")
        .arg(socket)
        .args(["--unixsocketperm", "700", "--daemonize", "no"])
        .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log_path)
        .arg("--pidfile")
        .arg(dir.join("redis.pid"))
        .stdin(Stdio::null())
        // Errors before the log file opens (bad options) go to stdout/stderr.
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Err(anyhow!(NOT_INSTALLED)),
        Err(err) => return Err(err).context("cannot start redis-server"),
    };
    if let Err(err) = wait_ready(dir, socket, Some(&mut child)) {
        // Do not leave a half-started server holding the data directory.
        let _ = child.kill();
        let _ = child.wait();
        return Err(err);
    }
    info!(pid = child.id(), socket = %socket.display(), "started the embedded redis-server");
    Ok(())
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Waits for `PING` to answer `PONG`; `child` (if we started the server)
/// is watched for an early exit. A server still loading a large AOF
/// (`-LOADING`) is making progress, so it may take longer than the timeout.
fn wait_ready(dir: &Path, socket: &Path, mut child: Option<&mut Child>) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut loading_logged = false;
    loop {
        if let Some(child) = child.as_deref_mut()
            && let Some(status) = child.try_wait().context("cannot check on redis-server")?
        {
            bail!("redis-server exited during startup ({status}); {}", log_tail(dir));
        }
        match probe(socket)? {
            Probe::Pong => return Ok(()),
            Probe::Loading => {
                if !loading_logged {
                    info!("the embedded redis-server is loading its data");
                    loading_logged = true;
                }
            }
            Probe::Down | Probe::Other(_) if Instant::now() < deadline => {}
            Probe::Down | Probe::Other(_) => bail!(
                "redis-server did not answer on {} within {} s; {}",
                socket.display(),
                START_TIMEOUT.as_secs(),
                log_tail(dir)
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `SHUTDOWN` (Redis fsyncs the AOF first) and waits for the process
/// to exit. The caller holds both locks, so nobody joins meanwhile.
fn stop_server(dir: &Path, socket: &Path, timeout: Duration) -> Result<()> {
    let pid = std::fs::read_to_string(dir.join("redis.pid"))
        .ok()
        .and_then(|text| text.trim().parse::<libc::pid_t>().ok())
        .filter(|pid| *pid > 0);
    let Some(mut conn) = connect(socket, timeout)? else {
        debug!("the embedded redis-server is already gone");
        let _ = std::fs::remove_file(socket);
        return Ok(());
    };
    // A successful SHUTDOWN closes the connection without a reply.
    match redis::cmd("SHUTDOWN").exec(&mut conn) {
        Ok(()) => {}
        Err(err) if err.code().is_some() => bail!("redis-server refused to shut down: {err}; {}", log_tail(dir)),
        Err(err) if err.is_connection_dropped() => {}
        Err(err) => return Err(err).context("cannot send SHUTDOWN to the embedded redis-server"),
    }
    let deadline = Instant::now() + timeout;
    loop {
        let running = match pid {
            Some(pid) => process_running(pid),
            None => !matches!(probe(socket)?, Probe::Down),
        };
        if !running {
            wait_for_watchdog(dir);
            info!(socket = %socket.display(), "stopped the embedded redis-server");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the embedded redis-server did not exit within {} s of SHUTDOWN; {}",
                timeout.as_secs(),
                log_tail(dir)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (briefly) for the watchdog of a server that exited: it exits
/// right after the server.
fn wait_for_watchdog(dir: &Path) {
    let Some(pid) = std::fs::read_to_string(dir.join("watchdog.pid"))
        .ok()
        .and_then(|text| text.trim().parse::<libc::pid_t>().ok())
        .filter(|pid| *pid > 0)
    else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while process_running(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid` still runs. Reaps it first if it is our exited child (we
/// may have started it), so a zombie does not count as running.
fn process_running(pid: libc::pid_t) -> bool {
    use rustix::process::{Pid, WaitOptions, test_kill_process, waitpid};
    let Some(pid) = Pid::from_raw(pid) else { return false };
    // Not our child (ECHILD), or still running: no status to reap.
    if let Ok(Some(_)) = waitpid(Some(pid), WaitOptions::NOHANG) {
        return false;
    }
    match test_kill_process(pid) {
        Ok(()) => true,
        Err(err) => err == rustix::io::Errno::PERM,
    }
}

/// The end of the server's log, for error messages.
fn log_tail(dir: &Path) -> String {
    let path = dir.join("redis.log");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(10)..].join("\n");
            format!("last lines of {}:\n{tail}", path.display())
        }
        Err(err) => format!("cannot read {}: {err}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(dir: &Path) -> libc::pid_t {
        let text = std::fs::read_to_string(dir.join("redis/redis.pid")).expect("pid file");
        text.trim().parse().expect("pid")
    }

    async fn set_and_get(redis: &EmbeddedRedis, write: Option<&str>) -> Option<String> {
        let client = redis::Client::open(redis.addr()).expect("a unix socket address");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        if let Some(value) = write {
            let () = redis::cmd("SET")
                .arg("k")
                .arg(value)
                .query_async(&mut conn)
                .await
                .expect("SET");
        }
        redis::cmd("GET").arg("k").query_async(&mut conn).await.expect("GET")
    }

    #[tokio::test]
    async fn second_user_joins_and_last_user_stops_the_server() {
        let data = tempfile::tempdir().expect("tempdir");
        let first = EmbeddedRedis::acquire(data.path()).await.expect("start");
        assert!(first.socket().is_absolute(), "{}", first.socket().display());
        let server = pid(data.path());
        let second = EmbeddedRedis::acquire(data.path()).await.expect("join");
        assert_eq!(pid(data.path()), server, "the second user must reuse the server");
        first.release().await.expect("first release");
        assert!(process_running(server), "still in use by the second user");
        assert_eq!(set_and_get(&second, Some("v")).await.as_deref(), Some("v"));
        let socket = second.socket().to_path_buf();
        second.release().await.expect("last release");
        assert!(!process_running(server), "the last user must stop the server");
        assert!(!socket.exists(), "socket left behind");
    }

    #[tokio::test]
    async fn data_survives_a_restart() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = EmbeddedRedis::acquire(data.path()).await.expect("start");
        set_and_get(&redis, Some("kept")).await;
        redis.release().await.expect("stop");
        let redis = EmbeddedRedis::acquire(data.path()).await.expect("restart");
        assert_eq!(set_and_get(&redis, None).await.as_deref(), Some("kept"));
        let server = pid(data.path());
        drop(redis);
        assert!(!process_running(server), "dropping the last user stops the server too");
    }

    #[tokio::test]
    async fn a_server_left_running_stops_by_itself_and_a_stale_socket_is_replaced() {
        let data = tempfile::tempdir().expect("tempdir");
        // A wasmjobs killed with -9: the kernel drops its lock; nobody
        // leaves, and the watchdog stops the server (it ran forever).
        let mut orphaned = EmbeddedRedis::acquire(data.path()).await.expect("start");
        let server = pid(data.path());
        drop(orphaned.users.take());
        drop(orphaned);
        let deadline = Instant::now() + Duration::from_secs(20);
        while process_running(server) {
            assert!(Instant::now() < deadline, "the orphaned redis-server still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
        let redis = EmbeddedRedis::acquire(data.path()).await.expect("start again");
        let server = pid(data.path());
        // The server itself killed with -9: its socket file stays behind.
        let server_pid = rustix::process::Pid::from_raw(server).expect("a pid");
        rustix::process::kill_process(server_pid, rustix::process::Signal::KILL).expect("kill the server");
        while process_running(server) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(redis.socket().exists());
        let again = EmbeddedRedis::acquire(data.path())
            .await
            .expect("replace the stale socket");
        assert_ne!(pid(data.path()), server);
        redis.release().await.expect("release");
        let replacement = pid(data.path());
        again.release().await.expect("release");
        assert!(!process_running(replacement));
    }

    #[tokio::test]
    async fn a_busy_server_is_waited_for_not_replaced() {
        let data = tempfile::tempdir().expect("tempdir");
        let first = EmbeddedRedis::acquire(data.path()).await.expect("start");
        let server = pid(data.path());
        // Every client's commands wait, PING too: the next user's probes
        // time out until the pause ends.
        let pause = Duration::from_millis(2500);
        let client = redis::Client::open(first.addr()).expect("a unix socket address");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause.as_millis() as u64)
            .arg("ALL")
            .query_async(&mut conn)
            .await
            .expect("CLIENT PAUSE");
        let paused = Instant::now();
        let second = EmbeddedRedis::acquire(data.path())
            .await
            .expect("join the paused server");
        assert!(
            paused.elapsed() >= pause - Duration::from_millis(500),
            "joined after {:?}, before the pause ended",
            paused.elapsed()
        );
        assert_eq!(
            pid(data.path()),
            server,
            "a busy server must be waited for, not replaced"
        );
        first.release().await.expect("first release");
        second.release().await.expect("last release");
        assert!(!process_running(server), "the last user must stop the server");
    }

    #[tokio::test]
    async fn any_data_directory_path_works() {
        use std::os::unix::ffi::OsStrExt;
        let data = tempfile::tempdir().expect("tempdir");
        // Spaces, '%', '?', '#', non-ASCII and non-UTF-8 bytes: the socket
        // path reaches redis-rs as a path, never through a URL.
        let odd = data
            .path()
            .join(std::ffi::OsStr::from_bytes(b"data dir/50%?#\xc3\xa9\xff"));
        let redis = EmbeddedRedis::acquire(&odd).await.expect("start");
        assert_eq!(set_and_get(&redis, Some("v")).await.as_deref(), Some("v"));
        let server = pid(&odd);
        redis.release().await.expect("stop");
        assert!(!process_running(server));
    }

    #[tokio::test]
    async fn a_too_long_socket_path_is_explained() {
        let data = tempfile::tempdir().expect("tempdir");
        let deep = data.path().join("d".repeat(120));
        let err = EmbeddedRedis::acquire(&deep).await.expect_err("path too long");
        assert!(err.to_string().contains("use a shorter --data-dir"), "{err:#}");
    }
}
