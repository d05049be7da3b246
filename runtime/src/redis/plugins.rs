//! The plugin reports in Redis: each wasmjobs process writes what its
//! plugins are, may do and did lately ([`crate::plugin::describe`]) as JSON
//! into the `plugins` field of its heartbeat hash with every beat
//! (`runner::heartbeat`); [`reports`] reads them back for the live
//! processes. A Sidekiq process has no such field and is left out; a field
//! that is not a report (anyone can write into the hash) is returned as
//! unreadable, never as an error for the whole page.

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;

use super::bounded;
use crate::plugin::Described;

/// The heartbeat field holding a process's report.
pub const FIELD: &str = "plugins";
/// Largest report read, bytes (a real one is a few KB per plugin).
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// One process's report.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The process (`hostname:pid:nonce`).
    pub identity: String,
    /// Its plugins, or why the field could not be read.
    pub plugins: Result<Described, String>,
}

/// The reports of `identities` (live processes, as listed), in that order;
/// processes without one are left out. Two round trips: the sizes
/// (`HSTRLEN`), then the fields no larger than [`MAX_REPORT_BYTES`].
pub async fn reports<C>(conn: &mut C, identities: &[String]) -> Result<Vec<Report>>
where
    C: ConnectionLike + Send,
{
    if identities.is_empty() {
        return Ok(Vec::new());
    }
    // Sizes first: a field someone made huge is never fetched.
    // A key of another type (written since it was listed) is an error
    // reply for that process alone.
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for identity in identities {
        pipe.cmd("HSTRLEN").arg(identity).arg(FIELD);
    }
    let sizes: Vec<redis::Value> = pipe
        .query_async(conn)
        .await
        .context("cannot read the plugin report sizes from Redis")?;
    let sizes: Vec<Result<usize, String>> = sizes.into_iter().map(bounded::reply).collect();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (identity, size) in identities.iter().zip(&sizes) {
        if size.as_ref().is_ok_and(|size| (1..=MAX_REPORT_BYTES).contains(size)) {
            pipe.hget(identity, FIELD);
        }
    }
    let mut fields: std::vec::IntoIter<redis::Value> = if pipe.is_empty() {
        Vec::new().into_iter()
    } else {
        let fields: Vec<redis::Value> = pipe
            .query_async(conn)
            .await
            .context("cannot read the plugin reports from Redis")?;
        fields.into_iter()
    };
    Ok(identities
        .iter()
        .zip(sizes)
        .filter_map(|(identity, size)| {
            let plugins = match size {
                Ok(0) => return None,
                Err(why) => Err(format!("not a heartbeat hash: {why}")),
                Ok(size) if size > MAX_REPORT_BYTES => Err(too_large(size)),
                // Gone between the two round trips: as if never there.
                Ok(_) => match bounded::reply::<Option<Vec<u8>>>(fields.next()?) {
                    Ok(field) => parse(&field?),
                    Err(why) => Err(format!("not a heartbeat hash: {why}")),
                },
            };
            Some(Report {
                identity: identity.clone(),
                plugins,
            })
        })
        .collect())
}

fn too_large(size: usize) -> String {
    format!("a report of {size} bytes, over {MAX_REPORT_BYTES}")
}

/// A report from the bytes of its field.
fn parse(bytes: &[u8]) -> Result<Described, String> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(too_large(bytes.len()));
    }
    serde_json::from_slice(bytes).map_err(|err| format!("not a plugin report: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_that_are_not_are_refused_with_a_reason() {
        assert!(parse(b"{\"plugins\":[]}").is_ok());
        assert!(parse(b"\xff\xfe").unwrap_err().contains("not a plugin report"));
        assert!(parse(b"[1,2]").unwrap_err().contains("not a plugin report"));
        let huge = vec![b' '; MAX_REPORT_BYTES + 1];
        assert!(parse(&huge).unwrap_err().contains("over"));
    }
}
