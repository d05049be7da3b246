//! ActiveJob on Sidekiq: the wrapper payload Rails' adapter pushes, and
//! the job inside it.
//!
//! A Rails app's `WelcomeJob.perform_later(user, at: t)` does not push a
//! `WelcomeJob`: it pushes a wrapper class
//! (`ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper` up to Rails 8.0
//! and Sidekiq 7, `Sidekiq::ActiveJob::Wrapper` from Sidekiq 8) whose
//! `wrapped` names the job's class and whose `args[0]` is ActiveJob's hash
//! (`job_class`, `job_id`, `arguments`, `executions`, `locale`, ...). Here:
//!
//! - [`is_wrapper`] and [`job_class`]: the class a person reads and a
//!   plugin is chosen by (as Sidekiq Web's `display_class` does);
//! - [`unwrap`]: the job inside, its arguments decoded
//!   ([`decode_arguments`]) into plain JSON a guest in any language reads: `_aj_*` markers removed, Rails' built-in serializers
//!   (`_aj_serialized`) mapped to JSON values, a GlobalID as its string.
//!   An argument serialized by an application's own serializer (Ruby code)
//!   cannot be decoded: the arguments are then an error naming it;
//! - [`context`]: the rest of the ActiveJob hash, read only when a job
//!   asks for it (most never do: reading it for every job cost more than
//!   the unwrapping itself).
//!
//! The payload itself is never rewritten: retries and the dead set keep
//! the wrapper, `wrapped` and the ActiveJob hash as Ruby wrote them, so
//! Sidekiq's Web UI and a Ruby process still read the job.
//!
//! Everything here reads bytes any Redis client wrote: a field of the
//! wrong type is treated as absent, never as a reason to panic.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::fields::MAX_CLASS_LEN;

/// The wrapper classes Rails' and Sidekiq's ActiveJob adapters push.
pub const WRAPPERS: [&str; 2] = [
    "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
    "Sidekiq::ActiveJob::Wrapper",
];

/// Whether `class` is an ActiveJob wrapper.
pub fn is_wrapper(class: &str) -> bool {
    WRAPPERS.contains(&class)
}

/// The class a person reads for a payload of `class`: for a wrapper, the
/// job's own (`wrapped`, else `args[0].job_class`), else `class` itself.
pub fn job_class<'a>(class: &'a str, wrapped: Option<&'a Value>, args: Option<&'a Value>) -> &'a str {
    if !is_wrapper(class) {
        return class;
    }
    let wrapped = wrapped.and_then(Value::as_str).filter(|w| !w.is_empty());
    let inner = || {
        args.and_then(|a| a.get(0))
            .and_then(|h| h.get("job_class"))
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
    };
    wrapped.or_else(inner).unwrap_or(class)
}

/// ActiveJob's fields of one job, besides its class and arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Context {
    /// ActiveJob's id (a UUID), not the Sidekiq jid.
    pub job_id: String,
    /// `job_class`.
    pub job_class: String,
    /// `executions`: runs before this one that Ruby's `retry_on` counted.
    pub executions: u32,
    /// `priority`, if set.
    pub priority: Option<i64>,
    /// `locale`, if set.
    pub locale: Option<String>,
    /// `timezone`, if set.
    pub timezone: Option<String>,
    /// `enqueued_at` (ISO 8601), if set.
    pub enqueued_at: Option<String>,
    /// `scheduled_at` (ISO 8601), if set.
    pub scheduled_at: Option<String>,
}

/// The job inside a wrapper payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwrapped {
    /// The job's own class.
    pub class: String,
    /// The arguments decoded into a plain JSON array (text), or why they
    /// cannot be (an argument an application's own serializer wrote).
    pub arguments: Result<String, String>,
}

/// What [`unwrap`] reads of the ActiveJob hash.
#[derive(Deserialize)]
struct Inside<'a> {
    #[serde(borrow, default)]
    job_class: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// The ActiveJob hash's context fields, borrowed; each kept raw so that a
