//! Connecting only to public addresses, for requests granted by name.
//!
//! Two layers, both on the path of the connection itself rather than on a
//! separate lookup (which DNS rebinding would defeat):
//!
//! - [`PublicResolver`] resolves with the system resolver, like hyper's
//!   default, and drops the addresses [`prohibited`] names, so a name with
//!   both public and private addresses connects to a public one; a name
//!   with only private ones fails with [`Prohibited`] before any connect.
//! - [`CheckedConnector`] looks at the peer address of every TCP connection
//!   it opens (the resolver is skipped for IP-literal hosts, e.g. when a
//!   `*.0.0.1` rule matches `127.0.0.1`) and drops the connection, with
//!   [`Prohibited`], if it is in a prohibited range.
//!
//! TLS runs on top of the checked connection, so HTTPS is covered alike.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::address::prohibited;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A connection refused because of the address it would reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prohibited {
    /// The host the request named.
    pub host: String,
    /// The address it resolved or connected to (the first, when a name had
    /// only prohibited addresses).
    pub addr: IpAddr,
    /// The range `addr` is in.
    pub range: &'static str,
}

impl fmt::Display for Prohibited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is {}, in the prohibited {} range",
            self.host, self.addr, self.range
        )
    }
}

impl std::error::Error for Prohibited {}

/// The system resolver, without prohibited addresses.
#[derive(Clone)]
pub(crate) struct PublicResolver {
    inner: GaiResolver,
}

impl PublicResolver {
    /// Over the system resolver (`getaddrinfo` on a blocking thread).
    pub(crate) fn new() -> Self {
        Self {
            inner: GaiResolver::new(),
        }
    }
}

impl Service<Name> for PublicResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = name.as_str().to_owned();
        let lookup = self.inner.call(name);
        Box::pin(async move {
            let all: Vec<SocketAddr> = lookup.await?.collect();
            let public: Vec<SocketAddr> = all.iter().copied().filter(|a| prohibited(a.ip()).is_none()).collect();
            match (public.is_empty(), all.first()) {
                (true, Some(first)) => Err(Box::new(Prohibited {
                    host,
                    addr: first.ip(),
                    range: prohibited(first.ip()).unwrap_or("prohibited"),
                }) as BoxError),
                _ => Ok(public.into_iter()),
            }
        })
    }
}

/// An [`HttpConnector`] over [`PublicResolver`] that also refuses
/// connections whose peer is in a prohibited range.
#[derive(Clone)]
pub(crate) struct CheckedConnector {
    inner: HttpConnector<PublicResolver>,
}

impl CheckedConnector {
    /// Wraps `inner`.
    pub(crate) fn new(inner: HttpConnector<PublicResolver>) -> Self {
        Self { inner }
    }
}

impl Service<http::Uri> for CheckedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let host = uri.host().unwrap_or_default().to_owned();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let stream = connecting.await?;
            let peer = stream
                .inner()
                .peer_addr()
                .map_err(|e| io::Error::new(e.kind(), format!("peer address of the connection to {host}: {e}")))?;
            match prohibited(peer.ip()) {
                // Dropping the stream closes the connection before a byte is sent.
                Some(range) => Err(Box::new(Prohibited {
                    host,
                    addr: peer.ip(),
                    range,
                }) as BoxError),
                None => Ok(stream),
            }
        })
    }
}
