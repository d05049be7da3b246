//! The dashboard: `wasmjobs web`, or `wasmjobs run --web ADDR` beside a
//! runner. One binary, no build step and no Node: pages are rendered on the
//! server from the templates in `templates/` (minijinja, HTML-escaped
//! everywhere by default), and a small script (`assets/app.js`) draws the
//! overview's charts (uPlot, vendored in `assets/vendor/uplot/` with its
//! licence and version) from `GET /api/history` on open and updates its
//! numbers and live chart once a second from `GET /api/overview`.
//!
//! Everything it shows and changes is in Redis, so a dashboard serves the
//! whole cluster, and it reads the same keys Sidekiq's Web UI reads — except
//! the jobs themselves with the PostgreSQL store (`--source`): then the
//! queue and set pages, a job's page, search and the overview's counts read
//! and change the store ([`store`]). Like `cli/` and `redis/`, it never
//! touches Wasmtime.
//!
//! | file | page |
//! |---|---|
//! | [`overview`] | `/`: counters, live chart (from the last hour per minute), history per day, queues, capacity, per-class p50/p95/p99 of the last hour; `/api/overview`, `/api/history` |
//! | [`queues`] | `/queues`, `/queues/NAME`: browse, delete one, clear, pause, resume |
//! | [`sets`] | `/scheduled`, `/retries`, `/dead` and a job's page: view, retry now, delete, bulk, filter by class |
//! | [`processes`] | `/processes`: quiet, stop, RSS, CPU, in flight, plugin versions; cancel a running job |
//! | [`plugins`] | `/plugins`: versions and where they run, classes, grants, limits, load errors, reload history |
//! | [`search`] | `/search?q=`: a job by jid or by text in its payload, in every queue and set (bounded) |
//! | [`cron`] | `/cron`: schedules, next runs, enqueue now, disable / enable |
//! | [`auth`] | the name asked for, credentials, CSRF and security headers, checked in one place for every request |
//! | [`hosts`] | the names the dashboard answers to without credentials (DNS rebinding) |
//! | [`login`] | the sign-in form for the token |
//! | [`serve`] | connections, with header, idle and shutdown time limits |
//! | [`view`] | the templates and the helpers they use |
//! | [`pager`] | `?page=N` and the links to the pages around it |
//! | [`store`] | where the job pages find the jobs: Redis or the PostgreSQL store |
//! | [`shards`] | `/shards`: the fleet, with several Redis shards: each shard's health, counters and link |
//!
//! With several Redis shards (`--shard`), every shard has the whole set of
//! pages: the default shard's at the root, each other's under
//! `/shard/NAME`; every page links to the others and to `/shards`. The
//! credentials, host and CSRF checks are made once, for every path.
//!
//! No page runs a Redis command the visitor names: every action is one of
//! the fixed operations of [`crate::redis::admin`], [`crate::redis::control`]
//! and [`crate::redis::cron`] (or of [`crate::pg::admin`]), on the entry a
//! page listed.

mod auth;
mod cron;
mod form;
mod login;
mod overview;
mod pager;
mod plugins;
mod processes;
mod queues;
mod search;
mod serve;
mod sets;
mod shards;
mod store;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use redis::aio::ConnectionManager;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use auth::Access;
pub(crate) use store::JobStore;

/// The default address of `wasmjobs web`.
pub(crate) const DEFAULT_ADDR: &str = "127.0.0.1:9494";

/// One shard's Redis, as a dashboard serves it.
pub(crate) struct Site {
    /// The shard's name (`default` for the default shard).
    pub(crate) name: String,
    /// Its connection.
    pub(crate) conn: ConnectionManager,
    /// Where it is, for the header (no password).
    pub(crate) location: String,
}

/// What every handler of one shard's pages shares.
pub(crate) struct Web {
    redis: ConnectionManager,
    location: String,
    /// The shard's name.
    name: String,
    /// The path its pages start with ([`view::Nav::base`]).
    base: String,
    /// Where the jobs are.
    store: JobStore,
    access: Access,
    /// The names requests may address ([`hosts`]).
    hosts: crate::hosts::AllowedHosts,
    view: view::View,
}

impl Web {
    fn conn(&self) -> ConnectionManager {
        self.redis.clone()
    }

    /// The path of this shard's overview.
    fn nav_home(&self) -> String {
        view::home_of(&self.base)
    }
}

/// An error page: what went wrong, never a stack trace or a Redis URL.
pub(crate) struct Failure(StatusCode, String);

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        tracing::warn!("web: {err:#}");
        Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("{err:#}"))
    }
}

