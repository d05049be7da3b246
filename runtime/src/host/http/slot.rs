//! A job's open requests, counted until their response body is done.
//!
//! A request takes a [`Slot`] from its job's counter when it is sent and
//! keeps it while it waits for the response head, then inside the response
//! body ([`HeldBody`]) until the body has been read to its end, has failed,
//! or is dropped (the guest dropped the response unread). So a guest that
//! keeps responses without reading them holds its slots, and at
//! [`super::HttpLimits::per_job`] open the next request is refused.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::{Error, WasiBody};

use crate::otel::HostSpan;

/// One of a job's open requests; released when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a slot from `open` if fewer than `limit` are taken.
    pub(crate) fn take(open: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Self(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body holding its request's [`Slot`] (and span, which ends
/// with it) until it is done.
pub(crate) struct HeldBody {
    inner: WasiBody,
    slot: Option<(Slot, HostSpan)>,
}

impl HeldBody {
    /// Wraps `inner`; an already finished body releases `slot` and ends
    /// `span` at once.
    pub(crate) fn new(inner: WasiBody, slot: Slot, span: HostSpan) -> Self {
        let slot = (!inner.is_end_stream()).then_some((slot, span));
        Self { inner, slot }
    }
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None | Some(Err(_))) => self.slot = None,
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.slot = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;

    fn open_count(open: &Arc<AtomicUsize>) -> usize {
        open.load(Ordering::Acquire)
    }

    /// A body of two chunks whose end is only known after the last poll.
    fn streamed() -> WasiBody {
        let frames = [
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
        ];
        StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    #[test]
    fn slots_are_bounded_and_released_on_drop() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<Slot> = (0..3).filter_map(|_| Slot::take(&open, 2)).collect();
        assert_eq!(slots.len(), 2);
        assert_eq!(open_count(&open), 2);
        drop(slots);
        assert_eq!(open_count(&open), 0);
        assert!(Slot::take(&open, 2).is_some());
    }

    #[tokio::test]
    async fn a_body_holds_its_slot_until_read_to_the_end() {
        let open = Arc::new(AtomicUsize::new(0));
        let slot = Slot::take(&open, 1).unwrap();
        let mut body = HeldBody::new(streamed(), slot, HostSpan::default());
        assert!(Slot::take(&open, 1).is_none(), "held while unread");
        assert!(body.frame().await.is_some());
        assert_eq!(open_count(&open), 1, "held while partly read");
        assert!(body.frame().await.is_some());
        assert!(body.frame().await.is_none());
        assert_eq!(open_count(&open), 0, "released at the end, before the body is dropped");
        drop(body);
        assert_eq!(open_count(&open), 0, "released once");
    }

    #[test]
    fn a_body_dropped_unread_releases_its_slot() {
        let open = Arc::new(AtomicUsize::new(0));
        let body = HeldBody::new(streamed(), Slot::take(&open, 1).unwrap(), HostSpan::default());
        assert_eq!(open_count(&open), 1);
        drop(body);
        assert_eq!(open_count(&open), 0);
    }

    #[test]
    fn an_empty_body_releases_at_once() {
        let open = Arc::new(AtomicUsize::new(0));
        let empty = Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync();
        let body = HeldBody::new(empty, Slot::take(&open, 1).unwrap(), HostSpan::default());
        assert_eq!(open_count(&open), 0);
        drop(body);
        assert_eq!(open_count(&open), 0);
    }
}
