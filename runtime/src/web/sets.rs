//! `/scheduled`, `/retries`, `/dead`: the sorted sets of jobs, one job's
//! page, and their actions (run now, delete; selected or all). A hundred
//! jobs to a page; filtered by class, a page is a window of a thousand
//! entries looked through, with every match in it.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::response::{Html, Response};
use minijinja::context;

use super::auth::Csrf;
use super::form::query_param;
use super::queues::{back, encode};
use super::store::Action;
use super::{Failure, Web, pager};
use crate::redis::admin::{self, JobSet};

/// Entries one filtered page looks through.
const FILTER_WINDOW: usize = admin::PAGE * 10;

/// How a set is titled and its actions named.
fn labels(set: JobSet) -> (&'static str, &'static str, &'static str) {
    match set {
        JobSet::Scheduled => ("Scheduled jobs", "Runs", "Enqueue now"),
        JobSet::Retries => ("Retries", "Next retry", "Retry now"),
        JobSet::Dead => ("Dead jobs", "Died", "Retry now"),
    }
}

fn set_of(name: &str) -> Result<JobSet, Failure> {
    JobSet::from_name(name).ok_or_else(|| Failure::not_found("no such page"))
}

pub(super) async fn list(
    State(web): State<Arc<Web>>,
    Path(set): Path<String>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let set = set_of(&set)?;
    let class_filter = query
        .as_deref()
        .and_then(|q| query_param(q, "class"))
        .filter(|c| !c.is_empty());
    let notice = query.as_deref().and_then(|q| query_param(q, "notice"));
    // Filtered, a page is a window of entries looked through, and shows
    // every match in it.
    let per_page = if class_filter.is_some() {
        FILTER_WINDOW
    } else {
        admin::PAGE
    };
    let page = pager::asked(query.as_deref());
    let first = pager::start(page, per_page);
    let admin::Jobs {
        size,
        entries: jobs,
        unreadable,
    } = web
        .store
        .set_jobs(&mut web.conn(), set, first, per_page, class_filter.as_deref())
        .await?;
    let filter = class_filter
        .as_deref()
        .map(|class| format!("class={}&", encode(class)))
        .unwrap_or_default();
    let pager = pager::pager(page, size, per_page, |n| {
        format!("{}/{}?{filter}page={n}", web.base, set.name())
    });
    let (title, when_label, enqueue_label) = labels(set);
    web.view.render(
        "set.html",
        context! {
            active => format!("/{}", set.name()),
            location => web.location,
            csrf,
            set => set.name(),
            title,
            when_label,
            enqueue_label,
            size,
            jobs,
            notice,
            pager,
            unreadable => unreadable.into_iter().collect::<Vec<_>>(),
            looked => (class_filter.is_some() && (first as u64) < size).then(|| (first + 1, (first + per_page).min(size as usize))),
            class_filter => class_filter.unwrap_or_default(),
        },
    )
}

pub(super) async fn job(
    State(web): State<Arc<Web>>,
    Path(set): Path<String>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let set = set_of(&set)?;
    let key = query.as_deref().and_then(|q| query_param(q, "key")).unwrap_or_default();
    let Some(job) = web.store.set_entry(&mut web.conn(), set, &key).await? else {
        return Err(Failure::not_found(
            "This job is no longer in the set: it ran, was retried or was deleted.",
        ));
    };
    let (title, when_label, enqueue_label) = labels(set);
    web.view.render(
        "job.html",
        context! {
            active => format!("/{}", set.name()),
            location => web.location,
            csrf,
            set => set.name(),
            title,
            when_label,
            enqueue_label,
            job,
        },
    )
}

pub(super) async fn act(
    State(web): State<Arc<Web>>,
    Path(set): Path<String>,
    body: String,
) -> Result<Response, Failure> {
    let set = set_of(&set)?;
    let mut conn = web.conn();
    let action = query_param(&body, "action").unwrap_or_default();
    let keys: Vec<String> = url::form_urlencoded::parse(body.as_bytes())
        .filter(|(name, _)| name == "key")
        .map(|(_, value)| value.into_owned())
        .collect();
    // Back to the page and filter the form was on.
    let filter = query_param(&body, "class")
        .filter(|c| !c.is_empty())
        .map(|class| format!("class={}&", encode(&class)))
        .unwrap_or_default();
    let path = format!("/{}?{filter}page={}", set.name(), pager::asked(Some(&body)));
    let notice = match action.as_str() {
        "delete-all" => format!("{} jobs deleted.", web.store.clear_set(&mut conn, set).await?),
        "enqueue-all" => format!("{} jobs enqueued.", web.store.enqueue_all(&mut conn, set).await?),
        "enqueue" | "delete" => {
            let (act, verb) = match action.as_str() {
                "delete" => (Action::Delete, "deleted"),
                _ => (Action::Enqueue, "enqueued"),
            };
            let tally = web.store.act(&mut conn, set, act, &keys).await?;
            let mut notice = format!("{} jobs {verb}.", tally.done);
            if tally.gone > 0 {
                notice.push_str(&format!(" {} were no longer there.", tally.gone));
            }
            if tally.refused > 0 {
                notice.push_str(&format!(
                    " {} are not job payloads and can only be deleted.",
                    tally.refused
                ));
            }
            notice
        }
        _ => return Err(Failure::not_found("no such action")),
    };
    Ok(back(&web, &path, &notice))
}
