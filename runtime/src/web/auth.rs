//! Who may use the dashboard, and proof that a change was asked for by its
//! own page: checked in one place, [`guard`], before any handler runs.
//!
//! In order, for every request:
//! - **The name it is addressed to** ([`super::hosts`]): without
//!   credentials, only loopback's names on the dashboard's port (and
//!   `WASMJOBS_WEB_HOSTS`), so a page that rebinds its own name to
//!   127.0.0.1 gets 421 instead of the dashboard (DNS rebinding).
//! - **Origin**: a `POST` whose `Origin` is not this host (or, without
//!   credentials, not one of the allowed names) is refused.
//! - **Credentials** come from the environment only (never the command
//!   line, which other users of the machine can read): `WASMJOBS_WEB_TOKEN`
//!   (sent as `Authorization: Bearer …`, or typed once into the sign-in
//!   form, [`super::login`], which sets an HttpOnly cookie holding its
//!   digest; never in a URL) or `WASMJOBS_WEB_USER` +
//!   `WASMJOBS_WEB_PASSWORD` (HTTP Basic). Compared in constant time,
//!   lengths included (both sides are hashed first).
//!   [`Access::required_for`] refuses to serve an address other than
//!   loopback without them.
//! - **CSRF**: every state-changing request is a `POST` carrying the
//!   `csrf` form field, which must equal the `wasmjobs_csrf` cookie
//!   (double submit; the cookie is `SameSite=Strict` and `HttpOnly`, set on
//!   the first page a browser loads). Another site can make a browser send
//!   a form, but cannot read the token to put in it.
//! - **Headers**: a Content-Security-Policy allowing only the dashboard's
//!   own scripts and styles, so even a payload that escaped escaping could
//!   not run; no framing; no sniffing.
//!
//! A form body must arrive within [`BODY_TIMEOUT`] (the server's own
//! timeouts are in [`super::serve`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::Web;
use super::form::query_param;
use super::login::{self, TOKEN_COOKIE};
use crate::hosts::{AllowedHosts, parse_list};

/// Most bytes of a form the dashboard reads.
const MAX_FORM: usize = 64 << 10;
/// Longest a client may take to send a form's body.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The CSRF cookie.
const CSRF_COOKIE: &str = "wasmjobs_csrf";

/// Who may use the dashboard: the credentials, and the extra names it
/// answers to without them (`WASMJOBS_WEB_HOSTS`).
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub(super) credentials: Credentials,
    hosts: Vec<String>,
}

impl Access {
    /// From the environment: [`Credentials::from_env`] and
    /// `WASMJOBS_WEB_HOSTS` (names, or `name:port`, separated by commas).
    pub fn from_env() -> Result<Self> {
        let credentials = Credentials::from_env()?;
        let hosts = match std::env::var("WASMJOBS_WEB_HOSTS") {
            Ok(list) => parse_list(&list)?,
            Err(_) => Vec::new(),
        };
        Ok(Self { credentials, hosts })
    }

    /// Refuses to serve `addr` to the network without credentials.
    pub fn required_for(&self, addr: SocketAddr) -> Result<()> {
        self.credentials.required_for(addr)
    }

    /// The names a dashboard bound to `bound` answers to.
    pub(super) fn allowed_hosts(&self, bound: SocketAddr) -> AllowedHosts {
        AllowedHosts::new(bound, self.credentials.any(), &self.hosts)
    }
}

/// How visitors prove who they are.
#[derive(Clone, Default)]
pub(super) struct Credentials {
    token: Option<String>,
    basic: Option<(String, String)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("basic", &self.basic.as_ref().map(|(user, _)| (user, "***")))
            .finish()
    }
}

