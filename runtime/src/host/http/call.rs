//! `wasmjobs:job/http`: a whole request in, a whole response out, in one
//! host call.
//!
//! The SDKs' HTTP clients are blocking and read the whole response, and
//! over `wasi:http` that costs about twenty host calls and as many resource
//! table entries per request (fields, request, its setters, body, future,
//! pollables, streams and their drops), plus two spawned tasks. Here the
//! guest's request becomes a hyper request in [`build`], goes through the
//! same grants, counters, per-job slot and per-plugin pools as the
//! `wasi:http` path ([`super::HttpPolicy`]), and its response is collected
//! (capped by [`super::HttpLimits::max_body`], timed between chunks) and
//! handed back in one piece.
//!
//! Failures are values ([`HttpError`]) whose message names the request and
//! what to do: a denial names the `[http] allow` rule that would grant it.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use http::{Method, Uri};
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{DEFAULT_FORBIDDEN_HEADERS, Error, RequestOptions, WasiBody};

use super::client::SendError;
use crate::bindings::http::{Host, HttpError, Request, Response};

/// What a request looks like after [`build`]: ready to send.
pub(crate) struct Built {
    pub request: http::Request<WasiBody>,
    pub options: Option<RequestOptions>,
    /// `METHOD url`, for messages.
    pub what: String,
}

/// Turns the guest's record into a hyper request, refusing what `wasi:http`
/// would refuse: an unknown scheme, user info, hop-by-hop headers, a
/// `content-length` that does not match the body.
pub(crate) fn build(request: Request) -> Result<Built, HttpError> {
    let Request {
        method,
        url,
        headers,
        body,
        timeout_ms,
    } = request;
    let what = format!("{method} {url}");
    let invalid = |reason: String| HttpError::InvalidRequest(format!("{what}: {reason}"));
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| invalid(format!("invalid method {method:?}")))?;
    let uri: Uri = url.parse().map_err(|err| invalid(format!("invalid URL: {err}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid("the URL must start with http:// or https://".into())),
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(invalid("the URL must name a host, without user info".into()));
    }

    let mut builder = http::Request::builder().method(method.clone()).uri(uri);
    let mut length = None;
    for (name, value) in headers {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid(format!("invalid header name {name:?}")))?;
        if DEFAULT_FORBIDDEN_HEADERS.contains(&header) {
            return Err(invalid(format!("header {name:?} is set by the host, not the job")));
        }
        let value =
            HeaderValue::from_bytes(&value).map_err(|_| invalid(format!("invalid value for header {name:?}")))?;
        if header == CONTENT_LENGTH {
            let declared = value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok());
            if declared != Some(body.len() as u64) {
                return Err(invalid(format!(
                    "content-length {value:?} does not match the {}-byte body",
                    body.len()
                )));
            }
            length = Some(value);
            continue;
        }
        builder = builder.header(header, value);
    }
    let needs_length = !body.is_empty() || matches!(method, Method::POST | Method::PUT | Method::PATCH);
    if let Some(length) = length.or_else(|| needs_length.then(|| HeaderValue::from(body.len()))) {
        builder = builder.header(CONTENT_LENGTH, length);
    }
    let body = Full::new(Bytes::from(body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let request = builder.body(body).map_err(|err| invalid(err.to_string()))?;

    let options = timeout_ms.map(|ms| {
        let timeout = Some(Duration::from_millis(ms));
        RequestOptions {
            connect_timeout: timeout,
            first_byte_timeout: timeout,
            between_bytes_timeout: timeout,
        }
    });
    Ok(Built { request, options, what })
}

/// What to do about a request to `uri` that `[http] allow` refused:
/// `add "<rule>" to [http] allow` ([`rule_for`]).
pub(crate) fn allow_hint(uri: &Uri) -> String {
    format!("add \"{}\" to [http] allow", rule_for(uri))
}

/// The rule that would grant `uri` in `[http] allow`: `host` on the
/// scheme's default port, `host:port` otherwise.
pub(crate) fn rule_for(uri: &Uri) -> String {
    let host = uri.host().unwrap_or_default();
    let default_port = if uri.scheme_str() == Some("https") { 443 } else { 80 };
    match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    }
}

