//! `/`: the overview, and `/api/overview`, the JSON its script polls
//! every second (counters, set sizes, busy and capacity:
//! [`api::overview`], three round trips) to update the numbers and the
//! chart without reloading.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Html;
use minijinja::context;
use serde_json::{Value, json};

use super::{Failure, Web, auth::Csrf};
use crate::redis::api;
use crate::redis::latency::last_hour;
use crate::redis::now_f64;

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
) -> Result<Html<String>, Failure> {
    let mut conn = web.conn();
    let stats = api::stats(&mut conn).await?;
    let latency = last_hour(&mut conn, now_f64()).await?;
    let busy: u64 = stats.processes.iter().map(|p| p.busy).sum();
    let capacity: u64 = stats.processes.iter().map(|p| p.concurrency).sum();
    // Queues some live process (ours or a Ruby Sidekiq's) fetches: any
    // other queue gets a warning, its jobs wait for nobody.
    let served: Vec<&str> = stats
        .processes
        .iter()
        .flat_map(|p| p.queues.iter().map(String::as_str))
        .collect();
    web.view.render(
        "overview.html",
        context! {
            active => "/",
            location => web.location,
            csrf,
            stats,
            latency,
            busy,
            capacity,
            served,
            unreadable => stats.unreadable,
        },
    )
}

pub(super) async fn api(State(web): State<Arc<Web>>) -> Result<Json<Value>, Failure> {
    let overview = api::overview(&mut web.conn()).await?;
    let mut json = serde_json::to_value(&overview).map_err(anyhow::Error::from)?;
    json["time"] = json!(now_f64());
    Ok(Json(json))
}
