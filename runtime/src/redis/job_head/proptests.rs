//! Property tests of the payload decoder: whatever bytes a Redis client
//! pushes, the decoder never panics, and it either yields a job or says why
//! not; a well-formed Sidekiq payload round-trips; the dead-set entry for
//! bytes that are not text is valid JSON holding those exact bytes.
//!
//! Case counts are small so the suite stays fast; `PROPTEST_CASES=100000`
//! runs a longer search.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::proptest_config::config;
use crate::redis::payload::{malformed, undecodable};

/// Any JSON value, a few levels deep, with the awkward corners: big and
/// negative numbers, floats, unicode and escapes in strings.
fn any_json() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((".{0,6}", inner), 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// JSON-looking text: the characters JSON is made of, so the parsers get
/// past the first byte more often than with arbitrary strings.
fn jsonish() -> impl Strategy<Value = String> {
    r#"[{}\[\]":,0-9a-z.eE+\- \\]{0,80}"#
}

/// What the fetcher does with the bytes of one list entry: a job, or the
/// dead-set entry explaining why not. Checks the invariants on the way.
fn decode(raw: &[u8]) -> Result<Job, Payload> {
    let text = match std::str::from_utf8(raw) {
        Ok(text) => text,
        Err(_) => {
            let dead = undecodable(raw, "default", 1.0);
            check_dead_entry(&dead, raw);
            return Err(dead);
        }
    };
    match job_from_raw(text) {
        Ok((job, enqueued)) => {
            assert!(!job.class.is_empty() && job.class.len() <= MAX_CLASS_LEN);
            assert!(!job.jid.is_empty() && !job.queue.is_empty());
            assert!(job.args.starts_with('['), "{}", job.args);
            assert!(enqueued >= 0.0 || enqueued.is_finite());
            Ok(job)
        }
        Err(error) => {
            assert!(error.starts_with("job payload"), "{error}");
            // The message quotes at most a preview of the payload.
            assert!(error.chars().count() < 1200, "{} chars", error.chars().count());
            let dead = malformed(text, &error, "default", 1.0);
            let json = dead.to_json();
            let back: Value = serde_json::from_str(&json).expect("the dead entry is JSON");
            assert_eq!(back["error_message"], Value::String(error));
            assert!(back["class"].as_str().is_some_and(|c| !c.is_empty()));
            assert!(back["args"].is_array() && back["jid"].is_string());
            Err(dead)
        }
    }
}

/// The dead-set entry for undecodable bytes is JSON and keeps them exactly.
fn check_dead_entry(dead: &Payload, raw: &[u8]) {
    let back: Value = serde_json::from_str(&dead.to_json()).expect("the dead entry is JSON");
    let hex_text = back["raw_hex"].as_str().expect("raw_hex is a string");
    assert_eq!(hex::decode(hex_text).expect("raw_hex is hex"), raw);
    // A lossy decoding that is a JSON object keeps its own fields.
    assert!(back["class"].as_str().is_some_and(|c| !c.is_empty()));
    assert!(back["args"].is_array() && back["jid"].is_string());
    assert_eq!(back["error_class"], "wasmjobs::MalformedPayload");
    assert!(back["error_message"].as_str().is_some_and(|m| m.contains("not UTF-8")));
}

/// One Sidekiq field of a generated payload.
#[derive(Debug, Clone)]
enum Field {
    Missing,
    Good(String),
    Wrong(Value),
    /// JSON text no `Value` holds: numbers out of `f64`'s range.
    Raw(&'static str),
    Huge(String),
    Twice(String, Value),
}

/// A field whose well-typed JSON text comes from `good`.
fn field(good: impl Strategy<Value = String> + Clone) -> impl Strategy<Value = Field> {
    prop_oneof![
        2 => Just(Field::Missing),
        6 => good.clone().prop_map(Field::Good),
        2 => any_json().prop_map(Field::Wrong),
        1 => prop::sample::select(&["1e400", "-1e400", "[1e999]", "123456789012345678901234567890"][..]).prop_map(Field::Raw),
        1 => (1usize..4).prop_map(|n| Field::Huge(json!("H".repeat(n * 100_000)).to_string())),
        1 => (good, any_json()).prop_map(|(g, other)| Field::Twice(g, other)),
    ]
}

fn quoted(pattern: &'static str) -> impl Strategy<Value = String> + Clone {
    pattern.prop_map(|s| json!(s).to_string())
}

/// Args as JSON text with random spacing, which the decoder must keep.
fn args_text() -> impl Strategy<Value = String> + Clone {
    (prop::collection::vec(any_json(), 0..5), " {0,2}").prop_map(|(items, pad)| {
        let items: Vec<String> = items.iter().map(Value::to_string).collect();
        format!("[{pad}{}{pad}]", items.join(&format!(",{pad}")))
    })
}

fn timestamp() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        (0.0f64..2e9).prop_map(|s| json!(s).to_string()),
        (0u64..4_000_000_000_000).prop_map(|ms| ms.to_string()),
    ]
}