impl Credentials {
    /// From `WASMJOBS_WEB_TOKEN`, `WASMJOBS_WEB_USER` and
    /// `WASMJOBS_WEB_PASSWORD` (empty values count as unset).
    pub(super) fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let token = var("WASMJOBS_WEB_TOKEN");
        let basic = match (var("WASMJOBS_WEB_USER"), var("WASMJOBS_WEB_PASSWORD")) {
            (Some(user), Some(password)) => Some((user, password)),
            (None, None) => None,
            _ => bail!("set both WASMJOBS_WEB_USER and WASMJOBS_WEB_PASSWORD, or neither"),
        };
        if let Some((user, _)) = &basic
            && user.contains(':')
        {
            bail!("WASMJOBS_WEB_USER cannot contain ':' (HTTP Basic separates the user from the password with it)");
        }
        Ok(Self { token, basic })
    }

    /// Whether any credential is set.
    pub(super) fn any(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }

    /// Refuses to serve `addr` to the network without credentials.
    pub(super) fn required_for(&self, addr: SocketAddr) -> Result<()> {
        if !addr.ip().is_loopback() && !self.any() {
            bail!(
                "refusing to serve the dashboard on {addr} without credentials: anyone who can reach it could \
                 delete and retry jobs. Set WASMJOBS_WEB_TOKEN, or WASMJOBS_WEB_USER and WASMJOBS_WEB_PASSWORD, \
                 or bind to 127.0.0.1"
            );
        }
        Ok(())
    }

    /// Whether `headers` carry a valid credential: the token as a bearer
    /// or as the sign-in cookie, or the user and password as HTTP Basic.
    fn admits(&self, headers: &HeaderMap) -> bool {
        if !self.any() {
            return true;
        }
        if let Some(token) = &self.token {
            let bearer = authorization(headers).and_then(|v| v.strip_prefix("Bearer "));
            if bearer.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
                return true;
            }
            if cookie(headers, TOKEN_COOKIE).is_some_and(|given| same(given.as_bytes(), digest(token).as_bytes())) {
                return true;
            }
        }
        if let Some((user, password)) = &self.basic
            && let Some(encoded) = authorization(headers).and_then(|v| v.strip_prefix("Basic "))
            && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim())
        {
            let expected = format!("{user}:{password}");
            return same(&decoded, expected.as_bytes());
        }
        false
    }

    /// The sign-in cookie's value if `given` is the token.
    pub(super) fn token_cookie(&self, given: &str) -> Option<String> {
        let token = self.token.as_ref()?;
        same(given.as_bytes(), token.as_bytes()).then(|| digest(token))
    }
}

/// A token's SHA-256, hex: what the sign-in cookie holds.
fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The CSRF token of this request, for the page's forms.
#[derive(Debug, Clone)]
pub(super) struct Csrf(pub String);

/// Constant-time equality, lengths included: both sides are hashed
/// first, so neither an early exit on the first differing byte nor one on
/// a length mismatch tells an attacker anything about the secret.
fn same(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// The value of cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

fn refuse(status: StatusCode, message: &str) -> Response {
    with_headers((status, message.to_owned()).into_response())
}

/// 401, naming the scheme the dashboard takes (so a browser prompts for
/// Basic credentials only when they are the way in).
fn unauthorized(credentials: &Credentials) -> Response {
    let mut response = refuse(StatusCode::UNAUTHORIZED, "credentials required");
    let challenge = if credentials.basic.is_some() {
        "Basic realm=\"wasmjobs\", charset=\"UTF-8\""
    } else {
        "Bearer realm=\"wasmjobs\""
    };
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    response
}

/// Whether the request's `Origin`, when it has one, is this host, and one
/// of the names this dashboard answers to.
fn same_origin(headers: &HeaderMap, hosts: &AllowedHosts) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    url::Url::parse(origin).is_ok_and(|url| {
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        url.host_str().is_some_and(|h| {
            let authority = format!("{h}{port}");
            authority == host && hosts.admits(&authority)
        })
    })
}

/// The name a request is addressed to: its `Host`, or the authority of an
/// absolute-form request target; `None` when it names none.
fn addressed_to(parts: &axum::http::request::Parts) -> Option<&str> {
    parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| parts.headers.get(header::HOST).map(|v| v.to_str().unwrap_or("")))
}

