//! `wasmjobs schedule`: every cron schedule in Redis and when it runs next.
//!
//! Lists what `cron_jobs:default` holds (sidekiq-cron's format): the
//! schedules plugins declare (`[[schedule]]` in a manifest, registered by
//! `wasmjobs run`) and those a Ruby app registered with sidekiq-cron. The
//! next run is computed here from the expression and zone; a schedule
//! whose expression wasmjobs cannot parse shows why instead. With shards,
//! a table per shard.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use super::{Cli, RedisArgs, fleet};
use crate::cron::{self, CronExpr};
use crate::redis::cron::{CronEntry, Listing, list};
use crate::redis::now_f64;

/// Arguments of `wasmjobs schedule`.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Print the schedules as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One schedule as shown.
#[derive(Debug, Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    entry: &'a CronEntry,
    /// The expression without its zone, and the zone.
    expression: Option<String>,
    timezone: Option<&'static str>,
    /// Next run, epoch seconds.
    next_run: Option<i64>,
    /// Why wasmjobs does not run it, if it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Runs the command.
pub async fn run(cli: &Cli, args: &ScheduleArgs) -> Result<ExitCode> {
    let answers = fleet::read_all(
        &args.redis,
        &cli.data_dir,
        |mut conn| async move { list(&mut conn).await },
    )
    .await?;
    let now = now_f64();
    let text = if args.json {
        let to_json =
            |listing: &Listing| serde_json::to_value(rows(listing, now)).context("cannot serialise the schedules");
        serde_json::to_string_pretty(&fleet::json(&answers, "schedules", to_json)?)
            .context("cannot serialise the schedules")?
            + "\n"
    } else {
        fleet::text(&answers, |listing| render(listing, &rows(listing, now), now))
    };
    print!("{text}");
    Ok(fleet::status(&answers))
}

fn rows(listing: &Listing, now: f64) -> Vec<Row<'_>> {
    listing
        .entries
        .iter()
        .map(|entry| match CronExpr::parse_sidekiq(&entry.cron) {
            Ok(expr) => Row {
                entry,
                expression: Some(expr.expression().to_owned()),
                timezone: Some(expr.zone()),
                next_run: expr.next_after(now.floor() as i64),
                error: None,
            },
            Err(err) => Row {
                entry,
                expression: None,
                timezone: None,
                next_run: None,
                error: Some(format!("{err:#}")),
            },
        })
        .collect()
}

/// The table.
fn render(listing: &Listing, rows: &[Row<'_>], now: f64) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no schedules (declare them with [[schedule]] in a plugin's wasmjobs.toml; see docs/cron.md)\n");
    } else {
        let cells: Vec<[String; 8]> = rows
            .iter()
            .map(|row| {
                let e = row.entry;
                let status = if e.enabled { "enabled" } else { "disabled" };
                let next = match (&row.error, row.next_run) {
                    (Some(_), _) => "(not run: see below)".to_owned(),
                    (None, _) if !e.enabled => "-".to_owned(),
                    (None, Some(next)) => format!("{} (in {})", cron::display(next), until(next as f64 - now)),
                    (None, None) => "never".to_owned(),
                };
                [
                    e.name.clone(),
                    row.expression.clone().unwrap_or_else(|| e.cron.clone()),
                    row.timezone.unwrap_or("-").to_owned(),
                    format!("{} → {}", e.class, e.queue),
                    status.to_owned(),
                    e.last_enqueue
                        .map(|t| cron::display(t as i64))
                        .unwrap_or_else(|| "-".to_owned()),
                    next,
                    e.plugin.clone().unwrap_or_else(|| "sidekiq-cron".to_owned()),
                ]
            })
            .collect();
        let header = [
            "NAME",
            "CRON",
            "ZONE",
            "CLASS → QUEUE",
            "STATUS",
            "LAST RUN",
            "NEXT RUN",
            "FROM",
        ];
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|c| c[i].chars().count())
                    .chain([header[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cols: Vec<&str>| {
            let mut text = String::new();
            for (i, col) in cols.iter().enumerate() {
                if i + 1 == cols.len() {
                    text.push_str(col);
                } else {
                    let pad = widths[i].saturating_sub(col.chars().count());
                    let _ = write!(text, "{col}{}  ", " ".repeat(pad));
                }
            }
            text.trim_end().to_owned() + "\n"
        };
        out.push_str(&line(header.to_vec()));
        for row in &cells {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        for row in rows {
            if let Some(error) = &row.error {
                let _ = writeln!(out, "{}: not run: {error}", row.entry.name);
            }
        }
    }
    for (key, why) in &listing.invalid {
        let _ = writeln!(out, "{key}: not a schedule wasmjobs can read: {why}");
    }
    if listing.truncated {
        let _ = writeln!(
            out,
            "(only the first {} schedules are shown and run)",
            crate::redis::cron::MAX_SCHEDULES
        );
    }
    out
}

/// Time until a run, for people: `4s`, `3m 05s`, `2h 10m`, `3d 4h`.
fn until(secs: f64) -> String {
    let whole = secs.max(0.0).ceil() as u64;
    match whole {
        0..60 => format!("{whole}s"),
        60..3_600 => format!("{}m {:02}s", whole / 60, whole % 60),
        3_600..86_400 => format!("{}h {:02}m", whole / 3_600, whole % 3_600 / 60),
        _ => format!("{}d {}h", whole / 86_400, whole % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn entry(pairs: &[(&str, &str)]) -> CronEntry {
        let fields: HashMap<Vec<u8>, Vec<u8>> = pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        CronEntry::from_hash("cron_job:default:x", &fields).unwrap()
    }

    #[test]
    fn the_table_shows_next_runs_and_what_cannot_run() {
        let listing = Listing {
            entries: vec![
                entry(&[
                    ("name", "report"),
                    ("klass", "ReportJob"),
                    ("cron", "*/5 * * * * Europe/Berlin"),
                    ("message", r#"{"queue":"reports"}"#),
                    ("wasmjobs_plugin", "reports"),
                    ("last_enqueue_time", "2026-12-02 03:00:00 +0000"),
                ]),
                entry(&[("name", "ruby"), ("klass", "R"), ("cron", "every day at noon")]),
            ],
            invalid: vec![("cron_job:default:bad".into(), "no \"cron\" field".into())],
            truncated: false,
        };
        let now = 1_796_180_645.0; // 2026-12-02T03:04:05Z
        let text = render(&listing, &rows(&listing, now), now);
        assert!(text.starts_with("NAME  "), "{text}");
        assert!(text.contains("*/5 * * * *"), "{text}");
        assert!(text.contains("Europe/Berlin"), "{text}");
        assert!(text.contains("ReportJob → reports"), "{text}");
        assert!(text.contains("2026-12-02 03:00:00Z"), "{text}");
        assert!(text.contains("2026-12-02 03:05:00Z (in 55s)"), "{text}");
        assert!(text.contains("sidekiq-cron"), "{text}");
        assert!(text.contains("ruby: not run:"), "{text}");
        assert!(text.contains("cron_job:default:bad: not a schedule"), "{text}");
        let empty = Listing::default();
        assert!(render(&empty, &[], now).starts_with("no schedules"));
    }

    #[test]
    fn times_until_read_naturally() {
        assert_eq!(until(4.2), "5s");
        assert_eq!(until(185.0), "3m 05s");
        assert_eq!(until(7_800.0), "2h 10m");
        assert_eq!(until(-3.0), "0s");
    }
}
