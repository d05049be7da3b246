//! `[[schedule]]`: periodic jobs a plugin declares in its manifest.
//!
//! ```toml
//! [[schedule]]
//! cron = "*/5 * * * *"          # 5 fields, or 6 with seconds first
//! timezone = "Europe/Berlin"    # IANA name; default UTC
//! class = "ReportJob"           # one of this plugin's `classes`
//! args = [1, "two"]             # the job's arguments; default []
//! queue = "reports"             # default "default"
//! name = "hourly-report"        # default: the class
//! catch_up = false              # see docs/cron.md
//! ```
//!
//! Only parsing and validation live here (no Redis): a bad expression, an
//! unknown zone, a class the plugin does not serve or a name used twice
//! refuses the plugin, with the manifest line, like every other manifest
//! error. The runner registers what a loaded plugin declares in Redis
//! (`redis::cron`) and runs it (`runner::cron`).

use std::ops::Range;

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::cron::CronExpr;

/// Most `[[schedule]]` entries in one manifest.
pub const MAX_SCHEDULES: usize = 100;
/// Longest schedule name, in bytes.
pub const MAX_NAME_LEN: usize = 200;
/// Longest queue name, in bytes.
pub const MAX_QUEUE_LEN: usize = 200;
/// Largest `args`, as JSON, in bytes.
pub const MAX_ARGS_BYTES: usize = 64 * 1024;

/// One periodic job.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its name, unique in the Redis it runs on (sidekiq-cron's job name).
    pub name: String,
    /// When it runs.
    pub cron: CronExpr,
    /// The job class enqueued.
    pub class: String,
    /// The job's arguments.
    pub args: Vec<Value>,
    /// The queue it is pushed to.
    pub queue: String,
    /// After a time with no process running, enqueue the most recent
    /// missed tick once.
    pub catch_up: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSchedule {
    cron: Spanned<String>,
    #[serde(default)]
    timezone: Option<Spanned<String>>,
    class: Spanned<String>,
    #[serde(default)]
    args: Option<Spanned<Value>>,
    #[serde(default)]
    queue: Option<Spanned<String>>,
    #[serde(default)]
    name: Option<Spanned<String>>,
    #[serde(default)]
    catch_up: bool,
}

/// Validates the `[[schedule]]` entries of a manifest serving `classes`;
/// `at` turns a span into `file:line`.
pub(crate) fn resolve(
    raw: &[Spanned<RawSchedule>],
    classes: &[String],
    at: &dyn Fn(Range<usize>) -> String,
) -> Result<Vec<Schedule>> {
    if raw.len() > MAX_SCHEDULES {
        let span = raw.get(MAX_SCHEDULES).map(Spanned::span).unwrap_or_default();
        bail!("{}: schedule: more than {MAX_SCHEDULES} entries", at(span));
    }
    let mut schedules: Vec<Schedule> = Vec::new();
    for entry in raw {
        let raw = entry.get_ref();
        let zone = raw.timezone.as_ref().map(|z| z.get_ref().as_str());
        let cron = CronExpr::parse(raw.cron.get_ref(), zone).map_err(|e| {
            let span = match (&raw.timezone, e.to_string().contains("time zone")) {
                (Some(zone), true) => zone.span(),
                _ => raw.cron.span(),
            };
            anyhow!("{}: schedule: {e}", at(span))
        })?;
        let class = raw.class.get_ref();
        if !classes.contains(class) {
            bail!(
                "{}: schedule.class: {class:?} is not one of this plugin's classes ({})",
                at(raw.class.span()),
                classes.join(", ")
            );
        }
        let args = match &raw.args {
            None => Vec::new(),
            Some(args) => match args.get_ref() {
                Value::Array(items) if serde_json::to_string(items).map_or(0, |s| s.len()) <= MAX_ARGS_BYTES => {
                    items.clone()
                }
                Value::Array(_) => bail!(
                    "{}: schedule.args: more than {MAX_ARGS_BYTES} bytes as JSON",
                    at(args.span())
                ),
                _ => bail!("{}: schedule.args: must be an array", at(args.span())),
            },
        };
        let queue = match &raw.queue {
            None => crate::job::DEFAULT_QUEUE.to_owned(),
            Some(queue) => {
                let text = queue.get_ref();
                if !valid_name(text, MAX_QUEUE_LEN) {
                    bail!(
                        "{}: schedule.queue: {text:?} is not a queue name (1-{MAX_QUEUE_LEN} letters, digits, '_', ':', '.', '-')",
                        at(queue.span())
                    );
                }
                text.clone()
            }
        };
        let (name, span) = match &raw.name {
            Some(name) => (name.get_ref().clone(), name.span()),
            None => (class.clone(), entry.span()),
        };
        if !valid_name(&name, MAX_NAME_LEN) {
            bail!(
                "{}: schedule.name: {name:?} is not a schedule name (1-{MAX_NAME_LEN} letters, digits, '_', ':', '.', '-')",
                at(span)
            );
        }
        if schedules.iter().any(|s| s.name == name) {
            let hint = if raw.name.is_none() {
                " (several schedules of one class need a `name` each)"
            } else {
                ""
            };
            bail!("{}: schedule.name: {name:?} is used twice{hint}", at(span));
        }
        schedules.push(Schedule {
            name,
            cron,
            class: class.clone(),
            args,
            queue,
            catch_up: raw.catch_up,
        });
    }
    Ok(schedules)
}

/// Letters, digits, `_`, `:`, `.`, `-`; 1 to `max` bytes.
fn valid_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-'))
}
