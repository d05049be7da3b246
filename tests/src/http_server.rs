//! A small HTTP server on loopback for jobs to call: HTTP/1.1, or HTTP/2
//! with prior knowledge ([`HttpServer::start_h2`], what a manifest rule
//! with `h2 = true` speaks over plain `http://`).
//!
//! Routes: `/ok` answers 200 `hello`; `/status/NNN` answers that status;
//! `/sleep` waits the configured delay, then answers 200 (the seed
//! benchmark's 200 ms endpoint); `/big/N` answers N bytes; `/gate` waits
//! until the test opens the gate ([`HttpServer::open_gate`]), then answers
//! 200, so a job calling it stays in flight as long as the test needs and
//! each call marks a start of the job ([`HttpServer::gate_hits`]); the
//! gate can be shut again for the next round ([`HttpServer::close_gate`]);
//! `/echo` answers 200 with what it received: the method, the `x-*` and
//! `content-*` headers (one `name: value` line each, in order), a blank
//! line and the body, and sets `x-echo: yes`.
//! Both modes serve every route. Every request and every connection is
//! counted, and so are the requests open now and the most open at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpSocket;
use tokio::sync::watch;

/// Connections the kernel may queue before `accept` (capped by
/// `net.core.somaxconn`, 4,096 on Debian 12).
const BACKLOG: u32 = 16_384;

/// A running server; stops when the runtime that started it stops.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    open: Arc<OpenRequests>,
    gate: Arc<Gate>,
}

/// The `/gate` route: closed until the test opens it; counts its callers.
struct Gate {
    open: watch::Sender<bool>,
    hits: AtomicUsize,
}

impl Gate {
    /// Counts the call, then waits until the gate is open.
    async fn pass(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open.subscribe();
        // The sender lives as long as the server: an error cannot happen.
        let _ = open.wait_for(|&open| open).await;
    }
}

/// Requests being answered now, and the most there ever were.
#[derive(Default)]
struct OpenRequests {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// Counts one request as open until dropped.
struct Open(Arc<OpenRequests>);

impl Open {
    fn new(open: &Arc<OpenRequests>) -> Self {
        let now = open.now.fetch_add(1, Ordering::Relaxed) + 1;
        open.peak.fetch_max(now, Ordering::Relaxed);
        Self(open.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HttpServer {
    /// Starts an HTTP/1.1 server whose `/sleep` route waits `delay`.
    pub async fn start(delay: Duration) -> Self {
        Self::start_with(delay, None).await
    }

    /// Starts an HTTP/2-only server (prior knowledge, no upgrade) whose
    /// `/sleep` route waits `delay` and which allows `max_streams`
    /// concurrent requests per connection.
    pub async fn start_h2(delay: Duration, max_streams: u32) -> Self {
        Self::start_with(delay, Some(max_streams)).await
    }

    async fn start_with(delay: Duration, h2: Option<u32>) -> Self {
        // A deep accept backlog: a burst of 10,000 connects against tokio's
        // default of 1,024 overflows it, and each dropped SYN is retried
        // by the client's kernel only after a second, which would measure
        // the server's backlog rather than the runner.
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("loopback address"))
            .expect("bind loopback");
        let listener = socket.listen(BACKLOG).expect("listen");
        let addr = listener.local_addr().expect("local addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(OpenRequests::default());
        let gate = Arc::new(Gate {
            open: watch::Sender::new(false),
            hits: AtomicUsize::new(0),
        });
        let gates = gate.clone();
        let counter = hits.clone();
        let accepted = connections.clone();
        let requests = open.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                let counter = counter.clone();
                let requests = requests.clone();
                let gates = gates.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let counter = counter.clone();
                        let requests = requests.clone();
                        let gate = gates.clone();
                        async move {
                            counter.fetch_add(1, Ordering::Relaxed);
                            let _open = Open::new(&requests);
                            if req.uri().path() == "/echo" {
                                return Ok::<_, Infallible>(echo(req).await);
                            }
                            if req.uri().path() == "/gate" {
                                gate.pass().await;
                                return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"opened"))));
                            }
                            Ok::<_, Infallible>(respond(req.uri().path(), delay).await)
                        }
                    });
                    let io = TokioIo::new(stream);
                    let _ = match h2 {
                        Some(streams) => {
                            http2::Builder::new(TokioExecutor::new())
                                .max_concurrent_streams(streams)
                                .serve_connection(io, service)
                                .await
                        }
                        None => http1::Builder::new().serve_connection(io, service).await,
                    };
                });
            }
        });
        Self {
            addr,
            hits,
            connections,
            open,
            gate,
        }
    }

    /// Calls of `/gate` so far (answered or still waiting).
    pub fn gate_hits(&self) -> usize {
        self.gate.hits.load(Ordering::Relaxed)
    }

    /// Opens `/gate`: the calls waiting on it are answered, and later ones
    /// pass at once.
    pub fn open_gate(&self) {
        self.gate.open.send_replace(true);
    }

    /// Shuts `/gate` again: calls from now on wait for the next
    /// [`HttpServer::open_gate`] (calls already let through are not held).
    pub fn close_gate(&self) {
        self.gate.open.send_replace(false);
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests being answered now (on `/gate`: those the gate holds).
    pub fn open_requests(&self) -> usize {
        self.open.now.load(Ordering::Relaxed)
    }

    /// The most requests that were being answered at the same moment:
    /// shows that jobs overlapped, without timing them.
    pub fn peak_open_requests(&self) -> usize {
        self.open.peak.load(Ordering::Relaxed)
    }
}