/// field of an unexpected type reads as absent instead of failing the rest.
#[derive(Deserialize)]
struct Hash<'a> {
    #[serde(borrow, default)]
    job_class: Option<&'a RawValue>,
    #[serde(borrow, default)]
    job_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    executions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    priority: Option<&'a RawValue>,
    #[serde(borrow, default)]
    locale: Option<&'a RawValue>,
    #[serde(borrow, default)]
    timezone: Option<&'a RawValue>,
    #[serde(borrow, default)]
    enqueued_at: Option<&'a RawValue>,
    #[serde(borrow, default)]
    scheduled_at: Option<&'a RawValue>,
}

fn text(raw: Option<&RawValue>) -> Option<String> {
    raw.and_then(|r| serde_json::from_str::<Cow<'_, str>>(r.get()).ok())
        .map(Cow::into_owned)
}

fn integer(raw: Option<&RawValue>) -> Option<i64> {
    raw.and_then(|r| serde_json::from_str::<i64>(r.get()).ok())
}

/// The job in a wrapper payload whose top-level `wrapped` is `wrapped` and
/// whose `args[0]` is the JSON text `hash`. Fails (with the reason, for
/// the dead set) when `hash` is not an ActiveJob hash: not an object, no
/// `arguments` array, or no class named anywhere.
pub fn unwrap(wrapped: Option<&str>, hash: &str) -> Result<Unwrapped, String> {
    let not_a_hash = || "an ActiveJob wrapper's args[0] is not an ActiveJob hash (a JSON object)".to_owned();
    // (A derived `Deserialize` would also read a struct from an array.)
    if !hash.trim_start().starts_with('{') {
        return Err(not_a_hash());
    }
    let fields: Inside<'_> = serde_json::from_str(hash).map_err(|_| not_a_hash())?;
    unwrap_fields(wrapped, fields)
}

/// [`unwrap`] of the first element of `args` (the JSON text of a wrapper's
/// `args` array), in one pass over it: the job, and the text of the
/// ActiveJob hash. `None` when `args[0]` is not a JSON object; a caller
/// then takes the element out itself and calls [`unwrap`], which says why.
pub fn unwrap_first<'a>(wrapped: Option<&str>, args: &'a str) -> Option<(Result<Unwrapped, String>, &'a str)> {
    let inner = args.trim_start().strip_prefix('[')?;
    let start = inner.len() - inner.trim_start().len();
    if !inner[start..].starts_with('{') {
        return None;
    }
    let mut stream = serde_json::Deserializer::from_str(inner).into_iter::<Inside<'a>>();
    let fields = stream.next()?.ok()?;
    let hash = inner.get(start..stream.byte_offset())?;
    Some((unwrap_fields(wrapped, fields), hash))
}

fn unwrap_fields(wrapped: Option<&str>, fields: Inside<'_>) -> Result<Unwrapped, String> {
    let class = match wrapped.filter(|w| !w.is_empty()) {
        Some(wrapped) => wrapped.to_owned(),
        None => match text(fields.job_class).filter(|c| !c.is_empty()) {
            Some(job_class) => job_class,
            None => return Err("an ActiveJob wrapper names no class (neither \"wrapped\" nor \"job_class\")".into()),
        },
    };
    if class.len() > MAX_CLASS_LEN {
        return Err(format!(
            "an ActiveJob job's class is {} bytes long, more than the {MAX_CLASS_LEN} allowed",
            class.len()
        ));
    }
    let arguments = match fields.arguments {
        Some(raw) if raw.get().starts_with('[') => raw.get(),
        _ => return Err("an ActiveJob hash has no \"arguments\" array".into()),
    };
    let arguments = if arguments.contains("\"_aj_") {
        serde_json::from_str::<Value>(arguments)
            .map_err(|e| format!("ActiveJob arguments are not valid JSON: {e}"))
            .and_then(decode_arguments)
            .map(|decoded| decoded.to_string())
    } else {
        // Nothing serialized, no markers: the text is already plain JSON.
        Ok(arguments.to_owned())
    };
    Ok(Unwrapped { class, arguments })
}