/// The `error.type` of a failed request's span: the WASI error code's
/// name, low-cardinality.
pub(crate) fn error_type(err: &Error) -> &'static str {
    match err {
        Error::DnsTimeout => "dns-timeout",
        Error::DestinationNotFound => "destination-not-found",
        Error::DestinationUnavailable => "destination-unavailable",
        Error::DestinationIpProhibited => "destination-ip-prohibited",
        Error::ConnectionRefused => "connection-refused",
        Error::ConnectionTerminated => "connection-terminated",
        Error::ConnectionTimeout => "connection-timeout",
        Error::ConnectionReadTimeout => "connection-read-timeout",
        Error::ConnectionWriteTimeout => "connection-write-timeout",
        Error::ConnectionLimitReached => "connection-limit-reached",
        Error::HttpResponseTimeout => "http-response-timeout",
        Error::HttpResponseBodySize(_) => "http-response-body-size",
        Error::HttpProtocolError => "http-protocol-error",
        Error::HttpRequestDenied => "http-request-denied",
        _ => "_OTHER",
    }
}

/// The message inside an [`HttpError`].
fn failure_message(failure: &HttpError) -> &str {
    match failure {
        HttpError::InvalidRequest(m)
        | HttpError::Denied(m)
        | HttpError::Prohibited(m)
        | HttpError::Timeout(m)
        | HttpError::Limit(m)
        | HttpError::Transport(m) => m,
    }
}

/// The case and message the guest gets for a request that failed with `err`.
pub(crate) fn failed(what: &str, err: &Error) -> HttpError {
    let message = format!("{what} failed: {err}");
    match err {
        Error::DnsTimeout
        | Error::ConnectionTimeout
        | Error::ConnectionReadTimeout
        | Error::ConnectionWriteTimeout
        | Error::HttpResponseTimeout => HttpError::Timeout(message),
        Error::ConnectionLimitReached | Error::HttpResponseBodySize(_) => HttpError::Limit(message),
        Error::DestinationIpProhibited => HttpError::Prohibited(message),
        Error::HttpRequestDenied => HttpError::Denied(message),
        _ => HttpError::Transport(message),
    }
}

impl Host for super::HttpPolicy {
    async fn send(&mut self, request: Request) -> Result<Response, HttpError> {
        self.start(request)?.await
    }
}

