//! The plugin reports in Redis: each wasmjobs process writes what its
//! plugins are, may do and did lately ([`crate::plugin::describe`]) as JSON
//! into the `plugins` field of its heartbeat hash with every beat
//! (`runner::heartbeat`); [`reports`] reads them back for the live
//! processes. A Sidekiq process has no such field and is left out; a field
//! that is not a report (anyone can write into the hash) is returned as
//! unreadable, never as an error for the whole page.

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;

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
/// processes without one are left out.
pub async fn reports<C>(conn: &mut C, identities: &[String]) -> Result<Vec<Report>>
where
    C: ConnectionLike + Send,
{
    if identities.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for identity in identities {
        pipe.hget(identity, FIELD);
    }
    let fields: Vec<Option<Vec<u8>>> = pipe
        .query_async(conn)
        .await
        .context("cannot read the plugin reports from Redis")?;
    Ok(identities
        .iter()
        .zip(fields)
        .filter_map(|(identity, field)| {
            Some(Report {
                identity: identity.clone(),
                plugins: parse(&field?),
            })
        })
        .collect())
}

/// A report from the bytes of its field.
fn parse(bytes: &[u8]) -> Result<Described, String> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(format!("a report of {} bytes, over {MAX_REPORT_BYTES}", bytes.len()));
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
