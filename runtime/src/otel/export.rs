//! Where finished spans go: opentelemetry-otlp's span exporter over
//! OTLP/HTTP, on a hyper client with the runner's TLS stack (rustls,
//! webpki roots), so `https://` collectors work without a second HTTP
//! library; or over gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) on tonic's
//! channel, which is hyper too, with the same rustls and roots for
//! `https://`. Headers (`OTEL_EXPORTER_OTLP_HEADERS`, …) are the
//! exporter's in both cases (gRPC metadata over gRPC).
//!
//! [`Logged`] wraps it only to say when exports fail: the batch processor
//! drops a batch it could not send (the collector is down, slow or
//! refusing), and without its internal logs compiled in it would say
//! nothing. At most one line a minute, with the spans lost since the last.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use hyper_rustls::ConfigBuilderExt;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use super::settings::{Protocol, Settings};

/// Least time between two lines about failed exports.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The OTLP span exporter `settings` describe.
pub(super) fn exporter(settings: &Settings) -> Result<Logged<opentelemetry_otlp::SpanExporter>> {
    let exporter = match settings.protocol {
        Protocol::Grpc => grpc(settings)?,
        Protocol::Protobuf | Protocol::Json => http(settings)?,
    };
    Ok(Logged::new(exporter, settings.endpoint.clone()))
}

/// The exporter over gRPC. The channel connects lazily: a collector that
/// is down at start is reported by the first failed export, as over HTTP.
fn grpc(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(settings.timeout);
    if settings.endpoint.starts_with("https://") {
        builder = builder.with_tls_config(ClientTlsConfig::new().with_webpki_roots());
    }
    builder.build().context("cannot build the OTLP/gRPC span exporter")
}

/// The exporter over HTTP, protobuf or JSON.
fn http(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter> {
    let tls = rustls::ClientConfig::builder()
        .with_webpki_roots()
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(settings.timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let protocol = match settings.protocol {
        Protocol::Json => opentelemetry_otlp::Protocol::HttpJson,
        Protocol::Protobuf | Protocol::Grpc => opentelemetry_otlp::Protocol::HttpBinary,
    };
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(settings.endpoint.clone())
        .with_protocol(protocol)
        .with_timeout(settings.timeout)
        .with_http_client(HyperClient::new(connector, settings.timeout, None))
        .build()
        .context("cannot build the OTLP span exporter")
}

/// An exporter that logs its failures, at most once per [`REPORT_EVERY`].
#[derive(Debug)]
pub(super) struct Logged<E> {
    inner: E,
    endpoint: String,
    /// When the last line was written, and the spans lost since.
    failures: Mutex<(Option<Instant>, u64)>,
}

impl<E> Logged<E> {
    fn new(inner: E, endpoint: String) -> Self {
        Self {
            inner,
            endpoint,
            failures: Mutex::new((None, 0)),
        }
    }

    /// Counts `spans` lost to `error`; logs if the last line is old enough.
    fn failed(&self, spans: usize, error: &dyn std::fmt::Display) {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        failures.1 += spans as u64;
        if failures.0.is_some_and(|at| at.elapsed() < REPORT_EVERY) {
            return;
        }
        tracing::warn!(
            endpoint = %super::settings::shown(&self.endpoint),
            spans_dropped = failures.1,
            "cannot send traces: {error} (jobs are not affected; next report in a minute at most)"
        );
        *failures = (Some(Instant::now()), 0);
    }
}

impl<E: SpanExporter> SpanExporter for Logged<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            self.failed(spans, error);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::settings::{Propagation, Sampling};

    fn settings(protocol: Protocol, endpoint: &str) -> Settings {
        Settings {
            endpoint: endpoint.into(),
            protocol,
            timeout: Duration::from_secs(1),
            sampling: Sampling {
                ratio: 1.0,
                parent_based: true,
            },
            propagation: Propagation::default(),
        }
    }

    #[tokio::test]
    async fn every_protocol_builds_for_http_and_https() {
        for protocol in [Protocol::Protobuf, Protocol::Json, Protocol::Grpc] {
            for endpoint in ["http://127.0.0.1:4317", "https://collector.example:4317"] {
                let built = exporter(&settings(protocol, endpoint));
                assert!(built.is_ok(), "{protocol:?} {endpoint}: {:?}", built.err());
            }
        }
    }
}