impl super::HttpPolicy {
    /// Checks `request` against the job's grants and limits and starts
    /// it: what is left to wait for holds no borrow of the store, so an
    /// `async func` import can release the store while it waits.
    pub(crate) fn start(
        &mut self,
        request: Request,
    ) -> Result<impl Future<Output = Result<Response, HttpError>> + Send + use<>, HttpError> {
        let Built {
            mut request,
            options,
            what,
        } = build(request)?;
        let Some((rule, route)) = self.permitted(request.uri()) else {
            self.note_denied(request.uri());
            return Err(HttpError::Denied(format!(
                "{what}: denied: the plugin's manifest does not grant this host; {}",
                allow_hint(request.uri())
            )));
        };
        let Some(slot) = self.take_slot() else {
            return Err(HttpError::Limit(format!(
                "{what}: too many requests open in this job (at most {})",
                self.client.limits().per_job
            )));
        };
        let mut span = self.traced(&mut request);
        let (client, pools) = (self.client.clone(), self.pools.clone());
        let (stats, log) = (self.stats.clone(), self.log.clone());
        // The exchange runs on a task of its own, not on the job's fiber:
        // polling a connect, a TLS handshake or hyper's dispatch there would
        // dirty pages of the fiber's stack for every in-flight job (the
        // fiber then waits on a join handle, a shallow poll). Dropping the
        // handle (the job timed out or was dropped) aborts the exchange.
        // Boxed, so spawning moves a pointer through the fiber's frames, not
        // the whole future (with it unboxed the fiber's stack held a second
        // page per job).
        Ok(wasmtime_wasi::runtime::spawn(Box::pin(async move {
            let response = client.send(&pools, request, options, route).await;
            let response = response.map_err(|err| {
                super::note_failure(&stats, &log, &err, &rule);
                let failure = match &err {
                    SendError::Prohibited(refused) => HttpError::Prohibited(format!(
                        "{what} failed: destination IP address prohibited ({refused}); the rule \"{rule}\" \
                         reaches public addresses only, a rule naming the IP literal reaches others"
                    )),
                    SendError::Wasi(err) => failed(&what, err),
                };
                span.failed(error_type(&Error::from(err)), &failure_message(&failure));
                failure
            })?;
            let (parts, body) = response.into_parts();
            span.http_status(parts.status.as_u16());
            let body = match body.collect().await {
                Ok(body) => body.to_bytes(),
                Err(err) => {
                    span.failed(error_type(&err), &err);
                    return Err(failed(&what, &err));
                }
            };
            drop(slot);
            let headers = parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                .collect();
            Ok(Response {
                status: parts.status.as_u16(),
                headers,
                body: body.into(),
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Request {
        Request {
            method: method.into(),
            url: url.into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: body.to_vec(),
            timeout_ms: None,
        }
    }

    fn refused(request: Request) -> String {
        match build(request) {
            Err(HttpError::InvalidRequest(message)) => message,
            Err(other) => panic!("unexpected error {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_plain_get_carries_no_length_and_keeps_its_headers() {
        let built = build(request(
            "GET",
            "http://h:8080/p?q=1",
            &[("x-a", "1"), ("x-a", "2")],
            b"",
        ))
        .unwrap();
        assert_eq!(built.what, "GET http://h:8080/p?q=1");
        assert_eq!(built.request.uri().path_and_query().unwrap().as_str(), "/p?q=1");
        let values: Vec<_> = built.request.headers().get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert!(built.request.headers().get(CONTENT_LENGTH).is_none());
        assert!(built.options.is_none());
    }

    #[test]
    fn a_body_gets_its_length_and_a_timeout_applies_to_every_wait() {
        let mut post = request("POST", "https://h/", &[], b"abc");
        post.timeout_ms = Some(1500);
        let built = build(post).unwrap();
        assert_eq!(built.request.headers()[CONTENT_LENGTH], "3");
        let options = built.options.unwrap();
        assert_eq!(options.connect_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(options.first_byte_timeout, options.between_bytes_timeout);
        let empty_put = build(request("PUT", "https://h/", &[], b"")).unwrap();
        assert_eq!(empty_put.request.headers()[CONTENT_LENGTH], "0");
    }

    #[test]
    fn what_wasi_http_refuses_is_refused_with_a_reason() {
        assert!(refused(request("GET", "ftp://h/", &[], b"")).contains("http:// or https://"));
        assert!(refused(request("GET", "/relative", &[], b"")).contains("http:// or https://"));
        assert!(refused(request("GET", "http://u:p@h/", &[], b"")).contains("user info"));
        assert!(refused(request("G T", "http://h/", &[], b"")).contains("invalid method"));
        assert!(refused(request("GET", "http://h/", &[("host", "evil")], b"")).contains("\"host\""));
        assert!(
            refused(request("GET", "http://h/", &[("transfer-encoding", "chunked")], b"")).contains("set by the host")
        );
        assert!(refused(request("GET", "http://h/", &[("bad name", "v")], b"")).contains("invalid header name"));
        assert!(refused(request("GET", "http://h/", &[("x", "a\nb")], b"")).contains("invalid value"));
        let lying = refused(request("POST", "http://h/", &[("content-length", "10")], b"abc"));
        assert!(lying.contains("does not match the 3-byte body"), "{lying}");
        assert!(build(request("POST", "http://h/", &[("Content-Length", "3")], b"abc")).is_ok());
    }

    #[test]
    fn a_denial_names_the_rule_that_would_grant_it() {
        let uri = |u: &str| u.parse::<Uri>().unwrap();
        assert_eq!(rule_for(&uri("http://127.0.0.1:18765/x")), "127.0.0.1:18765");
        assert_eq!(rule_for(&uri("http://example.com/")), "example.com");
        assert_eq!(rule_for(&uri("https://example.com:443/")), "example.com");
        assert_eq!(rule_for(&uri("https://example.com:80/")), "example.com:80");
        assert_eq!(rule_for(&uri("http://[::1]:8080/")), "[::1]:8080");
    }

    #[test]
    fn failures_fall_in_the_case_a_guest_acts_on() {
        assert!(matches!(
            failed("GET u", &Error::HttpResponseTimeout),
            HttpError::Timeout(_)
        ));
        assert!(matches!(
            failed("GET u", &Error::ConnectionReadTimeout),
            HttpError::Timeout(_)
        ));
        assert!(matches!(
            failed("GET u", &Error::HttpResponseBodySize(Some(9))),
            HttpError::Limit(_)
        ));
        assert!(matches!(
            failed("GET u", &Error::DestinationIpProhibited),
            HttpError::Prohibited(_)
        ));
        match failed("GET u", &Error::ConnectionRefused) {
            HttpError::Transport(message) => assert_eq!(message, "GET u failed: connection refused"),
            other => panic!("{other:?}"),
        }
    }
}
