//! The dashboard's templates (`templates/*.html`, compiled into the
//! binary) and the filters they use. minijinja escapes every value put into
//! an `.html` template, so a job's args, class, error or queue name —
//! anything a Redis client wrote — is shown as text; no template marks a
//! value safe.

use anyhow::{Context, Result};
use axum::response::Html;
use minijinja::{Environment, Value};

use super::Failure;

/// Where a dashboard's pages are: with several shards, each shard's
/// pages are under a path of their own, and every page links to the
/// others and to the fleet page.
#[derive(Debug, Clone, Default)]
pub(crate) struct Nav {
    /// The path this shard's pages start with (`""` for the default
    /// shard's, at the root; `/shard/NAME` for the others').
    pub(crate) base: String,
    /// This shard's name, with several.
    pub(crate) shard: Option<String>,
    /// Every shard's name and overview link, with several.
    pub(crate) shards: Vec<(String, String)>,
}

impl Nav {
    /// The overview's path.
    pub(crate) fn home(&self) -> String {
        home_of(&self.base)
    }
}

/// The overview's path for pages starting with `base` (the root's is `/`;
/// a nested router serves its `/` at `base` itself, not `base/`).
pub(crate) fn home_of(base: &str) -> String {
    match base {
        "" => "/".to_owned(),
        base => base.to_owned(),
    }
}

/// The compiled templates.
pub(crate) struct View {
    env: Environment<'static>,
}

const TEMPLATES: [(&str, &str); 16] = [
    ("base.html", include_str!("templates/base.html")),
    ("pager.html", include_str!("templates/pager.html")),
    ("unreadable.html", include_str!("templates/unreadable.html")),
    ("control_down.html", include_str!("templates/control_down.html")),
    ("stranded.html", include_str!("templates/stranded.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("queues.html", include_str!("templates/queues.html")),
    ("queue.html", include_str!("templates/queue.html")),
    ("set.html", include_str!("templates/set.html")),
    ("job.html", include_str!("templates/job.html")),
    ("processes.html", include_str!("templates/processes.html")),
    ("cron.html", include_str!("templates/cron.html")),
    ("search.html", include_str!("templates/search.html")),
    ("plugins.html", include_str!("templates/plugins.html")),
    ("login.html", include_str!("templates/login.html")),
    ("shards.html", include_str!("templates/shards.html")),
];

impl View {
    /// `jobs_in`: where the jobs are when not in Redis (the PostgreSQL
    /// store's location), shown in every page's header; `nav`: where this
    /// shard's pages are, and the other shards'.
    pub(crate) fn new(jobs_in: Option<String>, nav: &Nav) -> Result<Self> {
        let mut env = Environment::new();
        env.add_global("jobs_in", Value::from(jobs_in));
        env.add_global("base", Value::from(nav.base.clone()));
        env.add_global("home", Value::from(nav.home()));
        env.add_global("shard", Value::from(nav.shard.clone()));
        let shards: Vec<Value> = nav
            .shards
            .iter()
            .map(|(name, href)| minijinja::context! { name, href })
            .collect();
        env.add_global("shards", Value::from(shards));
        for (name, source) in TEMPLATES {
            env.add_template(name, source)
                .with_context(|| format!("dashboard template {name}"))?;
        }
        env.add_filter("ago", ago);
        env.add_filter("utc", utc);
        env.add_filter("ms", crate::metrics::published::short_ms);
        Ok(Self { env })
    }

    /// Renders template `name` with `context`.
    pub(crate) fn render(&self, name: &str, context: Value) -> Result<Html<String>, Failure> {
        let template = self
            .env
            .get_template(name)
            .map_err(|err| Failure::from(anyhow::anyhow!("template {name}: {err}")))?;
        template
            .render(context)
            .map(Html)
            .map_err(|err| Failure::from(anyhow::anyhow!("rendering {name}: {err:#}")))
    }
}

/// `epoch seconds | ago`: "3s ago", "in 5m".
fn ago(at: Option<f64>) -> String {
    let Some(at) = at.filter(|t| t.is_finite() && *t > 0.0) else {
        return "-".into();
    };
    let delta = crate::redis::now_f64() - at;
    let span = short(delta.abs());
    if delta >= 0.0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

fn short(secs: f64) -> String {
    match secs {
        s if s < 1.0 => format!("{:.0}ms", s * 1000.0),
        s if s < 60.0 => format!("{s:.0}s"),
        s if s < 3600.0 => format!("{:.0}m", s / 60.0),
        s if s < 86_400.0 => format!("{:.1}h", s / 3600.0),
        s => format!("{:.1}d", s / 86_400.0),
    }
}

/// `epoch seconds | utc`: "2026-12-02 06:58:01 UTC".
fn utc(at: Option<f64>) -> String {
    at.filter(|t| t.is_finite())
        .and_then(|t| chrono::DateTime::from_timestamp_millis((t * 1000.0) as i64))
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles_and_escapes() {
        let view = View::new(None, &Nav::default()).expect("templates");
        let env = &view.env;
        let template = env.template_from_named_str("probe.html", "{{ x }}").expect("probe");
        let out = template
            .render(minijinja::context! { x => "<script>alert(1)</script>" })
            .expect("render");
        assert_eq!(out, "&lt;script&gt;alert(1)&lt;&#x2f;script&gt;");
    }

    #[test]
    fn times_read_naturally() {
        assert_eq!(utc(Some(0.5)), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(None), "-");
        assert_eq!(ago(Some(f64::NAN)), "-");
        assert!(ago(Some(crate::redis::now_f64() - 90.0)).ends_with("m ago"));
        let ms = crate::metrics::published::short_ms;
        assert_eq!(ms(0.0123), "0.012ms");
        assert_eq!(ms(2500.0), "2.5s");
    }
}
