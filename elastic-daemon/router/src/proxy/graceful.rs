//! A client connection guarded by its head timeout (slowloris) and by the
//! listener's graceful stop, without a timer made per request.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::server::conn::auto;

use crate::proxy::body::ProxyBody;
use crate::proxy::connections::{ClientConn, Connections};
use crate::settings::ConnSettings;

/// A client connection's future, with the two things it needs from
/// outside hyper's own state machine: the graceful stop, and the request
/// head timeout (slowloris). The head timeout is kept here, per connection,
/// rather than by hyper per request (which makes and removes a timer entry
/// for every request, and reads the clock): one timer, which looks when it
/// fires whether the connection has been waiting for a request head all
/// along since it was set; if so, the connection closes. If not, and it is
/// idle now, the timer is set again for one head timeout after its latest
/// answer ended (the request's hold notes when: [`RequestHold`]), else (a
/// request open) one head timeout from now. So a connection that waits for
/// a head is closed one head timeout after it started to wait (before:
/// between one and two, as a timer set from when it fired could not
/// know), and busy connections cost the timer nothing per request. HTTP/2
/// connections are held to it only until their first request (hyper had
/// no head timeout for HTTP/2 at all; a connection that never sends one
/// now closes too); after it, the same timer closes them once no stream
/// has been open for the HTTP/2 idle timeout (GOAWAY first; if the client
/// keeps the connection open one more idle timeout, it is dropped).
pub(super) struct Guarded<C> {
    pub(super) conn: Pin<Box<C>>,
    pub(super) client: Arc<ClientConn>,
    pub(super) conns: Arc<Connections>,
    pub(super) id: u64,
    pub(super) ip: IpAddr,
    pub(super) waker: Option<Waker>,
    pub(super) stopping: bool,
    pub(super) head_timeout: Duration,
    pub(super) http2_idle_timeout: Duration,
    /// The connection is known to be HTTP/2 (the timer runs its idle
    /// timeout).
    pub(super) http2: bool,
    pub(super) timer: Pin<Box<tokio::time::Sleep>>,
    /// (received, done) when the timer was set.
    pub(super) armed_at: (u64, u64),
}

impl<C> Guarded<C> {
    /// `id` is the connection's in `conns`, from `ip`.
    pub(super) fn new(
        conn: C,
        client: Arc<ClientConn>,
        (conns, id, ip): (Arc<Connections>, u64, IpAddr),
        settings: &ConnSettings,
    ) -> Guarded<C> {
        let timer = Box::pin(tokio::time::sleep(settings.header_read_timeout));
        Guarded {
            conn: Box::pin(conn),
            client,
            conns,
            id,
            ip,
            waker: None,
            stopping: false,
            head_timeout: settings.header_read_timeout,
            http2_idle_timeout: settings.http2_idle_timeout,
            http2: false,
            timer,
            armed_at: (0, 0),
        }
    }
}

impl<C> Drop for Guarded<C> {
    fn drop(&mut self) {
        self.conns.remove(self.id, self.ip);
    }
}

/// The hyper connections a [`Guarded`] can stop gracefully.
pub(super) trait GracefulStop {
    fn graceful_stop(self: Pin<&mut Self>);
}

impl<I, S, E> GracefulStop for auto::Connection<'static, I, S, E>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<ProxyBody>>,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, ProxyBody>,
{
    fn graceful_stop(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<C, E> Future for Guarded<C>
where
    C: Future<Output = Result<(), E>> + GracefulStop,
{
    type Output = Result<(), HeadTimeout<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            this.waker = Some(cx.waker().clone());
            if let Some(w) = this.conns.table().wakers.get_mut(&this.id) {
                *w = Some(cx.waker().clone());
            }
        }
        // A connection accepted just before the shutdown whose request has
        // not been read yet is not idle: its client has sent, or is sending,
        // a request that no other process will see (it left the listening
        // socket's queue). Closing it would fail that request, so it is
        // stopped once its first request is in (served, then closed), or
        // ends at the head timeout if none comes. An idle keep-alive
        // connection closes at once, as before.
        if !this.stopping
            && this.conns.stopping.load(Ordering::SeqCst)
            && this.client.received.load(Ordering::Relaxed) > 0
        {
            this.stopping = true;
            this.conn.as_mut().graceful_stop();
        }
        if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(r.map_err(HeadTimeout::Conn));
        }
        if !this.http2 && this.client.http2.load(Ordering::Relaxed) {
            // Its first request came: from now on the idle timeout counts.
            this.http2 = true;
            this.timer.as_mut().reset(tokio::time::Instant::now() + this.http2_idle_timeout);
        }
        while this.timer.as_mut().poll(cx).is_ready() {
            // `done` first: the end of the request it counts is then seen.
            let done = this.client.done.load(Ordering::Acquire);
            let now = (this.client.received.load(Ordering::Relaxed), done);
            let idle = now.0 == now.1;
            // No request since the timer was set, and none open then.
            if now == this.armed_at && idle {
                if !this.http2 || this.stopping {
                    return Poll::Ready(Err(HeadTimeout::Elapsed));
                }
                this.stopping = true;
                this.conn.as_mut().graceful_stop();
                // Polled again to send the GOAWAY.
                cx.waker().wake_by_ref();
            }
            let period = if this.http2 { this.http2_idle_timeout } else { this.head_timeout };
            // Idle since an answer that ended after the timer was set: its
            // wait counts from that end (if that was a whole period ago
            // already, the timer is ready at once and closes it).
            let from = match now != this.armed_at && idle {
                true => tokio::time::Instant::from_std(this.client.idle_since()),
                false => tokio::time::Instant::now(),
            };
            this.armed_at = now;
            this.timer.as_mut().reset(from + period);
        }
        Poll::Pending
    }
}

/// How a guarded connection ended badly.
pub(super) enum HeadTimeout<E> {
    Conn(E),
    /// No complete request head within the head timeout (HTTP/2: no
    /// stream within its idle timeout).
    Elapsed,
}
