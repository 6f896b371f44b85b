//! The response bodies the proxy hands to hyper: its own answers and
//! replicas' answers passing through, each holding what must live as long
//! as the response does (the client's request count, the access log's
//! tap, the replica's lease).

#[allow(unused_imports)]
use super::*;

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
                    let ended = match &me.kind {
                        BodyKind::Own(b) => b.is_end_stream(),
                        BodyKind::Replica(b) => b.is_end_stream(),
                        BodyKind::Resumable(b) => b.is_end_stream(),
                    };
                    if ended {
                        tap.end(true);
                    }
                }
                Poll::Ready(None) => tap.end(true),
                Poll::Ready(Some(Err(_))) => tap.end(false),
                Poll::Pending => {}
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Own(b) => b.is_end_stream(),
            BodyKind::Replica(b) => b.is_end_stream(),
            BodyKind::Resumable(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Own(b) => b.size_hint(),
            BodyKind::Replica(b) => b.size_hint(),
            BodyKind::Resumable(_) => SizeHint::default(),
        }
    }
}

/// A replica's response body that holds the replica's lease until the last
/// frame has passed (or the client went away), then records the latency.
/// Polled only as a [`ProxyBody`], which ends it at its last frame.
pub(super) struct LeasedBody {
    pub(super) inner: BackendBody,
    pub(super) lease: Option<Lease>,
    pub(super) start: Instant,
    /// The first body byte passed (its time is a latency sample).
    pub(super) first_byte: bool,
}

impl LeasedBody {
    /// Ends the lease, once: when it did now, when.
    pub(super) fn finish(&mut self) -> Option<Instant> {
        if let Some(lease) = self.lease.take() {
            let now = Instant::now();
            // The connection first, so that the next request finds it idle.
            self.inner.finish(tokio::time::Instant::from_std(now));
            lease.replica().metrics.latency.observe(now.saturating_duration_since(self.start).as_secs_f64());
            return Some(now);
        }
        None
    }
}

impl Drop for LeasedBody {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl Body for LeasedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if !self.first_byte {
            if let (Poll::Ready(Some(Ok(frame))), Some(lease)) = (&r, &self.lease) {
                if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    lease.first_byte(self.start.elapsed());
                    self.first_byte = true;
                }
            }
        }
        if let (Poll::Ready(Some(Err(e))), Some(lease)) = (&r, &self.lease) {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let replica = lease.replica();
                replica.metrics.response_idle_timeouts.inc();
                tracing::info!(replica = %replica.address, "response cut off: {e}");
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
