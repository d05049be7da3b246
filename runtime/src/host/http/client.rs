//! The HTTP client every guest request goes through.
//!
//! [`HttpClient`] is process-wide: the limits, and the two connectors with
//! the one TLS configuration (webpki roots; ALPN offering `h2` and
//! `http/1.1`), built once. Connections are pooled per plugin
//! ([`PluginPools`], created on a plugin's first request), so jobs of a
//! plugin hitting the same host reuse connections instead of opening one
//! per job (wasmtime-wasi-http's default sender connects afresh for every
//! request), while no plugin can hold, starve or observe the connections of
//! another: over HTTP/2 a plugin that fills the server's concurrent-stream
//! limit would otherwise make every other plugin's requests to that host
//! queue behind its own. Each request is bounded: the time to the response
//! head, the time between body chunks, and the body's size; a guest can
//! ask for shorter timeouts but not for longer ones.
//!
//! Protocols: `https://` negotiates HTTP/2 or HTTP/1.1 by ALPN; plain
//! `http://` speaks HTTP/1.1 (keep-alive), or HTTP/2 with prior knowledge
//! when the rule that granted the request says `h2 = true` (a server that
//! only speaks HTTP/1.1 then fails the request with a protocol error).
//! Over HTTP/2 a plugin's requests to a host share a few connections
//! ([`Lanes`]): hyper's pool keeps one HTTP/2 connection per host, on
//! which requests past the server's concurrent-stream limit queue until a
//! stream frees, so a pool is split into lanes, each with its own
//! connection, and a request takes the first lane with fewer than
//! [`STREAMS_PER_LANE`] requests open. 1,000 requests in flight to one
//! host thus use 10 connections, not 1 with 900 waiting.
//!
//! A plugin's pools split further by reach. Requests granted by a rule that
//! names an IP literal or `localhost` go through the *open* pools, which
//! connect wherever the host resolves; every other request goes through the
//! *checked* ones, whose connector ([`super::connect`]) refuses non-public
//! addresses, judged on the TCP peer before TLS or any HTTP/2 preface.
//! hyper keys pooled connections by scheme and authority only, so a shared
//! pool would let a checked request reuse a connection opened unchecked;
//! apart, a checked request only ever reuses a connection that passed the
//! check when it was opened. HTTP/1.1 and prior-knowledge HTTP/2 are apart
//! too, for the same reason (one pool speaks one protocol over `http://`).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use super::connect::{CheckedConnector, Prohibited, PublicResolver};

/// Bounds applied to every outgoing request.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Connecting, and waiting for the response head.
    pub timeout: Duration,
    /// Waiting for the next chunk of the response body.
    pub between_bytes: Duration,
    /// Largest response body a guest may receive.
    pub max_body: u64,
    /// Idle connections kept per host (the executor raises it to the job
    /// concurrency, so a burst's connections are all reused).
    pub idle_per_host: usize,
    /// Requests one job may have open at once (waiting for a response, or
    /// with a response body neither read to the end nor dropped); more fail
    /// with `connection-limit-reached` (a guest cannot open thousands).
    pub per_job: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            between_bytes: Duration::from_secs(30),
            max_body: 64 << 20,
            idle_per_host: 1024,
            per_job: 100,
        }
    }
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The host resolved or connected to a prohibited address.
    Prohibited(Prohibited),
    /// Anything else, as the guest sees it.
    Wasi(Error),
}

impl From<SendError> for Error {
    fn from(err: SendError) -> Self {
        match err {
            SendError::Prohibited(_) => Error::DestinationIpProhibited,
            SendError::Wasi(err) => err,
        }
    }
}

/// The process-wide part: limits and connectors (with the TLS config).
pub struct HttpClient {
    /// For requests granted by name: public addresses only.
    checked: HttpsConnector<CheckedConnector>,
    /// For requests granted by an IP literal or `localhost` rule.
    open: HttpsConnector<HttpConnector>,
    limits: HttpLimits,
}

/// How a request travels: which of a plugin's pools it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// May reach loopback, private, link-local and other non-public
    /// addresses (the grant names an IP literal or `localhost`).
    pub private: bool,
    /// Plain `http://` speaks HTTP/2 with prior knowledge.
    pub h2: bool,
}

/// One plugin's connection pools, built on its first request. Shared by
/// every job of the plugin; never by two plugins.
#[derive(Default)]
pub struct PluginPools {
    pools: OnceLock<Pools>,
}

