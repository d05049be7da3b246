//! The consumer's fast path over a job payload: the [`Job`] the sandbox
//! runs, read straight from the payload text a worker fetched.
//!
//! The payload type itself ([`Payload`], its full parse, the dead-set
//! wrappers) lives in the `wasmjobs-client` crate, which producers use
//! without linking Wasmtime; what turns a payload into the sandbox's job
//! record is the runner's business and stays here.
//!
//! Everything here reads bytes a Redis client wrote: the property tests in
//! `job_head/proptests.rs` check that no input panics, that the fast path
//! ([`job_from_raw`]) and the full parse ([`Payload::parse`]) agree, and that
//! a dead-set entry for any bytes is valid JSON that keeps them.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use wasmjobs_client::activejob;

use super::payload::{MAX_CLASS_LEN, Payload, epoch_secs};
use crate::job::{ActiveJob, DEFAULT_QUEUE, Job, new_jid};

/// The job the sandbox runs for a fully parsed `payload`.
pub fn to_job(payload: &Payload) -> Job {
    let args = payload.get("args").map(Value::to_string).unwrap_or_else(|| "[]".into());
    let enqueued = payload
        .time("enqueued_at")
        .or_else(|| payload.time("created_at"))
        .unwrap_or(0.0);
    let mut job = Job {
        jid: payload.jid().to_owned(),
        class: payload.class().to_owned(),
        queue: payload.queue().to_owned(),
        args,
        // Retries before this run: retry_count is 0 while the first retry runs.
        retry_count: payload
            .retry_count()
            .map_or(0, |c| u32::try_from(c.saturating_add(1)).unwrap_or(u32::MAX)),
        enqueued_at_ms: (enqueued * 1000.0).max(0.0) as u64,
        activejob: None,
    };
    if activejob::is_wrapper(&job.class) {
        let first = match payload.get("args") {
            Some(Value::Array(args)) => args.first().map(Value::to_string),
            _ => None,
        };
        unwrap_activejob(&mut job, payload.str("wrapped"), first.as_deref());
    }
    job
}

/// Turns `job`, an ActiveJob wrapper (top-level `wrapped`, `args[0]` the
/// JSON text `hash`), into the job inside: its own class, its decoded
/// arguments, its context. A wrapper that cannot be unwrapped (no
/// ActiveJob hash, an argument only Ruby can decode) keeps what can be
/// read and carries the reason (`ActiveJob::refused`), which sends it to
/// the dead set if a plugin serves its class, and leaves it to whoever
/// does if none does.
fn unwrap_activejob(job: &mut Job, wrapped: Option<&str>, hash: Option<&str>) {
    let unwrapped = hash
        .ok_or_else(|| "an ActiveJob wrapper has no args[0] (its ActiveJob hash)".to_owned())
        .and_then(|hash| activejob::unwrap(wrapped, hash));
    apply_activejob(job, wrapped, hash.unwrap_or_default(), unwrapped);
}

/// Makes `job` the job `unwrapped` from the ActiveJob hash `hash`, or
/// keeps what it can and the reason why not.
fn apply_activejob(job: &mut Job, wrapped: Option<&str>, hash: &str, unwrapped: Result<activejob::Unwrapped, String>) {
    let refused = match unwrapped {
        Ok(unwrapped) => {
            job.class = unwrapped.class;
            match unwrapped.arguments {
                Ok(arguments) => {
                    job.args = arguments;
                    None
                }
                Err(reason) => Some(reason),
            }
        }
        Err(reason) => {
            if let Some(wrapped) = wrapped.filter(|w| !w.is_empty() && w.len() <= MAX_CLASS_LEN) {
                job.class = wrapped.to_owned();
            }
            Some(reason)
        }
    };
    job.activejob = Some(std::sync::Arc::new(ActiveJob {
        hash: hash.to_owned(),
        refused,
    }));
}