async fn echo(req: Request<Incoming>) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    let mut text = format!("{}\n", parts.method);
    for (name, value) in &parts.headers {
        if name.as_str().starts_with("x-") || name.as_str().starts_with("content-") {
            text.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
        }
    }
    text.push('\n');
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut echoed = text.into_bytes();
    echoed.extend_from_slice(&body);
    let mut response = Response::new(Full::new(Bytes::from(echoed)));
    response
        .headers_mut()
        .insert("x-echo", hyper::header::HeaderValue::from_static("yes"));
    response
}

async fn respond(path: &str, delay: Duration) -> Response<Full<Bytes>> {
    if let Some(size) = path.strip_prefix("/big/").and_then(|n| n.parse::<usize>().ok()) {
        return Response::new(Full::new(Bytes::from(vec![b'x'; size])));
    }
    let (status, body) = if path == "/ok" {
        (StatusCode::OK, "hello")
    } else if path == "/sleep" {
        tokio::time::sleep(delay).await;
        (StatusCode::OK, "slept")
    } else if let Some(code) = path.strip_prefix("/status/").and_then(|c| c.parse::<u16>().ok()) {
        (StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST), "status")
    } else {
        (StatusCode::NOT_FOUND, "not found")
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;

    use super::*;

    /// Waits (up to 10 s) until `server` answers `want` requests at once.
    async fn until_open(server: &HttpServer, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.open_requests() != want {
            assert!(
                Instant::now() < deadline,
                "{} requests open, expected {want}",
                server.open_requests()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The gate holds calls in either mode, counts them as open, lets them
    /// through when opened, and holds the next round once shut again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_gate_holds_opens_and_shuts_again_over_http1_and_http2() {
        for h2 in [false, true] {
            let server = if h2 {
                HttpServer::start_h2(Duration::from_millis(1), 100).await
            } else {
                HttpServer::start(Duration::from_millis(1)).await
            };
            let client = Client::builder(TokioExecutor::new())
                .http2_only(h2)
                .build_http::<Empty<Bytes>>();
            let get = |client: &Client<_, Empty<Bytes>>| {
                let (client, uri) = (client.clone(), server.url("/gate").parse::<hyper::Uri>().expect("uri"));
                tokio::spawn(async move {
                    let response = client.get(uri).await.expect("GET /gate");
                    assert_eq!(response.status(), StatusCode::OK);
                    response.into_body().collect().await.expect("body").to_bytes()
                })
            };

            server.close_gate();
            let first: Vec<_> = (0..3).map(|_| get(&client)).collect();
            until_open(&server, 3).await;
            assert_eq!(server.gate_hits(), 3);
            server.open_gate();
            for call in first {
                assert_eq!(call.await.expect("call"), "opened");
            }
            until_open(&server, 0).await;

            server.close_gate();
            let second = get(&client);
            until_open(&server, 1).await;
            assert!(!second.is_finished(), "a call passed the shut gate (h2: {h2})");
            server.open_gate();
            assert_eq!(second.await.expect("call"), "opened");
            assert_eq!(server.hits(), 4);
            if h2 {
                assert_eq!(server.connections(), 1, "HTTP/2 calls share one connection");
            }
        }
    }
}
