//! OpenTelemetry traces end to end: the real `wasmjobs run` with
//! `--otlp-endpoint` pointing at a real OTLP/HTTP receiver in this process
//! (`wasmjobs_e2e::otlp`, decoding with the OpenTelemetry protobuf
//! definitions), jobs pushed into a real Redis with a `traceparent` as the
//! Ruby Sidekiq instrumentation writes it, and a real HTTP server that
//! records the `traceparent` each request brought. Every run stops with
//! `--exit-when-empty`, well before the batch processor's 5-second tick,
//! so the spans arriving at all shows the flush at a clean stop.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::{Value, json};
use wasmjobs::redis::client;
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::otlp::{OtlpReceiver, Received, hex, int, text};
use wasmjobs_e2e::postgres::TestPostgres;
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::{Runner, int as redis_int, plugins};
use wasmjobs_e2e::{copy_plugin, eventually, plugins_dir, test_guests_dir};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// The `traceparent` and `tracestate` headers of a request, if sent.
type TraceHeaders = (Option<String>, Option<String>);

/// An HTTP server that answers 200 to everything and records, by path,
/// the `traceparent` and `tracestate` headers it was sent.
struct Capture {
    addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, TraceHeaders>>>,
}

impl Capture {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let recorded = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let header = |name: &str| {
                            request
                                .headers()
                                .get(name)
                                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        };
                        recorded.lock().unwrap_or_else(PoisonError::into_inner).insert(
                            request.uri().path().to_owned(),
                            (header("traceparent"), header("tracestate")),
                        );
                        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The `traceparent` and `tracestate` a request to `path` carried.
    fn headers(&self, path: &str) -> TraceHeaders {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .cloned()
            .expect("the job's request reached the server")
    }
}

/// A payload for `class` with `args` on the default queue, with the
/// top-level `fields` a producer's instrumentation adds.
fn payload(class: &str, args: Vec<Value>, fields: &[(&str, &str)]) -> Payload {
    let mut payload = Payload::new(class, args, "default", wasmjobs::redis::now_f64());
    for (key, value) in fields {
        payload.set(key, json!(value));
    }
    payload
}

/// Pushes `payloads`, runs `wasmjobs run --exit-when-empty` on `plugins`
/// with `flags` until it exits, and returns its log.
async fn run(redis: &TestRedis, plugins: &Path, mut payloads: Vec<Payload>, flags: &[&str]) -> String {
    let mut conn = redis.conn().await;
    client::push_bulk(&mut conn, &mut payloads).await.expect("push");
    let mut args = vec!["--exit-when-empty", "-c", "4"];
    args.extend_from_slice(flags);
    let mut runner = Runner::start(&redis.url(), plugins, &args);
    let status = tokio::task::block_in_place(|| runner.wait(Duration::from_secs(60)));
    let log = runner.log();
    assert!(status.success(), "wasmjobs run failed ({status}):\n{log}");
    assert_eq!(
        redis_int(&mut conn, "stat:processed").await,
        payloads.len() as u64,
        "every job succeeded:\n{log}"
    );
    log
}

/// Waits until the receiver holds at least `count` spans.
async fn spans(receiver: &OtlpReceiver, count: usize, log: &str) -> Vec<Received> {
    eventually(
        Duration::from_secs(10),
        || format!("{count} spans received; got {:#?}\n{log}", receiver.spans()),
        || async { receiver.spans().len() >= count },
    )
    .await;
    receiver.spans()
}

/// The job span of `jid`.
fn job_span<'a>(spans: &'a [Received], jid: &str) -> &'a Span {
    &spans
        .iter()
        .find(|r| text(&r.span.attributes, "messaging.message_id").as_deref() == Some(jid))
        .unwrap_or_else(|| panic!("no span for job {jid} in {spans:#?}"))
        .span
}

