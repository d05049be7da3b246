//! `/`: the overview, `/api/overview`, the JSON its script polls every
//! second (counters, set sizes, busy and capacity: [`api::overview`],
//! three round trips) to update the numbers and the live chart without
//! reloading, and `/api/history?days=N`, read once on open: the last
//! hour per minute, which the live chart starts from, and the last
//! [`HISTORY_DAYS`] (or `N`) days for the history chart ([`history`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::Html;
use minijinja::context;
use serde_json::{Value, json};

use super::form::query_param;
use super::{Failure, Web, auth::Csrf};
use crate::redis::latency::last_hour;
use crate::redis::now_f64;
use crate::redis::{api, history};

/// The days of history shown unless the page asks for others.
const HISTORY_DAYS: u32 = 30;
/// The choices the page offers (Sidekiq Web's).
const DAY_CHOICES: [u32; 4] = [7, 30, 90, 180];

/// The `days` the query asks for, within [`history::MAX_DAYS`].
fn days(query: Option<&str>) -> u32 {
    query
        .and_then(|q| query_param(q, "days"))
        .and_then(|d| d.trim().parse::<u32>().ok())
        .map_or(HISTORY_DAYS, |d| d.clamp(1, history::MAX_DAYS))
}

pub(super) async fn page(
    State(web): State<Arc<Web>>,
    axum::Extension(Csrf(csrf)): axum::Extension<Csrf>,
    RawQuery(query): RawQuery,
) -> Result<Html<String>, Failure> {
    let days = days(query.as_deref());
    let mut conn = web.conn();
    let (mut stats, control_down) = web.store.control(api::stats(&mut conn)).await?;
    web.store.count_into(&mut stats).await?;
    let latency = match control_down {
        None => web.store.control(last_hour(&mut conn, now_f64())).await?.0,
        Some(_) => Default::default(),
    };
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
            days,
            day_choices => DAY_CHOICES,
            unreadable => stats.unreadable,
            stranded => stats.stranded,
            control_down,
        },
    )
}

pub(super) async fn api(State(web): State<Arc<Web>>) -> Result<Json<Value>, Failure> {
    let (mut overview, control_down) = web.store.control(api::overview(&mut web.conn())).await?;
    web.store.count_overview(&mut overview).await?;
    let mut json = serde_json::to_value(&overview).map_err(anyhow::Error::from)?;
    json["time"] = json!(now_f64());
    if let Some(why) = control_down {
        json["control_down"] = json!(why);
    }
    Ok(Json(json))
}

pub(super) async fn api_history(
    State(web): State<Arc<Web>>,
    RawQuery(query): RawQuery,
) -> Result<Json<history::History>, Failure> {
    let days = days(query.as_deref());
    Ok(Json(history::read(&mut web.conn(), now_f64(), days).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_read_leniently_and_bounded() {
        assert_eq!(days(None), HISTORY_DAYS);
        assert_eq!(days(Some("days=7")), 7);
        assert_eq!(days(Some("days=x")), HISTORY_DAYS);
        assert_eq!(days(Some("days=0")), 1);
        assert_eq!(days(Some("days=99999999")), history::MAX_DAYS);
    }
}
