//! `wasmjobs env`: the Redis a program beside wasmjobs should use, as
//! shell assignments (`eval "$(wasmjobs env)"`), found as every other
//! command finds it ([`super::project`]). Starts nothing, creates nothing.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::project::{Chosen, DataDir};
use super::{Cli, RedisArgs};

/// Arguments of `wasmjobs env`.
#[derive(Debug, Args)]
pub struct EnvArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
}

/// Runs the command.
pub fn run(cli: &Cli, args: &EnvArgs) -> Result<ExitCode> {
    let mut text = render(&cli.data, args.redis.url.as_deref());
    if let Some((shards, routes)) = args.redis.shard_map(&cli.data_dir)?.env() {
        text.push_str("# the other Redis servers (shards) and the queues each holds\n");
        text.push_str(&format!("export WASMJOBS_SHARDS={}\n", quoted(&shards)));
        text.push_str(&format!("export WASMJOBS_ROUTES={}\n", quoted(&routes)));
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The assignments and comments `env` prints.
fn render(data: &DataDir, url: Option<&str>) -> String {
    let mut out = String::new();
    let place = match data.chosen {
        Chosen::Given => "given with --data-dir / WASMJOBS_DATA_DIR",
        Chosen::Found => "this project's",
        Chosen::New => "none yet: the first wasmjobs command run here creates it",
    };
    out.push_str(&format!("# data directory: {} ({place})\n", data.path.display()));
    out.push_str(&format!(
        "export WASMJOBS_DATA_DIR={}\n",
        quoted(&data.path.display().to_string())
    ));
    match url.map(str::trim).filter(|u| !u.is_empty()) {
        Some(url) => {
            out.push_str("# Redis: the one --redis / REDIS_URL names\n");
            out.push_str(&format!("export REDIS_URL={}\n", quoted(url)));
        }
        None => {
            let (socket, up) = crate::redis::embedded::status(&data.path);
            let state = if up {
                "running now"
            } else {
                "not running now: it starts with the first wasmjobs command that needs it and stops after the last, so keep `wasmjobs run` going while another program enqueues"
            };
            out.push_str(&format!("# Redis: the embedded one, on a unix socket ({state})\n"));
            out.push_str(&format!(
                "export REDIS_URL={}\n",
                quoted(&format!("unix://{}", socket.display()))
            ));
        }
    }
    out
}

/// `text` as one shell word.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_embedded_redis_is_printed_as_a_unix_url_a_shell_can_eval() {
        let data = DataDir {
            path: PathBuf::from("/home/me/it's app/.wasmjobs"),
            chosen: Chosen::Found,
        };
        let text = render(&data, None);
        assert!(
            text.contains(r"export REDIS_URL='unix:///home/me/it'\''s app/.wasmjobs/redis/redis.sock'"),
            "{text}"
        );
        assert!(text.contains("not running now"), "{text}");
        let given = render(&data, Some("redis://db:6379/2"));
        assert!(given.contains("export REDIS_URL='redis://db:6379/2'"), "{given}");
    }
}
