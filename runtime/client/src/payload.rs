//! The Sidekiq job payload: a JSON object in a Redis list or sorted set.
//!
//! Parsed into an ordered map so that every key a client put there — ours,
//! Sidekiq's, or the client's own — survives a retry or a requeue untouched
//! (only the fields we own change). Timestamps come in two styles: Sidekiq ≤ 7
//! writes epoch seconds as floats, Sidekiq 8 epoch milliseconds as integers;
//! both are read, and a payload keeps its own style when we write times into
//! it.
//!
//! Everything here reads bytes a Redis client wrote. The worker's fast path
//! (the few fields a job needs to start, read without building the map)
//! lives with the runner (`wasmjobs::redis::job_head`), whose property tests
//! check that it and [`Payload::parse`] agree and that a dead-set entry for
//! any bytes is valid JSON that keeps them.

use serde_json::{Map, Value, json};

use crate::fields::{DEFAULT_QUEUE, new_jid, preview};

pub use crate::fields::MAX_CLASS_LEN;

/// Numbers at or above this are milliseconds; below, seconds. (Seconds
/// reach 1e11 in the year 5138; milliseconds passed 1e11 in 1973.)
const MILLIS_THRESHOLD: f64 = 1e11;

/// How a payload writes its timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeStyle {
    /// Epoch seconds as a float (Sidekiq ≤ 7).
    FloatSeconds,
    /// Epoch milliseconds as an integer (Sidekiq 8).
    IntMillis,
}

/// How many times a job may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// `retry: true` or absent: the default number of retries.
    Default,
    /// `retry: false`: never retried, and not sent to the dead set either.
    Never,
    /// `retry: N`: at most N retries (0 means straight to the dead set).
    Max(u64),
}

/// A parsed job payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    map: Map<String, Value>,
}

impl Payload {
    /// Parses and validates `raw`. The error says what is wrong, for the
    /// dead set's `error_message`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(raw).map_err(|e| format!("job payload is not valid JSON ({e}): {}", preview(raw)))?;
        let Value::Object(map) = value else {
            return Err(format!("job payload is not a JSON object: {}", preview(raw)));
        };
        let mut payload = Payload { map };
        match payload.map.get("class") {
            Some(Value::String(class)) if class.len() > MAX_CLASS_LEN => {
                return Err(format!(
                    "job payload's \"class\" is {} bytes long, more than the {MAX_CLASS_LEN} allowed: {}",
                    class.len(),
                    preview(class)
                ));
            }
            Some(Value::String(class)) if !class.is_empty() => {}
            Some(_) => {
                return Err(format!(
                    "job payload's \"class\" is not a non-empty string: {}",
                    preview(raw)
                ));
            }
            None => return Err(format!("job payload has no \"class\": {}", preview(raw))),
        }
        match payload.map.get("args") {
            Some(Value::Array(_)) => {}
            Some(_) => return Err(format!("job payload's \"args\" is not a JSON array: {}", preview(raw))),
            None => return Err(format!("job payload has no \"args\": {}", preview(raw))),
        }
        if !matches!(payload.map.get("jid"), Some(Value::String(jid)) if !jid.is_empty()) {
            payload.map.insert("jid".into(), Value::String(new_jid()));
        }
        if !matches!(payload.map.get("queue"), Some(Value::String(q)) if !q.is_empty()) {
            payload.map.insert("queue".into(), Value::String(DEFAULT_QUEUE.into()));
        }
        Ok(payload)
    }

    /// A new payload as Sidekiq's client builds one: class, args, queue,
    /// fresh jid, `retry: true`, `created_at` (float seconds, which every
    /// Sidekiq version reads).
    pub fn new(class: &str, args: Vec<Value>, queue: &str, now: f64) -> Self {
        let mut map = Map::new();
        map.insert("retry".into(), Value::Bool(true));
        map.insert("queue".into(), Value::String(queue.to_owned()));
        map.insert("class".into(), Value::String(class.to_owned()));
        map.insert("args".into(), Value::Array(args));
        map.insert("jid".into(), Value::String(new_jid()));
        map.insert("created_at".into(), json!(now));
        Payload { map }
    }

    /// The job id.
    pub fn jid(&self) -> &str {
        self.str("jid").unwrap_or_default()
    }

    /// The job class.
    pub fn class(&self) -> &str {
        self.str("class").unwrap_or_default()
    }

    /// The class a person reads: for an ActiveJob wrapper, the job's own
    /// (`wrapped`, else `args[0].job_class`), as Sidekiq Web shows it.
    pub fn job_class(&self) -> &str {
        crate::activejob::job_class(self.class(), self.map.get("wrapped"), self.map.get("args"))
    }

    /// The queue the job belongs to.
    pub fn queue(&self) -> &str {
        self.str("queue").unwrap_or(DEFAULT_QUEUE)
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.map.get(key).and_then(Value::as_str)
    }

    /// Any field.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    /// Sets a field (keeping its position if it exists).
    pub fn set(&mut self, key: &str, value: Value) {
        self.map.insert(key.to_owned(), value);
    }

    /// Sidekiq's `retry_count`: absent before the first failure, 0 after it.
    pub fn retry_count(&self) -> Option<u64> {
        self.map.get("retry_count").and_then(Value::as_u64)
    }

    /// The job's `retry` option.
    pub fn retry_policy(&self) -> RetryPolicy {
        match self.map.get("retry") {
            Some(Value::Bool(false)) => RetryPolicy::Never,
            Some(Value::Number(n)) => n.as_u64().map_or(RetryPolicy::Default, RetryPolicy::Max),
            _ => RetryPolicy::Default,
        }
    }

    /// Reads a timestamp field in either style, as epoch seconds.
    pub fn time(&self, key: &str) -> Option<f64> {
        Some(epoch_secs(self.map.get(key)?.as_f64()?))
    }

    /// Removes a field.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.map.shift_remove(key)
    }

    /// The style this payload's timestamps are written in.
    pub fn time_style(&self) -> TimeStyle {
        for key in ["created_at", "enqueued_at"] {
            if let Some(Value::Number(n)) = self.map.get(key) {
                if n.is_u64() && n.as_f64().is_some_and(|v| v >= MILLIS_THRESHOLD) {
                    return TimeStyle::IntMillis;
                }
                return TimeStyle::FloatSeconds;
            }
        }
        TimeStyle::FloatSeconds
    }

    /// Writes a timestamp (epoch seconds) in this payload's own style.
    pub fn set_time(&mut self, key: &str, epoch_secs: f64) {
        let value = match self.time_style() {
            TimeStyle::FloatSeconds => json!(epoch_secs),
            TimeStyle::IntMillis => json!((epoch_secs * 1000.0).round() as u64),
        };
        self.map.insert(key.to_owned(), value);
    }

    /// Its fields, as a JSON object.
    pub fn into_map(self) -> Map<String, Value> {
        self.map
    }

    /// The payload as JSON text.
    pub fn to_json(&self) -> String {
        // Serialising a map of JSON values cannot fail.
        serde_json::to_string(&self.map).unwrap_or_default()
    }
}