/// The fields a job needs to start, borrowed from the payload text. Every
/// other field is read in full as it goes by ([`Checked`]), the times and
/// `retry_count` kept only if they are numbers ([`Number`]), so one pass
/// tells whether the full parse could hold the payload; the two fields
/// kept raw are checked on their own (`job_from_raw`). A field that appears twice fails, as a derived
/// `Deserialize` would, and leaves the payload to the full parse.
#[derive(Default)]
struct Head<'a> {
    class: Option<Cow<'a, str>>,
    args: Option<&'a RawValue>,
    jid: Option<Cow<'a, str>>,
    queue: Option<Cow<'a, str>>,
    retry_count: Option<serde_json::Number>,
    enqueued_at: Option<serde_json::Number>,
    created_at: Option<serde_json::Number>,
    /// An ActiveJob wrapper's job class.
    wrapped: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for Head<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Head<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a job payload (a JSON object)")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Head<'de>, A::Error> {
                fn once<'de, T, A: serde::de::MapAccess<'de>>(
                    slot: &mut Option<Option<T>>,
                    name: &'static str,
                    map: &mut A,
                ) -> Result<(), A::Error>
                where
                    T: Deserialize<'de>,
                {
                    if slot.is_some() {
                        return Err(serde::de::Error::duplicate_field(name));
                    }
                    *slot = Some(map.next_value()?);
                    Ok(())
                }
                let (mut class, mut args, mut jid, mut queue) = (None, None, None, None);
                let (mut retry_count, mut enqueued_at, mut created_at, mut wrapped) = (None, None, None, None);
                while let Some(key) = map.next_key::<Field>()? {
                    match key {
                        Field::Class => once(&mut class, "class", &mut map)?,
                        Field::Args => once(&mut args, "args", &mut map)?,
                        Field::Jid => once(&mut jid, "jid", &mut map)?,
                        Field::Queue => once(&mut queue, "queue", &mut map)?,
                        Field::RetryCount => once(&mut retry_count, "retry_count", &mut map)?,
                        Field::EnqueuedAt => once(&mut enqueued_at, "enqueued_at", &mut map)?,
                        Field::CreatedAt => once(&mut created_at, "created_at", &mut map)?,
                        Field::Wrapped => once(&mut wrapped, "wrapped", &mut map)?,
                        Field::Other => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(Head {
                    class: class.flatten().map(|Text(text)| text),
                    args: args.flatten(),
                    jid: jid.flatten().map(|Text(text)| text),
                    queue: queue.flatten().map(|Text(text)| text),
                    retry_count: retry_count.flatten().and_then(|Number(n)| n),
                    enqueued_at: enqueued_at.flatten().and_then(|Number(n)| n),
                    created_at: created_at.flatten().and_then(|Number(n)| n),
                    wrapped: wrapped.flatten(),
                })
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A key of the payload's object, matched without copying it (serde's
/// `Cow<str>` always copies: seven allocations a job, one per key).
enum Field {
    Class,
    Args,
    Jid,
    Queue,
    RetryCount,
    EnqueuedAt,
    CreatedAt,
    Wrapped,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Field;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }

            // Escaped or not: serde_json hands over the key unescaped.
            fn visit_str<E>(self, key: &str) -> Result<Field, E> {
                Ok(match key {
                    "class" => Field::Class,
                    "args" => Field::Args,
                    "jid" => Field::Jid,
                    "queue" => Field::Queue,
                    "retry_count" => Field::RetryCount,
                    "enqueued_at" => Field::EnqueuedAt,
                    "created_at" => Field::CreatedAt,
                    "wrapped" => Field::Wrapped,
                    _ => Field::Other,
                })
            }
        }
        deserializer.deserialize_identifier(Visitor)
    }
}

/// A JSON string, borrowed from the payload unless it holds escapes
/// (serde's `Cow<str>` copies every one).
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }

            fn visit_string<E>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// A field read where a number belongs: the number as
