//! Commands that read every shard the same way (`schedule`, `limits`):
//! without shards the one Redis's answer is the command's; with shards
//! each shard is read, one that is down is reported as down, and the
//! output has a section per shard (`--json`: `{"shards": [...]}`, each
//! with `name`, `location`, `up` and the command's document, or `error`);
//! a shard down makes the exit status 1.

use std::future::Future;

use anyhow::{Result, anyhow};
use redis::aio::ConnectionManager;

use super::RedisArgs;
use crate::redis::shards::{close_all, open_all};

/// What one shard answered.
pub(super) struct Answer<T> {
    pub(super) name: String,
    pub(super) location: String,
    pub(super) read: Result<T>,
}

/// Runs `read` on every shard of `args`. Without shards, an error is the
/// command's.
pub(super) async fn read_all<T, F, Fut>(args: &RedisArgs, data_dir: &std::path::Path, read: F) -> Result<Vec<Answer<T>>>
where
    F: Fn(ConnectionManager) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let map = args.shard_map(data_dir)?;
    let shards = open_all(&map).await;
    let reads = shards.iter().map(|shard| {
        let conn = shard.redis.as_ref().map(|redis| redis.conn());
        let read = &read;
        async move {
            match conn {
                Ok(conn) => read(conn).await,
                Err(err) => Err(anyhow!("{err:#}")),
            }
        }
    });
    let reads = futures_util::future::join_all(reads).await;
    let answers: Vec<Answer<T>> = shards
        .iter()
        .zip(reads)
        .map(|(shard, read)| Answer {
            name: shard.name.clone(),
            location: shard.location.clone(),
            read,
        })
        .collect();
    close_all(shards).await?;
    if !map.is_sharded() {
        let mut answers = answers;
        if let Some(Answer { read: Err(err), .. }) = answers.pop_if(|a| a.read.is_err()) {
            return Err(err);
        }
        return Ok(answers);
    }
    Ok(answers)
}

/// The exit status: 1 when a shard could not be read.
pub(super) fn status<T>(answers: &[Answer<T>]) -> std::process::ExitCode {
    match answers.iter().any(|answer| answer.read.is_err()) {
        true => std::process::ExitCode::from(1),
        false => std::process::ExitCode::SUCCESS,
    }
}

/// The text: the one answer, or a section per shard.
pub(super) fn text<T>(answers: &[Answer<T>], render: impl Fn(&T) -> String) -> String {
    if let [Answer { read: Ok(only), .. }] = answers {
        return render(only);
    }
    let mut out = String::new();
    for answer in answers {
        out.push_str(&format!("== shard {} ({}) ==\n", answer.name, answer.location));
        match &answer.read {
            Ok(read) => out.push_str(&render(read)),
            Err(err) => out.push_str(&format!("DOWN: {err:#}\n")),
        }
        out.push('\n');
    }
    out
}

/// The JSON: the one answer's document, or `{"shards": [...]}` with each
/// shard's document under `key`.
pub(super) fn json<T>(
    answers: &[Answer<T>],
    key: &str,
    to_json: impl Fn(&T) -> Result<serde_json::Value>,
) -> Result<serde_json::Value> {
    if let [Answer { read: Ok(only), .. }] = answers {
        return to_json(only);
    }
    let mut shards = Vec::with_capacity(answers.len());
    for answer in answers {
        let mut doc = serde_json::json!({
            "name": answer.name,
            "location": answer.location,
            "up": answer.read.is_ok(),
        });
        match &answer.read {
            Ok(read) => doc[key] = to_json(read)?,
            Err(err) => doc["error"] = format!("{err:#}").into(),
        }
        shards.push(doc);
    }
    Ok(serde_json::json!({ "shards": shards }))
}
