//! The HTTP endpoint of `wasmjobs run --metrics-addr ADDR`: `GET /metrics`
//! (Prometheus text format) and `GET /stats` (JSON). Read-only, no auth:
//! bind it to loopback or a private interface. It answers only to
//! loopback's names, IP addresses and the names in `WASMJOBS_WEB_HOSTS`
//! ([`crate::hosts`]): a page that rebinds its own name to this address
//! is refused with 421.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::Metrics;
use super::exposition::{prometheus, stats_document};
use crate::hosts::{AllowedHosts, parse_list};

/// A bound endpoint: its listening socket, kept while [`Server::serve`]
/// is restarted.
pub struct Server {
    listener: Arc<TcpListener>,
    metrics: Arc<Metrics>,
    hosts: Arc<AllowedHosts>,
    stop: tokio_util::sync::CancellationToken,
}

impl Server {
    /// Serves until `stop`. Can be called again after it ended (a
    /// supervisor's restart): the socket stays bound meanwhile.
    pub fn serve(&self) -> impl Future<Output = ()> + Send + 'static {
        serve(
            self.listener.clone(),
            self.metrics.clone(),
            self.hosts.clone(),
            self.stop.clone(),
        )
    }
}

/// Binds `addr` (so a bad address fails at start, not later) and returns
/// the bound address and the endpoint, which serves until `stop`.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(SocketAddr, Server)> {
    let extra = match std::env::var("WASMJOBS_WEB_HOSTS") {
        Ok(names) => parse_list(&names)?,
        Err(_) => Vec::new(),
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {addr}"))?;
    let bound = listener.local_addr().context("metrics listener address")?;
    let hosts = Arc::new(AllowedHosts::new(bound, false, &extra).and_ip_addresses());
    let server = Server {
        listener: Arc::new(listener),
        metrics,
        hosts,
        stop,
    };
    Ok((bound, server))
}

async fn serve(
    listener: Arc<TcpListener>,
    metrics: Arc<Metrics>,
    hosts: Arc<AllowedHosts>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!("metrics endpoint: accept failed: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (metrics, hosts) = (metrics.clone(), hosts.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (metrics, hosts) = (metrics.clone(), hosts.clone());
                async move { Ok::<_, Infallible>(respond(&request, &metrics, &hosts)) }
            });
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("metrics endpoint connection: {err}");
            }
        });
    }
}

/// The name a request is addressed to: its URI's authority, else its
/// `Host` (none: not a browser, let through).
fn addressed_to<B>(request: &Request<B>) -> Option<&str> {
    request.uri().authority().map(|a| a.as_str()).or_else(|| {
        request
            .headers()
            .get(http::header::HOST)
            .map(|value| value.to_str().unwrap_or("\u{fffd}"))
    })
}

fn respond(request: &Request<Incoming>, metrics: &Metrics, hosts: &AllowedHosts) -> Response<Full<Bytes>> {
    let misdirected = addressed_to(request).is_some_and(|name| !hosts.admits(name));
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        _ if misdirected => (
            StatusCode::MISDIRECTED_REQUEST,
            "text/plain",
            "misdirected request: this metrics endpoint answers only to loopback's names and IP addresses \
             (a page under another name may be a DNS rebinding attack); list other names in WASMJOBS_WEB_HOSTS\n"
                .to_owned(),
        ),
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            prometheus(metrics),
        ),
        (&Method::GET, "/stats") => match serde_json::to_string_pretty(&stats_document(metrics)) {
            Ok(json) => (StatusCode::OK, "application/json", json),
            Err(err) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("cannot encode the stats: {err}\n"),
            ),
        },
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics or /stats\n".to_owned(),
        ),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(http::header::CONTENT_TYPE, value);
    }
    response
}