/// `serde_json::Value` would hold it, or none for any other JSON value
/// (read in full, as [`Checked`] reads it). Read once, in the head's pass:
/// a number `Value` cannot hold (`1e400`) fails that pass.
struct Number(Option<serde_json::Number>);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Number;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_u64<E>(self, n: u64) -> Result<Number, E> {
                Ok(Number(Some(n.into())))
            }

            fn visit_i64<E>(self, n: i64) -> Result<Number, E> {
                Ok(Number(Some(n.into())))
            }

            fn visit_f64<E>(self, n: f64) -> Result<Number, E> {
                Ok(Number(serde_json::Number::from_f64(n)))
            }

            fn visit_bool<E>(self, _: bool) -> Result<Number, E> {
                Ok(Number(None))
            }

            fn visit_str<E>(self, _: &str) -> Result<Number, E> {
                Ok(Number(None))
            }

            fn visit_unit<E>(self) -> Result<Number, E> {
                Ok(Number(None))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Number, A::Error> {
                CheckedVisitor.visit_seq(seq).map(|Checked| Number(None))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Number, A::Error> {
                CheckedVisitor.visit_map(map).map(|Checked| Number(None))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The first element of a JSON array, borrowed (the rest skimmed).
struct First<'a>(Option<&'a RawValue>);

impl<'de> Deserialize<'de> for First<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = First<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON array")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<First<'de>, A::Error> {
                let first = seq.next_element::<&'de RawValue>()?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        deserializer.deserialize_seq(Visitor)
    }
}

