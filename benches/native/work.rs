//! What a job does, natively: `NoopJob` nothing, `HttpGetJob` one GET with
//! the client stack of the runner's host (`runtime/src/host/http/client.rs`),
//! over HTTP/1.1 keep-alive or, with `--h2`, over HTTP/2 with prior
//! knowledge (the runner's pool for an `h2 = true` rule).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wasmjobs::redis::payload::Payload;

/// The runner's default bound on connecting and waiting for the response head.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The runner's default idle connections per host, raised to the concurrency.
const IDLE_PER_HOST: usize = 1024;

/// The pooled client, built as the runner's host builds its *open* pools
/// (the ones a `127.0.0.1` rule uses).
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A client keeping as many idle connections per host as `concurrency`
/// (at least 1,024), as the runner's executor sets it; with `h2`, plain
/// `http://` speaks HTTP/2 with prior knowledge (`http2_only`), as the
/// runner's pool for an `h2 = true` rule does.
pub fn http_client(concurrency: usize, h2: bool) -> HttpClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(IDLE_PER_HOST.max(concurrency))
        .http2_only(h2)
        .build(connector)
}

/// Runs the job `raw`; returns whether it succeeded.
pub async fn perform(client: &HttpClient, raw: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(raw) else {
        return false;
    };
    let Ok(job) = Payload::parse(text) else {
        return false;
    };
    match job.class() {
        "NoopJob" => true,
        // The async plugin's jobs do the same GET.
        "HttpGetJob" | "AsyncHttpGetJob" => match job
            .get("args")
            .and_then(|args| args.get(0))
            .and_then(|url| url.as_str())
        {
            Some(url) => get(client, url).await,
            None => false,
        },
        _ => false,
    }
}

/// GETs `url` and reads the body to the end; true on a 2xx status.
async fn get(client: &HttpClient, url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    let response = match tokio::time::timeout(TIMEOUT, client.get(uri)).await {
        Ok(Ok(response)) => response,
        _ => return false,
    };
    let ok = response.status().is_success();
    ok && response.into_body().collect().await.is_ok()
}
