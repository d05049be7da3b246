//! Hiding passwords in connection URLs (Redis, PostgreSQL) before they
//! reach a log line or an error message. The URL is parsed by the `url`
//! crate (and, for Redis, by redis-rs's own parser) in each caller; these
//! are the two steps they share.

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
