//! What a manifest may ask of the runner it is loaded into.
//!
//! The runner's flags are **caps**, not only defaults: a plugin's `[limits]`
//! may lower `--memory`, `--job-timeout` and `--disk` but never raise them
//! (the log budget has no runner flag: a plugin may set any), and its
//! `env` grants may not pass on the runner's own secrets. A manifest that
//! asks for more is refused at load (and at every hot reload), naming the
//! flag that caps it, so the operator decides, not the plugin's author.
//!
//! Secrets are recognised two ways:
//! - by name: `REDIS_URL`, `DATABASE_URL` and every `WASMJOBS_*` variable
//!   (the runner's own settings, `WASMJOBS_DB` among them);
//! - by value: any variable whose value (in the runner's environment)
//!   contains one of the values the runner protects — its Redis URL and
//!   the URLs of its `--db` databases — whatever the variable is called
//!   (`--db main=$PG_DSN` makes `PG_DSN` a secret).

use anyhow::{Result, bail};

use super::manifest::Manifest;
use crate::redact::Secrets;
use crate::sandbox::Limits;
use crate::size::mib;

/// Variable names a plugin may never be granted.
const SECRET_NAMES: [&str; 2] = ["REDIS_URL", "DATABASE_URL"];
/// Prefix of the runner's own settings.
const RUNNER_PREFIX: &str = "WASMJOBS_";

/// Refuses `manifest` if it asks for more than `caps` and `disk` (the
/// runner's `--memory`, `--job-timeout` and `--disk`) or grants a variable
/// that holds a secret: by name, or by a value holding one of `protected`.
pub(crate) fn check(manifest: &Manifest, caps: &Limits, disk: u64, protected: &Secrets) -> Result<()> {
    let path = manifest.path.display();
    if let Some(memory) = manifest.limits.memory
        && memory > caps.memory
    {
        bail!(
            "{path}: limits.memory asks for {}, over the runner's cap of {} (--memory)",
            mib(memory),
            mib(caps.memory)
        );
    }
    if let Some(timeout) = manifest.limits.timeout
        && timeout > caps.timeout
    {
        bail!(
            "{path}: limits.timeout asks for {}, over the runner's cap of {} (--job-timeout)",
            humantime::format_duration(timeout),
            humantime::format_duration(caps.timeout)
        );
    }
    if let Some(asked) = manifest.limits.disk
        && asked > disk
    {
        bail!(
            "{path}: limits.disk asks for {}, over the runner's cap of {} (--disk)",
            mib(usize::try_from(asked).unwrap_or(usize::MAX)),
            mib(usize::try_from(disk).unwrap_or(usize::MAX))
        );
    }
    for name in &manifest.env {
        if let Some(why) = secret(name, std::env::var_os(name).as_deref(), protected) {
            bail!("{path}: env grants {name}, which {why}; a plugin may not see the runner's secrets");
        }
    }
    Ok(())
}

/// Why the variable `name` with `value` is a secret, if it is.
fn secret(name: &str, value: Option<&std::ffi::OsStr>, protected: &Secrets) -> Option<&'static str> {
    if SECRET_NAMES.iter().any(|s| name.eq_ignore_ascii_case(s)) {
        return Some("names a connection URL of the runner");
    }
    if name.to_ascii_uppercase().starts_with(RUNNER_PREFIX) {
        return Some("is a setting of the runner");
    }
    let value = value?.to_string_lossy();
    protected
        .held_in(&value)
        .then_some("holds a URL or password of the runner's Redis or PostgreSQL")
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn secrets_by_name() {
        let none = Secrets::default();
        assert!(secret("REDIS_URL", None, &none).is_some());
        assert!(secret("redis_url", None, &none).is_some());
        assert!(secret("DATABASE_URL", None, &none).is_some());
        assert!(secret("WASMJOBS_DB", None, &none).is_some());
        assert!(secret("wasmjobs_plugins", None, &none).is_some());
        assert!(secret("API_TOKEN", Some(OsStr::new("abc")), &none).is_none());
    }

    #[test]
    fn secrets_by_value() {
        let protected = Secrets::default().with_urls(["postgres://app:hunter2@db/app", ""]);
        let dsn = OsStr::new("postgres://app:hunter2@db/app?sslmode=require");
        assert!(secret("PG_DSN", Some(dsn), &protected).is_some());
        assert!(secret("PG_PASSWORD", Some(OsStr::new("hunter2")), &protected).is_some());
        assert!(secret("PG_DSN", Some(OsStr::new("other")), &protected).is_none());
        // An empty protected value protects nothing (it is in every string).
        assert!(secret("HOME", Some(OsStr::new("/root")), &protected).is_none());
    }
}
