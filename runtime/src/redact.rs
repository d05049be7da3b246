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

/// The runner's connection secrets, which no plugin's `env` grant may pass
/// on: every Redis and PostgreSQL URL it holds, as given and as passed to
/// the driver, and the password in each, as the driver reads it.
#[derive(Debug, Default, Clone)]
pub struct Secrets {
    /// URLs, each protected wherever it appears in a value.
    urls: Vec<String>,
    /// Passwords: a value that is one, holds one of [`MIN_INNER`] bytes or
    /// more, or holds a URL that carries one, is refused.
    passwords: Vec<String>,
}

/// The shortest password looked for inside a longer value: shorter ones
/// are matched whole (`HOME=/home/pwilson` does not hold the password `pw`).
const MIN_INNER: usize = 8;

/// The URL schemes whose passwords a value may carry, spelled any way.
const SCHEMES: [&str; 6] = [
    "postgres://",
    "postgresql://",
    "redis://",
    "rediss://",
    "redis+unix://",
    "unix://",
];

impl Secrets {
    /// Protects the Redis or PostgreSQL URL `url` and its password.
    pub fn add_url(&mut self, url: &str) {
        if url.is_empty() {
            return;
        }
        self.urls.push(url.to_owned());
        if let Some(password) = password_of(url)
            && !password.is_empty()
            && !self.passwords.contains(&password)
        {
            self.passwords.push(password);
        }
    }

    /// The same, for each of `urls`.
    pub fn with_urls<'a>(mut self, urls: impl IntoIterator<Item = &'a str>) -> Self {
        for url in urls {
            self.add_url(url);
        }
        self
    }

    /// Whether `value` holds one of the secrets, whatever its spelling: a
    /// URL as given, a password alone or inside a longer value, or any URL
    /// whose password is one of them (another host name, port, scheme,
    /// parameters or percent-encoding).
    pub(crate) fn held_in(&self, value: &str) -> bool {
        if self.urls.iter().any(|url| value.contains(url.as_str())) {
            return true;
        }
        if self
            .passwords
            .iter()
            .any(|p| value == p || (p.len() >= MIN_INNER && value.contains(p.as_str())))
        {
            return true;
        }
        SCHEMES.iter().any(|scheme| {
            value.match_indices(scheme).any(|(at, _)| {
                let token = value[at..].split(char::is_whitespace).next().unwrap_or_default();
                password_of(token).is_some_and(|p| self.passwords.contains(&p))
            })
        })
    }
}

/// The password of a Redis or PostgreSQL URL, as its driver reads it.
fn password_of(url: &str) -> Option<String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // As given, a `--db` URL holds wasmjobs's own parameters
        // (`pool=`), which tokio-postgres refuses: then as a plain URL.
        if let Ok(config) = url.parse::<tokio_postgres::Config>() {
            return config.get_password().map(|p| String::from_utf8_lossy(p).into_owned());
        }
        let parsed = url::Url::parse(url).ok()?;
        let password = parsed.password()?;
        // Percent-decoded ('+' is a plus here, not a space).
        let encoded = format!("p={}", password.replace('+', "%2B"));
        return Some(url::form_urlencoded::parse(encoded.as_bytes()).next()?.1.into_owned());
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url).ok()?;
    info.redis_settings().password().map(str::to_owned)
}

#[cfg(test)]
mod secrets_tests {
    use super::*;

    #[test]
    fn a_url_is_held_as_given_and_spelled_otherwise() {
        let secrets = Secrets::default().with_urls([
            "postgres://u:s3cret-pass@db.internal/app?pool=5&sslmode=disable",
            "redis://:hunter2hunter2@cache:6379/0",
        ]);
        for held in [
            "postgres://u:s3cret-pass@db.internal/app?pool=5&sslmode=disable",
            "postgresql://u:s3cret-pass@DB.internal:5432/app",
            "host=x postgres://other:s3cret-pass@10.0.0.1/app",
            "postgres://u:s3cret%2Dpass@db.internal/app",
            "s3cret-pass",
            "redis://default:hunter2hunter2@127.0.0.1:6379",
            "rediss://:hunter2hunter2@cache",
            "prefix-hunter2hunter2-suffix",
        ] {
            assert!(secrets.held_in(held), "{held}");
        }
        for free in [
            "postgres://u:other@db.internal/app",
            "redis://cache:6379",
            "/home/u",
            "",
        ] {
            assert!(!secrets.held_in(free), "{free}");
        }
    }

    #[test]
    fn a_short_password_is_held_only_whole() {
        let secrets = Secrets::default().with_urls(["postgres://u:pw@h/db"]);
        assert!(secrets.held_in("pw"));
        assert!(!secrets.held_in("/home/pwilson"));
        assert!(secrets.held_in("postgresql://x:pw@elsewhere/db"));
        // A URL without a password protects only itself.
        let secrets = Secrets::default().with_urls(["redis://cache:6379", ""]);
        assert!(secrets.held_in("redis://cache:6379/1"));
        assert!(!secrets.held_in("anything"));
    }
}
