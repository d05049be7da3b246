//! The read side of the cluster-limit keys (`runner::limiter`), for
//! `wasmjobs stats`: per plugin, the starts in its rate windows, the
//! key values seen, the concurrency leases held now and the refusals
//! counted so far.
//!
//! Bounded whatever is in Redis: a `SCAN` of `wasmjobs:limit:*` stops
//! after [`MAX_KEYS`] keys or [`MAX_ROUNDS`] calls (the result then says
//! `truncated`), and the sizes are read in one pipelined round trip. Key
//! names are read as bytes and any that do not parse are skipped, and a
//! key of another type counts as empty.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use redis::aio::ConnectionLike;
use serde::Serialize;

use super::keys::LIMIT_PREFIX;

/// Most limit keys read.
pub(crate) const MAX_KEYS: usize = 10_000;
/// Most `SCAN` calls.
pub(crate) const MAX_ROUNDS: usize = 200;

/// What the limit keys say.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LimitStats {
    /// Per plugin (its key segment), by name.
    pub plugins: Vec<PluginLimits>,
    /// Whether the scan stopped at its bounds (the figures are partial).
    pub truncated: bool,
}

/// One plugin's limit keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PluginLimits {
    /// The plugin's segment in the key names (its name when plain).
    pub plugin: String,
    /// Starts in the window of `limits.rate` (entries of its log; a log is
    /// trimmed at each start and expires one window after the last).
    pub starts: u64,
    /// Key values with a per-key log or leases now.
    pub keys: u64,
    /// Starts in the windows of `per_key.rate`, all key values together.
    pub key_starts: u64,
    /// Concurrency leases held now (not expired), all key values together.
    pub leases: u64,
    /// Jobs refused by a rate limit so far (`overrated` counts).
    pub overrated_rate: u64,
    /// Jobs refused by a concurrency limit so far.
    pub overrated_concurrency: u64,
}

enum Kind {
    Rate,
    KeyRate(String),
    Leases(String),
    Overrated,
}

/// `(plugin, kind)` of a limit key name, if it is one.
fn classify(name: &str) -> Option<(String, Kind)> {
    let rest = name.strip_prefix(LIMIT_PREFIX)?;
    let (plugin, rest) = rest.split_once(':')?;
    let kind = match rest {
        "rate" => Kind::Rate,
        "overrated" => Kind::Overrated,
        _ => {
            let bucket = rest.strip_prefix("key:")?;
            if let Some(bucket) = bucket.strip_suffix(":rate") {
                Kind::KeyRate(bucket.to_owned())
            } else {
                Kind::Leases(bucket.strip_suffix(":leases")?.to_owned())
            }
        }
    };
    Some((plugin.to_owned(), kind))
}

/// Reads every plugin's limit keys (bounded, see the module docs).
pub async fn limit_stats<C: ConnectionLike + Send>(conn: &mut C) -> Result<LimitStats> {
    let mut names = Vec::new();
    let mut cursor = 0u64;
    let mut truncated = false;
    for round in 0.. {
        let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{LIMIT_PREFIX}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .context("scanning the limit keys")?;
        names.extend(page.into_iter().filter_map(|n| String::from_utf8(n).ok()));
        cursor = next;
        if cursor == 0 {
            break;
        }
        if names.len() >= MAX_KEYS || round + 1 >= MAX_ROUNDS {
            truncated = true;
            break;
        }
    }
    names.sort();
    names.dedup();
    names.truncate(MAX_KEYS);
    let classified: Vec<(String, Kind, String)> = names
        .into_iter()
        .filter_map(|name| classify(&name).map(|(plugin, kind)| (plugin, kind, name)))
        .collect();

    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .context("reading Redis's clock")?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut pipe = redis::pipe();
    for (_, kind, name) in &classified {
        match kind {
            Kind::Rate | Kind::KeyRate(_) => pipe.cmd("ZCARD").arg(name),
            Kind::Leases(_) => pipe.cmd("ZCOUNT").arg(name).arg(format!("({now_ms}")).arg("+inf"),
            Kind::Overrated => pipe.cmd("HMGET").arg(name).arg("rate").arg("concurrency"),
        };
    }
    // A key of another type (anyone can write one) counts as empty.
    pipe.ignore_errors();
    let values: Vec<redis::Value> = if classified.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(conn).await.context("reading the limit keys")?
    };

    let mut plugins: BTreeMap<String, (PluginLimits, std::collections::BTreeSet<String>)> = BTreeMap::new();
    for ((plugin, kind, _), value) in classified.into_iter().zip(values) {
        let (entry, buckets) = plugins.entry(plugin.clone()).or_insert_with(|| {
            (
                PluginLimits {
                    plugin,
                    ..PluginLimits::default()
                },
                Default::default(),
            )
        });
        let count = || redis::from_redis_value::<u64>(value.clone()).unwrap_or(0);
        match kind {
            Kind::Rate => entry.starts += count(),
            Kind::KeyRate(bucket) => {
                entry.key_starts += count();
                buckets.insert(bucket);
            }
            Kind::Leases(bucket) => {
                entry.leases += count();
                buckets.insert(bucket);
            }
            Kind::Overrated => {
                let (rate, concurrency): (Option<u64>, Option<u64>) =
                    redis::from_redis_value(value).unwrap_or_default();
                entry.overrated_rate += rate.unwrap_or(0);
                entry.overrated_concurrency += concurrency.unwrap_or(0);
            }
        }
    }
    Ok(LimitStats {
        plugins: plugins
            .into_values()
            .map(|(mut entry, buckets)| {
                entry.keys = buckets.len() as u64;
                entry
            })
            .collect(),
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_classify_or_are_skipped() {
        let kind = |name: &str| {
            classify(name).map(|(plugin, kind)| {
                let kind = match kind {
                    Kind::Rate => "rate".to_owned(),
                    Kind::KeyRate(b) => format!("key-rate {b}"),
                    Kind::Leases(b) => format!("leases {b}"),
                    Kind::Overrated => "overrated".to_owned(),
                };
                format!("{plugin} {kind}")
            })
        };
        assert_eq!(kind("wasmjobs:limit:p:rate").as_deref(), Some("p rate"));
        assert_eq!(kind("wasmjobs:limit:p:key:ab:rate").as_deref(), Some("p key-rate ab"));
        assert_eq!(
            kind("wasmjobs:limit:p:key:none:leases").as_deref(),
            Some("p leases none")
        );
        assert_eq!(kind("wasmjobs:limit:p:overrated").as_deref(), Some("p overrated"));
        for other in [
            "wasmjobs:limit:p",
            "wasmjobs:limit:p:key:x",
            "wasmjobs:limit:p:other",
            "queue:x",
        ] {
            assert!(kind(other).is_none(), "{other}");
        }
    }
}
