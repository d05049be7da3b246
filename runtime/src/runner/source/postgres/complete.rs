//! Writing a batch of ended jobs to PostgreSQL: one transaction, at most
//! four statements whatever the batch's size (one per kind of outcome,
//! each over arrays), pipelined on one connection.
//!
//! Every statement is fenced on the job's row *and* claim and this
//! process's identity: a job whose lease ran out and was claimed again
//! elsewhere is not touched, and the count of such jobs is returned so the
//! runner can say so. Writing a batch again after a failed commit is
//! harmless for the same reason.

use anyhow::{Context, Result};
use serde_json::Value;

use super::sql;
use crate::runner::fetched::{Completion, Finish, Receipt};
use crate::runner::job_retry::Write;

/// The batch sorted by the statement that writes each job.
#[derive(Default)]
pub(super) struct Plan {
    ack: Columns,
    release: Columns,
    later: Columns,
    at: Vec<f64>,
    later_payloads: Vec<String>,
    bury: Columns,
    kinds: Vec<&'static str>,
    buried: Vec<String>,
    /// Jobs with no receipt (never from this store): nothing to write.
    pub(super) foreign: usize,
}

/// Rows and claims of one statement.
#[derive(Default)]
struct Columns {
    rows: Vec<i64>,
    claims: Vec<i32>,
}

impl Columns {
    fn push(&mut self, receipt: Receipt) {
        self.rows.push(receipt.row);
        self.claims.push(receipt.claim);
    }

    fn len(&self) -> usize {
        self.rows.len()
    }
}

impl Plan {
    /// Sorts `batch`.
    pub(super) fn of(batch: &[Completion]) -> Self {
        let mut plan = Plan::default();
        for completion in batch {
            let Some(receipt) = completion.job.receipt else {
                plan.foreign += 1;
                continue;
            };
            match &completion.finish {
                Finish::Requeue | Finish::Outcome(Write::HandBack) => plan.release.push(receipt),
                Finish::Outcome(Write::Ack | Write::Drop | Write::Discard) => plan.ack.push(receipt),
                Finish::Outcome(
                    Write::Retry { at, payload }
                    | Write::Reschedule { at, payload }
                    | Write::HandBackLater { at, payload },
                ) => {
                    match storable(payload) {
                        Some(payload) => {
                            plan.later.push(receipt);
                            plan.at.push(*at);
                            plan.later_payloads.push(payload);
                        }
                        // Cannot be stored as JSON: it could never run again.
                        None => plan.bury(receipt, "dead", unreadable(payload)),
                    }
                }
                Finish::Outcome(Write::Dead { payload }) => {
                    let payload = storable(payload).unwrap_or_else(|| unreadable(payload));
                    plan.bury(receipt, "dead", payload);
                }
                Finish::Outcome(Write::Cancelled { payload, .. }) => {
                    let payload = storable(payload).unwrap_or_else(|| unreadable(payload));
                    plan.bury(receipt, "cancelled", payload);
                }
            }
        }
        plan
    }

    fn bury(&mut self, receipt: Receipt, kind: &'static str, payload: String) {
        self.bury.push(receipt);
        self.kinds.push(kind);
        self.buried.push(payload);
    }

    /// Jobs this plan writes.
    pub(super) fn len(&self) -> usize {
        self.ack.len() + self.release.len() + self.later.len() + self.bury.len()
    }

    /// Whether it buries any job (the dead table is then trimmed).
    pub(super) fn buries(&self) -> bool {
        self.bury.len() > 0
    }

    /// Whether it makes a job claimable now.
    pub(super) fn releases(&self) -> bool {
        self.release.len() > 0
    }