/// Epoch seconds from a Sidekiq timestamp in either style (float seconds,
/// or Sidekiq 8's integer milliseconds).
pub fn epoch_secs(value: f64) -> f64 {
    if value >= MILLIS_THRESHOLD {
        value / 1000.0
    } else {
        value
    }
}

/// A payload for the dead set describing one that could not be parsed.
///
/// A valid JSON object keeps all its fields (plus the error fields); anything
/// else is wrapped, with the original text in `malformed_payload`, so it
/// never vanishes and can be inspected in the Web UI.
pub fn malformed(raw: &str, error: &str, queue: &str, now: f64) -> Payload {
    let mut map = match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => map,
        _ => {
            let mut map = Map::new();
            map.insert("class".into(), Value::String("wasmjobs::MalformedPayload".into()));
            map.insert("args".into(), Value::Array(Vec::new()));
            map.insert("malformed_payload".into(), Value::String(raw.to_owned()));
            map
        }
    };
    if !matches!(map.get("jid"), Some(Value::String(_))) {
        map.insert("jid".into(), Value::String(new_jid()));
    }
    if !matches!(map.get("queue"), Some(Value::String(_))) {
        map.insert("queue".into(), Value::String(queue.to_owned()));
    }
    if !matches!(map.get("class"), Some(Value::String(c)) if !c.is_empty()) {
        map.insert("class".into(), Value::String("wasmjobs::MalformedPayload".into()));
    }
    if !matches!(map.get("args"), Some(Value::Array(_))) {
        map.insert("args".into(), Value::Array(Vec::new()));
    }
    let mut payload = Payload { map };
    payload.set("error_class", Value::String("wasmjobs::MalformedPayload".into()));
    payload.set("error_message", Value::String(error.to_owned()));
    payload.set_time("failed_at", now);
    payload
}

