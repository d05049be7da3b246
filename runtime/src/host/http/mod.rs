//! `wasi:http/outgoing-handler`: the guest's outgoing requests.
//!
//! wasmtime-wasi-http implements the WASI types and streams; every request
//! then reaches [`WasiHttpHooks::send_request`], which is where the host's
//! policy lives ([`HttpPolicy`]): the plugin's `http.allow` list
//! ([`allow`]), counters, and the shared, pooled, bounded client
//! ([`client`]). A request to a host outside the list never leaves the
//! process: the guest gets `HTTP-request-denied`, the host logs it (with the
//! job's labels) and counts it. A job may have at most
//! [`HttpLimits::per_job`] requests waiting for a response; beyond that the
//! guest gets `connection-limit-reached`.

pub mod allow;
pub mod client;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

pub use allow::AllowList;
pub use client::{HttpClient, HttpLimits};

use crate::host::log::LogSink;

/// Per-plugin request counters (for logs, stats and tests).
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Requests refused by `http.allow`.
    pub denied: AtomicU64,
    /// Requests refused because the job had too many waiting.
    pub limited: AtomicU64,
}

/// The outgoing-request hook installed in every job's store.
pub struct HttpPolicy {
    client: Arc<HttpClient>,
    allow: Arc<AllowList>,
    stats: Arc<HttpStats>,
    log: LogSink,
    /// This job's requests waiting for a response (created on first use).
    waiting: Option<Arc<AtomicUsize>>,
}

impl HttpPolicy {
    /// The policy for one job of a plugin with grants `allow`.
    pub fn new(client: Arc<HttpClient>, allow: Arc<AllowList>, stats: Arc<HttpStats>, log: LogSink) -> Self {
        Self {
            client,
            allow,
            stats,
            log,
            waiting: None,
        }
    }

    fn permitted(&self, uri: &http::Uri) -> bool {
        let scheme = uri.scheme_str().unwrap_or("https");
        let Some(host) = uri.host() else { return false };
        let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
        self.allow.allows(scheme, host, port)
    }
}

type Sent = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Sent,
    ) -> Box<dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, Sent)>> + Send> {
        _ = fut;
        if !self.permitted(request.uri()) {
            self.stats.denied.fetch_add(1, Ordering::Relaxed);
            let labels = self.log.labels();
            tracing::warn!(
                jid = %labels.jid,
                class = %labels.class,
                plugin = %labels.plugin,
                uri = %request.uri(),
                allowed = %self.allow,
                "outgoing HTTP request denied: host not in the plugin's http.allow"
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        let waiting = self.waiting.get_or_insert_with(Default::default).clone();
        if waiting.fetch_add(1, Ordering::AcqRel) >= self.client.limits().per_job {
            waiting.fetch_sub(1, Ordering::AcqRel);
            self.stats.limited.fetch_add(1, Ordering::Relaxed);
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        }
        self.stats.sent.fetch_add(1, Ordering::Relaxed);
        let client = self.client.clone();
        Box::new(async move {
            let response = client.send(request, options).await;
            waiting.fetch_sub(1, Ordering::AcqRel);
            Ok((response?, Box::new(async { Ok(()) }) as Sent))
        })
    }
}