/// A JSON document read in full, numbers included, and kept nowhere: fails
/// on exactly the documents `serde_json::Value` cannot hold.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// The job to run for payload text `raw`, and its enqueue time in epoch
/// seconds (0 if unknown) — the same as `to_job(&Payload::parse(raw)?)`,
/// without building the whole map: on the hot path only the fields the
/// sandbox needs are read, and the full payload is parsed only when a
/// failure has to be written back.
pub fn job_from_raw(raw: &str) -> Result<(Job, f64), String> {
    let full = || {
        Payload::parse(raw).map(|p| {
            let enqueued = p.time("enqueued_at").or_else(|| p.time("created_at")).unwrap_or(0.0);
            (to_job(&p), enqueued)
        })
    };
    // The head reads every field it does not keep in full; the ones it
    // keeps raw are checked here. A number the full parse cannot hold
    // (`1e400`) would start a job whose failure could then not be written
    // back as a retry: such a payload is left to the full parse.
    let Ok(head) = serde_json::from_str::<Head>(raw) else {
        return full();
    };
    if [head.args, head.wrapped]
        .into_iter()
        .flatten()
        .any(|r| serde_json::from_str::<Checked>(r.get()).is_err())
    {
        return full();
    }
    let (Some(class), Some(args)) = (head.class, head.args) else {
        return full();
    };
    if class.is_empty() || class.len() > MAX_CLASS_LEN || !args.get().starts_with('[') {
        return full();
    }
    // As the full parse reads it: `enqueued_at` if it is a number, else
    // `created_at` if that is.
    let enqueued = head
        .enqueued_at
        .as_ref()
        .or(head.created_at.as_ref())
        .and_then(serde_json::Number::as_f64)
        .map_or(0.0, epoch_secs);
    let retry_count = head.retry_count.as_ref().and_then(serde_json::Number::as_u64);
    let jid = head.jid.filter(|j| !j.is_empty()).map_or_else(new_jid, Cow::into_owned);
    let queue = head
        .queue
        .filter(|q| !q.is_empty())
        .map_or_else(|| DEFAULT_QUEUE.to_owned(), Cow::into_owned);
    let mut job = Job {
        jid,
        class: class.into_owned(),
        queue,
        args: args.get().to_owned(),
        retry_count: retry_count.map_or(0, |c| u32::try_from(c.saturating_add(1)).unwrap_or(u32::MAX)),
        enqueued_at_ms: (enqueued * 1000.0).max(0.0) as u64,
        activejob: None,
    };
    if activejob::is_wrapper(&job.class) {
        let wrapped = head
            .wrapped
            .and_then(|w| serde_json::from_str::<Cow<'_, str>>(w.get()).ok());
        match activejob::unwrap_first(wrapped.as_deref(), args.get()) {
            Some((unwrapped, hash)) => apply_activejob(&mut job, wrapped.as_deref(), hash, unwrapped),
            None => {
                let first = serde_json::from_str::<First>(args.get())
                    .ok()
                    .and_then(|first| first.0.map(RawValue::get));
                unwrap_activejob(&mut job, wrapped.as_deref(), first);
            }
        }
    }
    Ok((job, enqueued))
}

/// A bounded stand-in for the payload `raw`, for places that show a job
/// rather than run it (the heartbeat's `work` hash): its class, an
/// ActiveJob wrapper's `wrapped`, jid and queue (each cut to [`MAX_CLASS_LEN`] characters), its enqueue times, its
/// size, and `args` replaced by one string saying how large the payload
/// is. Valid JSON whatever `raw` is; a few hundred bytes at most.
pub fn preview(raw: &str) -> String {
    let cut = |text: Option<Cow<'_, str>>| -> Option<String> { text.map(|t| t.chars().take(MAX_CLASS_LEN).collect()) };
    let note = format!("(args not shown: the payload is {} bytes)", raw.len());
    let mut preview = serde_json::Map::new();
    match serde_json::from_str::<Head>(raw) {
        Ok(head) => {
            preview.insert("class".into(), cut(head.class).map_or(Value::Null, Value::String));
            preview.insert("args".into(), Value::Array(vec![Value::String(note)]));
            preview.insert("jid".into(), cut(head.jid).map_or(Value::Null, Value::String));
            preview.insert("queue".into(), cut(head.queue).map_or(Value::Null, Value::String));
            let wrapped = head
                .wrapped
                .and_then(|w| serde_json::from_str::<Cow<'_, str>>(w.get()).ok());
            if let Some(wrapped) = cut(wrapped) {
                preview.insert("wrapped".into(), Value::String(wrapped));
            }
            for (key, value) in [("enqueued_at", head.enqueued_at), ("created_at", head.created_at)] {
                if let Some(number) = value {
                    preview.insert(key.into(), Value::Number(number));
                }
            }
        }
        Err(_) => {
            preview.insert("class".into(), Value::String("(not a job payload)".into()));
            preview.insert("args".into(), Value::Array(vec![Value::String(note)]));
        }
    }
    preview.insert("payload_bytes".into(), Value::from(raw.len()));
    Value::Object(preview).to_string()
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::redis::payload::RetryPolicy;

    #[test]
    fn previews_are_bounded_jobs_whatever_the_payload() {
        let long = "y".repeat(1 << 20);
        let raw = format!(r#"{{"class":"C","args":["{long}"],"jid":"{long}","queue":"q","enqueued_at":1764500000.5}}"#);
        let preview: Value = serde_json::from_str(&super::preview(&raw)).unwrap();
        assert_eq!(preview["class"], "C");
        assert_eq!(preview["queue"], "q");
        assert_eq!(preview["jid"].as_str().unwrap().len(), MAX_CLASS_LEN);
        assert_eq!(preview["enqueued_at"], 1_764_500_000.5);
        assert_eq!(preview["payload_bytes"], raw.len());
        assert!(preview["args"][0].as_str().unwrap().contains(&raw.len().to_string()));
        let sidekiq8 = r#"{"class":"C","args":[],"created_at":1764500000500,"enqueued_at":"soon"}"#;
        let preview: Value = serde_json::from_str(&super::preview(sidekiq8)).unwrap();
        assert_eq!(preview["created_at"], 1_764_500_000_500_u64);
        assert!(preview.get("enqueued_at").is_none(), "{preview}");
        for junk in ["", "not json", "[1,2]", r#"{"class":5}"#] {
            let preview: Value = serde_json::from_str(&super::preview(junk)).unwrap();
            assert!(preview["args"].is_array(), "{junk:?}: {preview}");
        }
    }

    #[test]
    fn both_timestamp_styles_give_the_enqueue_time() {
        let old =
            Payload::parse(r#"{"class":"X","args":[],"created_at":1764500000.5,"enqueued_at":1764500001.25}"#).unwrap();
        assert_eq!(to_job(&old).enqueued_at_ms, 1_764_500_001_250);
        let new = Payload::parse(r#"{"class":"X","args":[],"created_at":1764500000500}"#).unwrap();
        assert_eq!(to_job(&new).enqueued_at_ms, 1_764_500_000_500);
        assert_eq!(to_job(&new).args, json!([]).to_string());
    }

    /// The reference's Rails 8.0 + Sidekiq 8.1 shape (integer-millisecond
    /// timestamps), under both wrapper names.
    fn activejob_payload(wrapper: &str, arguments: &str) -> String {
        format!(
            r#"{{"retry":true,"queue":"default","class":"{wrapper}","wrapped":"WelcomeJob","args":[{{"job_class":"WelcomeJob","job_id":"8c1e7f52-3a4b-4c5d-9e6f-0a1b2c3d4e5f","provider_job_id":null,"queue_name":"default","priority":null,"arguments":{arguments},"executions":1,"exception_executions":{{}},"locale":"en","timezone":"UTC","enqueued_at":"2026-12-03T10:15:30.123456789Z","scheduled_at":null}}],"jid":"b4a5c6d7e8f90a1b2c3d4e5f","created_at":1764756930123,"enqueued_at":1764756930124}}"#
        )
    }

    #[test]
    fn activejob_wrappers_run_as_the_job_inside() {
        let arguments = r#"[{"_aj_globalid":"gid://myapp/User/42"},{"send_at":{"_aj_serialized":"ActiveJob::Serializers::TimeWithZoneSerializer","value":"2026-12-03T10:20:30.123456789Z","time_zone":"Etc/UTC"},"tag":{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"vip"},"_aj_ruby2_keywords":["send_at","tag"]}]"#;
        for wrapper in activejob::WRAPPERS {
            let raw = activejob_payload(wrapper, arguments);
            let (fast, enqueued) = job_from_raw(&raw).unwrap();
            assert_eq!(fast.class, "WelcomeJob");
            assert_eq!(
                serde_json::from_str::<Value>(&fast.args).unwrap(),
                json!(["gid://myapp/User/42", {"send_at": "2026-12-03T10:20:30.123456789Z", "tag": "vip"}])
            );
            assert_eq!((enqueued * 1000.0).round(), 1_764_756_930_124.0);
            assert_eq!(fast.enqueued_at_ms, 1_764_756_930_124);
            let aj = fast.activejob.as_deref().unwrap();
            assert_eq!(aj.refused, None);
            assert_eq!(aj.context().executions, 1);
            assert_eq!(aj.context().timezone.as_deref(), Some("UTC"));
            assert!(aj.hash.starts_with(r#"{"job_class":"WelcomeJob""#), "{}", aj.hash);
            let full = to_job(&Payload::parse(&raw).unwrap());
            assert_eq!(full.class, fast.class);
            assert_eq!(
                serde_json::from_str::<Value>(&full.args).unwrap(),
                serde_json::from_str::<Value>(&fast.args).unwrap()
            );
            assert_eq!(full.activejob.unwrap().context().job_id, aj.context().job_id);
        }
        // Plain arguments pass as they are.
        let (plain, _) = job_from_raw(&activejob_payload(activejob::WRAPPERS[0], r#"["x", 1]"#)).unwrap();
        assert_eq!(plain.args, r#"["x", 1]"#);
    }

    #[test]
    fn activejob_jobs_that_cannot_run_say_why_and_keep_their_class() {
        let money = activejob_payload(
            activejob::WRAPPERS[1],
            r#"[{"_aj_serialized":"MoneySerializer","cents":5}]"#,
        );
        let (job, _) = job_from_raw(&money).unwrap();
        assert_eq!(job.class, "WelcomeJob");
        let refused = job.activejob.unwrap().refused.clone().unwrap();
        assert!(refused.contains("MoneySerializer"), "{refused}");
        for (raw, class) in [
            (
                r#"{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"W","args":[]}"#,
                "W",
            ),
            (
                r#"{"class":"Sidekiq::ActiveJob::Wrapper","args":[7]}"#,
                "Sidekiq::ActiveJob::Wrapper",
            ),
            (
                r#"{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"W","args":[{"job_class":"W"}]}"#,
                "W",
            ),
        ] {
            let (fast, _) = job_from_raw(raw).unwrap();
            let full = to_job(&Payload::parse(raw).unwrap());
            for job in [fast, full] {
                assert_eq!(job.class, class, "{raw}");
                assert!(job.activejob.unwrap().refused.is_some(), "{raw}");
            }
        }
    }

    #[test]
    fn retry_count_counts_the_runs_before() {
        let p = Payload::parse(r#"{"class":"X","args":[],"retry":3,"retry_count":1}"#).unwrap();
        assert_eq!(p.retry_policy(), RetryPolicy::Max(3));
        assert_eq!(to_job(&p).retry_count, 2);
    }

    #[test]
    fn overlong_class_names_are_refused_by_both_parsers() {
        let raw = format!(r#"{{"class":"{}","args":[]}}"#, "C".repeat(MAX_CLASS_LEN + 1));
        let full = Payload::parse(&raw).unwrap_err();
        assert!(full.contains("more than the 256 allowed"), "{full}");
        assert!(full.len() < 600, "{}", full.len());
        assert_eq!(job_from_raw(&raw).unwrap_err(), full);
        let ok = format!(r#"{{"class":"{}","args":[]}}"#, "C".repeat(MAX_CLASS_LEN));
        assert!(job_from_raw(&ok).is_ok());
    }

    /// Found by `proptests::structured_payloads_decode_or_explain`: a number
    /// out of `f64`'s range passed the fast path (which only skims it) but
    /// not the full parse, so the job ran and then could not be retried.
    #[test]
    fn out_of_range_numbers_are_refused_by_both_parsers() {
        for raw in [
            r#"{"class":"\u000b","args":[],"retry_count":1e400}"#,
            r#"{"class":"X","args":[1e999]}"#,
            r#"{"class":"X","args":[],"custom":{"n":-1e400}}"#,
            r#"{"class":"X","args":[],"\ud800":1}"#,
        ] {
            let full = Payload::parse(raw).unwrap_err();
            assert!(full.contains("not valid JSON"), "{full}");
            assert_eq!(job_from_raw(raw).map(|(job, _)| job.args), Err(full), "{raw}");
        }
    }

    #[test]
    fn the_fast_path_reads_what_the_full_parse_reads() {
        for raw in [
            r#"{"class":"X","args":[1,{"a":[2]}],"jid":"j","queue":"q","retry_count":2,"enqueued_at":1764500001.25,"x":{"y":1}}"#,
            r#"{"class":"X","args":[],"created_at":1764500000500}"#,
            r#"{"args":["a"],"class":"Y","queue":"","retry_count":"weird"}"#,
            // Fields where numbers belong, holding something else.
            r#"{"class":"X","args":[],"enqueued_at":"soon","created_at":1764500000.5}"#,
            r#"{"class":"X","args":[],"enqueued_at":null,"created_at":1764500000500,"retry_count":-1}"#,
            r#"{"class":"X","args":[],"enqueued_at":{"at":[1]},"retry_count":2.0}"#,
            r#"{"class":"X","args":[],"enqueued_at":-5,"retry_count":18446744073709551615}"#,
            // Escaped keys and values: read unescaped, as the full parse does.
            r#"{"cl\u0061ss":"X\"Y","\u0061rgs":[],"jid":"j\u00e9","qu\u0065ue":"l\now","retry_count":1}"#,
        ] {
            let (fast, enqueued) = job_from_raw(raw).unwrap();
            let full = Payload::parse(raw).unwrap();
            let mut expected = to_job(&full);
            if full.str("jid").is_none_or(str::is_empty) || raw.contains("\"jid\":\"\"") {
                expected.jid = fast.jid.clone();
            }
            assert_eq!(fast.class, expected.class);
            assert_eq!(
                serde_json::from_str::<Value>(&fast.args).unwrap(),
                serde_json::from_str::<Value>(&expected.args).unwrap()
            );
            assert_eq!(
                (fast.queue.as_str(), fast.retry_count, fast.enqueued_at_ms),
                (expected.queue.as_str(), expected.retry_count, expected.enqueued_at_ms)
            );
            assert_eq!(
                enqueued,
                full.time("enqueued_at")
                    .or_else(|| full.time("created_at"))
                    .unwrap_or(0.0)
            );
        }
        assert_eq!(job_from_raw(r#"{"class":"X","args":[],"jid":"j"}"#).unwrap().0.jid, "j");
        let escaped = job_from_raw(r#"{"cl\u0061ss":"X\"Y","args":[],"j\u0069d":"j\u00e9","queue":"l\now"}"#)
            .unwrap()
            .0;
        assert_eq!(
            (escaped.class.as_str(), escaped.jid.as_str(), escaped.queue.as_str()),
            ("X\"Y", "jé", "l\now")
        );
        for bad in [
            "nope",
            "[1]",
            r#"{"args":[]}"#,
            r#"{"class":"X","args":"1"}"#,
            r#"{"class":"","args":[]}"#,
        ] {
            assert_eq!(
                job_from_raw(bad).unwrap_err(),
                Payload::parse(bad).unwrap_err(),
                "{bad}"
            );
        }
    }
}