    /// Runs the plan in `tx` for `owner`; returns how many jobs were
    /// written (the rest had been taken over).
    pub(super) async fn run(&self, tx: &deadpool_postgres::Transaction<'_>, owner: &str) -> Result<u64> {
        let ack = async {
            if self.ack.len() == 0 {
                return Ok(0);
            }
            let statement = tx.prepare_cached(sql::ACK).await?;
            tx.execute(&statement, &[&self.ack.rows, &self.ack.claims, &owner])
                .await
        };
        let release = async {
            if self.release.len() == 0 {
                return Ok(0);
            }
            let statement = tx.prepare_cached(sql::RELEASE).await?;
            tx.execute(&statement, &[&self.release.rows, &self.release.claims, &owner])
                .await
        };
        let later = async {
            if self.later.len() == 0 {
                return Ok(0);
            }
            let statement = tx.prepare_cached(sql::LATER).await?;
            tx.execute(
                &statement,
                &[
                    &self.later.rows,
                    &self.later.claims,
                    &owner,
                    &self.at,
                    &self.later_payloads,
                ],
            )
            .await
        };
        let bury = async {
            if self.bury.len() == 0 {
                return Ok(0);
            }
            let statement = tx.prepare_cached(sql::BURY).await?;
            tx.execute(
                &statement,
                &[&self.bury.rows, &self.bury.claims, &owner, &self.kinds, &self.buried],
            )
            .await
        };
        let (ack, release, later, bury) =
            futures_util::try_join!(ack, release, later, bury).context("recording ended jobs in PostgreSQL")?;
        Ok(ack + release + later + bury)
    }
}

/// `payload` as PostgreSQL's `jsonb` takes it: a JSON object, with any
/// NUL character (which `jsonb` refuses, and a guest's error message can
/// hold) replaced by U+FFFD. `None` if it is no JSON object.
fn storable(payload: &str) -> Option<String> {
    if !payload.contains("\\u0000") {
        return serde_json::from_str::<&serde_json::value::RawValue>(payload)
            .ok()
            .filter(|raw| raw.get().trim_start().starts_with('{'))
            .map(|_| payload.to_owned());
    }
    let mut value: Value = serde_json::from_str(payload).ok()?;
    if !value.is_object() {
        return None;
    }
    replace_nul(&mut value);
    Some(value.to_string())
}

fn replace_nul(value: &mut Value) {
    match value {
        Value::String(text) if text.contains('\0') => *text = text.replace('\0', "\u{fffd}"),
        Value::Array(items) => items.iter_mut().for_each(replace_nul),
        Value::Object(map) => map.values_mut().for_each(replace_nul),
        _ => {}
    }
}

/// A dead-table entry for text that is no JSON object: kept whole, as a
/// string.
fn unreadable(payload: &str) -> String {
    let text = payload.replace('\0', "\u{fffd}");
    serde_json::json!({
        "class": "wasmjobs::Unreadable",
        "raw": text,
        "error_class": "wasmjobs::MalformedPayload",
        "error_message": "the job's payload is not a JSON object",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_stored_as_jsonb_takes_them() {
        let plain = r#"{"class":"A","args":[]}"#;
        assert_eq!(storable(plain).as_deref(), Some(plain));
        // jsonb refuses \u0000; the character becomes U+FFFD, the rest stays.
        let nul = r#"{"class":"A","error_message":"bad\u0000byte","args":["\u0000"]}"#;
        let stored: Value = serde_json::from_str(&storable(nul).expect("an object")).expect("json");
        assert_eq!(stored["error_message"], "bad\u{fffd}byte");
        assert_eq!(stored["args"][0], "\u{fffd}");
        // An escaped backslash before "u0000" is no NUL and is kept.
        let escaped = r#"{"class":"A","args":["\\u0000"]}"#;
        assert_eq!(storable(escaped).map(|s| s.contains(r"\\u0000")), Some(true));
        assert_eq!(storable("[1]"), None);
        assert_eq!(storable("not json"), None);
        let kept: Value = serde_json::from_str(&unreadable("not\0json")).expect("json");
        assert_eq!(kept["raw"], "not\u{fffd}json");
    }
}