/// Authenticates every request, checks the CSRF token of every `POST`,
/// hands handlers the page's token, and sets the security headers.
pub(super) async fn guard(State(web): State<std::sync::Arc<Web>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    if let Some(name) = addressed_to(&parts)
        && !web.hosts.admits(name)
    {
        return refuse(StatusCode::MISDIRECTED_REQUEST, &web.hosts.refusal());
    }
    let is_post = parts.method == Method::POST;
    if is_post && !same_origin(&parts.headers, &web.hosts) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: CSRF check failed (cross-origin request)",
        );
    }
    let body = if is_post {
        match tokio::time::timeout(BODY_TIMEOUT, to_bytes(body, MAX_FORM)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "form too large"),
            Err(_) => return refuse(StatusCode::REQUEST_TIMEOUT, "the form took too long to arrive"),
        }
    } else if parts.method == Method::GET || parts.method == Method::HEAD {
        Default::default()
    } else {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "only GET and POST");
    };
    let credentials = &web.access.credentials;
    let path = parts.uri.path();
    if is_post && path == "/login" && credentials.token.is_some() {
        return with_headers(login::submit(&web, std::str::from_utf8(&body).unwrap_or("")));
    }
    // The stylesheet of the sign-in form; nothing else is public.
    let public = !is_post && path == "/assets/style.css";
    if !public && !credentials.admits(&parts.headers) {
        if credentials.token.is_some() && !is_post {
            let asked = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            return with_headers(login::form(&web, asked, false));
        }
        return unauthorized(credentials);
    }
    let existing = cookie(&parts.headers, CSRF_COOKIE).filter(|t| t.len() == 32);
    if is_post {
        let given = std::str::from_utf8(&body).ok().and_then(|f| query_param(f, "csrf"));
        match (&existing, given) {
            (Some(expected), Some(given)) if same(expected.as_bytes(), given.as_bytes()) => {}
            _ => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "refused: CSRF token missing or wrong; reload the page and try again",
                );
            }
        }
    }
    let (token, fresh) = match existing {
        Some(token) => (token, false),
        None => (hex::encode(rand::random::<[u8; 16]>()), true),
    };
    parts.extensions.insert(Csrf(token.clone()));
    let mut response = next.run(Request::from_parts(parts, Body::from(body))).await;
    if fresh
        && let Ok(value) = HeaderValue::from_str(&format!("{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"))
    {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    with_headers(response)
}

/// `response` with the security headers every answer carries.
fn with_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn loopback_needs_nothing_other_addresses_need_credentials() {
        let none = Credentials::default();
        assert!(none.required_for("127.0.0.1:9494".parse().unwrap()).is_ok());
        assert!(none.required_for("[::1]:9494".parse().unwrap()).is_ok());
        let err = none.required_for("0.0.0.0:9494".parse().unwrap()).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
        let token = Credentials {
            token: Some("t".into()),
            basic: None,
        };
        assert!(token.required_for("0.0.0.0:9494".parse().unwrap()).is_ok());
    }

    #[test]
    fn tokens_and_basic_credentials_are_checked_exactly() {
        let creds = Credentials {
            token: Some("s3cret".into()),
            basic: Some(("admin".into(), "pw".into())),
        };
        assert!(creds.admits(&headers(&[("authorization", "Bearer s3cret")])));
        assert!(!creds.admits(&headers(&[("authorization", "Bearer s3cre")])));
        assert!(!creds.admits(&headers(&[("authorization", "Bearer s3crets")])));
        let cookie = creds.token_cookie("s3cret").expect("the token signs in");
        assert_ne!(cookie, "s3cret", "the cookie holds a digest, not the token");
        assert!(creds.admits(&headers(&[("cookie", &format!("a=b; wasmjobs_token={cookie}"))])));
        assert!(
            !creds.admits(&headers(&[("cookie", "wasmjobs_token=s3cret")])),
            "the raw token is not a cookie"
        );
        assert_eq!(creds.token_cookie("s3cre"), None);
        let basic = base64::engine::general_purpose::STANDARD.encode("admin:pw");
        assert!(creds.admits(&headers(&[("authorization", &format!("Basic {basic}"))])));
        let wrong = base64::engine::general_purpose::STANDARD.encode("admin:pW");
        assert!(!creds.admits(&headers(&[("authorization", &format!("Basic {wrong}"))])));
        assert!(!creds.admits(&HeaderMap::new()));
        assert!(Credentials::default().admits(&HeaderMap::new()));
    }

    #[test]
    fn equality_does_not_depend_on_lengths() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }

    #[test]
    fn origins_must_be_this_host_and_an_allowed_name() {
        let hosts = AllowedHosts::new("127.0.0.1:9494".parse().unwrap(), false, &[]);
        assert!(same_origin(&headers(&[("host", "127.0.0.1:9494")]), &hosts));
        assert!(same_origin(
            &headers(&[("host", "127.0.0.1:9494"), ("origin", "http://127.0.0.1:9494")]),
            &hosts
        ));
        assert!(!same_origin(
            &headers(&[("host", "127.0.0.1:9494"), ("origin", "http://evil.example")]),
            &hosts
        ));
        assert!(!same_origin(
            &headers(&[("host", "127.0.0.1:9494"), ("origin", "null")]),
            &hosts
        ));
        // A rebound name is same-origin with itself, but not allowed.
        assert!(!same_origin(
            &headers(&[
                ("host", "rebind.example:9494"),
                ("origin", "http://rebind.example:9494")
            ]),
            &hosts
        ));
    }
}