impl std::fmt::Debug for PluginPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginPools")
            .field("started", &self.pools.get().is_some())
            .finish()
    }
}

struct Pools {
    checked: Lanes<HttpsConnector<CheckedConnector>>,
    open: Lanes<HttpsConnector<HttpConnector>>,
    checked_h2: Lanes<HttpsConnector<CheckedConnector>>,
    open_h2: Lanes<HttpsConnector<HttpConnector>>,
}

/// Requests a lane is given before the next lane is used: the fewest
/// concurrent streams an HTTP/2 server should allow (RFC 9113 §6.5.2
/// recommends no fewer than 100; nginx allows 128, Go 250, hyper 200).
pub(crate) const STREAMS_PER_LANE: usize = 100;
/// Most lanes per pool: past `STREAMS_PER_LANE × MAX_LANES` requests in
/// flight, requests go to the least busy lane.
const MAX_LANES: usize = 64;

/// A pool split into lanes, each a hyper client with its own connections
/// (so over HTTP/2 each lane holds its own connection to a host), built on
/// first use. Requests fill the first lane that has room.
struct Lanes<C> {
    connector: C,
    limits: HttpLimits,
    h2_only: bool,
    lanes: Vec<Lane<C>>,
}

struct Lane<C> {
    client: OnceLock<Client<C, WasiBody>>,
    open: Arc<AtomicUsize>,
}

/// A request's place in its lane, given back when dropped (with the
/// response body, or on an error).
pub(crate) struct InLane(Arc<AtomicUsize>);

impl Drop for InLane {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<C> Lanes<C>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    fn new(connector: C, limits: &HttpLimits, h2_only: bool) -> Self {
        let lanes = (0..MAX_LANES)
            .map(|_| Lane {
                client: OnceLock::new(),
                open: Arc::default(),
            })
            .collect();
        Self {
            connector,
            limits: *limits,
            h2_only,
            lanes,
        }
    }

    /// A client to send on, and the request's place in its lane. With
    /// `spread` (HTTP/2, or `https://`, which may negotiate it), the
    /// first lane with fewer than [`STREAMS_PER_LANE`] requests open, else
    /// the least busy; without, always the first (HTTP/1.1 over plain
    /// `http://` opens a connection per concurrent request anyway).
    fn pick(&self, spread: bool) -> (&Client<C, WasiBody>, InLane) {
        let lanes = if spread { &self.lanes[..] } else { &self.lanes[..1] };
        let lane = lanes
            .iter()
            .find(|lane| lane.open.load(Ordering::Acquire) < STREAMS_PER_LANE)
            .or_else(|| lanes.iter().min_by_key(|lane| lane.open.load(Ordering::Acquire)))
            .unwrap_or(&self.lanes[0]);
        lane.open.fetch_add(1, Ordering::AcqRel);
        let client = lane
            .client
            .get_or_init(|| pooled(self.connector.clone(), &self.limits, self.h2_only));
        (client, InLane(lane.open.clone()))
    }
}

impl HttpClient {
    /// A client with `limits`. Cheap to share (`Arc`); one per process.
    pub fn new(limits: HttpLimits) -> Self {
        let tls = rustls::ClientConfig::builder()
            .with_webpki_roots()
            .with_no_client_auth();
        let checked = CheckedConnector::new(http_connector(PublicResolver::new(), &limits));
        let open = http_connector(hyper_util::client::legacy::connect::dns::GaiResolver::new(), &limits);
        Self {
            checked: https(checked, tls.clone()),
            open: https(open, tls),
            limits,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> HttpLimits {
        self.limits
    }

    /// A plugin's pools, built from the shared connectors on first use.
    fn pools<'a>(&self, pools: &'a PluginPools) -> &'a Pools {
        pools.pools.get_or_init(|| Pools {
            checked: Lanes::new(self.checked.clone(), &self.limits, false),
            open: Lanes::new(self.open.clone(), &self.limits, false),
            checked_h2: Lanes::new(self.checked.clone(), &self.limits, true),
            open_h2: Lanes::new(self.open.clone(), &self.limits, true),
        })
    }

