//! `/processes`: the live processes (quiet, stop) and the jobs running in
//! each (cancel). Quiet and stop are Sidekiq's signals (`<identity>-signals`,
//! popped by the process's next heartbeat); cancel is `wasmjobs cancel`'s
//! (a job cancelled before is said to be, and its new request closed).
//! A queue both a wasmjobs and a Ruby Sidekiq process fetch is named at
//! the top, with the fix (`crate::redis::sharing`).
//! Every record Sidekiq (6, 7, 8) or another wasmjobs writes is listed, with
//! what could not be read of it; members of `processes` and work hashes
//! that are keys of another type are named as unreadable.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::{Html, Response};
use minijinja::context;

use super::auth::Csrf;
use super::form::query_param;
use super::queues::back;
use super::{Failure, Web};
use crate::redis::{admin, api, control, sharing};

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let mut conn = web.conn();
    let (processes, mut unreadable) = api::process_records(&mut conn).await?;
    let shared = sharing::shared_queues(&processes, crate::redis::now_f64());
    let identities: Vec<String> = processes.iter().map(|p| p.identity.clone()).collect();
    let (running, damaged) = admin::running(&mut conn, &identities).await?;
    unreadable.extend(damaged);
    let notice = query.as_deref().and_then(|q| query_param(q, "notice"));
    web.view.render(
        "processes.html",
        context! { active => "/processes", location => web.location, csrf, processes, running, notice, unreadable, shared },
    )
}

pub(super) async fn signal(State(web): State<Arc<Web>>, body: String) -> Result<Response, Failure> {
    let identity = query_param(&body, "identity").unwrap_or_default();
    let (signal, what) = match query_param(&body, "signal").as_deref() {
        Some("TSTP") => ("TSTP", "to go quiet (stop fetching)"),
        Some("TERM") => ("TERM", "to stop"),
        _ => return Err(Failure::not_found("no such signal")),
    };
    let mut conn = web.conn();
    // Only a live process, as listed: not a key the visitor names.
    let live = api::processes(&mut conn).await?;
    if !live.iter().any(|p| p.identity == identity) {
        return Ok(back(&web, "/processes", "That process is no longer alive."));
    }
    admin::signal(&mut conn, &identity, signal).await?;
    Ok(back(
        &web,
        "/processes",
        &format!("Asked {identity} {what}; it acts on its next heartbeat (within 10 s)."),
    ))
}

pub(super) async fn cancel(State(web): State<Arc<Web>>, body: String) -> Result<Response, Failure> {
    let jid = query_param(&body, "jid").unwrap_or_default();
    control::valid_jid(&jid).map_err(|err| Failure::not_found(format!("{err:#}")))?;
    let mut conn = web.conn();
    let request = control::CancelRequest::now("wasmjobs web");
    let looked = control::cancel_looking(&mut conn, std::slice::from_ref(&jid), &request).await?;
    let found = looked
        .found
        .into_iter()
        .next()
        .map_or(control::Found::Unknown, |(_, found)| found);
    if matches!(found, control::Found::Unknown) {
        match control::already_cancelled(&mut conn, &[&jid]).await {
            // Its process recorded it before it could be found running.
            Ok(mut earlier) => match earlier.remove(&jid) {
                Some((at, from)) if at.is_some_and(|at| at >= request.at - 0.002) => {
                    return Ok(back(
                        &web,
                        "/processes",
                        &format!("Job {jid} cancelled: stopped by {from}."),
                    ));
                }
                // A second click: the request just written is done with,
                // so the fetches need not look requests up for it (unless
                // a place was too long to read: a copy may wait there).
                Some((_, from)) => {
                    if looked.read_all
                        && let Err(err) = control::close_requests(&mut conn, &[&jid]).await
                    {
                        tracing::warn!(jid = %jid, "{err:#}; fetches look cancel requests up until it is closed or expires");
                    }
                    return Ok(back(
                        &web,
                        "/processes",
                        &format!("Job {jid} was already cancelled ({from}); nothing more to do."),
                    ));
                }
                None => {}
            },
            // The cancel itself is sent: say what is known.
            Err(err) => tracing::warn!(jid = %jid, "{err:#}"),
        }
    }
    let what = match found {
        control::Found::Queue(queue) => format!("taken out of queue {queue} before it ran"),
        control::Found::Scheduled => "taken out of the scheduled set".to_owned(),
        control::Found::Retry => "taken out of the retry set".to_owned(),
        control::Found::Running(processes) => format!("running in {}, which stops it", processes.join(", ")),
        control::Found::Unknown => "not found waiting or running; the request stays for a day".to_owned(),
    };
    Ok(back(&web, "/processes", &format!("Job {jid} cancelled: {what}.")))
}
