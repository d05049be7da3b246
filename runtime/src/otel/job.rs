//! The job span: `"<queue> process"`, kind CONSUMER, with the attributes
//! of the Ruby OpenTelemetry Sidekiq instrumentation (its old semantic
//! conventions) and wasmjobs's own.
//!
//! The runner starts it when a job starts ([`super::Tracing::job_span`])
//! and ends it with the outcome ([`JobSpan::end`]). A span the sampler
//! drops is non-recording: it still has a trace id and a span id (with the
//! sampled flag off), which the job's outgoing HTTP requests carry, and
//! nothing else is built for it.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use super::carrier::Carrier;
use super::host::JobTrace;
use super::settings::Propagation;
use crate::job::Job;
use wasmjobs_client::payload::epoch_secs;

/// Longest string attribute taken from a payload (jid, class, queue).
const MAX_ATTRIBUTE: usize = 256;
/// Longest error message recorded as a span status.
const MAX_STATUS: usize = 1024;

/// One job's span, from its start to its outcome.
pub(crate) struct JobSpan {
    /// The job span (in the producer's baggage, when there is some).
    cx: Context,
    tracer: SdkTracer,
    recording: bool,
}

/// What starts a job span.
pub(crate) struct Start<'a> {
    /// The payload as stored.
    pub(crate) raw: &'a str,
    /// The queue it was fetched from.
    pub(crate) queue: &'a str,
    /// The job, if the payload is one.
    pub(crate) job: Option<&'a Job>,
}

/// Starts a job span with `tracer` under `propagation`.
pub(crate) fn start(tracer: &SdkTracer, propagation: Propagation, start: &Start<'_>) -> JobSpan {
    let mut carrier = Carrier::may_be_in(start.raw).then(|| Carrier::parse(start.raw));
    let remote = match (&carrier, propagation) {
        (Some(carrier), Propagation::Child | Propagation::Link) => carrier.context(),
        _ => Context::new(),
    };
    let builder = tracer.span_builder("process").with_kind(SpanKind::Consumer);
    let span = match propagation {
        Propagation::Link => {
            let linked = remote.span().span_context().clone();
            let links = if linked.is_valid() {
                vec![Link::with_context(linked)]
            } else {
                Vec::new()
            };
            builder.with_links(links).start_with_context(tracer, &Context::new())
        }
        Propagation::Child | Propagation::None => builder.start_with_context(tracer, &remote),
    };
    let mut job_span = JobSpan {
        recording: opentelemetry::trace::Span::is_recording(&span),
        cx: remote.with_span(span),
        tracer: tracer.clone(),
    };
    if job_span.recording {
        let carrier = carrier.get_or_insert_with(|| Carrier::parse(start.raw));
        job_span.describe(start, carrier);
    }
    job_span
}

impl JobSpan {
    /// Names the span and sets what is known at the start.
    fn describe(&mut self, start: &Start<'_>, carrier: &Carrier) {
        let span = self.cx.span();
        span.update_name(format!("{} process", capped(start.queue)));
        span.set_attributes(attributes(start.queue, start.job, carrier.wrapped.text()));
        for (name, at) in [
            ("created_at", &carrier.created_at),
            ("enqueued_at", &carrier.enqueued_at),
        ] {
            // Sidekiq 8 writes integer milliseconds, older ones float seconds.
            if let Some(time) = at.number().map(epoch_secs).and_then(epoch) {
                span.add_event_with_timestamp(name, time, Vec::new());
            }
        }
    }

    /// What the job's host calls work with: this span's context.
    pub(crate) fn host(&self) -> JobTrace {
        JobTrace::new(self.cx.clone(), self.tracer.clone(), self.recording)
    }

    /// Records the plugin that serves the job.
    pub(crate) fn plugin(&self, name: &str, version: &str) {
        if self.recording {
            self.cx.span().set_attributes([
                KeyValue::new("wasmjobs.plugin", name.to_owned()),
                KeyValue::new("wasmjobs.plugin_version", version.to_owned()),
            ]);
        }
    }

    /// Records the time from enqueue to start.
    pub(crate) fn queue_latency(&self, latency: Duration) {
        if self.recording {
            self.cx.span().set_attribute(KeyValue::new(
                "wasmjobs.queue_latency_ms",
                latency.as_secs_f64() * 1000.0,
            ));
        }
    }

    /// Marks the span as failed with `message`.
    pub(crate) fn failed(&self, message: &str) {
        if self.recording {
            let message = match message.char_indices().nth(MAX_STATUS) {
                Some((cut, _)) => &message[..cut],
                None => message,
            };
            self.cx.span().set_status(Status::error(message.to_owned()));
        }
    }

