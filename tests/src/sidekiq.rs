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
    let output = Command::new("ruby")
        .args(["-e", &program])
        .env("REDIS_URL", url)
        .output()
        .expect("ruby is not installed: apt-get install ruby-sidekiq");
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
