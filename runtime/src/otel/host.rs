//! Child spans of a job for its host calls, and the `traceparent` its
//! outgoing HTTP requests carry.
//!
//! A [`JobTrace`] is the job span's context as the host capabilities get
//! it, through their per-job views (the HTTP policy, the SQL view, the
//! budgeted filesystem). Each call that reaches outside the sandbox opens
//! a [`HostSpan`], which ends when dropped:
//!
//! - an HTTP request: kind CLIENT, named after its method, with the stable
//!   HTTP semantic conventions (`http.request.method`, `url.full`,
//!   `server.address`, `server.port`, `http.response.status_code`,
//!   `error.type`); 4xx and 5xx answers are errors, as for any client span;
//! - a SQL statement: kind CLIENT, named `"<OPERATION> <db>"`, with
//!   `db.system.name`, `db.operation.name`, `db.query.text` (the statement
//!   as sent: values are bound separately, never in it), `wasmjobs.db`
//!   (the runner's name for the database) and `db.response.returned_rows`;
//! - a file open: kind INTERNAL, `"file open"`, with `file.path` (the
//!   guest's path, relative to its preopened directory) and whether it
//!   creates or truncates.
//!
//! Child spans exist only when the job span is recording (sampled). The
//! `traceparent` goes out either way, so the services a job calls follow
//! the sampling decision: from the HTTP span when there is one, else from
//! the job span (sampled flag off). It replaces any `traceparent` the guest
//! set, and a `tracestate` the guest set goes (it would describe another
//! parent); with tracing off the guest's headers are left alone.

use std::borrow::Cow;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderInjector;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, Span};

/// Longest statement or path recorded on a span.
const MAX_TEXT: usize = 2048;

/// A job's span context, for the spans of its host calls.
#[derive(Clone)]
pub(crate) struct JobTrace {
    cx: Context,
    tracer: SdkTracer,
    recording: bool,
}

impl std::fmt::Debug for JobTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTrace")
            .field("span", self.cx.span().span_context())
            .field("recording", &self.recording)
            .finish()
    }
}

/// A host call's span; ends when dropped. Empty when the job is not
/// sampled.
#[derive(Debug, Default)]
pub(crate) struct HostSpan(Option<Span>);

impl JobTrace {
    pub(super) fn new(cx: Context, tracer: SdkTracer, recording: bool) -> Self {
        Self { cx, tracer, recording }
    }

    /// This trace if its job span is recording: what SQL and file spans
    /// need (they propagate nothing).
    pub(crate) fn recording(self) -> Option<Self> {
        self.recording.then_some(self)
    }

    /// A child span of the job, if the job span is recording.
    fn child(&self, name: impl Into<Cow<'static, str>>, kind: SpanKind, attributes: Vec<KeyValue>) -> HostSpan {
        if !self.recording {
            return HostSpan::default();
        }
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        HostSpan(Some(span))
    }

    /// Opens the span of an outgoing HTTP request and puts its
    /// `traceparent` into `request`'s headers.
    pub(crate) fn http<B>(&self, request: &mut http::Request<B>) -> HostSpan {
        let span = self.child(
            request.method().as_str().to_owned(),
            SpanKind::Client,
            http_attributes(request.method(), request.uri()),
        );
        let headers = request.headers_mut();
        headers.remove("tracestate");
        let propagator = TraceContextPropagator::new();
        match &span.0 {
            Some(span) => {
                let own = opentelemetry::trace::Span::span_context(span).clone();
                propagator.inject_context(
                    &Context::new().with_remote_span_context(own),
                    &mut HeaderInjector(headers),
                );
            }
            None => propagator.inject_context(&self.cx, &mut HeaderInjector(headers)),
        }
        // The propagator writes an empty `tracestate` for an empty state.
        if headers.get("tracestate").is_some_and(|state| state.is_empty()) {
            headers.remove("tracestate");
        }
        span
    }

    /// Opens the span of a SQL statement on the database the runner calls
    /// `db`, of kind `system` (`postgresql`, `sqlite`).
    pub(crate) fn sql(&self, db: &str, system: &'static str, statement: &str) -> HostSpan {
        let operation = crate::sql_text::first_keyword(statement);
        let name = match operation.is_empty() {
            true => db.to_owned(),
            false => format!("{operation} {db}"),
        };
        let mut attributes = vec![
            KeyValue::new("db.system.name", system),
            KeyValue::new("db.query.text", capped(statement).into_owned()),
            KeyValue::new("wasmjobs.db", db.to_owned()),
        ];
        if !operation.is_empty() {
            attributes.push(KeyValue::new("db.operation.name", operation));
        }
        self.child(name, SpanKind::Client, attributes)
    }

    /// Opens the span of a file open at the guest's `path`.
    pub(crate) fn file_open(&self, path: &str, create: bool, truncate: bool) -> HostSpan {
        self.child(
            "file open",
            SpanKind::Internal,
            vec![
                KeyValue::new("file.path", capped(path).into_owned()),
                KeyValue::new("wasmjobs.file.create", create),
                KeyValue::new("wasmjobs.file.truncate", truncate),
            ],
        )
    }
}

impl HostSpan {
    fn with(&mut self, f: impl FnOnce(&mut Span)) {
        if let Some(span) = &mut self.0 {
            f(span);
        }
    }

    /// Records an HTTP response's status; 4xx and 5xx mark the span failed.
    pub(crate) fn http_status(&mut self, status: u16) {
        self.with(|span| {
            use opentelemetry::trace::Span as _;
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
            if status >= 400 {
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
                span.set_status(Status::error(""));
            }
        });
    }

    /// Records how many rows a statement returned or affected.
    pub(crate) fn rows(&mut self, rows: u64) {
        self.with(|span| {
            use opentelemetry::trace::Span as _;
            span.set_attribute(KeyValue::new("db.response.returned_rows", rows as i64));
        });
    }

