//! The response bodies the proxy hands to hyper: its own answers and
//! replicas' answers passing through, each holding what must live as long
//! as the response does (the client's request count, the access log's
//! tap, the replica's lease).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use crate::access_log::Tap;
use crate::proxy::connections::RequestHold;
use crate::proxy::leased::LeasedBody;
use crate::proxy::resumable::ResumableBody;
use crate::proxy::watched::WatchedStream;

/// A response body: the router's own answer, or a replica's passing
/// through (no box per response).
pub struct ProxyBody {
    pub(super) kind: BodyKind,
    /// Its request's hold on the connection, let go with the body.
    pub(super) hold: Option<RequestHold>,
    /// The access log's watch on it, when the log is on.
    pub(super) tap: Option<Box<Tap>>,
}

impl ProxyBody {
    /// A replica's answer ends: its lease goes, and the clock reading that
    /// ends its latency also ends its request's hold (instead of a reading
    /// of the hold's own).
    fn finish(kind: &mut BodyKind, hold: &mut Option<RequestHold>) {
        let ended = match kind {
            BodyKind::Replica(b) => b.finish(),
            BodyKind::Resumable(b) => b.finish(),
            BodyKind::Watched(b) => b.finish(),
            BodyKind::Own(_) => None,
        };
        if let (Some(ended), Some(hold)) = (ended, hold) {
            hold.ended = Some(ended);
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        ProxyBody::finish(&mut self.kind, &mut self.hold);
    }
}

pub(super) enum BodyKind {
    Own(Full<Bytes>),
    Replica(LeasedBody),
    /// A stream the router can continue elsewhere ([`ResumableBody`]).
    Resumable(Box<ResumableBody>),
    /// A stream it passes without following, watched for its end
    /// ([`WatchedStream`]).
    Watched(Box<WatchedStream>),
}

impl BodyKind {
    /// Ended by the router's error event rather than whole.
    fn cut(&self) -> bool {
        match self {
            BodyKind::Watched(b) => b.cut,
            BodyKind::Resumable(b) => b.ended_by_error(),
            BodyKind::Own(_) | BodyKind::Replica(_) => false,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let me = self.get_mut();
        let r = match &mut me.kind {
            BodyKind::Own(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            BodyKind::Replica(b) => Pin::new(b).poll_frame(cx),
            BodyKind::Resumable(b) => Pin::new(b.as_mut()).poll_frame(cx),
            BodyKind::Watched(b) => Pin::new(b.as_mut()).poll_frame(cx),
        };
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            ProxyBody::finish(&mut me.kind, &mut me.hold);
        }
        if let Some(tap) = &mut me.tap {
            if let BodyKind::Resumable(b) = &me.kind {
                tap.moved = b.moves();
            }
            match &r {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        tap.data(data);
                    }
                    // hyper stops polling a body that says it ended (a
                    // known length reached) and drops it: that is whole too.
                    if me.kind.is_end_stream() {
                        tap.end(!me.kind.cut());
                    }
                }
                Poll::Ready(None) => tap.end(!me.kind.cut()),
                Poll::Ready(Some(Err(_))) => tap.end(false),
                Poll::Pending => {}
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.kind.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Own(b) => b.size_hint(),
            BodyKind::Replica(b) => b.size_hint(),
            BodyKind::Resumable(_) | BodyKind::Watched(_) => SizeHint::default(),
        }
    }
}

impl BodyKind {
    fn is_end_stream(&self) -> bool {
        match self {
            BodyKind::Own(b) => b.is_end_stream(),
            BodyKind::Replica(b) => b.is_end_stream(),
            BodyKind::Resumable(b) => b.is_end_stream(),
            BodyKind::Watched(b) => b.is_end_stream(),
        }
    }
}
