//! Sidekiq's own Ruby client and API (Debian's `ruby-sidekiq`), run against
//! the Redis under test: the other side of the wire format.

use std::process::Command;

use serde_json::Value;

/// Runs `script` with `sidekiq`, `sidekiq/api` and `json` loaded and the
/// client pointed at `url`; returns what it printed, trimmed. Panics with
/// Ruby's stderr if the script fails.
pub fn ruby(url: &str, script: &str) -> String {
    let program = format!(
        r#"require "sidekiq"; require "sidekiq/api"; require "json"
Sidekiq.configure_client {{ |c| c.redis = {{ url: ENV.fetch("REDIS_URL") }} }}
{script}"#
    );
    run_ruby(&program, &[("REDIS_URL", url)])
}

/// Runs the Ruby `program` with `env` added; returns what it printed,
/// trimmed. Panics with Ruby's stderr if it fails.
pub fn run_ruby(program: &str, env: &[(&str, &str)]) -> String {
    let output = Command::new("ruby")
        .args(["-e", program])
        .envs(env.iter().copied())
        .output()
        .expect("ruby is not installed: scripts/setup.sh test");
    assert!(
        output.status.success(),
        "ruby failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// [`ruby`] for a script that prints one JSON document.
pub fn ruby_json(url: &str, script: &str) -> Value {
    let printed = ruby(url, script);
    serde_json::from_str(&printed).unwrap_or_else(|e| panic!("ruby printed no JSON ({e}): {printed}"))
}

/// A real Sidekiq server process (Debian's `sidekiq` command) against the
/// Redis under test: it writes its heartbeat into `processes` as Sidekiq
/// does, and obeys the Web UI's signals. Killed when dropped.
pub struct SidekiqProcess {
    child: std::process::Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SidekiqProcess {
    /// Starts `sidekiq -q QUEUE -c 1` with a worker class `RubyOnlyJob`.
    pub fn start(url: &str, queue: &str) -> SidekiqProcess {
        Self::start_with(
            url,
            &["-q", queue, "-c", "1"],
            "class RubyOnlyJob\n  include Sidekiq::Worker\n  def perform(*) end\nend\n",
        )
    }

    /// Starts `sidekiq ARGS` requiring the Ruby source `worker` (its job
    /// classes), in a directory of its own.
    pub fn start_with(url: &str, args: &[&str], worker: &str) -> SidekiqProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("worker.rb");
        std::fs::write(&source, worker).expect("worker.rb");
        let log = dir.path().join("sidekiq.log");
        let child = Command::new("sidekiq")
            .arg("-r")
            .arg(&source)
            .args(args)
            .env("REDIS_URL", url)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(std::process::Stdio::from(
                std::fs::File::options().append(true).open(&log).expect("log file"),
            ))
            .spawn()
            .expect("sidekiq is not installed: apt-get install ruby-sidekiq");
        SidekiqProcess { child, log, _dir: dir }
    }

    /// Its process id (Sidekiq's identity is `hostname:PID:nonce`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SidekiqProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