    /// Marks the call failed: `kind` is a low-cardinality `error.type`,
    /// `message` the description.
    pub(crate) fn failed(&mut self, kind: &str, message: &dyn std::fmt::Display) {
        self.with(|span| {
            use opentelemetry::trace::Span as _;
            span.set_attribute(KeyValue::new("error.type", kind.to_owned()));
            let message = message.to_string();
            span.set_status(Status::error(capped(&message).into_owned()));
        });
    }
}

/// The HTTP client attributes known before sending (stable semantic
/// conventions). `url.full` leaves out user info.
pub(crate) fn http_attributes(method: &http::Method, uri: &http::Uri) -> Vec<KeyValue> {
    let scheme = uri.scheme_str().unwrap_or("http");
    let host = uri.host().unwrap_or_default();
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    let authority = match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    vec![
        KeyValue::new("http.request.method", method.as_str().to_owned()),
        KeyValue::new(
            "url.full",
            capped(&format!("{scheme}://{authority}{path}")).into_owned(),
        ),
        KeyValue::new("server.address", host.to_owned()),
        KeyValue::new("server.port", i64::from(port)),
    ]
}

/// `text` cut to [`MAX_TEXT`] bytes on a character boundary.
fn capped(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_TEXT {
        return Cow::Borrowed(text);
    }
    let mut cut = MAX_TEXT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(text[..cut].to_owned())
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState, TracerProvider};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    use super::*;

    fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
        attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.as_str().into_owned())
    }

    #[test]
    fn http_attributes_follow_the_stable_conventions_without_user_info() {
        let uri: http::Uri = "http://user:pw@127.0.0.1:8080/a/b?q=1".parse().unwrap();
        let attributes = http_attributes(&http::Method::POST, &uri);
        assert_eq!(attribute(&attributes, "http.request.method").as_deref(), Some("POST"));
        assert_eq!(
            attribute(&attributes, "url.full").as_deref(),
            Some("http://127.0.0.1:8080/a/b?q=1")
        );
        assert_eq!(attribute(&attributes, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(attribute(&attributes, "server.port").as_deref(), Some("8080"));
        let default_port = http_attributes(&http::Method::GET, &"https://example.com".parse().unwrap());
        assert_eq!(attribute(&default_port, "server.port").as_deref(), Some("443"));
        assert_eq!(
            attribute(&default_port, "url.full").as_deref(),
            Some("https://example.com/")
        );
    }

    /// A job trace under a sampled (or not) remote parent, and its spans.
    fn trace(sampled: bool) -> (JobTrace, InMemorySpanExporter, SdkTracerProvider) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("test");
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let parent = SpanContext::new(TraceId::from(7), SpanId::from(9), flags, true, TraceState::default());
        let remote = Context::new().with_remote_span_context(parent);
        let span = tracer.start_with_context("job", &remote);
        let recording = opentelemetry::trace::Span::is_recording(&span);
        (
            JobTrace::new(remote.with_span(span), tracer, recording),
            exporter,
            provider,
        )
    }

    #[test]
    fn an_http_request_carries_its_spans_traceparent_and_loses_the_guests() {
        let (trace, exporter, provider) = trace(true);
        let mut request = http::Request::get("http://127.0.0.1:9/x")
            .header("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
            .header("tracestate", "guest=1")
            .body(())
            .unwrap();
        let mut span = trace.http(&mut request);
        span.http_status(503);
        drop(span);
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let http = spans.iter().find(|s| s.name == "GET").expect("an HTTP span");
        assert_eq!(http.span_kind, SpanKind::Client);
        assert_eq!(http.span_context.trace_id(), TraceId::from(7));
        let header = request.headers()["traceparent"].to_str().unwrap();
        assert_eq!(
            header,
            format!("00-{}-{}-01", http.span_context.trace_id(), http.span_context.span_id())
        );
        assert!(request.headers().get("tracestate").is_none());
        assert!(matches!(http.status, Status::Error { .. }));
    }

    #[test]
    fn an_unsampled_job_propagates_its_own_context_and_records_nothing() {
        let (trace, exporter, provider) = trace(false);
        let mut request = http::Request::get("http://127.0.0.1:9/x").body(()).unwrap();
        drop(trace.http(&mut request));
        assert!(trace.clone().recording().is_none());
        drop(trace.sql("main", "postgresql", "SELECT 1"));
        provider.force_flush().unwrap();
        assert!(exporter.get_finished_spans().unwrap().is_empty());
        let header = request.headers()["traceparent"].to_str().unwrap();
        assert!(header.starts_with(&format!("00-{}-", TraceId::from(7))), "{header}");
        assert!(header.ends_with("-00"), "{header}");
    }

    #[test]
    fn sql_and_file_spans_describe_the_call() {
        let (trace, exporter, provider) = trace(true);
        let mut sql = trace.sql("main", "postgresql", "select * from t where id = $1");
        sql.rows(3);
        drop(sql);
        let mut open = trace.file_open("data/x.txt", true, false);
        open.failed("no-entry", &"no such file");
        drop(open);
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let sql = spans.iter().find(|s| s.name == "SELECT main").expect("a SQL span");
        assert_eq!(
            attribute(&sql.attributes, "db.operation.name").as_deref(),
            Some("SELECT")
        );
        assert_eq!(
            attribute(&sql.attributes, "db.response.returned_rows").as_deref(),
            Some("3")
        );
        let open = spans.iter().find(|s| s.name == "file open").expect("a file span");
        assert_eq!(attribute(&open.attributes, "file.path").as_deref(), Some("data/x.txt"));
        assert_eq!(open.status, Status::error("no such file"));
    }
}
