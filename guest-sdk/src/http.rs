//! A small blocking HTTP client over `wasi:http/outgoing-handler` 0.2.
//!
//! Job code is synchronous, and so is this client: [`get`] returns when the
//! whole response body has been read. The wait is not wasted: while the guest
//! is blocked the host (which implements the request with async I/O) runs other
//! jobs, so a plugin can make slow requests without tying up a host thread.
//!
//! ```no_run
//! use wasmjobs_guest::{http, JobError};
//!
//! # fn run() -> Result<(), JobError> {
//! // One call: GET, then fail (retryably, via `?`) unless the status is 2xx.
//! let page = http::get("http://127.0.0.1:9292/hello")?.error_for_status()?;
//! wasmjobs_guest::log::info!("{} bytes", page.bytes().len());
//!
//! // The builder, for headers, a body and a timeout.
//! #[derive(serde::Deserialize)]
//! struct Created { id: u64 }
//! let created: Created = http::Request::post("https://api.example.com/items")
//!     .header("authorization", "Bearer t0k3n")
//!     .json(&serde_json::json!({ "name": "widget" }))
//!     .timeout(std::time::Duration::from_secs(10))
//!     .send()?
//!     .error_for_status()?
//!     .json()?;
//! # let _ = created.id;
//! # Ok(())
//! # }
//! ```
//!
//! Only `http://` and `https://` URLs of the form
//! `scheme://host[:port][/path][?query]` are accepted (no user info; a
//! `#fragment` is dropped). Which hosts a plugin may reach is up to the host;
//! a refused request fails with an [`Error`] of kind [`ErrorKind::Transport`]
//! like any network error. Every [`Error`] converts into a retryable
//! [`JobError`](crate::JobError) with `?`.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    ErrorCode, FieldSizePayload, Fields, FutureIncomingResponse, HeaderError, IncomingBody, IncomingResponse, Method,
    OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use crate::bindings::wasi::io::streams::{InputStream, StreamError};

/// How much to ask for per read of a response body.
const READ_CHUNK: u64 = 64 * 1024;

/// `GET url`, reading the whole response.
///
/// Any status counts as a response here; chain
/// [`error_for_status`](Response::error_for_status) to treat non-2xx as an
/// error.
pub fn get(url: &str) -> Result<Response, Error> {
    Request::get(url).send()
}

/// `POST url` with `body` (no content type; use [`Request::post`] with
/// [`Request::header`] or [`Request::json`] to set one).
pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Result<Response, Error> {
    Request::post(url).body(body).send()
}

/// An HTTP request being built. Nothing happens until [`send`](Request::send).
#[derive(Debug)]
#[must_use = "a request does nothing until `send` is called"]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
    /// An error found while building (e.g. by `json`), reported by `send` so
    /// that the builder stays chainable.
    error: Option<Error>,
}