/// The spans whose parent is `parent`.
fn children<'a>(spans: &'a [Received], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_continues_the_payloads_trace_and_passes_it_to_its_http_call() {
    let redis = TestRedis::start();
    let receiver = OtlpReceiver::start().await;
    let server = Capture::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugin(&plugins_dir().join("http-get"), dir.path());
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let traced = payload(
        "HttpGetJob",
        vec![json!(server.url("/traced"))],
        &[
            ("traceparent", &traceparent),
            ("tracestate", "rojo=00f067aa0ba902b7"),
            ("baggage", "tenant=acme"),
        ],
    );
    let malformed = payload(
        "HttpGetJob",
        vec![json!(server.url("/malformed"))],
        &[("traceparent", "00-zz-not-a-trace-01")],
    );
    let (traced_jid, malformed_jid) = (traced.jid().to_owned(), malformed.jid().to_owned());
    let log = run(
        &redis,
        dir.path(),
        vec![traced, malformed],
        &["--otlp-endpoint", &receiver.endpoint()],
    )
    .await;
    assert!(
        log.contains(&format!("tracing: traces to {}/v1/traces", receiver.endpoint())),
        "one line says where traces go:\n{log}"
    );
    let spans = spans(&receiver, 4, &log).await;
    assert!(spans.iter().all(|r| r.service == "wasmjobs"), "{spans:#?}");

    // The job span: the payload's span is its parent, the Ruby
    // instrumentation's name and attributes, and ours.
    let job = job_span(&spans, &traced_jid);
    assert_eq!(hex(&job.trace_id), TRACE_ID);
    assert_eq!(hex(&job.parent_span_id), PARENT_ID);
    assert_eq!(job.name, "default process");
    assert_eq!(job.kind, SpanKind::Consumer as i32);
    let attributes = &job.attributes;
    for (key, want) in [
        ("messaging.system", "sidekiq"),
        ("messaging.sidekiq.job_class", "HttpGetJob"),
        ("messaging.destination", "default"),
        ("messaging.destination_kind", "queue"),
        ("messaging.operation", "process"),
        ("wasmjobs.plugin", "http-get"),
        ("wasmjobs.outcome", "success"),
    ] {
        assert_eq!(text(attributes, key).as_deref(), Some(want), "{key} in {job:#?}");
    }
    assert_eq!(text(attributes, "wasmjobs.plugin_version").map(|v| v.len()), Some(12));
    assert_eq!(int(attributes, "wasmjobs.retry_count"), Some(0));
    assert!(
        wasmjobs_e2e::otlp::attribute(attributes, "wasmjobs.queue_latency_ms").is_some(),
        "{job:#?}"
    );
    assert!(job.events.iter().any(|e| e.name == "enqueued_at"), "{job:#?}");
    assert_ne!(job.status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32));

    // Its HTTP request: a CLIENT child span, the stable HTTP conventions.
    let http = children(&spans, job);
    assert_eq!(http.len(), 1, "one child span: {http:#?}");
    let http = http[0];
    assert_eq!(http.name, "GET");
    assert_eq!(http.kind, SpanKind::Client as i32);
    assert_eq!(text(&http.attributes, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(text(&http.attributes, "url.full"), Some(server.url("/traced")));
    assert_eq!(int(&http.attributes, "http.response.status_code"), Some(200));
    assert_eq!(
        int(&http.attributes, "server.port"),
        Some(i64::from(server.addr.port()))
    );

    // The server saw the HTTP span as the request's parent, in the
    // payload's trace; the payload's tracestate went along with it.
    let (sent, state) = server.headers("/traced");
    assert_eq!(
        sent.as_deref(),
        Some(format!("00-{TRACE_ID}-{}-01", hex(&http.span_id)).as_str())
    );
    assert_eq!(state.as_deref(), Some("rojo=00f067aa0ba902b7"));

    // A malformed traceparent is ignored: the job ran, in a trace of its own.
    let root = job_span(&spans, &malformed_jid);
    assert!(root.parent_span_id.is_empty(), "a root span: {root:#?}");
    assert_ne!(hex(&root.trace_id), TRACE_ID);
    assert_eq!(text(&root.attributes, "wasmjobs.outcome").as_deref(), Some("success"));
    let (sent, state) = server.headers("/malformed");
    let sent = sent.expect("a traceparent all the same");
    assert_eq!(state, None, "no tracestate where there is none");
    assert!(sent.starts_with(&format!("00-{}-", hex(&root.trace_id))), "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wasi_http_request_is_traced_too() {
    let redis = TestRedis::start();
    let receiver = OtlpReceiver::start().await;
    let server = Capture::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugin(&test_guests_dir().join("chaos"), dir.path());
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    // One request through `wasi:http/outgoing-handler`, its body unread.
    let job = payload(
        "ChaosJob",
        vec![
            json!("http-flood"),
            json!(1),
            json!(server.addr.to_string()),
            json!("/wasi"),
        ],
        &[("traceparent", &traceparent)],
    );
    let jid = job.jid().to_owned();
    let log = run(
        &redis,
        dir.path(),
        vec![job],
        &["--otlp-endpoint", &receiver.endpoint()],
    )
    .await;
    let spans = spans(&receiver, 2, &log).await;
    let job = job_span(&spans, &jid);
    assert_eq!(hex(&job.trace_id), TRACE_ID);
    let http = children(&spans, job);
    assert_eq!(http.len(), 1, "{spans:#?}");
    assert_eq!(http[0].name, "GET");
    assert_eq!(text(&http[0].attributes, "url.full"), Some(server.url("/wasi")));
    assert_eq!(int(&http[0].attributes, "http.response.status_code"), Some(200));
    let (sent, _) = server.headers("/wasi");
    assert_eq!(
        sent.as_deref(),
        Some(format!("00-{TRACE_ID}-{}-01", hex(&http[0].span_id)).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_statements_and_file_opens_get_child_spans() {
    let redis = TestRedis::start();
    let pg = TestPostgres::start();
    let receiver = OtlpReceiver::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugin(&plugins_dir().join("sql"), dir.path());
    copy_plugin(&plugins_dir().join("file-append"), dir.path());
    let sql = payload("SqlJob", vec![json!("main"), json!("select 41 + 1")], &[]);
    let file = payload("FileAppendJob", vec![json!("traced.txt"), json!(1)], &[]);
    let (sql_jid, file_jid) = (sql.jid().to_owned(), file.jid().to_owned());
    let db = format!("main={}", pg.url("postgres"));
    let log = run(
        &redis,
        dir.path(),
        vec![sql, file],
        &["--otlp-endpoint", &receiver.endpoint(), "--db", &db],
    )
    .await;
    let spans = spans(&receiver, 4, &log).await;

    let job = job_span(&spans, &sql_jid);
    let statement = children(&spans, job);
    assert_eq!(statement.len(), 1, "{spans:#?}");
    let statement = statement[0];
    assert_eq!(statement.name, "SELECT main");
    assert_eq!(statement.kind, SpanKind::Client as i32);
    assert_eq!(
        text(&statement.attributes, "db.system.name").as_deref(),
        Some("postgresql")
    );
    assert_eq!(
        text(&statement.attributes, "db.operation.name").as_deref(),
        Some("SELECT")
    );
    assert_eq!(
        text(&statement.attributes, "db.query.text").as_deref(),
        Some("select 41 + 1")
    );
    assert_eq!(int(&statement.attributes, "db.response.returned_rows"), Some(1));

    let job = job_span(&spans, &file_jid);
    let opens = children(&spans, job);
    assert!(
        opens
            .iter()
            .any(|s| s.name == "file open" && text(&s.attributes, "file.path").as_deref() == Some("traced.txt")),
        "{opens:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_payload_is_traced_at_ratio_zero_and_an_unsampled_job_still_propagates() {
    let redis = TestRedis::start();
    let receiver = OtlpReceiver::start().await;
    let server = Capture::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugin(&plugins_dir().join("http-get"), dir.path());
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let sampled = payload(
        "HttpGetJob",
        vec![json!(server.url("/sampled"))],
        &[("traceparent", &traceparent)],
    );
    let unsampled = payload("HttpGetJob", vec![json!(server.url("/unsampled"))], &[]);
    let sampled_jid = sampled.jid().to_owned();
    let log = run(
        &redis,
        dir.path(),
        vec![sampled, unsampled],
        &["--otlp-endpoint", &receiver.endpoint(), "--otlp-sample", "0"],
    )
    .await;
    let spans = spans(&receiver, 2, &log).await;
    assert_eq!(spans.len(), 2, "only the sampled payload's job and request: {spans:#?}");
    assert_eq!(hex(&job_span(&spans, &sampled_jid).trace_id), TRACE_ID);
    let (sent, _) = server.headers("/unsampled");
    let sent = sent.expect("the unsampled job's request carries a traceparent");
    assert!(sent.ends_with("-00") && !sent.contains(TRACE_ID), "{sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_jobs_nothing() {
    let redis = TestRedis::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let dir = tempfile::tempdir().expect("tempdir");
    copy_plugin(&plugins_dir().join("noop"), dir.path());
    let jobs = (0..50).map(|_| payload("NoopJob", vec![], &[])).collect();
    let started = std::time::Instant::now();
    let log = run(&redis, dir.path(), jobs, &["--otlp-endpoint", &endpoint]).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "stopped in {:?}",
        started.elapsed()
    );
    assert!(log.contains("cannot send traces"), "the failure is logged:\n{log}");
    assert_eq!(log.matches("cannot send traces").count(), 1, "once:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_over_grpc_when_the_protocol_says_so() {
    let redis = TestRedis::start();
    let receiver = OtlpReceiver::start_grpc().await;
    let dir = plugins(&["noop"], &[]);
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let mut jobs = vec![payload("NoopJob", vec![], &[("traceparent", &traceparent)])];
    let jid = jobs[0].jid().to_owned();
    let mut conn = redis.conn().await;
    client::push_bulk(&mut conn, &mut jobs).await.expect("push");
    // The standard variable picks the protocol; the endpoint is the
    // collector's gRPC address as is (no /v1/traces).
    let mut runner = Runner::start_wrapped(
        &["env", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"],
        &redis.url(),
        dir.path(),
        &["--exit-when-empty", "--otlp-endpoint", &receiver.endpoint()],
    );
    let status = tokio::task::block_in_place(|| runner.wait(Duration::from_secs(60)));
    let log = runner.log();
    assert!(status.success(), "wasmjobs run failed ({status}):\n{log}");
    assert!(
        log.contains(&format!("tracing: traces to {}/ (grpc)", receiver.endpoint())),
        "one line says where traces go and how:\n{log}"
    );
    let spans = spans(&receiver, 1, &log).await;
    let job = job_span(&spans, &jid);
    assert_eq!(hex(&job.trace_id), TRACE_ID);
    assert_eq!(hex(&job.parent_span_id), PARENT_ID);
    assert_eq!(job.name, "default process");
    assert!(receiver.requests() >= 1);
}
