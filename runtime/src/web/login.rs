//! Signing in with the dashboard's token from a browser.
//!
//! A browser cannot send `Authorization: Bearer`, and a token in the URL
//! (`?token=`) stays in the history, in logs and in `Referer` headers, so a
//! visitor without credentials is shown a form instead (with status 401);
//! `POST /login` checks the token and sets an HttpOnly, `SameSite=Strict`
//! cookie holding the token's SHA-256 (never the token itself), then sends
//! the browser back to the page it asked for. Only a path on this site is
//! followed back (`/…`, never `//host` or a URL), so the form cannot be
//! used to redirect elsewhere.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use minijinja::context;

use super::Web;
use super::form::query_param;

/// The cookie signing in sets: the token's SHA-256, hex.
pub(super) const TOKEN_COOKIE: &str = "wasmjobs_token";

/// The sign-in form for a visitor who asked for `next`; `wrong` when a
/// token was given and was not the right one.
pub(super) fn form(web: &Web, next: &str, wrong: bool) -> Response {
    let next = if safe_next(next) { next } else { "/" };
    match web.view.render("login.html", context! { next => next, wrong => wrong }) {
        Ok(page) => (StatusCode::UNAUTHORIZED, page).into_response(),
        Err(failure) => failure.into_response(),
    }
}

/// `POST /login` with the urlencoded `form`: back to the page asked for
/// with the cookie set, or the form again.
pub(super) fn submit(web: &Web, form: &str) -> Response {
    let next = query_param(form, "next")
        .filter(|n| safe_next(n))
        .unwrap_or_else(|| "/".into());
    let given = query_param(form, "token").unwrap_or_default();
    let Some(cookie) = web.access.credentials.token_cookie(&given) else {
        return form_again(web, &next);
    };
    let mut response = (StatusCode::SEE_OTHER, "signed in").into_response();
    let headers = response.headers_mut();
    if let (Ok(location), Ok(cookie)) = (
        HeaderValue::from_str(&next),
        HeaderValue::from_str(&format!("{TOKEN_COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Strict")),
    ) {
        headers.insert(header::LOCATION, location);
        headers.append(header::SET_COOKIE, cookie);
        response
    } else {
        form_again(web, "/")
    }
}

fn form_again(web: &Web, next: &str) -> Response {
    form(web, next, true)
}

/// Whether `next` is a path on this site: starts with one `/`, no
/// backslash (browsers read `/\host` as `//host`), no control characters.
fn safe_next(next: &str) -> bool {
    next.starts_with('/')
        && !next.starts_with("//")
        && !next.contains('\\')
        && next.len() <= 2048
        && !next.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn only_paths_on_this_site_are_followed_back() {
        for ok in ["/", "/dead?page=2", "/queues/default"] {
            assert!(safe_next(ok), "{ok}");
        }
        for refused in [
            "",
            "//evil.example/",
            "/\\evil.example",
            "https://evil.example/",
            "dead",
            "/a\nb",
        ] {
            assert!(!safe_next(refused), "{refused:?}");
        }
    }
}