impl Failure {
    fn not_found(what: impl Into<String>) -> Self {
        Failure(StatusCode::NOT_FOUND, what.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// Binds `addr` (refusing a non-loopback address without credentials)
/// and returns the dashboard of `sites` (the default shard's first; one
/// with one Redis), ready to serve until `stop`. `store` is where the
/// default shard's jobs are; with several shards it must be Redis.
pub(crate) async fn bind(
    addr: SocketAddr,
    sites: Vec<Site>,
    store: JobStore,
    access: Access,
    stop: CancellationToken,
) -> Result<Dashboard> {
    access.required_for(addr)?;
    if sites.len() > 1 && store.location().is_some() {
        anyhow::bail!("the dashboard reads shards in Redis only; with --source the jobs are in PostgreSQL");
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the dashboard"))?;
    let bound = listener.local_addr().context("dashboard listener address")?;
    let sharded = sites.len() > 1;
    let base_of = |index: usize, name: &str| match index {
        0 => String::new(),
        _ => format!("/shard/{name}"),
    };
    let shards: Vec<(String, String)> = match sharded {
        true => sites
            .iter()
            .enumerate()
            .map(|(index, site)| (site.name.clone(), view::home_of(&base_of(index, &site.name))))
            .collect(),
        false => Vec::new(),
    };
    let mut store = Some(store);
    let mut webs = Vec::new();
    for (index, site) in sites.into_iter().enumerate() {
        let store = store.take().unwrap_or(JobStore::Redis);
        let nav = view::Nav {
            base: base_of(index, &site.name),
            shard: sharded.then(|| site.name.clone()),
            shards: shards.clone(),
        };
        webs.push(Arc::new(Web {
            redis: site.conn,
            location: site.location,
            name: site.name,
            base: nav.base.clone(),
            hosts: access.allowed_hosts(bound),
            access: access.clone(),
            view: view::View::new(store.location(), &nav)?,
            store,
        }));
    }
    Ok(Dashboard {
        listener: Arc::new(listener),
        bound,
        app: app(webs)?,
        stop,
    })
}

/// A bound dashboard: its listening socket and its routes.
pub(crate) struct Dashboard {
    listener: Arc<TcpListener>,
    bound: SocketAddr,
    app: Router,
    stop: CancellationToken,
}

impl Dashboard {
    /// The address it listens on.
    pub(crate) fn bound(&self) -> SocketAddr {
        self.bound
    }

    /// Serves until the stop ([`serve`]). Can be called again after it
    /// ended (the supervisor's restart): the socket stays bound meanwhile.
    pub(crate) fn serve(&self) -> impl Future<Output = ()> + Send + 'static {
        serve::serve(self.listener.clone(), self.app.clone(), self.stop.clone())
    }
}

/// The line that tells the user (and tests) where the dashboard is.
pub(crate) fn announce(bound: SocketAddr) {
    tracing::info!("wasmjobs web: listening on http://{bound}");
    if !tracing::enabled!(tracing::Level::INFO) {
        eprintln!("wasmjobs web: listening on http://{bound}");
    }
}

/// Every shard's pages (the default shard's at the root), the fleet
/// page with several, and the checks every request goes through.
fn app(webs: Vec<Arc<Web>>) -> Result<Router> {
    let default = webs.first().cloned().context("a dashboard needs a Redis")?;
    let mut app = pages(default.clone());
    if webs.len() > 1 {
        for web in &webs[1..] {
            app = app.nest(&web.base, pages(web.clone()));
        }
        let fleet = Arc::new(shards::Fleet { sites: webs });
        app = app.merge(Router::new().route("/shards", get(shards::page)).with_state(fleet));
    }
    Ok(app
        .layer(axum::middleware::from_fn_with_state(default, auth::guard))
        .layer(DefaultBodyLimit::max(64 << 10)))
}

/// One shard's pages.
fn pages(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/api/overview", get(overview::api))
        .route("/api/history", get(overview::api_history))
        .route("/queues", get(queues::list))
        .route("/queues/{name}", get(queues::page))
        .route("/queues/{name}/{action}", post(queues::act))
        .route("/processes", get(processes::page))
        .route("/processes/signal", post(processes::signal))
        .route("/cancel", post(processes::cancel))
        .route("/plugins", get(plugins::page))
        .route("/search", get(search::page))
        .route("/cron", get(cron::page))
        .route("/cron/enqueue", post(cron::enqueue))
        .route("/cron/status", post(cron::status))
        .route("/assets/{file}", get(asset))
        .route("/{set}", get(sets::list))
        .route("/{set}/job", get(sets::job))
        .route("/{set}/act", post(sets::act))
        .with_state(web)
}

/// The static files: ours and the vendored chart library.
async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (body, kind): (&'static str, &'static str) = match file.as_str() {
        "app.js" => (include_str!("assets/app.js"), "text/javascript; charset=utf-8"),
        "style.css" => (include_str!("assets/style.css"), "text/css; charset=utf-8"),
        "uPlot.iife.min.js" => (
            include_str!("assets/vendor/uplot/uPlot.iife.min.js"),
            "text/javascript; charset=utf-8",
        ),
        "uPlot.min.css" => (
            include_str!("assets/vendor/uplot/uPlot.min.css"),
            "text/css; charset=utf-8",
        ),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}
