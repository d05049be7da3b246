//! The process-wide HTTP client every guest request goes through.
//!
//! One pooled hyper client (HTTP/1.1 keep-alive, TLS with the webpki roots)
//! serves every job of every plugin, so jobs hitting the same host reuse
//! connections instead of opening one per job (wasmtime-wasi-http's default
//! sender connects afresh for every request). Each request is bounded: the
//! time to the response head, the time between body chunks, and the body's
//! size; a guest can ask for shorter timeouts but not for longer ones.
//!
//! There are in fact two pools. Requests granted by a rule that names an IP
//! literal or `localhost` go through the *open* one, which connects
//! wherever the host resolves; every other request goes through the
//! *checked* one, whose connector ([`super::connect`]) refuses non-public
//! addresses. hyper keys pooled connections by scheme and authority only,
//! so one shared pool would let a checked request reuse a connection opened
//! unchecked for another plugin; with two, a checked request only ever
//! reuses a connection that passed the check when it was opened.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
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

/// The shared client.
pub struct HttpClient {
    /// For requests granted by name: public addresses only.
    checked: Client<HttpsConnector<CheckedConnector>, WasiBody>,
    /// For requests granted by an IP literal or `localhost` rule.
    open: Client<HttpsConnector<HttpConnector>, WasiBody>,
    limits: HttpLimits,
}

impl HttpClient {
    /// A client with `limits`. Cheap to share (`Arc`); one per process.
    pub fn new(limits: HttpLimits) -> Self {
        let checked = CheckedConnector::new(http_connector(PublicResolver::new(), &limits));
        let open = http_connector(hyper_util::client::legacy::connect::dns::GaiResolver::new(), &limits);
        Self {
            checked: pooled(checked, &limits),
            open: pooled(open, &limits),
            limits,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> HttpLimits {
        self.limits
    }

    /// Sends `request`, honouring the guest's `options` where they are
    /// stricter than ours. Only with `private` may it reach loopback,
    /// private, link-local and other non-public addresses.
    pub(crate) async fn send(
        &self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        private: bool,
    ) -> Result<http::Response<WasiBody>, SendError> {
        let options = options.unwrap_or_default();
        let shorter = |guest: Option<Duration>, ours: Duration| guest.map_or(ours, |g| g.min(ours));
        let head_timeout = shorter(options.first_byte_timeout, self.limits.timeout)
            .max(shorter(options.connect_timeout, self.limits.timeout));
        let between = shorter(options.between_bytes_timeout, self.limits.between_bytes);
        let sending = if private {
            self.open.request(request)
        } else {
            self.checked.request(request)
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
        Ok(response.map(|body| Guarded::new(body, max_body, between).boxed_unsync()))
    }
}

/// An HTTP connector with our socket options over `resolver`.
fn http_connector<R>(resolver: R, limits: &HttpLimits) -> HttpConnector<R> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(limits.timeout));
    http
}

/// A pooled client over `connector`, with TLS.
fn pooled<C>(connector: C, limits: &HttpLimits) -> Client<HttpsConnector<C>, WasiBody>
where
    HttpsConnector<C>: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(limits.idle_per_host)
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

/// A response body with a size cap and a between-chunks timeout.
struct Guarded {
    inner: hyper::body::Incoming,
    seen: u64,
    max: u64,
    between: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Guarded {
    fn new(inner: hyper::body::Incoming, max: u64, between: Duration) -> Self {
        Self {
            inner,
            seen: 0,
            max,
            between,
            deadline: Box::pin(tokio::time::sleep(between)),
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
