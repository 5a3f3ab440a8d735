//! The API's request bodies have a deadline: a client that sends its headers and then trickles
//! its body (or stops sending it) would otherwise hold a connection and one of the
//! `api.max_concurrent_requests` permits for ever. The whole body must arrive within
//! `api.body_read_timeout` of its headers; after that, reading it fails with [`BodyTimedOut`],
//! which the extractors answer 408 `request_timeout` (and hyper closes the connection, whose
//! body was not read to its end).

use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;

use crate::queue::Handover;

/// The body did not arrive within `api.body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within api.body_read_timeout")]
pub(crate) struct BodyTimedOut;

/// A request body that fails with [`BodyTimedOut`] once its deadline passes. The timer is armed
/// when the body is first read and it is still not complete, so a request without a body, or
/// whose body is never read, costs no timer.
pub(crate) struct DeadlineBody {
    inner: Body,
    deadline: tokio::time::Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl DeadlineBody {
    /// `inner` with a deadline `within` from now (the request's headers have just arrived).
    pub(crate) fn wrap(inner: Body, within: Duration) -> Body {
        Body::new(DeadlineBody { inner, deadline: tokio::time::Instant::now() + within, timer: None })
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut.into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether reading a body failed because its deadline passed (the error as axum's extractors
/// report it, with [`BodyTimedOut`] somewhere in its chain of sources).
pub(crate) fn timed_out(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<BodyTimedOut>() {
            return true;
        }
        next = error.source();
    }
    false
}

/// An answer's body that carries a grouped take's [`Handover`]: once the connection has taken
/// its last byte the messages are taken; dropped before that (the client left, the request
/// timed out, the connection failed before the body), they are released and keep their places.
pub(crate) struct HandoverBody {
    inner: Body,
    handover: Option<Handover>,
}

impl HandoverBody {
    /// `response` with its body carrying `handover`.
    pub(crate) fn wrap(response: Response, handover: Handover) -> Response {
        response.map(|inner| Body::new(HandoverBody { inner, handover: Some(handover) }))
    }
}

impl http_body::Body for HandoverBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for HandoverBody {
    fn drop(&mut self) {
        // hyper drops a body once it has taken its last frame (or at once, an empty one, as it
        // writes the head); it writes and flushes them in the same turn.
        if http_body::Body::is_end_stream(&self.inner)
            && let Some(handover) = self.handover.take()
        {
            handover.handed_over();
        }
    }
}
