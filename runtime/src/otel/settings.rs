//! What `wasmjobs run` is told about tracing: its flags and the standard
//! `OTEL_*` variables, resolved once at start into [`Settings`] (or `None`:
//! tracing off).
//!
//! Tracing is on when `--otlp-endpoint` is given, or when
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set (and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`
//! says otherwise). The endpoint follows the OTLP/HTTP rules: the flag and
//! `OTEL_EXPORTER_OTLP_ENDPOINT` are a base URL to which `/v1/traces` is
//! appended, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is used as it is.
//! Sampling is parent-based with a ratio for root spans: `--otlp-sample`,
//! else `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, else 1.0.

use std::fmt;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

/// The tracing flags of `wasmjobs run`.
#[derive(Debug, Clone, Default, Args)]
pub struct OtelArgs {
    /// Send OpenTelemetry traces (one span per job, child spans for its
    /// HTTP requests, SQL statements and file opens) over OTLP/HTTP to this
    /// collector base URL (`/v1/traces` is appended), e.g.
    /// http://127.0.0.1:4318; over gRPC (to e.g. http://127.0.0.1:4317)
    /// with OTEL_EXPORTER_OTLP_PROTOCOL=grpc. Also on with
    /// OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Fraction of jobs traced (0.0–1.0) when the job's payload brings no
    /// sampling decision of its own; default 1.0, or OTEL_TRACES_SAMPLER(_ARG).
    #[arg(long, value_name = "RATIO")]
    pub otlp_sample: Option<f64>,
    /// How a job's span relates to the `traceparent` in its payload: its
    /// parent (child), a link from a new trace (link), or nothing (none).
    #[arg(long, value_enum, value_name = "STYLE", default_value_t)]
    pub otlp_propagation: Propagation,
}

/// How the context in a job's payload is used (the Ruby instrumentation's
/// `propagation_style`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Propagation {
    /// The payload's span is the job span's parent: one trace from the
    /// producer through the job.
    #[default]
    Child,
    /// The job span starts a new trace that links to the payload's span.
    Link,
    /// The payload's context is ignored.
    None,
}

impl fmt::Display for Propagation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Propagation::Child => "child",
            Propagation::Link => "link",
            Propagation::None => "none",
        })
    }
}

/// How root spans (and, for the non-parent-based samplers, all spans) are
/// sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Fraction of root traces recorded.
    pub ratio: f64,
    /// A sampled or unsampled parent decides for its children.
    pub parent_based: bool,
}

/// The OTLP transport and encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`, the default.
    Protobuf,
    /// `http/json`.
    Json,
    /// `grpc`: the `TraceService` over HTTP/2 (a collector's port 4317).
    Grpc,
}

/// Tracing, resolved: where spans go and which are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where spans go: the full URL they are posted to (`…/v1/traces`)
    /// over HTTP, the collector's base URL over gRPC.
    pub endpoint: String,
    /// The encoding.
    pub protocol: Protocol,
    /// Per export request.
    pub timeout: Duration,
    /// The sampler.
    pub sampling: Sampling,
    /// Child, link or none.
    pub propagation: Propagation,
}

