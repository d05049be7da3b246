//! OpenTelemetry traces: one span per job, child spans for its host calls,
//! the producer's context taken from the payload and passed on to the
//! services the job calls.
//!
//! Design:
//! - **The OpenTelemetry API and SDK directly**, not through `tracing`:
//!   the spans are few and known (job, HTTP request, SQL statement, file
//!   open), and a span the sampler drops is then non-recording and costs a
//!   few hundred nanoseconds, whatever the log filter says.
//! - **Off by default, one branch when off**: without `--otlp-endpoint` or
//!   an `OTEL_EXPORTER_OTLP_*ENDPOINT` ([`settings`]) there is no
//!   [`Tracing`], and the runner's only cost per job is testing an
//!   `Option`. The host capabilities then get no [`JobTrace`] and leave the
//!   guest's headers alone.
//! - **Who opens which span**: the runner owns the job span
//!   ([`job`]; it knows the queue, the retry count, the plugin and the
//!   outcome) and hands its context, as a [`JobTrace`], to the executor,
//!   which puts it in the job's per-job views (HTTP policy, SQL view,
//!   budgeted filesystem). The host capabilities open the child spans
//!   ([`host`]). Nothing here knows Wasmtime or Redis.
//! - **Parent from the payload**: the top-level `traceparent`,
//!   `tracestate` and `baggage` fields, as the Ruby OpenTelemetry Sidekiq
//!   instrumentation writes them ([`carrier`]), through the W3C
//!   TraceContext and Baggage propagators. `--otlp-propagation child`
//!   (default: the issue asks for the payload's span as parent), `link`
//!   (the Ruby gem's default: a new trace linking to it) or `none`. A
//!   malformed context is ignored (a new root), never a failed job.
//! - **Sampling**: parent-based, with `--otlp-sample RATIO` (or
//!   `OTEL_TRACES_SAMPLER(_ARG)`) for root spans; a payload's sampled flag
//!   decides for its job.
//! - **Export**: opentelemetry-otlp over OTLP/HTTP ([`export`]), from the
//!   SDK's batch span processor running as a task on the runner's tokio
//!   runtime (queue of 16,384 spans, batches of 2,048, unless
//!   `OTEL_BSP_*` says otherwise). A collector that is down costs jobs
//!   nothing: full batches are dropped, failures logged once a minute.
//!   [`Tracing::shutdown`] flushes what is left when `run` stops.

mod carrier;
pub(crate) mod export;
pub(crate) mod host;
pub(crate) mod job;
pub(crate) mod settings;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Key, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider};

pub(crate) use host::{HostSpan, JobTrace};
pub(crate) use job::JobSpan;
pub(crate) use settings::{OtelArgs, Settings};

/// Spans queued for export at most (`OTEL_BSP_MAX_QUEUE_SIZE` overrides).
const QUEUE: usize = 16_384;
/// Spans per export request at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` overrides).
const BATCH: usize = 2_048;

/// Tracing, on: the SDK's provider (with its batch processor and exporter)
/// and the tracer every span comes from.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    settings: Settings,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").field("settings", &self.settings).finish()
    }
}

impl Tracing {
    /// Starts tracing if `args` (or the `OTEL_*` variables) turn it on.
    /// Must run on the tokio runtime: the batch processor is a task of it.
    pub fn from_args(args: &OtelArgs) -> Result<Option<Arc<Self>>> {
        Ok(match args.settings()? {
            Some(settings) => Some(Arc::new(Self::start(settings)?)),
            None => None,
        })
    }

    /// Starts exporting as `settings` say, and logs where traces go.
    pub fn start(settings: Settings) -> Result<Self> {
        let exporter = export::exporter(&settings)?;
        let unset = |name: &str| std::env::var_os(name).is_none();
        let mut batch = BatchConfigBuilder::default().with_max_export_timeout(settings.timeout);
        if unset("OTEL_BSP_MAX_QUEUE_SIZE") {
            batch = batch.with_max_queue_size(QUEUE);
        }
        if unset("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            batch = batch.with_max_export_batch_size(BATCH);
        }
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
            .with_batch_config(batch.build())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(&settings))
            .with_resource(resource())
            .build();
        let tracer = provider.tracer("wasmjobs");
        tracing::info!("tracing: {settings}");
        Ok(Self {
            provider,
            tracer,
            settings,
        })
    }

    /// Starts the span of a job (see [`job`]).
    pub(crate) fn job_span(&self, start: &job::Start<'_>) -> JobSpan {
        job::start(&self.tracer, self.settings.propagation, start)
    }

    /// Exports the spans still queued and stops; waits at most the export
    /// timeout and a second. The SDK's shutdown blocks its thread until the
    /// batch task has answered, so it runs on a blocking thread, never on a
    /// runtime worker (with `--threads 1` that would stall the task).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        let limit = self.settings.timeout + Duration::from_secs(1);
        let flushing = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(limit, flushing).await {
            Ok(Ok(Ok(()))) => tracing::debug!("traces flushed"),
            Ok(Ok(Err(err))) => tracing::warn!("flushing traces at exit: {err}"),
            Ok(Err(err)) => tracing::warn!("flushing traces at exit: {err}"),
            Err(_) => tracing::warn!("traces not flushed within {limit:?}: the last spans are lost"),
        }
    }
}

/// Parent-based (or not) ratio sampling, as `settings` say.
fn sampler(settings: &Settings) -> Sampler {
    let ratio = settings.sampling.ratio;
    let root = if ratio >= 1.0 {
        Sampler::AlwaysOn
    } else if ratio <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::TraceIdRatioBased(ratio)
    };
    match settings.sampling.parent_based {
        true => Sampler::ParentBased(Box::new(root)),
        false => root,
    }
}

/// The process's resource: the SDK's detectors (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`), with `service.name` "wasmjobs" unless one
/// of them names the service.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        return detected;
    }
    Resource::builder()
        .with_attributes([KeyValue::new("service.name", "wasmjobs")])
        .build()
}
