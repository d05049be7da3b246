//! The guest's outgoing requests: `wasi:http/outgoing-handler`, and our
//! one-call `wasmjobs:job/http` ([`call`]), which the SDKs use.
//!
//! wasmtime-wasi-http implements the WASI types and streams; every request
//! then reaches [`WasiHttpHooks::send_request`]. The one-call import builds
//! the same hyper request itself. Both go through the host's policy
//! ([`HttpPolicy`]): the plugin's `http.allow` list ([`allow`]), counters,
//! the per-job slot, and the shared, pooled, bounded client ([`client`]).
//!
//! - A request to a host outside the list never leaves the process: the
//!   guest gets `HTTP-request-denied`, the host logs it (with the job's
//!   labels) and counts it in [`HttpStats::denied`].
//! - A request granted by a name or a `*.domain` wildcard reaches public
//!   addresses only ([`address`]), judged on the addresses the connection
//!   itself resolves and connects to ([`connect`]), so DNS the plugin's
//!   author controls cannot point it at loopback, the private network or
//!   the cloud metadata service. Such a request gets
//!   `destination-IP-prohibited`; the host logs the host, the address and
//!   the rule, and counts it in [`HttpStats::prohibited`]. Only a rule that
//!   names an IP literal or `localhost` reaches non-public addresses.
//! - A job may have at most [`HttpLimits::per_job`] requests open: waiting
//!   for a response, or with a response whose body is neither read to the
//!   end nor dropped ([`slot`]). Beyond that the guest gets
//!   `connection-limit-reached`, counted in [`HttpStats::limited`].
//! - With tracing on, each request gets a child span of the job and a
//!   `traceparent` header (replacing the guest's): see `crate::otel::host`.
//! - Connections are pooled per plugin ([`PluginPools`]); `https://`
//!   negotiates HTTP/2 by ALPN, and plain `http://` speaks it with prior
//!   knowledge when the granting rule says `h2 = true` ([`client`]).

mod address;
pub mod allow;
mod call;
pub mod client;
mod connect;
mod slot;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

pub use allow::{AllowList, Grant};
pub use client::{HttpClient, HttpLimits, PluginPools};

use crate::host::http::client::{Route, SendError};
use crate::host::http::slot::{HeldBody, Slot};
use crate::host::log::LogSink;
use crate::otel::{HostSpan, JobTrace};

/// Per-plugin request counters (for logs, stats and tests).
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Requests refused by `http.allow`.
    pub denied: AtomicU64,
    /// Requests refused because the job had too many open.
    pub limited: AtomicU64,
    /// Requests refused because a granted name led to a non-public address.
    pub prohibited: AtomicU64,
}

/// The outgoing-request hook installed in every job's store.
pub struct HttpPolicy {
    client: Arc<HttpClient>,
    pools: Arc<PluginPools>,
    allow: Arc<AllowList>,
    stats: Arc<HttpStats>,
    log: LogSink,
    /// This job's open requests: waiting for a response, or with its body
    /// unfinished (created on first use).
    open: Option<Arc<AtomicUsize>>,
    /// The job's trace, when tracing is on: each request gets a span (if
    /// sampled) and a `traceparent` header.
    trace: Option<JobTrace>,
    /// The first request of the job `http.allow` refused: its authority and
    /// what to do about it ([`call::allow_hint`]), for the failure's message.
    denied: Option<(String, String)>,
}

impl HttpPolicy {
    /// The policy for one job of a plugin with grants `allow` and
    /// connection pools `pools`.
    pub fn new(
        client: Arc<HttpClient>,
        pools: Arc<PluginPools>,
        allow: Arc<AllowList>,
        stats: Arc<HttpStats>,
        log: LogSink,
    ) -> Self {
        Self {
            client,
            pools,
            allow,
            stats,
            log,
            open: None,
            trace: None,
            denied: None,
        }
    }

    /// For a job that failed with `message`: which request `http.allow`
    /// refused and the rule that would grant it (a guest sees only
    /// `HttpRequestDenied`, which some SDKs, JavaScript's `fetch` among
    /// them, report vaguely); none when the message already says what to
    /// do (the one-call import's error does).
    pub(crate) fn denied_note(&self, message: &str) -> Option<String> {
        let (authority, hint) = self.denied.as_ref()?;
        (!message.contains(hint.as_str())).then(|| {
            format!(
                "http: the request to {authority} was denied: the plugin's manifest does not grant this host; {hint}"
            )
        })
    }

