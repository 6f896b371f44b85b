//! A replica's answer on its way through the proxy, holding the replica's
//! lease until its last frame: what the plain, followed and watched
//! bodies ([`super::body`], [`super::resumable`], [`super::watched`]) all
//! pass their replica's bytes through.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::backend_pool::BackendBody;
use crate::endpoint::Lease;

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

/// What resolves once a replica is lost ([`lost_of`]).
pub(super) type Lost = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Resolves once the replica of `lease` is lost (its health checks get no
/// answer: [`crate::reach`]).
pub(super) fn lost_of(lease: &Lease) -> Lost {
    let replica = lease.replica().clone();
    Box::pin(async move { replica.reach.lost().await })
}