    /// Ends the span with the job's `outcome` (success, retry, dead, …).
    pub(crate) fn end(self, outcome: &'static str) {
        if self.recording {
            let span = self.cx.span();
            span.set_attribute(KeyValue::new("wasmjobs.outcome", outcome));
            span.end();
        }
    }
}

/// The attributes of a job span known at its start: the Ruby
/// instrumentation's (`messaging.*`, old semantic conventions) and the
/// retry count.
pub(crate) fn attributes(queue: &str, job: Option<&Job>, wrapped: Option<&str>) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("messaging.system", "sidekiq"),
        KeyValue::new("messaging.destination", capped(queue).into_owned()),
        KeyValue::new("messaging.destination_kind", "queue"),
        KeyValue::new("messaging.operation", "process"),
    ];
    if let Some(job) = job {
        let class = wrapped.filter(|w| !w.is_empty()).unwrap_or(&job.class);
        attributes.extend([
            KeyValue::new("messaging.sidekiq.job_class", capped(class).into_owned()),
            KeyValue::new("messaging.message_id", capped(&job.jid).into_owned()),
            KeyValue::new("wasmjobs.retry_count", i64::from(job.retry_count)),
        ]);
    }
    attributes
}

/// `text` cut to [`MAX_ATTRIBUTE`] bytes on a character boundary.
fn capped(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_ATTRIBUTE {
        return Cow::Borrowed(text);
    }
    let mut cut = MAX_ATTRIBUTE;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(text[..cut].to_owned())
}

/// Epoch seconds as a time, if they are a plausible one.
fn epoch(seconds: f64) -> Option<SystemTime> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .and_then(|since| SystemTime::UNIX_EPOCH.checked_add(since))
}

#[cfg(test)]
mod tests {
    use opentelemetry::Value;
    use opentelemetry::trace::{TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    use super::*;

    fn job() -> Job {
        Job {
            jid: "b4a577edbccf1d805744efa9".into(),
            class: "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper".into(),
            queue: "mailers".into(),
            args: "[]".into(),
            retry_count: 2,
            enqueued_at_ms: 0,
            activejob: None,
        }
    }

    fn get<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
        attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
    }

    #[test]
    fn attributes_are_the_ruby_instrumentations() {
        let job = job();
        let attributes = attributes("mailers", Some(&job), Some("SignupMailer"));
        let text = |key| get(&attributes, key).map(|v| v.as_str().into_owned());
        assert_eq!(text("messaging.system").as_deref(), Some("sidekiq"));
        assert_eq!(text("messaging.sidekiq.job_class").as_deref(), Some("SignupMailer"));
        assert_eq!(
            text("messaging.message_id").as_deref(),
            Some("b4a577edbccf1d805744efa9")
        );
        assert_eq!(text("messaging.destination").as_deref(), Some("mailers"));
        assert_eq!(text("messaging.destination_kind").as_deref(), Some("queue"));
        assert_eq!(text("messaging.operation").as_deref(), Some("process"));
        assert_eq!(get(&attributes, "wasmjobs.retry_count"), Some(&Value::I64(2)));
        let unwrapped = super::attributes("mailers", Some(&job), None);
        assert_eq!(
            get(&unwrapped, "messaging.sidekiq.job_class").map(|v| v.as_str().into_owned()),
            Some(job.class.clone())
        );
    }

    #[test]
    fn a_payload_that_is_no_job_gets_the_queue_only() {
        let attributes = attributes("default", None, None);
        assert!(get(&attributes, "messaging.message_id").is_none());
        assert!(get(&attributes, "messaging.destination").is_some());
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn provider(sampler: opentelemetry_sdk::trace::Sampler) -> (SdkTracer, InMemorySpanExporter, SdkTracerProvider) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_sampler(sampler)
            .build();
        (provider.tracer("test"), exporter, provider)
    }

    /// Runs one job span for a payload with a sampled `traceparent` under
    /// `propagation`, and returns what was exported.
    fn span_under(propagation: Propagation) -> opentelemetry_sdk::trace::SpanData {
        let (tracer, exporter, provider) = provider(opentelemetry_sdk::trace::Sampler::AlwaysOn);
        let raw = format!(r#"{{"class":"K","jid":"j1","traceparent":"00-{TRACE}-00f067aa0ba902b7-01"}}"#);
        let job = job();
        let span = start(
            &tracer,
            propagation,
            &Start {
                raw: &raw,
                queue: "mailers",
                job: Some(&job),
            },
        );
        span.failed("boom");
        span.end("retry");
        provider.force_flush().unwrap();
        let mut spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 1);
        spans.remove(0)
    }

