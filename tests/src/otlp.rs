//! A real OTLP/HTTP trace receiver on loopback: `POST /v1/traces` with an
//! `ExportTraceServiceRequest` in protobuf, decoded with the
//! OpenTelemetry protobuf definitions (`opentelemetry-proto`), answered
//! with an empty `ExportTraceServiceResponse` as a collector does; or the
//! same service over gRPC ([`OtlpReceiver::start_grpc`]: the generated
//! `TraceService` server, on tonic). The tests read the spans it received;
//! the benchmarks use it as a sink that only counts
//! ([`OtlpReceiver::start_counting`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// A span as received, with the `service.name` of its resource.
#[derive(Debug, Clone)]
pub struct Received {
    /// The resource's `service.name`.
    pub service: String,
    /// The span.
    pub span: Span,
}

/// A running receiver; stops when the runtime that started it stops.
pub struct OtlpReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

impl OtlpReceiver {
    /// Starts a receiver that decodes and keeps every span.
    pub async fn start() -> Self {
        Self::start_with(true).await
    }

    /// Starts a receiver that only counts requests and bytes (a sink for
    /// benchmarks: no decoding on the machine's cores).
    pub async fn start_counting() -> Self {
        Self::start_with(false).await
    }

    async fn start_with(decode: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("receiver address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicUsize::new(0));
        let (kept, counted, sized) = (spans.clone(), requests.clone(), bytes.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (kept, counted, sized) = (kept.clone(), counted.clone(), sized.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let (kept, counted, sized) = (kept.clone(), counted.clone(), sized.clone());
                        async move { Ok::<_, Infallible>(receive(request, decode, &kept, &counted, &sized).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            spans,
            requests,
            bytes,
        }
    }

    /// Starts a receiver of OTLP over gRPC that decodes and keeps every
    /// span (a collector's port 4317).
    pub async fn start_grpc() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP/gRPC receiver");
        let addr = listener.local_addr().expect("receiver address");
        let receiver = Self {
            addr,
            spans: Arc::new(Mutex::new(Vec::new())),
            requests: Arc::new(AtomicUsize::new(0)),
            bytes: Arc::new(AtomicUsize::new(0)),
        };
        let service = GrpcTraces {
            spans: receiver.spans.clone(),
            requests: receiver.requests.clone(),
        };
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
            if let Err(err) = served {
                eprintln!("OTLP/gRPC receiver: {err}");
            }
        });
        receiver
    }

    /// The base URL to give `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Export requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// Request body bytes received so far.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

async fn receive(
    request: Request<Incoming>,
    decode: bool,
    kept: &Mutex<Vec<Received>>,
    requests: &AtomicUsize,
    bytes: &AtomicUsize,
) -> Response<Full<Bytes>> {
    let respond = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/x-protobuf"),
        );
        response
    };
    if request.method() != hyper::Method::POST || request.uri().path() != "/v1/traces" {
        return respond(StatusCode::NOT_FOUND, Vec::new());
    }
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return respond(StatusCode::BAD_REQUEST, Vec::new());
    };
    requests.fetch_add(1, Ordering::Relaxed);
    bytes.fetch_add(body.len(), Ordering::Relaxed);
    if decode {
        let Ok(export) = ExportTraceServiceRequest::decode(body) else {
            return respond(StatusCode::BAD_REQUEST, Vec::new());
        };
        keep(export, kept);
    }
    respond(StatusCode::OK, Vec::new())
}

/// Keeps the spans of `export` in `kept`.
fn keep(export: ExportTraceServiceRequest, kept: &Mutex<Vec<Received>>) {
    let mut spans = kept.lock().unwrap_or_else(PoisonError::into_inner);
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| text(&r.attributes, "service.name"))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            spans.extend(scope.spans.into_iter().map(|span| Received {
                service: service.clone(),
                span,
            }));
        }
    }
}

/// The `TraceService` of the gRPC receiver.
struct GrpcTraces {
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl TraceService for GrpcTraces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        keep(request.into_inner(), &self.spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The attribute `key` of `attributes`, as it was sent.
pub fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

/// A string attribute.
pub fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key) {
        Some(any_value::Value::StringValue(text)) => Some(text.clone()),
        _ => None,
    }
}

/// An integer attribute.
pub fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key) {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

/// Bytes as lowercase hex (trace and span ids).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
