//! `/queues` and `/queues/NAME`: the queues, a queue's jobs newest first,
//! a hundred to a page, and its actions (pause, resume, clear, delete one
//! job).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use minijinja::context;

use super::auth::Csrf;
use super::form::query_param;
use super::{Failure, Web, pager};
use crate::redis::{admin, api, control};

pub(super) async fn list(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
) -> Result<Html<String>, Failure> {
    let (mut stats, control_down) = web.store.control(api::stats(&mut web.conn())).await?;
    web.store.count_into(&mut stats).await?;
    web.view.render(
        "queues.html",
        context! { active => "/queues", location => web.location, csrf, queues => stats.queues, unreadable => stats.unreadable, stranded => stats.stranded, control_down },
    )
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    Path(name): Path<String>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Html<String>, Failure> {
    control::valid_queue(&name).map_err(|err| Failure::not_found(format!("{err:#}")))?;
    let mut conn = web.conn();
    let page = pager::asked(query.as_deref());
    let first = pager::start(page, admin::PAGE);
    let admin::Jobs {
        size,
        entries: jobs,
        unreadable,
    } = web.store.queue_jobs(&mut conn, &name, first, admin::PAGE).await?;
    let ((paused, paused_unreadable), control_down) = web.store.control(api::is_paused(&mut conn, &name)).await?;
    let unreadable: Vec<_> = unreadable.into_iter().chain(paused_unreadable).collect();
    let notice = query.as_deref().and_then(|q| query_param(q, "notice"));
    let path = format!("{}/queues/{}", web.base, encode(&name));
    let pager = pager::pager(page, size, admin::PAGE, |n| format!("{path}?page={n}"));
    web.view.render(
        "queue.html",
        context! {
            active => "/queues",
            location => web.location,
            csrf,
            name,
            size,
            first => first + 1,
            jobs,
            notice,
            pager,
            unreadable,
            control_down,
            state => if paused { "paused" } else { "active" },
        },
    )
}

pub(super) async fn act(
    State(web): State<Arc<Web>>,
    Path((name, action)): Path<(String, String)>,
    body: String,
) -> Result<Response, Failure> {
    control::valid_queue(&name).map_err(|err| Failure::not_found(format!("{err:#}")))?;
    let mut conn = web.conn();
    let notice = match action.as_str() {
        "pause" => {
            control::pause(&mut conn, std::slice::from_ref(&name)).await?;
            format!("Queue {name} paused: no process fetches from it until it is resumed.")
        }
        "resume" => {
            control::resume(&mut conn, std::slice::from_ref(&name)).await?;
            format!("Queue {name} resumed.")
        }
        "clear" => {
            let removed = web.store.clear_queue(&mut conn, &name).await?;
            format!("Queue {name} cleared: {removed} jobs deleted.")
        }
        "delete" => {
            let key = query_param(&body, "key").unwrap_or_default();
            let page = pager::asked(Some(&body));
            match web.store.delete_queued(&mut conn, &name, &key, page).await? {
                Some(jid) => format!("Job {jid} deleted."),
                None => "That job is no longer in the queue.".to_owned(),
            }
        }
        _ => return Err(Failure::not_found("no such action")),
    };
    // Back to the page the form was on (page 1 for the queue's own actions).
    let page = pager::asked(Some(&body));
    Ok(back(&web, &format!("/queues/{}?page={page}", encode(&name)), &notice))
}

/// Percent-encodes a path segment or query value.
pub(super) fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A redirect to `path` of `web`'s shard that shows `notice` there.
pub(super) fn back(web: &Web, path: &str, notice: &str) -> Response {
    let separator = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{}{path}{separator}notice={}", web.base, encode(notice))).into_response()
}