/// The OTLP/HTTP path of traces under a base endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// `OTEL_EXPORTER_OTLP_TIMEOUT`'s default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl OtelArgs {
    /// The settings these flags and the process's environment select;
    /// `None` when tracing is off.
    pub fn settings(&self) -> Result<Option<Settings>> {
        self.resolve(|name| std::env::var(name).ok())
    }

    /// [`OtelArgs::settings`] with the environment read through `env`.
    pub(crate) fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>> {
        let env = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let protocol = match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            None => Protocol::Protobuf,
            Some(p) if p.eq_ignore_ascii_case("http/protobuf") => Protocol::Protobuf,
            Some(p) if p.eq_ignore_ascii_case("http/json") => Protocol::Json,
            Some(p) if p.eq_ignore_ascii_case("grpc") => Protocol::Grpc,
            Some(p) => bail!("OTEL_EXPORTER_OTLP_PROTOCOL={p}: wasmjobs knows http/protobuf, http/json and grpc"),
        };
        // Over HTTP a base URL gets the signal's path; gRPC names the
        // service in the request, so its URL is the collector's as given.
        let base = |url: &str, source: &str| match protocol {
            Protocol::Grpc => checked_url(url.trim_end_matches('/'), source),
            Protocol::Protobuf | Protocol::Json => with_traces_path(url, source),
        };
        let endpoint = match &self.otlp_endpoint {
            Some(url) => base(url, "--otlp-endpoint")?,
            None => {
                let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
                    || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
                match (
                    env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
                    env("OTEL_EXPORTER_OTLP_ENDPOINT"),
                ) {
                    _ if disabled => return Ok(None),
                    (Some(full), _) => checked_url(&full, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?,
                    (None, Some(url)) => base(&url, "OTEL_EXPORTER_OTLP_ENDPOINT")?,
                    (None, None) => return Ok(None),
                }
            }
        };
        let timeout = env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let sampling = match self.otlp_sample {
            Some(ratio) if (0.0..=1.0).contains(&ratio) => Sampling {
                ratio,
                parent_based: true,
            },
            Some(ratio) => bail!("--otlp-sample {ratio}: the ratio must be between 0.0 and 1.0"),
            None => sampler_from_env(env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG"))?,
        };
        Ok(Some(Settings {
            endpoint,
            protocol,
            timeout,
            sampling,
            propagation: self.otlp_propagation,
        }))
    }
}

/// The sampler `OTEL_TRACES_SAMPLER` names (the spec's values the SDK
/// implements); unset is `parentbased_always_on`.
fn sampler_from_env(sampler: Option<String>, arg: Option<String>) -> Result<Sampling> {
    let ratio = || -> Result<f64> {
        match arg.as_deref().map(str::parse::<f64>) {
            None => Ok(1.0),
            Some(Ok(ratio)) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
            Some(_) => bail!(
                "OTEL_TRACES_SAMPLER_ARG={}: the ratio must be between 0.0 and 1.0",
                arg.as_deref().unwrap_or_default()
            ),
        }
    };
    let (ratio, parent_based) = match sampler.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("parentbased_always_on") => (1.0, true),
        Some("parentbased_always_off") => (0.0, true),
        Some("parentbased_traceidratio") => (ratio()?, true),
        Some("always_on") => (1.0, false),
        Some("always_off") => (0.0, false),
        Some("traceidratio") => (ratio()?, false),
        Some(other) => bail!(
            "OTEL_TRACES_SAMPLER={other}: wasmjobs knows always_on, always_off, traceidratio and their parentbased_ forms"
        ),
    };
    Ok(Sampling { ratio, parent_based })
}

/// `base` with `/v1/traces` appended (unless it already ends so).
fn with_traces_path(base: &str, source: &str) -> Result<String> {
    let trimmed = base.trim_end_matches('/');
    if trimmed.ends_with(TRACES_PATH) {
        return checked_url(trimmed, source);
    }
    checked_url(&format!("{trimmed}{TRACES_PATH}"), source)
}

/// `url` if it is an `http://` or `https://` URL with a host.
fn checked_url(url: &str, source: &str) -> Result<String> {
    let parsed: http::Uri = match url.parse() {
        Ok(uri) => uri,
        Err(err) => bail!("{source}: {url:?} is not a URL: {err}"),
    };
    match (parsed.scheme_str(), parsed.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(url.to_owned()),
        _ => bail!("{source}: {url:?} must be an http:// or https:// URL with a host"),
    }
}

/// `url` without user info (credentials) for the log.
pub(crate) fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() || !parsed.username().is_empty() {
                let _ = parsed.set_password(None);
                let _ = parsed.set_username("***");
            }
            crate::redact::query_passwords(&mut parsed);
            parsed.to_string()
        }
        Err(_) => crate::redact::scheme_only(url),
    }
}