/// A payload's fields, each well-typed, wrong-typed, huge, missing or twice.
fn fields() -> impl Strategy<Value = Vec<(&'static str, Field)>> {
    (
        field(quoted(".{1,40}")),
        field(args_text()),
        field(quoted("[0-9a-f]{1,24}")),
        field(quoted("[a-z_]{1,12}")),
        field(prop_oneof![
            Just("true".to_owned()),
            Just("false".to_owned()),
            (0u64..30).prop_map(|n| n.to_string())
        ]),
        field((0u64..30).prop_map(|n| n.to_string())),
        (field(timestamp()), field(timestamp())),
        (field(quoted(".{0,40}")), field(quoted("[A-Za-z:]{1,20}"))),
        Just(()),
    )
        .prop_map(
            |(class, args, jid, queue, retry, retry_count, (enq, created), (msg, err_class), ())| {
                vec![
                    ("class", class),
                    ("args", args),
                    ("jid", jid),
                    ("queue", queue),
                    ("retry", retry),
                    ("retry_count", retry_count),
                    ("enqueued_at", enq),
                    ("created_at", created),
                    ("error_message", msg),
                    ("error_class", err_class),
                ]
            },
        )
        .prop_shuffle()
}

/// The payload text for `fields`, duplicates and all.
fn payload_text(fields: &[(&'static str, Field)]) -> String {
    let mut members = Vec::new();
    for (key, value) in fields {
        match value {
            Field::Missing => {}
            Field::Good(text) | Field::Huge(text) => members.push(format!("\"{key}\":{text}")),
            Field::Raw(text) => members.push(format!("\"{key}\":{text}")),
            Field::Wrong(value) => members.push(format!("\"{key}\":{value}")),
            Field::Twice(text, other) => {
                members.push(format!("\"{key}\":{other}"));
                members.push(format!("\"{key}\":{text}"));
            }
        }
    }
    format!("{{{}}}", members.join(","))
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn arbitrary_bytes_decode_or_explain(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&raw);
    }

    #[test]
    fn arbitrary_text_decodes_or_explains(raw in prop_oneof![any::<String>(), jsonish()]) {
        let _ = decode(raw.as_bytes());
    }

    #[test]
    fn any_json_value_decodes_or_explains(value in any_json()) {
        let _ = decode(value.to_string().as_bytes());
    }

    /// Both parsers (the fast path that starts jobs, and the full parse
    /// that writes failures back) agree on what they accept and on why
    /// they refuse.
    #[test]
    fn structured_payloads_decode_or_explain(fields in fields()) {
        let text = payload_text(&fields);
        let fast = decode(text.as_bytes());
        let full = Payload::parse(&text);
        match (&fast, &full) {
            (Ok(job), Ok(payload)) => {
                prop_assert_eq!(&job.class, payload.class());
                prop_assert_eq!(
                    serde_json::from_str::<Value>(&job.args).ok(),
                    payload.get("args").cloned()
                );
            }
            (Err(_), Err(_)) => prop_assert_eq!(job_from_raw(&text).err(), full.err()),
            _ => prop_assert!(false, "fast path {:?} but full parse {:?}", fast.is_ok(), full.is_ok()),
        }
    }

    /// A well-formed payload gives back its class, jid and the exact bytes
    /// of its args.
    #[test]
    fn well_formed_payloads_round_trip(
        class in "[A-Za-z0-9_:]{1,40}|.{1,40}",
        args in args_text(),
        jid in "[0-9a-f]{24}",
        queue in "[a-z_]{1,12}",
        retry_count in prop::option::of(0u64..100),
        created in 1.0f64..2e9,
    ) {
        let mut text = format!(
            r#"{{"class":{},"args":{args},"jid":"{jid}","queue":"{queue}","created_at":{}"#,
            json!(class),
            json!(created)
        );
        if let Some(count) = retry_count {
            text.push_str(&format!(r#","retry_count":{count}"#));
        }
        text.push('}');
        let (job, enqueued) = job_from_raw(&text).expect("a well-formed payload decodes");
        prop_assert_eq!(&job.class, &class);
        prop_assert_eq!(&job.jid, &jid);
        prop_assert_eq!(&job.queue, &queue);
        prop_assert_eq!(&job.args, &args);
        prop_assert_eq!(enqueued, created);
        prop_assert_eq!(job.retry_count, retry_count.map_or(0, |c| c as u32 + 1));
        let full = Payload::parse(&text).expect("the full parse accepts it too");
        prop_assert_eq!(full.class(), class.as_str());
        prop_assert_eq!(full.jid(), jid.as_str());
    }

    /// A valid payload with one byte flipped, or cut short, never panics.
    #[test]
    fn damaged_payloads_decode_or_explain(
        fields in fields(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let mut raw = payload_text(&fields).into_bytes();
        let at = at.index(raw.len());
        if cut {
            raw.truncate(at);
        } else {
            raw[at] = byte;
        }
        let _ = decode(&raw);
    }

    #[test]
    fn undecodable_bytes_are_kept_as_hex(raw in prop::collection::vec(any::<u8>(), 0..512)) {
        check_dead_entry(&undecodable(&raw, "q", 1.0), &raw);
    }
}