    #[test]
    fn child_link_and_none_use_the_payloads_context_as_they_say() {
        let trace = TraceId::from_hex(TRACE).unwrap();
        let child = span_under(Propagation::Child);
        assert_eq!(child.name, "mailers process");
        assert_eq!(child.span_kind, SpanKind::Consumer);
        assert_eq!(child.span_context.trace_id(), trace);
        assert_eq!(child.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(child.parent_span_is_remote);
        assert_eq!(child.status, Status::error("boom"));
        assert_eq!(get(&child.attributes, "wasmjobs.outcome"), Some(&Value::from("retry")));

        let link = span_under(Propagation::Link);
        assert_ne!(link.span_context.trace_id(), trace);
        assert_eq!(link.parent_span_id, opentelemetry::trace::SpanId::INVALID);
        assert_eq!(link.links.links.len(), 1);
        assert_eq!(link.links.links[0].span_context.trace_id(), trace);

        let none = span_under(Propagation::None);
        assert_ne!(none.span_context.trace_id(), trace);
        assert!(none.links.links.is_empty());
    }

    #[test]
    fn an_unsampled_job_records_nothing_and_its_host_calls_propagate_only() {
        let sampler =
            opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(opentelemetry_sdk::trace::Sampler::AlwaysOff));
        let (tracer, exporter, provider) = provider(sampler);
        let job = job();
        let span = start(
            &tracer,
            Propagation::Child,
            &Start {
                raw: r#"{"class":"K"}"#,
                queue: "q",
                job: Some(&job),
            },
        );
        assert!(span.host().recording().is_none());
        span.plugin("p", "v");
        span.end("success");
        provider.force_flush().unwrap();
        assert!(exporter.get_finished_spans().unwrap().is_empty());
    }

    /// What a job span costs the runner per job, at 1% sampling (mostly
    /// unsampled) and at 100% (recorded, handed to an in-memory exporter).
    /// A measurement, not a check: `cargo test --release -p wasmjobs --lib
    /// otel::job::tests::cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn cost_per_job() {
        use opentelemetry_sdk::trace::Sampler;
        let raw = r#"{"class":"NoopJob","args":[],"retry":true,"queue":"default","jid":"b4a577edbccf1d805744efa9","created_at":1764660000.1,"enqueued_at":1764660000.1}"#;
        let job = job();
        for (name, ratio) in [("1%", 0.01), ("100%", 1.0)] {
            let (tracer, exporter, _provider) =
                provider(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
            let n = 200_000u32;
            let started = std::time::Instant::now();
            for i in 0..n {
                let span = start(
                    &tracer,
                    Propagation::Child,
                    &Start {
                        raw,
                        queue: "default",
                        job: Some(&job),
                    },
                );
                drop(span.host().recording());
                span.plugin("noop", "0123456789ab");
                span.queue_latency(Duration::from_millis(3));
                span.end("success");
                if i % 1000 == 999 {
                    exporter.reset();
                }
            }
            println!("{name}: {} ns per job", started.elapsed().as_nanos() / u128::from(n));
        }
    }

    /// The `created_at`/`enqueued_at` events of a Sidekiq 8 payload
    /// (integer milliseconds) and of an older one (float seconds) land at
    /// the same instant.
    #[test]
    fn timestamp_events_read_milliseconds_and_seconds_alike() {
        let at = |raw: &str| {
            let (tracer, exporter, provider) = provider(opentelemetry_sdk::trace::Sampler::AlwaysOn);
            let job = job();
            let span = start(
                &tracer,
                Propagation::None,
                &Start {
                    raw,
                    queue: "q",
                    job: Some(&job),
                },
            );
            span.end("success");
            provider.force_flush().unwrap();
            let spans = exporter.get_finished_spans().unwrap();
            let events: Vec<(String, SystemTime)> = spans[0]
                .events
                .iter()
                .map(|e| (e.name.to_string(), e.timestamp))
                .collect();
            events
        };
        let seconds = at(r#"{"class":"K","jid":"j","created_at":1764756930.123,"enqueued_at":1764756930.5}"#);
        let millis = at(r#"{"class":"K","jid":"j","created_at":1764756930123,"enqueued_at":1764756930500}"#);
        let created = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_756_930_123);
        let near = |events: &[(String, SystemTime)], name: &str, when: SystemTime| {
            let (_, t) = events
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no {name} event in {events:?}"));
            let apart = t.duration_since(when).unwrap_or_else(|e| e.duration());
            assert!(
                apart < Duration::from_millis(2),
                "{name} at {t:?}, {apart:?} from {when:?}"
            );
        };
        for events in [&seconds, &millis] {
            near(events, "created_at", created);
            near(events, "enqueued_at", created + Duration::from_millis(377));
        }
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_ATTRIBUTE);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_ATTRIBUTE && cut.chars().all(|c| c == 'é'));
        assert!(matches!(capped("short"), Cow::Borrowed("short")));
        assert!(epoch(-1.0).is_none() && epoch(f64::NAN).is_none());
        assert!(epoch(1_700_000_000.25).is_some());
    }
}