/// The context in the ActiveJob hash `hash` (JSON text); what it lacks, or
/// holds in another type, is left empty.
pub fn context(hash: &str) -> Context {
    if !hash.trim_start().starts_with('{') {
        return Context::default();
    }
    let Ok(fields) = serde_json::from_str::<Hash<'_>>(hash) else {
        return Context::default();
    };
    Context {
        job_id: text(fields.job_id).unwrap_or_default(),
        job_class: text(fields.job_class).unwrap_or_default(),
        executions: integer(fields.executions)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        priority: integer(fields.priority),
        locale: text(fields.locale),
        timezone: text(fields.timezone),
        enqueued_at: text(fields.enqueued_at),
        scheduled_at: text(fields.scheduled_at),
    }
}

/// The keys ActiveJob adds to a serialized hash to restore it in Ruby.
const MARKERS: [&str; 3] = [
    "_aj_symbol_keys",
    "_aj_ruby2_keywords",
    "_aj_hash_with_indifferent_access",
];

const SERIALIZED: &str = "_aj_serialized";
const GLOBAL_ID: &str = "_aj_globalid";

/// ActiveJob `arguments` as plain JSON: markers removed, the built-in
/// serializers' objects mapped (Symbol, Module → their name; Time,
/// DateTime, TimeWithZone, Date → their ISO 8601 text; Duration → seconds;
/// BigDecimal → its text; Range → `{begin, end, exclude_end}`), a GlobalID
/// (`{"_aj_globalid": "gid://…"}`) as its string. Fails naming the
/// serializer of an argument no built-in serializer wrote.
pub fn decode_arguments(arguments: Value) -> Result<Value, String> {
    decode(arguments)
}

fn decode(value: Value) -> Result<Value, String> {
    match value {
        Value::Array(items) => items
            .into_iter()
            .map(decode)
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Value::Object(map) => decode_object(map),
        other => Ok(other),
    }
}

fn decode_object(mut map: Map<String, Value>) -> Result<Value, String> {
    if map.len() == 1
        && let Some(Value::String(gid)) = map.get(GLOBAL_ID)
    {
        return Ok(Value::String(gid.clone()));
    }
    if let Some(serializer) = map.get(SERIALIZED) {
        let name = serializer.as_str().unwrap_or_default().to_owned();
        return deserialize(&name, map);
    }
    for marker in MARKERS {
        map.remove(marker);
    }
    map.into_iter()
        .map(|(key, value)| decode(value).map(|value| (key, value)))
        .collect::<Result<Map<_, _>, _>>()
        .map(Value::Object)
}

