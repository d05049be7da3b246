//! `/cron`: every cron schedule in Redis (plugins' and sidekiq-cron's)
//! with its next run; "enqueue now", which enqueues the job a tick would
//! (with `cron_tick` the time of the click), in the dashboard's job store
//! (Redis, or PostgreSQL with `--source`), without claiming a tick, so
//! the schedule's own runs are unaffected; and disable / enable, which
//! sets the schedule's `status` as sidekiq-cron's Web UI does
//! ([`cron::set_enabled`]).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, Response};
use minijinja::context;
use serde_json::Value;

use super::auth::Csrf;
use super::form::query_param;
use super::queues::back;
use super::{Failure, Web};
use crate::cron::CronExpr;
use crate::redis::{cron, now_f64};

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let listing = cron::list(&mut web.conn()).await?;
    let now = now_f64();
    let entries: Vec<_> = listing
        .entries
        .iter()
        .map(|e| {
            let expr = CronExpr::parse_sidekiq(&e.cron).ok();
            let next = expr
                .as_ref()
                .and_then(|x| x.next_after(now.floor() as i64))
                .map(|t| t as f64);
            context! {
                name => e.name,
                cron => expr.as_ref().map_or(e.cron.clone(), |x| x.expression().to_owned()),
                timezone => expr.as_ref().map(|x| x.zone()).filter(|z| *z != "UTC"),
                class => e.class,
                queue => e.queue,
                args => Value::Array(e.args.clone()).to_string(),
                enabled => e.enabled,
                next,
                last => e.last_enqueue,
                plugin => e.plugin,
            }
        })
        .collect();
    let notice = query.as_deref().and_then(|q| query_param(q, "notice"));
    let unreadable: Vec<_> = listing.invalid.iter().map(|(key, why)| context! { key, why }).collect();
    web.view.render(
        "cron.html",
        context! { active => "/cron", location => web.location, csrf, entries, notice, unreadable, truncated => listing.truncated },
    )
}

pub(super) async fn enqueue(State(web): State<Arc<Web>>, body: String) -> Result<Response, Failure> {
    let name = query_param(&body, "name").unwrap_or_default();
    let mut conn = web.conn();
    let listing = cron::list(&mut conn).await?;
    let Some(entry) = listing.entries.iter().find(|e| e.name == name) else {
        return Ok(back(&web, "/cron", "That schedule no longer exists."));
    };
    let now = now_f64();
    let payload = entry.payload(now.floor() as i64, now);
    let jid = web.store.push(&mut conn, payload).await?;
    Ok(back(
        &web,
        "/cron",
        &format!("{} enqueued now (job {jid}).", entry.name),
    ))
}

pub(super) async fn status(State(web): State<Arc<Web>>, body: String) -> Result<Response, Failure> {
    let name = query_param(&body, "name").unwrap_or_default();
    let enabled = match query_param(&body, "status").as_deref() {
        Some("enabled") => true,
        Some("disabled") => false,
        _ => {
            return Err(Failure(
                StatusCode::BAD_REQUEST,
                "status must be enabled or disabled".into(),
            ));
        }
    };
    let mut conn = web.conn();
    let listing = cron::list(&mut conn).await?;
    let Some(entry) = listing.entries.iter().find(|e| e.name == name) else {
        return Ok(back(&web, "/cron", "That schedule no longer exists."));
    };
    if !cron::set_enabled(&mut conn, entry, enabled).await? {
        return Ok(back(&web, "/cron", "That schedule no longer exists."));
    }
    let notice = if enabled {
        format!("{} enabled: its next tick is enqueued.", entry.name)
    } else {
        format!(
            "{} disabled: no process enqueues its ticks until it is enabled again.",
            entry.name
        )
    };
    Ok(back(&web, "/cron", &notice))
}
