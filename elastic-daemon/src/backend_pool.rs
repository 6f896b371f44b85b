//! Keep-alive HTTP/1.1 connections to one replica, on hyper's
//! `client::conn::http1`, without a task per connection: the request that
//! uses a connection polls hyper's connection state machine itself (while
//! waiting for the response head, then from its response body), so a
//! proxied request runs in the client connection's task from the first
//! byte read to the last byte written, with no hand-over to another task.
//! A connection is kept for the next request when its response has been
//! read to the end; a request dropped half-way (client gone, timeout)
//! closes it, as hyper's own pool does.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type RequestBody = Full<Bytes>;
type Connection = http1::Connection<TokioIo<TcpStream>, RequestBody>;

/// How long a connection may sit unused before it is closed rather than
/// reused (replicas close idle connections on their own schedule too).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// One HTTP/1.1 connection to a replica: hyper's request handle and the
/// connection itself, which whoever uses the handle must poll.
pub struct BackendConn {
    tx: http1::SendRequest<RequestBody>,
    /// `None` once the connection has ended (closed, failed).
    conn: Option<Connection>,
    idle_since: Instant,
}

impl BackendConn {
    /// Drives the connection (reads, writes, hands over responses and body
    /// frames); false once it has ended.
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(conn) = self.conn.as_mut() {
            if Pin::new(conn).poll(cx).is_ready() {
                // Dropping it answers every request still queued on it.
                self.conn = None;
            }
        }
        self.conn.is_some()
    }

    /// Whether the next request can go out on it at once.
    fn reusable(&self) -> bool {
        self.conn.is_some() && self.tx.is_ready() && !self.tx.is_closed()
    }
}

/// A replica's idle connections, the most recently used first out.
#[derive(Default)]
pub struct IdleConns {
    idle: Mutex<Vec<BackendConn>>,
}

impl IdleConns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<BackendConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pop(&self) -> Option<BackendConn> {
        let mut idle = self.lock();
        while let Some(c) = idle.pop() {
            if c.reusable() && c.idle_since.elapsed() < IDLE_TIMEOUT {
                return Some(c);
            }
        }
        None
    }

    /// Keeps a connection whose last response was read to the end.
    fn put(&self, mut c: BackendConn) {
        // One more turn lets hyper see the end of the exchange and ask for
        // the next request; with a waker that does nothing, so that a
        // later request on this connection does not wake this task.
        let alive = c.poll_conn(&mut Context::from_waker(noop_waker()));
        if alive && c.reusable() {
            let now = Instant::now();
            c.idle_since = now;
            let mut idle = self.lock();
            // The oldest are at the bottom; drop the ones past their time.
            let stale = idle.iter().take_while(|c| now.duration_since(c.idle_since) >= IDLE_TIMEOUT).count();
            idle.drain(..stale);
            idle.push(c);
        }
    }

    /// Closes the connections unused for `max_idle` or more.
    pub fn prune(&self, max_idle: Duration) {
        let now = Instant::now();
        self.lock().retain(|c| now.duration_since(c.idle_since) < max_idle);
    }

    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

/// Why a request got no response head from the replica.
#[derive(Debug)]
pub enum SendError {
    /// It never left: no connection could be made, or the connection
    /// closed before the request was written.
    NotSent(String),
    /// It may have reached the replica (written, then the connection failed).
    Failed(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::NotSent(reason) => write!(f, "not sent: {reason}"),
            SendError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Sends `request` (origin-form target, `Host` set) to the replica at
/// `address` on an idle connection of `idle`, or a new one, and returns its
/// response with the connection. Idle connections that turn out closed are
/// skipped; the request is then sent on the next one.
pub async fn send(
    idle: &IdleConns,
    address: SocketAddr,
    connect_timeout: Duration,
    mut request: Request<RequestBody>,
) -> Result<(Response<Incoming>, BackendConn), SendError> {
    loop {
        let (mut c, fresh) = match idle.pop() {
            Some(c) => (c, false),
            None => match connect(address, connect_timeout).await {
                Ok(c) => (c, true),
                Err(reason) => return Err(SendError::NotSent(reason)),
            },
        };
        let response = tokio::task::unconstrained(c.tx.try_send_request(request));
        let mut response = pin!(response);
        let result = std::future::poll_fn(|cx| {
            c.poll_conn(cx);
            // Only polling the connection can make the response ready, and
            // it was just polled with this task's waker: a second waker
            // would only wake this task again for nothing. (Unconstrained:
            // no coop budget, which would otherwise rely on that waker.)
            response.as_mut().poll(&mut Context::from_waker(noop_waker()))
        })
        .await;
        match result {
            Ok(r) => return Ok((r, c)),
            Err(mut e) => match e.take_message() {
                Some(r) if !fresh => request = r,
                Some(_) => return Err(SendError::NotSent(e.into_error().to_string())),
                None => return Err(SendError::Failed(e.into_error())),
            },
        }
    }
}

async fn connect(address: SocketAddr, timeout: Duration) -> Result<BackendConn, String> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
        Err(_) => return Err(format!("connecting to {address} timed out")),
        Ok(Err(e)) => return Err(format!("connecting to {address}: {e}")),
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    let (tx, conn) =
        http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("connection to {address}: {e}"))?;
    Ok(BackendConn { tx, conn: Some(conn), idle_since: Instant::now() })
}

/// A replica's response body, polled together with its connection; the
/// connection goes back to `idle` once the body has been read to the end.
pub struct BackendBody {
    inner: Incoming,
    conn: Option<BackendConn>,
    idle: Arc<IdleConns>,
}

impl BackendBody {
    pub fn new(inner: Incoming, conn: BackendConn, idle: Arc<IdleConns>) -> BackendBody {
        BackendBody { inner, conn: Some(conn), idle }
    }

    fn keep_conn(&mut self) {
        if let Some(c) = self.conn.take() {
            self.idle.put(c);
        }
    }

    /// Done with the body: read to the end, the connection serves the next
    /// request; left half-way (client gone), it closes.
    pub fn finish(&mut self) {
        if self.inner.is_end_stream() {
            self.keep_conn();
        }
        self.conn = None;
    }
}

impl Drop for BackendBody {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for BackendBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let conn_alive = this.conn.as_mut().is_some_and(|c| c.poll_conn(cx));
        let r = if conn_alive {
            // As in `send`: frames only arrive while the connection is
            // polled, and it was just polled with this task's waker.
            Pin::new(&mut this.inner).poll_frame(&mut Context::from_waker(noop_waker()))
        } else {
            Pin::new(&mut this.inner).poll_frame(cx)
        };
        match &r {
            Poll::Ready(None) => this.keep_conn(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
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

/// A waker that does nothing, for polls whose wake-up is already arranged.
fn noop_waker() -> &'static Waker {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
        fn wake_by_ref(self: &Arc<Self>) {}
    }
    static NOOP: OnceLock<Waker> = OnceLock::new();
    NOOP.get_or_init(|| Waker::from(Arc::new(Noop)))
}
