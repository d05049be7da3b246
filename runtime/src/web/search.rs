//! `/search?q=TEXT`: find a job by its jid, or by any text of its payload
//! (class, args, error message), in every queue and in the scheduled,
//! retry and dead sets.
//!
//! Bounded, like every page: the first [`WINDOW`] entries of each queue
//! (newest first) and set (in its listing's order) are looked through,
//! read as the listings read them (whole up to [`admin::LIST_MAX`] bytes,
//! a larger entry by its ends only), in at most [`MAX_QUEUES`] queues, and
//! the first [`MAX_MATCHES`] matches are shown. The page says how much it
//! looked through, so that a miss reads as "not in the first N" rather
//! than "not there". Matching is a case-insensitive substring of the
//! payload's text; the visitor's text is only ever compared, never sent to
//! Redis as a pattern.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::Html;
use minijinja::context;
use serde::Serialize;

use super::auth::Csrf;
use super::form::query_param;
use super::{Failure, Web};
use crate::redis::admin::{self, Entry, JobSet};
use crate::redis::api;

/// Entries looked through per queue or set.
pub(super) const WINDOW: usize = 1_000;
/// Queues looked through (in name order).
const MAX_QUEUES: usize = 100;
/// Matches shown.
const MAX_MATCHES: usize = 100;
/// Longest text searched for, in bytes.
const MAX_QUERY: usize = 200;

/// Where a job was found, and the job.
#[derive(Debug, Serialize)]
struct Found {
    /// `queue` or `set`.
    kind: &'static str,
    /// The queue's name, or the set's name in URLs.
    place: String,
    /// The listing page it is on (queues), for the link.
    page: usize,
    job: Entry,
}

/// What was looked through.
#[derive(Debug, Default, Serialize)]
struct Looked {
    /// Entries compared.
    entries: usize,
    /// Queues and sets whose size is beyond [`WINDOW`].
    cut: Vec<String>,
    /// Queues left out beyond [`MAX_QUEUES`].
    queues_left: usize,
}

/// Whether `entry` matches `needle` (lower case).
fn matches(entry: &Entry, needle: &str) -> bool {
    entry.jid.to_lowercase().contains(needle) || entry.text.to_lowercase().contains(needle)
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let q = query
        .as_deref()
        .and_then(|q| query_param(q, "q"))
        .map(|q| q.trim().to_owned())
        .unwrap_or_default();
    let too_long = q.len() > MAX_QUERY;
    let mut found = Vec::new();
    let mut looked = Looked::default();
    if !q.is_empty() && !too_long {
        let needle = q.to_lowercase();
        let mut conn = web.conn();
        let mut stats = api::stats(&mut conn).await?;
        web.store.count_into(&mut stats).await?;
        looked.queues_left = stats.queues.len().saturating_sub(MAX_QUEUES);
        for queue in stats.queues.iter().take(MAX_QUEUES) {
            let jobs = web.store.queue_jobs(&mut conn, &queue.name, 0, WINDOW).await?;
            if jobs.size > WINDOW as u64 {
                looked.cut.push(format!("queue {} ({} jobs)", queue.name, jobs.size));
            }
            looked.entries += jobs.entries.len();
            for (at, job) in jobs.entries.into_iter().enumerate() {
                if found.len() < MAX_MATCHES && matches(&job, &needle) {
                    found.push(Found {
                        kind: "queue",
                        place: queue.name.clone(),
                        page: at / admin::PAGE + 1,
                        job,
                    });
                }
            }
        }
        for set in [JobSet::Scheduled, JobSet::Retries, JobSet::Dead] {
            let jobs = web.store.set_jobs(&mut conn, set, 0, WINDOW, None).await?;
            if jobs.size > WINDOW as u64 {
                looked.cut.push(format!("{} ({} jobs)", set.name(), jobs.size));
            }
            looked.entries += jobs.entries.len();
            for job in jobs.entries {
                if found.len() < MAX_MATCHES && matches(&job, &needle) {
                    found.push(Found {
                        kind: "set",
                        place: set.name().to_owned(),
                        page: 1,
                        job,
                    });
                }
            }
        }
    }
    web.view.render(
        "search.html",
        context! {
            active => "/search",
            location => web.location,
            csrf,
            q,
            too_long,
            max_query => MAX_QUERY,
            found,
            looked,
            window => WINDOW,
            max_matches => MAX_MATCHES,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_matches_by_jid_or_text_whatever_the_case() {
        let entry = Entry::read(
            br#"{"class":"MailJob","args":["Ada@Example.com"],"jid":"abc123","queue":"q"}"#.to_vec(),
            None,
        );
        assert!(matches(&entry, "abc123"));
        assert!(matches(&entry, "ada@example.com"));
        assert!(matches(&entry, "mailjob"));
        assert!(!matches(&entry, "bob"));
    }
}
