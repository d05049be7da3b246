//! The trace context a producer left in a job's payload.
//!
//! The Ruby OpenTelemetry Sidekiq instrumentation (and any client using
//! the default `tracecontext,baggage` propagators) writes `traceparent`,
//! `tracestate` (when non-empty) and `baggage` (when set) at the **top
//! level** of the job hash. [`Carrier`] reads those, plus the fields the
//! job span reports (`wrapped`, `created_at`, `enqueued_at`), in one pass
//! over the raw payload, and never fails: the payload comes from Redis,
//! anyone can push anything, so a field of the wrong type, an oversized
//! value or an invalid `traceparent` is ignored and the job span starts a
//! new trace. Validation of the W3C fields is the propagators'.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use serde::Deserialize;

/// Longest `traceparent`, `tracestate` or `baggage` considered (the W3C
/// limits: 32 tracestate members of ≤ 256 characters, 8,192 bytes of
/// baggage); anything longer is ignored whole.
const MAX_FIELD: usize = 8192;

/// The payload fields tracing reads.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Carrier {
    #[serde(default)]
    traceparent: Field,
    #[serde(default)]
    tracestate: Field,
    #[serde(default)]
    baggage: Field,
    /// The ActiveJob class a Sidekiq wrapper runs.
    #[serde(default)]
    pub(crate) wrapped: Field,
    /// When the job was created (epoch seconds).
    #[serde(default)]
    pub(crate) created_at: Field,
    /// When it was last enqueued (epoch seconds).
    #[serde(default)]
    pub(crate) enqueued_at: Field,
}

/// One field as found: text, a number, or anything else (ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub(crate) enum Field {
    Text(String),
    Number(f64),
    #[default]
    #[serde(skip)]
    Absent,
    Other(serde::de::IgnoredAny),
}

impl Field {
    /// The text, if the field is a string of at most [`MAX_FIELD`] bytes.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Field::Text(text) if text.len() <= MAX_FIELD => Some(text),
            _ => None,
        }
    }

    /// The number, if the field is a finite one.
    pub(crate) fn number(&self) -> Option<f64> {
        match self {
            Field::Number(n) if n.is_finite() => Some(*n),
            _ => None,
        }
    }
}

impl Carrier {
    /// The fields of `raw` (a job payload); empty if `raw` is not a JSON
    /// object or a field repeats.
    pub(crate) fn parse(raw: &str) -> Self {
        serde_json::from_str(raw).unwrap_or_default()
    }

    /// Whether `raw` may carry a context: the cheap test that spares
    /// parsing the payload of a job pushed without one.
    pub(crate) fn may_be_in(raw: &str) -> bool {
        raw.contains("traceparent") || raw.contains("baggage")
    }

    /// The producer's context: its span (remote) and baggage, or an empty
    /// context when the payload has none or an invalid one.
    pub(crate) fn context(&self) -> Context {
        let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), self);
        if self.baggage.text().is_none() {
            return cx;
        }
        BaggagePropagator::new().extract_with_context(&cx, self)
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.text(),
            "tracestate" => self.tracestate.text(),
            "baggage" => self.baggage.text(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        ["traceparent", "tracestate", "baggage"]
            .into_iter()
            .filter(|key| self.get(key).is_some())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::baggage::BaggageExt;
    use opentelemetry::trace::{TraceContextExt, TraceId};

    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn payload(extra: &str) -> String {
        format!(r#"{{"class":"K","args":[{{"traceparent":"nested, ignored"}}],"jid":"abc","queue":"q"{extra}}}"#)
    }

    #[test]
    fn the_top_level_traceparent_is_the_parent() {
        let raw = payload(&format!(
            r#","traceparent":"{PARENT}","tracestate":"congo=t61rcWkgMzE""#
        ));
        assert!(Carrier::may_be_in(&raw));
        let cx = Carrier::parse(&raw).context();
        let span = cx.span();
        let parent = span.span_context();
        assert!(parent.is_valid() && parent.is_remote() && parent.is_sampled());
        assert_eq!(
            parent.trace_id(),
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap()
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(parent.trace_state().get("congo"), Some("t61rcWkgMzE"));
    }

    #[test]
    fn baggage_comes_along() {
        let raw = payload(&format!(r#","traceparent":"{PARENT}","baggage":"user=42,tenant=acme""#));
        let cx = Carrier::parse(&raw).context();
        assert_eq!(
            cx.baggage().get("tenant").map(|v| v.as_str().to_owned()),
            Some("acme".into())
        );
        assert!(cx.span().span_context().is_valid());
    }

    #[test]
    fn hostile_or_missing_contexts_give_a_new_root() {
        let cases = [
            payload(""),
            payload(r#","traceparent":"garbage""#),
            payload(r#","traceparent":"00-00000000000000000000000000000000-b7ad6b7169203331-01""#),
            payload(r#","traceparent":"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01""#),
            payload(r#","traceparent":42"#),
            payload(r#","traceparent":{"a":[1,2]}"#),
            payload(&format!(r#","traceparent":"{PARENT}{}""#, " ".repeat(MAX_FIELD))),
            format!(r#"{{"traceparent":"{PARENT}","traceparent":"{PARENT}"}}"#),
            "not json".into(),
            "[1,2]".into(),
            String::new(),
        ];
        for raw in cases {
            let cx = Carrier::parse(&raw).context();
            assert!(!cx.span().span_context().is_valid(), "{raw}");
        }
        assert!(!Carrier::may_be_in(r#"{"class":"K","args":[],"jid":"j"}"#));
    }

    #[test]
    fn the_reported_fields_are_read_whatever_their_neighbours() {
        let raw = payload(r#","wrapped":"MailerJob","created_at":1700000000.5,"enqueued_at":"soon","traceparent":7"#);
        let carrier = Carrier::parse(&raw);
        assert_eq!(carrier.wrapped.text(), Some("MailerJob"));
        assert_eq!(carrier.created_at.number(), Some(1_700_000_000.5));
        assert_eq!(carrier.enqueued_at.number(), None);
        assert_eq!(carrier.keys(), Vec::<&str>::new());
    }
}