impl fmt::Display for Settings {
    /// What the start-up line says: where spans go, how, which are kept.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = match self.protocol {
            Protocol::Protobuf => "http/protobuf",
            Protocol::Json => "http/json",
            Protocol::Grpc => "grpc",
        };
        let sampler = if self.sampling.parent_based {
            "of root traces, the payload's decision otherwise"
        } else {
            "of all traces"
        };
        write!(
            f,
            "traces to {} ({protocol}), sampling {} {sampler}, propagation {}",
            shown(&self.endpoint),
            self.sampling.ratio,
            self.propagation
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(args: &OtelArgs, env: &[(&str, &str)]) -> Result<Option<Settings>> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        args.resolve(|name| env.get(name).cloned())
    }

    fn flag(endpoint: &str) -> OtelArgs {
        OtelArgs {
            otlp_endpoint: Some(endpoint.into()),
            ..OtelArgs::default()
        }
    }

    #[test]
    fn off_without_a_flag_or_an_endpoint_variable() {
        assert_eq!(resolve(&OtelArgs::default(), &[]).unwrap(), None);
        assert_eq!(
            resolve(&OtelArgs::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap(),
            None
        );
        let disabled = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ];
        assert_eq!(resolve(&OtelArgs::default(), &disabled).unwrap(), None);
        let none = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        assert_eq!(resolve(&OtelArgs::default(), &none).unwrap(), None);
    }

    #[test]
    fn endpoints_follow_the_otlp_http_rules() {
        let endpoint = |args: &OtelArgs, env: &[(&str, &str)]| resolve(args, env).unwrap().unwrap().endpoint;
        assert_eq!(endpoint(&flag("http://c:4318"), &[]), "http://c:4318/v1/traces");
        assert_eq!(endpoint(&flag("http://c:4318/"), &[]), "http://c:4318/v1/traces");
        assert_eq!(
            endpoint(&flag("http://c:4318/v1/traces"), &[]),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            endpoint(
                &flag("https://c/otlp"),
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other")]
            ),
            "https://c/otlp/v1/traces",
            "the flag wins"
        );
        assert_eq!(
            endpoint(
                &OtelArgs::default(),
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]
            ),
            "http://c:4318/v1/traces"
        );
        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/custom"),
        ];
        assert_eq!(
            endpoint(&OtelArgs::default(), &both),
            "http://t:9/custom",
            "the traces variable is used as it is"
        );
        for bad in ["c:4318", "ftp://c", "not a url", "http://"] {
            assert!(resolve(&flag(bad), &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn sampling_comes_from_the_flag_then_the_variables() {
        let sampling = |args: &OtelArgs, env: &[(&str, &str)]| resolve(args, env).unwrap().unwrap().sampling;
        let mut args = flag("http://c");
        assert_eq!(
            sampling(&args, &[]),
            Sampling {
                ratio: 1.0,
                parent_based: true
            }
        );
        let env = [
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ];
        assert_eq!(
            sampling(&args, &env),
            Sampling {
                ratio: 0.25,
                parent_based: false
            }
        );
        args.otlp_sample = Some(0.01);
        assert_eq!(
            sampling(&args, &env),
            Sampling {
                ratio: 0.01,
                parent_based: true
            }
        );
        args.otlp_sample = Some(1.5);
        assert!(resolve(&args, &[]).is_err());
        args.otlp_sample = None;
        assert!(resolve(&args, &[("OTEL_TRACES_SAMPLER", "xray")]).is_err());
        assert!(
            resolve(
                &args,
                &[
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "x")
                ]
            )
            .is_err()
        );
    }

    #[test]
    fn protocol_and_timeout_come_from_the_variables() {
        let settings = resolve(
            &flag("http://c"),
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(settings.protocol, Protocol::Json);
        assert_eq!(settings.timeout, Duration::from_millis(2500));
        let grpc = resolve(
            &flag("http://c:4317/"),
            &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")],
        )
        .expect("grpc")
        .expect("on");
        assert_eq!(
            (grpc.protocol, grpc.endpoint.as_str()),
            (Protocol::Grpc, "http://c:4317")
        );
        let env_grpc = resolve(
            &OtelArgs::default(),
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "GRPC"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317"),
            ],
        )
        .expect("grpc from the environment")
        .expect("on");
        assert_eq!(env_grpc.endpoint, "https://c:4317", "no /v1/traces over gRPC");
        let other = resolve(&flag("http://c"), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]);
        assert!(
            other
                .unwrap_err()
                .to_string()
                .contains("http/protobuf, http/json and grpc")
        );
    }

    #[test]
    fn the_start_line_hides_credentials() {
        let settings = resolve(&flag("https://user:secret@c:4318"), &[]).unwrap().unwrap();
        let line = settings.to_string();
        assert!(!line.contains("secret"), "{line}");
        assert!(
            line.contains("sampling 1 of root traces") && line.contains("propagation child"),
            "{line}"
        );
    }
}