impl Request {
    /// A request with any method (`"GET"`, `"PATCH"`, `"PROPFIND"`, ...).
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
            error: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new("GET", url)
    }

    /// A `POST` request.
    pub fn post(url: impl Into<String>) -> Self {
        Self::new("POST", url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> Self {
        Self::new("PUT", url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new("DELETE", url)
    }

    /// Add a header. Repeating a name adds another value rather than replacing
    /// the first one. `content-length` is set for you when there is a body.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Set the request body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Set the body to `value` as JSON, with `content-type: application/json`.
    /// A value that can't be serialised makes [`send`](Request::send) fail.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body;
                self.header("content-type", "application/json")
            }
            Err(source) => {
                let message = format!("{} {}: cannot serialise the JSON body: {source}", self.method, self.url);
                self.error = Some(Error::new(ErrorKind::InvalidRequest, message));
                self
            }
        }
    }

    /// Give up when connecting, waiting for the first response byte, or
    /// waiting between two body bytes takes longer than `timeout` (each wait
    /// is timed on its own). Without it the host's defaults apply; a job also
    /// has an overall time limit set by the host.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Send the request and read the whole response.
    ///
    /// Blocks the job (not the host) until the response body has been read.
    /// Fails on an invalid URL or header, and on any transport error (DNS,
    /// connection refused, TLS, timeout, request denied by the host), but
    /// not on a non-2xx status: see [`Response::error_for_status`].
    pub fn send(self) -> Result<Response, Error> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let target = Target::parse(&self.url)?;
        let what = format!("{} {}", self.method, self.url);

        let headers = Fields::new();
        for (name, value) in &self.headers {
            headers
                .append(name, value.as_bytes())
                .map_err(|error| Error::header(&what, name, error))?;
        }
        let has_length = self
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !has_length && (!self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH")) {
            headers
                .append("content-length", &self.body.len().to_string().into_bytes())
                .map_err(|error| Error::header(&what, "content-length", error))?;
        }

        let request = OutgoingRequest::new(headers);
        let invalid = |part: &str| {
            Error::new(
                ErrorKind::InvalidRequest,
                format!("{what}: the host rejected the request's {part}"),
            )
        };
        request
            .set_method(&wasi_method(&self.method))
            .map_err(|()| invalid("method"))?;
        request
            .set_scheme(Some(&target.scheme))
            .map_err(|()| invalid("scheme"))?;
        request
            .set_authority(Some(&target.authority))
            .map_err(|()| invalid("host"))?;
        request
            .set_path_with_query(Some(&target.path_with_query))
            .map_err(|()| invalid("path"))?;
        let outgoing_body = request.body().map_err(|()| invalid("body (already taken)"))?;

        let options = self.timeout.map(|timeout| {
            let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
            let options = RequestOptions::new();
            // Best effort: a host that doesn't support a timeout says so here,
            // and its own limits still apply.
            let _ = options.set_connect_timeout(Some(nanos));
            let _ = options.set_first_byte_timeout(Some(nanos));
            let _ = options.set_between_bytes_timeout(Some(nanos));
            options
        });

        let future = outgoing_handler::handle(request, options).map_err(|code| Error::transport(&what, &code))?;

        // Stream the body after `handle`, so a body bigger than the host's
        // buffer doesn't block: the host is already sending it.
        let written = write_body(&outgoing_body, &self.body);
        let finished = OutgoingBody::finish(outgoing_body, None);

        // Wait for the response even if writing failed: its error (say,
        // connection refused) says more than the broken pipe does.
        let response = wait_for(&future).map_err(|code| Error::transport(&what, &code))?;
        drop(future);
        written.map_err(|reason| {
            Error::new(
                ErrorKind::Transport,
                format!("{what} failed while sending the body: {reason}"),
            )
        })?;
        finished.map_err(|code| Error::transport(&what, &code))?;

        read_response(response, self.method, self.url)
    }
}

/// Write `bytes` to the body's stream, respecting the stream's back-pressure,
/// and wait until they are flushed.
fn write_body(body: &OutgoingBody, bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let stream = body
        .write()
        .map_err(|()| "the body stream was already taken".to_string())?;
    let mut rest = bytes;
    while !rest.is_empty() {
        let permitted = stream.check_write().map_err(stream_error)?;
        if permitted == 0 {
            stream.subscribe().block();
            continue;
        }
        let n = rest.len().min(usize::try_from(permitted).unwrap_or(usize::MAX));
        stream.write(&rest[..n]).map_err(stream_error)?;
        rest = &rest[n..];
    }
    stream.flush().map_err(stream_error)?;
    // `check-write` reports the flush's outcome once the stream is ready.
    stream.subscribe().block();
    stream.check_write().map_err(stream_error)?;
    Ok(())
}

fn wait_for(future: &FutureIncomingResponse) -> Result<IncomingResponse, ErrorCode> {
    loop {
        match future.get() {
            Some(Ok(result)) => return result,
            // Only possible if the response was already taken, which this
            // module never does twice.
            Some(Err(())) => {
                return Err(ErrorCode::InternalError(Some("response already taken".into())));
            }
            None => future.subscribe().block(),
        }
    }
}