    /// Sends `request` through the plugin's `pools` along `route`,
    /// honouring the guest's `options` where they are stricter than ours.
    pub(crate) async fn send(
        &self,
        pools: &PluginPools,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        route: Route,
    ) -> Result<http::Response<WasiBody>, SendError> {
        let options = options.unwrap_or_default();
        let shorter = |guest: Option<Duration>, ours: Duration| guest.map_or(ours, |g| g.min(ours));
        let head_timeout = shorter(options.first_byte_timeout, self.limits.timeout)
            .max(shorter(options.connect_timeout, self.limits.timeout));
        let between = shorter(options.between_bytes_timeout, self.limits.between_bytes);
        let pools = self.pools(pools);
        // Prior knowledge only where there is no TLS to negotiate by ALPN.
        let h2 = route.h2 && request.uri().scheme() == Some(&http::uri::Scheme::HTTP);
        let spread = h2 || request.uri().scheme() == Some(&http::uri::Scheme::HTTPS);
        let (sending, in_lane) = match (route.private, h2) {
            (true, true) => send_on(pools.open_h2.pick(spread), request),
            (true, false) => send_on(pools.open.pick(spread), request),
            (false, true) => send_on(pools.checked_h2.pick(spread), request),
            (false, false) => send_on(pools.checked.pick(spread), request),
        };
        let response = match tokio::time::timeout(head_timeout, sending).await {
            Err(_) => return Err(SendError::Wasi(Error::HttpResponseTimeout)),
            Ok(Err(err)) => return Err(classify(&err)),
            Ok(Ok(response)) => response,
        };
        if let Some(length) = response.headers().get(http::header::CONTENT_LENGTH)
            && let Some(length) = length.to_str().ok().and_then(|l| l.parse::<u64>().ok())
            && length > self.limits.max_body
        {
            return Err(SendError::Wasi(Error::HttpResponseBodySize(Some(length))));
        }
        let max_body = self.limits.max_body;
        Ok(response.map(|body| Guarded::new(body, max_body, between, in_lane).boxed_unsync()))
    }
}

/// Starts sending `request` on the picked lane's client.
fn send_on<C>(
    (client, in_lane): (&Client<C, WasiBody>, InLane),
    request: http::Request<WasiBody>,
) -> (hyper_util::client::legacy::ResponseFuture, InLane)
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    (client.request(request), in_lane)
}

/// An HTTP connector with our socket options over `resolver`.
fn http_connector<R>(resolver: R, limits: &HttpLimits) -> HttpConnector<R> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(limits.timeout));
    http
}

/// `connector` with TLS for `https://` (ALPN: `h2`, then `http/1.1`).
fn https<C>(connector: C, tls: rustls::ClientConfig) -> HttpsConnector<C> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(connector)
}

/// A pool over `connector`; with `h2_only`, plain `http://` speaks HTTP/2
/// with prior knowledge.
fn pooled<C>(connector: C, limits: &HttpLimits, h2_only: bool) -> Client<C, WasiBody>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(limits.idle_per_host)
        .http2_only(h2_only)
        .build(connector)
}

/// Maps a client error to the WASI error code the guest sees.
fn classify(err: &hyper_util::client::legacy::Error) -> SendError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(prohibited) = cause.downcast_ref::<Prohibited>() {
            return SendError::Prohibited(prohibited.clone());
        }
        source = cause.source();
    }
    SendError::Wasi(classify_other(err))
}

/// Maps a client error other than a prohibited address.
fn classify_other(err: &hyper_util::client::legacy::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                std::io::ErrorKind::TimedOut => Error::ConnectionTimeout,
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => Error::ConnectionTerminated,
                _ if err.is_connect() => Error::DestinationUnavailable,
                _ => Error::HttpProtocolError,
            };
        }
        source = cause.source();
    }
    if err.is_connect() {
        // Name resolution failures surface as connect errors without an io cause.
        Error::DestinationNotFound
    } else {
        Error::HttpProtocolError
    }
}

/// A response body with a size cap and a between-chunks timeout; it holds
/// the request's place in its lane until dropped.
struct Guarded {
    inner: hyper::body::Incoming,
    seen: u64,
    max: u64,
    between: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _in_lane: InLane,
}

impl Guarded {
    fn new(inner: hyper::body::Incoming, max: u64, between: Duration, in_lane: InLane) -> Self {
        Self {
            inner,
            seen: 0,
            max,
            between,
            deadline: Box::pin(tokio::time::sleep(between)),
            _in_lane: in_lane,
        }
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen += data.len() as u64;
                    if self.seen > self.max {
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(self.seen)))));
                    }
                }
                let next = tokio::time::Instant::now() + self.between;
                self.deadline.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(Error::Hyper(err)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