/// A payload for the dead set describing one whose bytes are not UTF-8
/// text (so not JSON either): [`malformed`]'s wrapper around the lossy
/// decoding (invalid bytes as U+FFFD, which the Web UI can show), with the
/// exact bytes kept as lowercase hex in `raw_hex` so nothing is lost.
pub fn undecodable(raw: &[u8], queue: &str, now: f64) -> Payload {
    let error = match std::str::from_utf8(raw) {
        Ok(_) => "job payload is not UTF-8 text".to_owned(),
        Err(e) => format!(
            "job payload is not UTF-8 text (invalid byte at offset {}), so not JSON either; its bytes are in raw_hex",
            e.valid_up_to()
        ),
    };
    let text = String::from_utf8_lossy(raw);
    let mut payload = malformed(&text, &error, queue, now);
    payload.set("malformed_payload", Value::String(text.into_owned()));
    payload.set("raw_hex", Value::String(hex::encode(raw)));
    payload
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_order_survive_a_round_trip() {
        let raw = r#"{"class":"X","args":[1,{"a":2}],"jid":"abc","queue":"q","custom":{"trace":"t-1"},"created_at":1764500000.123456}"#;
        let mut p = Payload::parse(raw).unwrap();
        assert_eq!(p.to_json(), raw);
        p.set("retry_count", json!(0));
        let again = p.to_json();
        assert!(again.starts_with(r#"{"class":"X","args":[1,{"a":2}],"jid":"abc","queue":"q","custom":{"trace":"t-1"},"created_at":1764500000.123456,"#));
    }

    #[test]
    fn both_timestamp_styles_are_read_and_kept() {
        let old =
            Payload::parse(r#"{"class":"X","args":[],"created_at":1764500000.5,"enqueued_at":1764500001.25}"#).unwrap();
        assert_eq!(old.time("enqueued_at"), Some(1_764_500_001.25));
        assert_eq!(old.time_style(), TimeStyle::FloatSeconds);

        let mut new =
            Payload::parse(r#"{"class":"X","args":[],"created_at":1764500000500,"enqueued_at":1764500001250}"#)
                .unwrap();
        assert_eq!(new.time("enqueued_at"), Some(1_764_500_001.25));
        assert_eq!(new.time_style(), TimeStyle::IntMillis);
        new.set_time("failed_at", 1_764_500_002.5);
        assert_eq!(new.get("failed_at"), Some(&json!(1_764_500_002_500u64)));
    }

    #[test]
    fn malformed_payloads_are_explained() {
        assert!(Payload::parse("not json").unwrap_err().contains("not valid JSON"));
        assert!(Payload::parse("[1]").unwrap_err().contains("not a JSON object"));
        assert!(Payload::parse(r#"{"args":[]}"#).unwrap_err().contains("no \"class\""));
        assert!(Payload::parse(r#"{"class":"X"}"#).unwrap_err().contains("no \"args\""));
        assert!(
            Payload::parse(r#"{"class":"X","args":"1"}"#)
                .unwrap_err()
                .contains("not a JSON array")
        );
    }

    #[test]
    fn malformed_payloads_keep_what_they_had() {
        let wrapped = malformed("garbage{", "bad", "default", 1.0);
        assert_eq!(wrapped.str("malformed_payload"), Some("garbage{"));
        assert_eq!(wrapped.class(), "wasmjobs::MalformedPayload");
        assert_eq!(wrapped.str("error_message"), Some("bad"));
        let kept = malformed(r#"{"jid":"j1","custom":1}"#, "no class", "critical", 1.0);
        assert_eq!(kept.jid(), "j1");
        assert_eq!(kept.get("custom"), Some(&json!(1)));
        assert_eq!(kept.queue(), "critical");
    }

    #[test]
    fn undecodable_bytes_are_kept_exactly() {
        let raw = b"\xff\xfe{\"class\":\"X\",\"args\":[]}";
        let dead = undecodable(raw, "low", 2.0);
        assert_eq!(dead.class(), "wasmjobs::MalformedPayload");
        assert_eq!(dead.queue(), "low");
        assert!(dead.str("error_message").unwrap().contains("not UTF-8"));
        assert_eq!(hex::decode(dead.str("raw_hex").unwrap()).unwrap(), raw);
        assert_eq!(
            dead.str("malformed_payload"),
            Some(String::from_utf8_lossy(raw).as_ref())
        );
    }

    #[test]
    fn missing_jid_and_queue_get_defaults_and_retry_policy_reads() {
        let p = Payload::parse(r#"{"class":"X","args":[],"retry":false}"#).unwrap();
        assert_eq!(p.jid().len(), 24);
        assert_eq!(p.queue(), "default");
        assert_eq!(p.retry_policy(), RetryPolicy::Never);
        let p = Payload::parse(r#"{"class":"X","args":[],"retry":3,"retry_count":1}"#).unwrap();
        assert_eq!(p.retry_policy(), RetryPolicy::Max(3));
        assert_eq!(
            Payload::parse(r#"{"class":"X","args":[]}"#).unwrap().retry_policy(),
            RetryPolicy::Default
        );
    }
}