    /// The same policy, tracing each request under `trace`.
    pub(crate) fn with_trace(mut self, trace: Option<JobTrace>) -> Self {
        self.trace = trace;
        self
    }

    /// Opens the request's span and sets its `traceparent`, if traced.
    fn traced<B>(&self, request: &mut http::Request<B>) -> HostSpan {
        match &self.trace {
            Some(trace) => trace.http(request),
            None => HostSpan::default(),
        }
    }

    /// The grant for `uri`, if any: whether it may go, and where.
    fn permitted(&self, uri: &http::Uri) -> Option<(String, Route)> {
        let scheme = uri.scheme_str().unwrap_or("https");
        let host = uri.host()?;
        let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
        self.allow.grant(scheme, host, port).map(|grant| {
            let route = Route {
                private: grant.private,
                h2: grant.h2,
            };
            (grant.rule.to_owned(), route)
        })
    }
}

type Sent = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl HttpPolicy {
    /// Counts and logs a request refused by `http.allow`.
    fn note_denied(&mut self, uri: &http::Uri) {
        self.stats.denied.fetch_add(1, Ordering::Relaxed);
        if self.denied.is_none() {
            let authority = uri.authority().map_or_else(|| uri.to_string(), ToString::to_string);
            self.denied = Some((authority, call::allow_hint(uri)));
        }
        let labels = self.log.labels();
        tracing::warn!(
            jid = %labels.jid,
            class = %labels.class,
            plugin = %labels.plugin,
            uri = %uri,
            allowed = %self.allow,
            "outgoing HTTP request denied: host not in the plugin's http.allow; {}",
            call::allow_hint(uri)
        );
    }

    /// One of the job's request slots, or `None` (counted) when it has
    /// [`HttpLimits::per_job`] open.
    fn take_slot(&mut self) -> Option<Slot> {
        let open = self.open.get_or_insert_with(Default::default);
        let slot = Slot::take(open, self.client.limits().per_job);
        match slot {
            Some(_) => self.stats.sent.fetch_add(1, Ordering::Relaxed),
            None => self.stats.limited.fetch_add(1, Ordering::Relaxed),
        };
        slot
    }
}

/// Counts and logs a request the connector refused because the name
/// granted by `rule` led to a non-public address.
fn note_failure(stats: &HttpStats, log: &LogSink, err: &SendError, rule: &str) {
    let SendError::Prohibited(refused) = err else {
        return;
    };
    stats.prohibited.fetch_add(1, Ordering::Relaxed);
    let labels = log.labels();
    tracing::warn!(
        jid = %labels.jid,
        class = %labels.class,
        plugin = %labels.plugin,
        host = %refused.host,
        address = %refused.addr,
        range = refused.range,
        rule = %rule,
        "outgoing HTTP request refused: a name granted by http.allow leads to a non-public address \
         (only rules naming an IP literal or localhost may reach those)"
    );
}

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Sent,
    ) -> Box<dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, Sent)>> + Send> {
        _ = fut;
        let Some((rule, route)) = self.permitted(request.uri()) else {
            self.note_denied(request.uri());
            return Box::new(async { Err(Error::HttpRequestDenied) });
        };
        let Some(slot) = self.take_slot() else {
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        };
        let mut span = self.traced(&mut request);
        let client = self.client.clone();
        let pools = self.pools.clone();
        let stats = self.stats.clone();
        let log = self.log.clone();
        Box::new(async move {
            // The slot (and the span) go with the response body; on an
            // error they are dropped here.
            let response = client.send(&pools, request, options, route).await;
            let response = response.map_err(|err| {
                note_failure(&stats, &log, &err, &rule);
                let err = Error::from(err);
                span.failed(call::error_type(&err), &err);
                err
            })?;
            span.http_status(response.status().as_u16());
            let response = response.map(|body| HeldBody::new(body, slot, span).boxed_unsync());
            Ok((response, Box::new(async { Ok(()) }) as Sent))
        })
    }
}
