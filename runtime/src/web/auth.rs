//! Who may use the dashboard, and proof that a change was asked for by its
//! own page: checked in one place, [`guard`], before any handler runs.
//!
//! - **Credentials** come from the environment only (never the command
//!   line, which other users of the machine can read): `WASMJOBS_WEB_TOKEN`
//!   (sent as `Authorization: Bearer …`, or once as `?token=…`, which sets
//!   an HttpOnly cookie for a browser) or `WASMJOBS_WEB_USER` +
//!   `WASMJOBS_WEB_PASSWORD` (HTTP Basic). [`Credentials::required_for`]
//!   refuses to serve an address other than loopback without them.
//! - **CSRF**: every state-changing request is a `POST` carrying the
//!   `csrf` form field, which must equal the `wasmjobs_csrf` cookie
//!   (double submit; the cookie is `SameSite=Strict` and `HttpOnly`, set on
//!   the first page a browser loads). Another site can make a browser send
//!   a form, but cannot read the token to put in it. A `POST` whose `Origin`
//!   names another host is refused as well.
//! - **Headers**: a Content-Security-Policy allowing only the dashboard's
//!   own scripts and styles, so even a payload that escaped escaping could
//!   not run; no framing; no sniffing.

use std::net::SocketAddr;

use anyhow::{Result, bail};
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use super::Web;

/// Most bytes of a form the dashboard reads.
const MAX_FORM: usize = 64 << 10;
/// The CSRF cookie.
const CSRF_COOKIE: &str = "wasmjobs_csrf";
/// The cookie a `?token=` visit sets.
const TOKEN_COOKIE: &str = "wasmjobs_token";

/// How visitors prove who they are.
#[derive(Clone, Default)]
pub struct Credentials {
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
    pub fn from_env() -> Result<Self> {
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
    pub fn any(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }

    /// Refuses to serve `addr` to the network without credentials.
    pub fn required_for(&self, addr: SocketAddr) -> Result<()> {
        if !addr.ip().is_loopback() && !self.any() {
            bail!(
                "refusing to serve the dashboard on {addr} without credentials: anyone who can reach it could \
                 delete and retry jobs. Set WASMJOBS_WEB_TOKEN, or WASMJOBS_WEB_USER and WASMJOBS_WEB_PASSWORD, \
                 or bind to 127.0.0.1"
            );
        }
        Ok(())
    }

    /// Whether `headers` (or the `?token=` of `query`) carry a valid credential.
    fn admits(&self, headers: &HeaderMap, query: Option<&str>) -> bool {
        if !self.any() {
            return true;
        }
        if let Some(token) = &self.token {
            let bearer = authorization(headers).and_then(|v| v.strip_prefix("Bearer "));
            let cookie = cookie(headers, TOKEN_COOKIE);
            let queried = query.and_then(|q| query_param(q, "token"));
            if [bearer, cookie.as_deref(), queried.as_deref()]
                .into_iter()
                .flatten()
                .any(|given| same(given.as_bytes(), token.as_bytes()))
            {
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
}

/// The CSRF token of this request, for the page's forms.
#[derive(Debug, Clone)]
pub struct Csrf(pub String);

/// Constant-time equality (no early exit on the first differing byte).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

/// The decoded value of `name` in a urlencoded `query` or form.
pub(super) fn query_param(query: &str, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut response = (status, message.to_owned()).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"wasmjobs\", charset=\"UTF-8\""),
        );
    }
    response
}

/// Whether the request's `Origin`, when it has one, is this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    url::Url::parse(origin).is_ok_and(|url| {
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        url.host_str().is_some_and(|h| format!("{h}{port}") == host)
    })
}

/// Authenticates every request, checks the CSRF token of every `POST`,
/// hands handlers the page's token, and sets the security headers.
pub(super) async fn guard(State(web): State<std::sync::Arc<Web>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let query = parts.uri.query().map(str::to_owned);
    if !web.credentials.admits(&parts.headers, query.as_deref()) {
        return refuse(StatusCode::UNAUTHORIZED, "credentials required");
    }
    let mut set_token_cookie = None;
    if let Some(token) = query.as_deref().and_then(|q| query_param(q, "token"))
        && web.credentials.token.is_some()
    {
        set_token_cookie = Some(token);
    }
    let existing = cookie(&parts.headers, CSRF_COOKIE).filter(|t| t.len() == 32);
    let body = if parts.method == Method::POST {
        if !same_origin(&parts.headers) {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: CSRF check failed (cross-origin request)",
            );
        }
        let Ok(bytes) = to_bytes(body, MAX_FORM).await else {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "form too large");
        };
        let given = std::str::from_utf8(&bytes).ok().and_then(|f| query_param(f, "csrf"));
        match (&existing, given) {
            (Some(expected), Some(given)) if same(expected.as_bytes(), given.as_bytes()) => {}
            _ => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "refused: CSRF token missing or wrong; reload the page and try again",
                );
            }
        }
        Body::from(bytes)
    } else if parts.method == Method::GET || parts.method == Method::HEAD {
        body
    } else {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "only GET and POST");
    };
    let (token, fresh) = match existing {
        Some(token) => (token, false),
        None => (hex::encode(rand::random::<[u8; 16]>()), true),
    };
    parts.extensions.insert(Csrf(token.clone()));
    let mut response = next.run(Request::from_parts(parts, body)).await;
    let headers = response.headers_mut();
    if fresh
        && let Ok(value) = HeaderValue::from_str(&format!("{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"))
    {
        headers.append(header::SET_COOKIE, value);
    }
    if let Some(token) = set_token_cookie
        && let Ok(value) = HeaderValue::from_str(&format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"))
    {
        headers.append(header::SET_COOKIE, value);
    }
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
        assert!(creds.admits(&headers(&[("authorization", "Bearer s3cret")]), None));
        assert!(!creds.admits(&headers(&[("authorization", "Bearer s3cre")]), None));
        assert!(creds.admits(&headers(&[("cookie", "a=b; wasmjobs_token=s3cret")]), None));
        assert!(creds.admits(&HeaderMap::new(), Some("x=1&token=s3cret")));
        let basic = base64::engine::general_purpose::STANDARD.encode("admin:pw");
        assert!(creds.admits(&headers(&[("authorization", &format!("Basic {basic}"))]), None));
        let wrong = base64::engine::general_purpose::STANDARD.encode("admin:pW");
        assert!(!creds.admits(&headers(&[("authorization", &format!("Basic {wrong}"))]), None));
        assert!(!creds.admits(&HeaderMap::new(), None));
        assert!(Credentials::default().admits(&HeaderMap::new(), None));
    }

    #[test]
    fn origins_must_be_this_host() {
        assert!(same_origin(&headers(&[("host", "127.0.0.1:9494")])));
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:9494"),
            ("origin", "http://127.0.0.1:9494")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:9494"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:9494"),
            ("origin", "null")
        ])));
    }
}
