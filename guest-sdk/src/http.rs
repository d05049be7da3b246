//! A small HTTP client over the host's one-call `wasmjobs:job/http`
//! import (blocking) and its `async-http` twin (for async jobs).
//!
//! A [`Job`](crate::Job) is synchronous, and so is this client: [`get`] returns when the
//! whole response body has been read. The whole request goes to the host in
//! one call and the whole response comes back in one, which costs the host
//! a fraction of what the same request over `wasi:http`'s resources costs. The wait is not wasted: while the guest
//! is blocked the host (which implements the request with async I/O) runs other
//! jobs, so a plugin can make slow requests without tying up a host thread.
//! An [`AsyncJob`](crate::AsyncJob) awaits the same requests instead
//! ([`get_async`], [`Request::send_async`]), and the other jobs of its
//! instance run meanwhile.
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
//! like any network error, whose message names the `[http] allow` rule that
//! would grant it. Every [`Error`] converts into a retryable
//! [`JobError`](crate::JobError) with `?`.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::async_bindings::wasmjobs::job::async_http as async_wire;
use crate::bindings::wasmjobs::job::http as wire;

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

/// `GET url`, reading the whole response, as a future: [`get`] for an
/// [`AsyncJob`](crate::AsyncJob) (see [`Request::send_async`]).
pub async fn get_async(url: &str) -> Result<Response, Error> {
    Request::get(url).send_async().await
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
        let (request, method, url) = self.into_wire()?;
        let response = wire::send(&request).map_err(Error::from_host)?;
        Ok(Response::from_wire(method, url, response))
    }

    /// Send the request and read the whole response, as a future: the
    /// [`AsyncJob`](crate::AsyncJob) form of [`send`](Request::send), with
    /// the same outcomes. While it waits, the other jobs of the instance
    /// run.
    ///
    /// Only an [`AsyncJob`](crate::AsyncJob) can use it: its import,
    /// `async-http`, is in the `async-plugin` world alone, so the host
    /// refuses a [`Job`](crate::Job) plugin that calls it (it "uses
    /// component-model async", which runs only with `[instances]
    /// concurrent`).
    pub async fn send_async(self) -> Result<Response, Error> {
        let (request, method, url) = self.into_wire()?;
        let response = async_wire::send(request).await.map_err(Error::from_host)?;
        Ok(Response::from_wire(method, url, response))
    }

    /// The request as the host's import takes it, with its method and the
    /// URL as given, which the [`Response`] keeps.
    fn into_wire(self) -> Result<(wire::Request, String, String), Error> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let target = Target::parse(&self.url)?;
        let request = wire::Request {
            method: self.method,
            url: target.to_string(),
            headers: self
                .headers
                .into_iter()
                .map(|(name, value)| (name, value.into_bytes()))
                .collect(),
            body: self.body,
            timeout_ms: self
                .timeout
                .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        let method = request.method.clone();
        Ok((request, method, self.url))
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
    fn from_wire(method: String, url: String, response: wire::Response) -> Self {
        Response {
            method,
            url,
            status: response.status,
            headers: response
                .headers
                .into_iter()
                .map(|(name, value)| {
                    let value =
                        String::from_utf8(value).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
                    (name, value)
                })
                .collect(),
            body: response.body,
        }
    }

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

    /// The host's answer, whose message already names the request.
    fn from_host(error: wire::HttpError) -> Self {
        use wire::HttpError as E;
        let (kind, message) = match error {
            E::InvalidRequest(message) => (ErrorKind::InvalidRequest, message),
            E::Timeout(message) => (ErrorKind::Timeout, message),
            E::Denied(message) | E::Prohibited(message) | E::Limit(message) | E::Transport(message) => {
                (ErrorKind::Transport, message)
            }
        };
        Error::new(kind, message)
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

/// A URL checked and split: scheme, `host[:port]`, `/path?query`.
#[derive(Debug)]
struct Target {
    scheme: &'static str,
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
            "http"
        } else if scheme.eq_ignore_ascii_case("https") {
            "https"
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

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.path_with_query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> (String, String, String) {
        let target = Target::parse(url).unwrap();
        assert_eq!(
            target.to_string(),
            format!("{}://{}{}", target.scheme, target.authority, target.path_with_query)
        );
        (target.scheme.to_string(), target.authority, target.path_with_query)
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
    fn host_errors_keep_their_message_and_kind() {
        let denied = Error::from_host(wire::HttpError::Denied("GET http://x/: denied; add \"x\"".into()));
        assert_eq!(denied.kind(), ErrorKind::Transport);
        assert_eq!(denied.to_string(), "GET http://x/: denied; add \"x\"");
        assert!(Error::from_host(wire::HttpError::Timeout("t".into())).is_timeout());
        let invalid = Error::from_host(wire::HttpError::InvalidRequest("i".into()));
        assert_eq!(invalid.kind(), ErrorKind::InvalidRequest);
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
