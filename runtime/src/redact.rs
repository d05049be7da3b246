//! Hiding passwords in connection URLs (Redis, PostgreSQL) before they
//! reach a log line or an error message. The URL is parsed by the `url`
//! crate (and, for Redis, by redis-rs's own parser) in each caller; these
//! are the steps they share, and [`postgres_url`], the whole of it for
//! PostgreSQL (the SQL capability's `--db` and the job store's `--source`).

/// Masks the value of every query parameter whose name contains "pass"
/// (`?password=`, `?pass=`, `?sslpassword=`, any case).
pub(crate) fn query_passwords(url: &mut url::Url) {
    let Some(query) = url.query() else { return };
    let query = query
        .split('&')
        .map(|pair| match url::form_urlencoded::parse(pair.as_bytes()).next() {
            Some((name, _)) if name.to_ascii_lowercase().contains("pass") => {
                format!("{}=***", pair.split_once('=').map_or(pair, |(name, _)| name))
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    url.set_query(Some(&query));
}

/// `scheme://***` (or `scheme:***`, or `***` if `text` starts with no
/// scheme): all that can be shown of text that is not a URL.
pub(crate) fn scheme_only(text: &str) -> String {
    let scheme = text.split_once(':').map(|(scheme, _)| scheme).filter(|scheme| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    match scheme {
        Some(scheme) if text[scheme.len() + 1..].starts_with("//") => format!("{scheme}://***"),
        Some(scheme) => format!("{scheme}:***"),
        None => "***".to_owned(),
    }
}

/// `postgres://user:secret@host/...` → `postgres://user:***@host/...`, for
/// logs and errors; the value of any query parameter whose name contains
/// `pass` (`password=`, `sslpassword=`) is shown as `***` too, and a
/// `#fragment` is left out.
///
/// The `url` crate parses; but tokio-postgres, which gets the URL, reads the
/// credentials up to the *first* `@` anywhere, so `u:p/ss@h` has the
/// password `p/ss` where the `url` crate sees host `u`, port `p`. Where the
/// two could disagree (a `/`, `?` or `#` before the first `@` after a `:`),
/// or the text is no `postgres://` URL at all (several hosts, `h1,h2`, are
/// not one the `url` crate takes), only the scheme is shown.
pub(crate) fn postgres_url(text: &str) -> String {
    let credentials = text
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(credentials, _)| credentials);
    let ambiguous = credentials.is_some_and(|c| c.contains(':') && c.contains(['/', '?', '#']));
    let mut url = match url::Url::parse(text) {
        Ok(url) if !ambiguous && matches!(url.scheme(), "postgres" | "postgresql") => url,
        _ => return scheme_only(text),
    };
    if url.password().is_some() && url.set_password(Some("***")).is_err() {
        return scheme_only(text);
    }
    url.set_fragment(None);
    query_passwords(&mut url);
    url.into()
}
