//! A real PostgreSQL server per test, so SQL tests never share state or
//! mock the database.
//!
//! Each [`TestPostgres`] `initdb`s a cluster in its own temporary directory
//! and runs `postgres` on a free loopback port, with trust authentication
//! for the superuser `wasmjobs` and durability off (`fsync=off`): it lives
//! for one test. With `WASMJOBS_PG_DURABLE=1` in the environment it keeps
//! PostgreSQL's durable defaults instead (`fsync`, `synchronous_commit`,
//! `full_page_writes` on), for benchmarks that measure what a production
//! server pays. PostgreSQL refuses to run as root, so when the tests run
//! as root (as CI does) the server runs as the `postgres` system user that
//! Debian's `postgresql` package creates (`scripts/setup.sh test` installs
//! it); the cluster's directory is handed to that user. The binaries come
//! from `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`.
//! The Debian system cluster is never touched.

use std::ffi::CString;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The superuser of test clusters (trust authentication, no password).
pub const USER: &str = "wasmjobs";
/// How long a server may take to accept connections after starting.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether servers keep PostgreSQL's durable defaults (`WASMJOBS_PG_DURABLE=1`).
pub fn durable() -> bool {
    std::env::var("WASMJOBS_PG_DURABLE").is_ok_and(|v| v == "1")
}

/// A `postgres` server of the test's own; stopped when dropped.
pub struct TestPostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// uid/gid to run the server as (when the tests run as root).
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
}

impl TestPostgres {
    /// Initialises a cluster, starts the server and waits until it accepts
    /// connections. Panics with an install hint if PostgreSQL is missing.
    pub fn start() -> TestPostgres {
        let bin = bindir();
        let dir = tempfile::Builder::new()
            .prefix("wasmjobs-pg-")
            .tempdir()
            .expect("temp dir for postgres");
        let run_as = server_user();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("hand the cluster dir to postgres");
        }
        let mut server = TestPostgres {
            dir,
            bin,
            port: free_port(),
            run_as,
            child: None,
        };
        let data = server.data_dir();
        let initdb = server
            .server_command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output()
            .expect("run initdb");
        crate::assert_success(&initdb, "initdb");
        server.spawn();
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// A command running `program` from the server's bindir as the server's
    /// user, in the cluster's directory.
    fn server_command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.log_path()).expect("postgres log file");
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(self.log_path(), Some(uid), Some(gid)).expect("chown the log");
        }
        let fast: &[&str] = if durable() {
            &[]
        } else {
            &[
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]
        };
        let child = self
            .server_command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(fast)
            .args(["-c", "max_connections=300", "-c", "shared_buffers=32MB"])
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("postgres exited at start ({status}); {}", self.log_tail());
            }
            let ready = TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && Command::new(self.bin.join("pg_isready"))
                    .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                    .status()
                    .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "postgres did not start; {}", self.log_tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://wasmjobs@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        self.url_as(USER, db)
    }

    /// `postgres://ROLE@127.0.0.1:PORT/DB` (trust authentication: any
    /// password in a URL is ignored).
    pub fn url_as(&self, role: &str, db: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` (owned by the test superuser).
    pub fn create_database(&self, name: &str) {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
    }

    /// Runs `sql` in database `db` with `psql` and returns its unaligned,
    /// tuples-only output (`-At`), trimmed. Panics on any SQL error.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let output = Command::new(self.bin.join("psql"))
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args(["-p", &self.port.to_string(), "-U", USER, "-d", db, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        crate::assert_success(&output, &format!("psql {sql:?}"));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Runs the pgbench script `script` `transactions` times on database
    /// `db` (`-n -M prepared`, one client) and returns its transactions per
    /// second. Panics if pgbench fails.
    pub fn pgbench(&self, db: &str, script: &Path, transactions: u64) -> f64 {
        let output = Command::new(self.bin.join("pgbench"))
            .args(["-n", "-M", "prepared", "-h", "127.0.0.1"])
            .args(["-p", &self.port.to_string(), "-U", USER])
            .args(["-t", &transactions.to_string(), "-f"])
            .arg(script)
            .arg(db)
            .stdin(Stdio::null())
            .output()
            .expect("run pgbench");
        crate::assert_success(&output, "pgbench");
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no tps in pgbench's output:\n{stdout}"))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        match std::fs::read_to_string(self.log_path()) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                format!("log:\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
            }
            Err(e) => format!("no log: {e}"),
        }
    }
}

impl TestPostgres {
    /// Stops the server as a crash would (`immediate`: no checkpoint,
    /// every connection cut) and starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop_server();
        self.spawn();
    }

    fn stop_server(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // `immediate`: nothing to keep, and the test is waiting.
        let stopped = self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "20", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// The directory holding `initdb`, `postgres`, `pg_ctl`, `pg_isready`, `psql`.
fn bindir() -> PathBuf {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|d| d.join("initdb").is_file()) {
        return dir;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("PostgreSQL server binaries not found (pg_config --bindir, /usr/lib/postgresql/*/bin): run `scripts/setup.sh test` (apt-get install postgresql)")
    })
}

/// `Some((uid, gid))` of the `postgres` user when running as root (the
/// server refuses root), `None` otherwise.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = CString::new("postgres").expect("no NUL");
    // SAFETY: `name` is a valid C string; getpwnam returns null or a pointer
    // to a static record that we read at once, before any other call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root, and there is no `postgres` user to run the test server as: run `scripts/setup.sh test` (apt-get install postgresql)"
    );
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Some((uid, gid))
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop_server();
    }
}