/// The JSON value for an object Rails' serializer `name` wrote.
fn deserialize(name: &str, mut map: Map<String, Value>) -> Result<Value, String> {
    let short = name.strip_prefix("ActiveJob::Serializers::").unwrap_or("");
    let value = |map: &mut Map<String, Value>| {
        map.remove("value")
            .ok_or_else(|| format!("an ActiveJob argument serialized by {name} has no \"value\""))
    };
    match short {
        "SymbolSerializer"
        | "ModuleSerializer"
        | "TimeSerializer"
        | "DateTimeSerializer"
        | "DateSerializer"
        | "TimeWithZoneSerializer"
        | "BigDecimalSerializer"
        | "DurationSerializer" => value(&mut map),
        "RangeSerializer" => {
            let mut range = Map::new();
            for key in ["begin", "end"] {
                range.insert(key.into(), decode(map.remove(key).unwrap_or(Value::Null))?);
            }
            let exclude = map.remove("exclude_end").and_then(|e| e.as_bool()).unwrap_or(false);
            range.insert("exclude_end".into(), Value::Bool(exclude));
            Ok(Value::Object(range))
        }
        _ => Err(format!(
            "an ActiveJob argument was serialized by {}, which only Ruby can read (an application's own \
             serializer): the job cannot run as a plugin; pass plain values, or decode it in the plugin \
             from the raw ActiveJob hash",
            crate::fields::preview(if name.is_empty() { "(no serializer name)" } else { name })
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `EchoJob.perform_later(...)` as Debian 12's Rails 6.1 and Sidekiq
    /// 6.4 wrote it (captured from a real enqueue).
    const RAILS_61: &str = r#"{"job_class":"EchoJob","job_id":"c37401c3-cd5b-4735-89cb-35cf36006bb4","provider_job_id":null,"queue_name":"wasm","priority":null,"arguments":["x",1,{"_aj_globalid":"gid://myapp/User/42"},{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"sym"},{"a":1,"b":2,"_aj_symbol_keys":["a"]},{"_aj_serialized":"ActiveJob::Serializers::TimeSerializer","value":"2026-12-03T10:20:30.000000000Z"},{"_aj_serialized":"ActiveJob::Serializers::DurationSerializer","value":300,"parts":[[{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"minutes"},5]]},"0.15e1",{"_aj_serialized":"ActiveJob::Serializers::DateSerializer","value":"2026-01-02"},{"_aj_serialized":"ActiveJob::Serializers::DateTimeSerializer","value":"2026-01-02T03:04:05.000000000+00:00"},{"_aj_serialized":"ActiveJob::Serializers::TimeWithZoneSerializer","value":"2026-12-04T06:25:02.182174774+01:00"},{"send_at":{"_aj_serialized":"ActiveJob::Serializers::TimeSerializer","value":"2026-01-01T00:00:00.000000000Z"},"tag":{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"vip"},"_aj_ruby2_keywords":["send_at","tag"]}],"executions":0,"exception_executions":{},"locale":"en","timezone":null,"enqueued_at":"2026-12-04T05:25:02Z"}"#;

    #[test]
    fn rails_61_arguments_decode_to_plain_json() {
        let job = unwrap(Some("EchoJob"), RAILS_61).unwrap();
        assert_eq!(job.class, "EchoJob");
        let args: Value = serde_json::from_str(&job.arguments.unwrap()).unwrap();
        assert_eq!(
            args,
            json!([
                "x",
                1,
                "gid://myapp/User/42",
                "sym",
                {"a": 1, "b": 2},
                "2026-12-03T10:20:30.000000000Z",
                300,
                "0.15e1",
                "2026-01-02",
                "2026-01-02T03:04:05.000000000+00:00",
                "2026-12-04T06:25:02.182174774+01:00",
                {"send_at": "2026-01-01T00:00:00.000000000Z", "tag": "vip"}
            ])
        );
        let context = context(RAILS_61);
        assert_eq!(context.job_id, "c37401c3-cd5b-4735-89cb-35cf36006bb4");
        assert_eq!(context.job_class, "EchoJob");
        assert_eq!(context.executions, 0);
        assert_eq!((context.priority, context.timezone), (None, None));
        assert_eq!(context.locale.as_deref(), Some("en"));
        assert_eq!(context.enqueued_at.as_deref(), Some("2026-12-04T05:25:02Z"));
    }

    #[test]
    fn rails_8_serializers_decode() {
        let hash = json!({
            "job_class": "WelcomeJob", "job_id": "8c1e", "priority": 10, "executions": 2,
            "timezone": "UTC", "scheduled_at": "2026-12-03T10:20:30.123456789Z",
            "arguments": [
                {"_aj_serialized": "ActiveJob::Serializers::BigDecimalSerializer", "value": "1.5"},
                {"_aj_serialized": "ActiveJob::Serializers::RangeSerializer",
                 "begin": 1, "end": {"_aj_serialized": "ActiveJob::Serializers::SymbolSerializer", "value": "z"},
                 "exclude_end": true},
                {"_aj_serialized": "ActiveJob::Serializers::ModuleSerializer", "value": "Admin::User"},
                {"_aj_serialized": "ActiveJob::Serializers::TimeWithZoneSerializer",
                 "value": "2026-12-03T10:20:30.123456789Z", "time_zone": "Etc/UTC"},
                {"k": [{"_aj_globalid": "gid://a/B/1"}], "_aj_hash_with_indifferent_access": true},
                {"_aj_globalid": "gid://a/B/2", "other": 1}
            ]
        });
        let job = unwrap(None, &hash.to_string()).unwrap();
        assert_eq!(job.class, "WelcomeJob");
        let args: Value = serde_json::from_str(&job.arguments.unwrap()).unwrap();
        assert_eq!(
            args,
            json!([
                "1.5",
                {"begin": 1, "end": "z", "exclude_end": true},
                "Admin::User",
                "2026-12-03T10:20:30.123456789Z",
                {"k": ["gid://a/B/1"]},
                // Not a GlobalID reference (a second key): a hash like any other.
                {"_aj_globalid": "gid://a/B/2", "other": 1}
            ])
        );
        let context = context(&hash.to_string());
        assert_eq!((context.priority, context.executions), (Some(10), 2));
        assert_eq!(context.scheduled_at.as_deref(), Some("2026-12-03T10:20:30.123456789Z"));
    }

    #[test]
    fn an_unknown_serializer_is_named() {
        let hash =
            json!({"job_class": "J", "arguments": [1, {"x": {"_aj_serialized": "MoneySerializer", "cents": 5}}]});
        let error = unwrap(Some("J"), &hash.to_string()).unwrap().arguments.unwrap_err();
        assert!(error.contains("MoneySerializer"), "{error}");
        let hash = json!({"job_class": "J", "arguments": [{"_aj_serialized": 7}]});
        let error = unwrap(Some("J"), &hash.to_string()).unwrap().arguments.unwrap_err();
        assert!(error.contains("no serializer name"), "{error}");
        let hash =
            json!({"job_class": "J", "arguments": [{"_aj_serialized": "ActiveJob::Serializers::TimeSerializer"}]});
        let error = unwrap(Some("J"), &hash.to_string()).unwrap().arguments.unwrap_err();
        assert!(error.contains("no \"value\""), "{error}");
    }

    #[test]
    fn hashes_that_are_not_activejob_are_refused_with_a_reason() {
        for (wrapped, hash) in [
            (Some("J"), "[1]"),
            (None, r#"["J", [1]]"#),
            (Some("J"), "\"text\""),
            (Some("J"), r#"{"job_class":"J"}"#),
            (Some("J"), r#"{"arguments":"1"}"#),
            (None, r#"{"arguments":[]}"#),
            (None, r#"{"job_class":5,"arguments":[]}"#),
        ] {
            assert!(unwrap(wrapped, hash).is_err(), "{hash}");
        }
        let long = "C".repeat(MAX_CLASS_LEN + 1);
        assert!(
            unwrap(Some(&long), r#"{"arguments":[]}"#)
                .unwrap_err()
                .contains("more than")
        );
        // Fields of the wrong type read as absent.
        let odd = context(r#"{"arguments":[],"executions":"2","priority":[],"locale":1}"#);
        assert_eq!((odd.executions, odd.priority, odd.locale), (0, None, None));
        assert_eq!(context("[1]"), Context::default());
        assert_eq!(context(r#"["J", "id", 3]"#), Context::default());
    }

    #[test]
    fn the_first_argument_unwraps_in_place_as_it_does_alone() {
        let hash = r#"{"job_class":"J","arguments":[1,{"_aj_symbol_keys":[],"a":2}],"x":"]"}"#;
        for args in [
            format!("[{hash}]"),
            format!(" [ \n{hash} , 7, \"x\"]"),
            format!("[{hash},{hash}]"),
        ] {
            let (unwrapped, text) = unwrap_first(None, &args).unwrap();
            assert_eq!(text, hash, "{args}");
            assert_eq!(unwrapped, unwrap(None, hash));
            assert_eq!(unwrapped.unwrap().arguments.unwrap(), r#"[1,{"a":2}]"#);
        }
        // Not an object first: left to the caller, which says why.
        for args in ["[]", "[1]", "[\"x\"]", "[[1]]", "{}", "", "[{\"job_class\":"] {
            assert!(unwrap_first(None, args).is_none(), "{args}");
        }
        // An object that is not an ActiveJob hash: the reason, as alone.
        let (refused, text) = unwrap_first(Some("J"), r#"[{"job_class":"J"}]"#).unwrap();
        assert_eq!(text, r#"{"job_class":"J"}"#);
        assert_eq!(refused, unwrap(Some("J"), text));
        assert!(refused.is_err());
    }

    #[test]
    fn the_class_a_person_reads() {
        let args = json!([{"job_class": "Inner"}]);
        let wrapper = WRAPPERS[1];
        assert_eq!(job_class(wrapper, Some(&json!("Outer")), Some(&args)), "Outer");
        assert_eq!(job_class(wrapper, Some(&json!("")), Some(&args)), "Inner");
        assert_eq!(job_class(wrapper, None, Some(&json!([1]))), wrapper);
        assert_eq!(job_class("Plain", Some(&json!("Outer")), Some(&args)), "Plain");
    }
}