fn read_response(response: IncomingResponse, method: String, url: String) -> Result<Response, Error> {
    let status = response.status();
    let headers = {
        let fields = response.headers();
        let entries = fields.entries();
        drop(fields);
        entries
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect::<Vec<_>>()
    };

    let body_error = |reason: String| {
        Error::new(
            ErrorKind::Transport,
            format!("{method} {url} failed while reading the body: {reason}"),
        )
    };
    let incoming = response
        .consume()
        .map_err(|()| body_error("the body was already taken".into()))?;
    let body = {
        let stream = incoming
            .stream()
            .map_err(|()| body_error("the body stream was already taken".into()))?;
        let capacity = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse::<usize>().ok())
            .unwrap_or(0)
            .min(16 << 20);
        read_to_end(&stream, capacity).map_err(body_error)?
        // The stream (a child of the body) is dropped here, before `finish`.
    };
    // Trailers are not exposed; finishing the body tells the host we are done.
    drop(IncomingBody::finish(incoming));
    drop(response);

    Ok(Response {
        method,
        url,
        status,
        headers,
        body,
    })
}

fn read_to_end(stream: &InputStream, capacity: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::with_capacity(capacity);
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(body),
            Err(error) => return Err(stream_error(error)),
        }
    }
}

fn stream_error(error: StreamError) -> String {
    match error {
        StreamError::Closed => "the stream was closed".into(),
        StreamError::LastOperationFailed(error) => match crate::bindings::wasi::http::types::http_error_code(&error) {
            Some(code) => describe(&code).0,
            None => error.to_debug_string(),
        },
    }
}

fn wasi_method(method: &str) -> Method {
    match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_string()),
    }
}

/// A complete HTTP response: status, headers and the whole body.
#[derive(Debug, Clone)]
pub struct Response {
    method: String,
    url: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    /// The status code, e.g. `200`.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The URL the request was sent to, as given (for messages).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// All response headers in the order received, names as sent by the
    /// server (HTTP/1) or lowercase (HTTP/2). Values that aren't UTF-8 are
    /// decoded lossily.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of the header `name` (case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The body.
    pub fn bytes(&self) -> &[u8] {
        &self.body
    }

    /// The body, by value (no copy).
    pub fn into_bytes(self) -> Vec<u8> {
        self.body
    }

    /// The body as text. Invalid UTF-8 is replaced with `U+FFFD` rather than
    /// failing: this is mostly for logs and messages.
    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// The body decoded from JSON. Fails (retryably, via `?`) if it isn't
    /// valid JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|source| {
            Error::new(
                ErrorKind::Decode,
                format!(
                    "{} {}: the response body is not the expected JSON: {source}",
                    self.method, self.url
                ),
            )
        })
    }

    /// `Ok(self)` for a 2xx status, otherwise an [`Error`] of kind
    /// [`ErrorKind::Status`] naming the status and the URL, so that
    /// `http::get(url)?.error_for_status()?` fails the job (retryably) on
    /// anything but success.
    pub fn error_for_status(self) -> Result<Response, Error> {
        if self.is_success() {
            Ok(self)
        } else {
            let mut error = Error::new(
                ErrorKind::Status,
                format!("{} {} returned HTTP {}", self.method, self.url, self.status),
            );
            error.status = Some(self.status);
            Err(error)
        }
    }
}

/// What went wrong with a request. See [`Error::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The URL is not `http(s)://host[:port][/path][?query]`.
    InvalidUrl,
    /// A header, the method or the body could not be put in a request.
    InvalidRequest,
    /// The request failed on the way: DNS, connection, TLS, protocol, a
    /// request the host denied, or the connection dropping mid-body.
    Transport,
    /// A connect, first-byte or between-bytes timeout.
    Timeout,
    /// A non-2xx status, from [`Response::error_for_status`].
    Status,
    /// The body could not be decoded, from [`Response::json`].
    Decode,
}

