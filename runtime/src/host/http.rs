//! `wasi:http/outgoing-handler`: the guest's outgoing requests.
//!
//! wasmtime-wasi-http implements the WASI types and streams; requests reach
//! the network through [`WasiHttpHooks::send_request`], which is where the
//! host's outgoing-request policy lives. [`HttpPolicy`] is that hook. Its
//! timeouts apply to every request a guest makes unless the guest asks for
//! shorter ones (`request-options`), so a guest cannot hang on a server that
//! never answers: connecting and waiting for the first byte are both bounded
//! by [`DEFAULT_TIMEOUT`].

use std::time::Duration;

use wasmtime_wasi_http::{RequestOptions, WasiHttpHooks};

/// Default bound on connecting and on waiting for response bytes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The outgoing-request hook installed in every job's store.
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    timeout: Duration,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl HttpPolicy {
    /// Fills in the timeouts the guest did not set, and caps the ones it did.
    fn options(&self, options: Option<RequestOptions>) -> RequestOptions {
        let mut options = options.unwrap_or_default();
        let cap = |t: Option<Duration>| Some(t.map_or(self.timeout, |t| t.min(self.timeout)));
        options.connect_timeout = cap(options.connect_timeout);
        options.first_byte_timeout = cap(options.first_byte_timeout);
        options.between_bytes_timeout = cap(options.between_bytes_timeout);
        options
    }
}

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<wasmtime_wasi_http::WasiBody>,
                    Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                )>,
            > + Send,
    > {
        _ = fut;
        let options = self.options(options);
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
            ))
        })
    }
}