/// An HTTP failure, with a message naming the request and the cause, e.g.
/// `GET http://127.0.0.1:9/ failed: connection refused` or
/// `GET http://example.com/ returned HTTP 503`.
///
/// With `?` in a job it becomes a retryable [`JobError`](crate::JobError)
/// carrying that message.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    status: Option<u16>,
}

impl Error {
    fn new(kind: ErrorKind, message: String) -> Self {
        Error {
            kind,
            message,
            status: None,
        }
    }

    fn invalid_url(url: &str, reason: &str) -> Self {
        Error::new(ErrorKind::InvalidUrl, format!("invalid URL {url:?}: {reason}"))
    }

    fn header(what: &str, name: &str, error: HeaderError) -> Self {
        let reason = match error {
            HeaderError::InvalidSyntax => "invalid name or value",
            HeaderError::Forbidden => "the host does not allow setting it",
            HeaderError::Immutable => "the headers are immutable",
        };
        Error::new(
            ErrorKind::InvalidRequest,
            format!("{what}: cannot set header {name:?}: {reason}"),
        )
    }

    fn transport(what: &str, code: &ErrorCode) -> Self {
        let (reason, timeout) = describe(code);
        let kind = if timeout {
            ErrorKind::Timeout
        } else {
            ErrorKind::Transport
        };
        Error::new(kind, format!("{what} failed: {reason}"))
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The status, for an [`ErrorKind::Status`] error.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// Whether this is a timeout.
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Render a WASI HTTP `error-code` for people, and say whether it is a
/// timeout.
fn describe(code: &ErrorCode) -> (String, bool) {
    fn size(what: &str, limit: Option<u64>) -> String {
        match limit {
            Some(limit) => format!("{what} too large (limit {limit})"),
            None => format!("{what} too large"),
        }
    }
    fn field(what: &str, payload: Option<&FieldSizePayload>) -> String {
        match payload.and_then(|p| p.field_name.as_deref()) {
            Some(name) => format!("{what} {name:?} too large"),
            None => format!("{what} too large"),
        }
    }
    let text = match code {
        ErrorCode::DnsTimeout => return ("DNS lookup timed out".into(), true),
        ErrorCode::DnsError(payload) => match (&payload.rcode, payload.info_code) {
            (Some(rcode), _) => format!("DNS error: {rcode}"),
            (None, Some(info)) => format!("DNS error (info code {info})"),
            (None, None) => "DNS error".into(),
        },
        ErrorCode::DestinationNotFound => "host not found".into(),
        ErrorCode::DestinationUnavailable => "destination unavailable".into(),
        ErrorCode::DestinationIpProhibited => "destination IP address prohibited".into(),
        ErrorCode::DestinationIpUnroutable => "destination IP address unroutable".into(),
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTerminated => "connection terminated".into(),
        ErrorCode::ConnectionTimeout => return ("connection timed out".into(), true),
        ErrorCode::ConnectionReadTimeout => return ("timed out reading the response".into(), true),
        ErrorCode::ConnectionWriteTimeout => return ("timed out sending the request".into(), true),
        ErrorCode::ConnectionLimitReached => "connection limit reached".into(),
        ErrorCode::TlsProtocolError => "TLS protocol error".into(),
        ErrorCode::TlsCertificateError => "TLS certificate error".into(),
        ErrorCode::TlsAlertReceived(alert) => match (&alert.alert_message, alert.alert_id) {
            (Some(message), _) => format!("TLS alert received: {message}"),
            (None, Some(id)) => format!("TLS alert received (id {id})"),
            (None, None) => "TLS alert received".into(),
        },
        ErrorCode::HttpRequestDenied => "request denied by the host".into(),
        ErrorCode::HttpRequestLengthRequired => "the server requires a content-length".into(),
        ErrorCode::HttpRequestBodySize(limit) => size("request body", *limit),
        ErrorCode::HttpRequestMethodInvalid => "invalid method".into(),
        ErrorCode::HttpRequestUriInvalid => "invalid URI".into(),
        ErrorCode::HttpRequestUriTooLong => "URI too long".into(),
        ErrorCode::HttpRequestHeaderSectionSize(limit) => size("request header section", limit.map(u64::from)),
        ErrorCode::HttpRequestHeaderSize(payload) => field("request header", payload.as_ref()),
        ErrorCode::HttpRequestTrailerSectionSize(limit) => size("request trailer section", limit.map(u64::from)),
        ErrorCode::HttpRequestTrailerSize(payload) => field("request trailer", Some(payload)),
        ErrorCode::HttpResponseIncomplete => "incomplete response".into(),
        ErrorCode::HttpResponseHeaderSectionSize(limit) => size("response header section", limit.map(u64::from)),
        ErrorCode::HttpResponseHeaderSize(payload) => field("response header", Some(payload)),
        ErrorCode::HttpResponseBodySize(limit) => size("response body", *limit),
        ErrorCode::HttpResponseTrailerSectionSize(limit) => size("response trailer section", limit.map(u64::from)),
        ErrorCode::HttpResponseTrailerSize(payload) => field("response trailer", Some(payload)),
        ErrorCode::HttpResponseTransferCoding(coding) => match coding {
            Some(coding) => format!("unsupported transfer coding {coding:?}"),
            None => "unsupported transfer coding".into(),
        },
        ErrorCode::HttpResponseContentCoding(coding) => match coding {
            Some(coding) => format!("unsupported content coding {coding:?}"),
            None => "unsupported content coding".into(),
        },
        ErrorCode::HttpResponseTimeout => {
            return ("timed out waiting for the response".into(), true);
        }
        ErrorCode::HttpUpgradeFailed => "HTTP upgrade failed".into(),
        ErrorCode::HttpProtocolError => "HTTP protocol error".into(),
        ErrorCode::LoopDetected => "loop detected".into(),
        ErrorCode::ConfigurationError => "configuration error".into(),
        ErrorCode::InternalError(Some(message)) => format!("internal error: {message}"),
        ErrorCode::InternalError(None) => "internal error".into(),
    };
    (text, false)
}

/// A URL split the way `wasi:http` wants it.
#[derive(Debug)]
struct Target {
    scheme: Scheme,
    authority: String,
    path_with_query: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, Error> {
        let invalid = |reason: &str| Error::invalid_url(url, reason);
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("contains whitespace or control characters"));
        }
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected http://host[:port]/path or https://..."))?;
        let scheme = if scheme.eq_ignore_ascii_case("http") {
            Scheme::Http
        } else if scheme.eq_ignore_ascii_case("https") {
            Scheme::Https
        } else {
            return Err(invalid("only http:// and https:// URLs are supported"));
        };

        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let path = path.split('#').next().unwrap_or_default();

        if authority.is_empty() {
            return Err(invalid("missing host"));
        }
        if authority.contains('@') {
            return Err(invalid("user info (user:password@) is not supported"));
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            // An IPv6 literal: [::1] or [::1]:8080.
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("unclosed '[' in the host"))?;
            if host.is_empty() || !host.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.') {
                return Err(invalid("invalid IPv6 address"));
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(invalid("unexpected text after the IPv6 address")),
                },
            }
        } else {
            match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(invalid("missing host"));
        }
        if let Some(port) = port
            && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err())
        {
            return Err(invalid("invalid port"));
        }

        let path_with_query = if path.is_empty() {
            "/".to_string()
        } else if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        Ok(Target {
            scheme,
            authority: authority.to_string(),
            path_with_query,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, String, String) {
        let target = Target::parse(url).unwrap();
        let scheme = match target.scheme {
            Scheme::Http => "http".to_string(),
            Scheme::Https => "https".to_string(),
            Scheme::Other(other) => other,
        };
        (scheme, target.authority, target.path_with_query)
    }

    fn own(a: &str, b: &str, c: &str) -> (String, String, String) {
        (a.into(), b.into(), c.into())
    }

    #[test]
    fn parses_urls() {
        assert_eq!(
            parse("http://127.0.0.1:9292/hello"),
            own("http", "127.0.0.1:9292", "/hello")
        );
        assert_eq!(parse("https://example.com"), own("https", "example.com", "/"));
        assert_eq!(
            parse("HTTPS://example.com?q=1&r=2"),
            own("https", "example.com", "/?q=1&r=2")
        );
        assert_eq!(
            parse("http://example.com/a/b?c=d#frag"),
            own("http", "example.com", "/a/b?c=d")
        );
        assert_eq!(parse("http://example.com#frag"), own("http", "example.com", "/"));
        assert_eq!(parse("http://[::1]:8080/x"), own("http", "[::1]:8080", "/x"));
        assert_eq!(parse("http://[::1]"), own("http", "[::1]", "/"));
    }

    #[test]
    fn rejects_bad_urls() {
        for (url, reason) in [
            ("ftp://example.com/", "only http:// and https://"),
            ("example.com/path", "expected http://"),
            ("http://", "missing host"),
            ("http:///path", "missing host"),
            ("http://:80/", "missing host"),
            ("http://user:pw@example.com/", "user info"),
            ("http://example.com:99999/", "invalid port"),
            ("http://example.com:/", "invalid port"),
            ("http://example.com:8a/", "invalid port"),
            ("http://exa mple.com/", "whitespace"),
            ("http://[::1/", "unclosed"),
            ("http://[::1]x/", "after the IPv6"),
            ("http://::1/", "missing host"),
        ] {
            let error = Target::parse(url).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidUrl);
            assert!(error.to_string().contains(reason), "{url}: {error} (wanted {reason:?})");
            assert!(error.to_string().starts_with(&format!("invalid URL {url:?}")));
        }
    }

    #[test]
    fn describes_error_codes() {
        assert_eq!(
            describe(&ErrorCode::ConnectionRefused),
            ("connection refused".to_string(), false)
        );
        assert!(describe(&ErrorCode::ConnectionTimeout).1);
        let error = Error::transport("GET http://x/", &ErrorCode::HttpRequestDenied);
        assert_eq!(error.to_string(), "GET http://x/ failed: request denied by the host");
        assert_eq!(error.kind(), ErrorKind::Transport);
        let error = Error::transport("GET http://x/", &ErrorCode::HttpResponseTimeout);
        assert!(error.is_timeout());
    }

    fn response(status: u16, body: &str) -> Response {
        Response {
            method: "GET".into(),
            url: "http://example.com/x".into(),
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn error_for_status() {
        assert!(response(204, "").error_for_status().is_ok());
        let error = response(503, "").error_for_status().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Status);
        assert_eq!(error.status(), Some(503));
        assert_eq!(error.to_string(), "GET http://example.com/x returned HTTP 503");
        let job_error = crate::JobError::from(error);
        assert_eq!(job_error.kind(), crate::JobErrorKind::Retry);
        assert_eq!(job_error.message(), "GET http://example.com/x returned HTTP 503");
    }

    #[test]
    fn response_accessors() {
        let response = response(200, r#"{"id": 7}"#);
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.text(), r#"{"id": 7}"#);
        let value: serde_json::Value = response.json().unwrap();
        assert_eq!(value["id"], 7);
        let error = response.json::<Vec<u8>>().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Decode);
    }

    #[test]
    fn json_builder_sets_body_and_type() {
        let request = Request::post("http://x/").json(&serde_json::json!({"a": 1}));
        assert_eq!(request.body, br#"{"a":1}"#);
        assert_eq!(
            request.headers,
            vec![("content-type".to_string(), "application/json".to_string())]
        );
    }
}
