//! The replica's front: a keyed proxy before the model server that counts
//! requests in flight, answers "draining" once the drain began, and cuts
//! what is left, each told why, when the drain times out.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::access::{Access, Refused};
use crate::conventions::{DRAINING_HEADER, MOVABLE_HEADER, REPLICA_KEY_HEADER, SERVER_FAILED_HEADER};

/// The front's limits, the router's defaults (onepoold.toml's
/// `header_read_timeout`, `max_header_bytes`, `max_request_body`,
/// `max_connections`): the front faces the cluster network like the
/// router does, and before these a client that sent its head slowly held
/// a connection for ever.
#[derive(Debug, Clone, Copy)]
pub struct FrontBounds {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_body_bytes: usize,
    pub max_connections: usize,
}

impl Default for FrontBounds {
    fn default() -> FrontBounds {
        FrontBounds {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            max_body_bytes: 8 * 1024 * 1024,
            max_connections: 1024,
        }
    }
}

/// What the front needs to pass a request on.
#[derive(Debug)]
pub struct FrontConfig {
    pub backend: SocketAddr,
    pub access: Access,
    /// `Bearer <the server's own key>`, added to every request.
    pub backend_auth: Option<http::HeaderValue>,
    pub bounds: FrontBounds,
    /// The front's TLS (`--tls`); `None`: clear HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// What the front proxy shares with the drain.
#[derive(Default)]
pub struct Front {
    in_flight: AtomicU64,
    draining: AtomicBool,
    idle: Notify,
    /// Set when the drain timeout passed: what is still in flight is cut
    /// off with an answer that says so (see [`Front::cut_off`]).
    cut: CancellationToken,
    /// Set when the drain began (or with `cut`): the streams the router
    /// can continue elsewhere end at once ([`Front::move_off`]).
    moving: CancellationToken,
    /// Streams ended for the router to continue elsewhere (for the drain's
    /// note, logs and tests).
    pub moved: AtomicU64,
    /// Requests answered "draining" (for logs and tests).
    pub turned_away: AtomicU64,
    /// Requests cut off at the drain timeout (for logs and tests).
    pub cut_short: AtomicU64,
    /// Requests and connections refused: no key, a path not served, a
    /// body too large, over the connection cap.
    pub refused: AtomicU64,
    /// Set once the drain is over: each client connection finishes what it
    /// writes and closes ([`Front::close_connections`]).
    closing: CancellationToken,
    /// Client connections open, and a wake-up when one closes.
    connections: AtomicU64,
    closed: Notify,
}

impl Front {
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
    /// The drain timeout passed: a request the server has not answered yet
    /// gets the draining status (it never got an answer, so the router
    /// sends it to another replica), and a stream of server-sent events
    /// ends with an OpenAI-style error event saying why, instead of a bare
    /// cut the client cannot tell from a network fault. Any other response
    /// body in flight is aborted.
    pub fn cut_off(&self) {
        self.moving.cancel();
        self.cut.cancel();
    }

    /// The drain began: the streams the router marked movable
    /// ([`MOVABLE_HEADER`]) end now with the reclaim event, which the
    /// router reads as "continue it on another replica", so the drain
    /// waits only for what cannot move (issue #43). A movable request
    /// still waiting for the server's answer is answered "draining" (the
    /// router sends it elsewhere whole).
    pub fn move_off(&self) {
        self.moving.cancel();
    }

    /// After the drain: every client connection writes out what it holds
    /// and closes; waits for that, at most `timeout`. A response counts as
    /// done (and the drain as over) when its last frame left the server's
    /// side, which can be before hyper has written it to the router: the
    /// process must not end in between (seen as a stream cut off before
    /// `data: [DONE]` in the demo).
    pub async fn close_connections(&self, timeout: Duration) {
        self.closing.cancel();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let closed = self.closed.notified();
            if self.connections.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, closed).await.is_err() {
                return;
            }
        }
    }

    /// Waits until nothing is in flight or `timeout` passes.
    pub async fn wait_idle(&self, timeout: Duration) -> Result<Duration, u64> {
        let t0 = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return Ok(t0.elapsed());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(self.in_flight());
            }
        }
    }
}

/// Decrements the in-flight count when the response body ends or is dropped
/// (streams count until their last frame).
struct Guard(Arc<Front>);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The last event of a stream cut off (at the drain timeout, or at once
/// for an immediate class): the shape
/// OpenAI's API uses for an error in the middle of a stream, which its
/// clients raise as an API error.
const CUT_EVENT: &str = "data: {\"error\":{\"message\":\"the replica serving this stream was reclaimed for higher-priority work before the stream finished; retry the request\",\"type\":\"server_error\",\"code\":\"replica_reclaimed\"}}\n\n";

/// A response body from the server that counts as in flight until it
/// ends, and ends early (see [`Front::cut_off`]) when the replica is cut.
struct GuardedBody {
    inner: Incoming,
    _guard: Guard,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Server-sent events: cut off with [`CUT_EVENT`].
    events: bool,
    /// Ended for the router to continue elsewhere (counted as moved).
    movable: bool,
    ended: bool,
    state: Arc<Front>,
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.cut.as_mut().poll(cx).is_ready() {
            self.ended = true;
            match self.movable {
                true => self.state.moved.fetch_add(1, Ordering::SeqCst),
                false => self.state.cut_short.fetch_add(1, Ordering::SeqCst),
            };
            return Poll::Ready(Some(if self.events {
                Ok(Frame::data(Bytes::from_static(CUT_EVENT.as_bytes())))
            } else {
                Err("the replica was reclaimed before the response was complete".into())
            }));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(BoxError::from)
    }
    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type FrontBody = UnsyncBoxBody<Bytes, BoxError>;

fn plain(status: StatusCode, text: &str, draining: bool) -> Response<FrontBody> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).map_err(|never| match never {}).boxed_unsync());
    *r.status_mut() = status;
    if draining {
        r.headers_mut().insert(DRAINING_HEADER, http::HeaderValue::from_static("1"));
        r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    r
}

fn refused(state: &Front, why: Refused) -> Response<FrontBody> {
    state.refused.fetch_add(1, Ordering::Relaxed);
    match why {
        Refused::Key => plain(StatusCode::UNAUTHORIZED, "this replica answers onepoold's router only\n", false),
        Refused::Path => plain(StatusCode::NOT_FOUND, "not a path this endpoint serves\n", false),
    }
}

async fn front(
    req: Request<Incoming>,
    state: Arc<Front>,
    client: onepool_client::Pooled<Limited<Incoming>>,
    cfg: Arc<FrontConfig>,
) -> Response<FrontBody> {
    if let Err(why) = cfg.access.check(req.uri().path(), req.headers()) {
        return refused(&state, why);
    }
    let too_long = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > cfg.bounds.max_body_bytes as u64);
    if too_long {
        state.refused.fetch_add(1, Ordering::Relaxed);
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n", false);
    }
    if state.is_draining() {
        state.turned_away.fetch_add(1, Ordering::SeqCst);
        return plain(StatusCode::SERVICE_UNAVAILABLE, "replica is draining; retry elsewhere\n", true);
    }
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = Guard(state.clone());
    // Checked with the key above: only onepoold's router sets it.
    let movable = req.headers().get(MOVABLE_HEADER).is_some_and(|v| v.as_bytes() == b"1");
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(MOVABLE_HEADER);
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("http://{}{path}", cfg.backend).parse() {
        Ok(u) => u,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "bad request target\n", false),
    };
    // onepoold's key stops here; the server gets its own.
    parts.headers.remove(REPLICA_KEY_HEADER);
    match &cfg.backend_auth {
        Some(auth) => {
            parts.headers.insert(http::header::AUTHORIZATION, auth.clone());
        }
        None => {
            parts.headers.remove(http::header::AUTHORIZATION);
        }
    }
    let body = Limited::new(body, cfg.bounds.max_body_bytes);
    let until = match movable {
        true => &state.moving,
        false => &state.cut,
    };
    let answer = tokio::select! {
        r = client.request(Request::from_parts(parts, body)) => r,
        _ = until.cancelled() => {
            match movable {
                true => state.moved.fetch_add(1, Ordering::SeqCst),
                false => state.cut_short.fetch_add(1, Ordering::SeqCst),
            };
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the replica was reclaimed before the model server answered; retry elsewhere\n",
                true,
            );
        }
    };
    match answer {
        Ok(resp) => guarded(resp, guard, &state, movable),
        // Nothing listens: the server died (the router only sends here
        // after a health check passed through it). The request never reached
        // it, so the router may retry it anywhere: answer "draining".
        Err(e) if e.is_connect() => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("model server not reachable ({e}); retry elsewhere\n"),
            true,
        ),
        // The replica is being reclaimed and its server went before it
        // answered (an immediate class: Slurm signals the server with the
        // launcher, and either may act first). Nothing reached the client,
        // so it is answered like the cut: the router retries it elsewhere.
        Err(e) if state.is_draining() => {
            state.cut_short.fetch_add(1, Ordering::SeqCst);
            plain(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the replica was reclaimed before the model server answered ({e}); retry elsewhere\n"),
                true,
            )
        }
        Err(e) => {
            tracing::warn!("the model server failed a request: {e:?}");
            let mut r = plain(StatusCode::BAD_GATEWAY, &format!("model server failed: {e}\n"), false);
            r.headers_mut().insert(SERVER_FAILED_HEADER, http::HeaderValue::from_static("1"));
            r
        }
    }
}

/// The server's answer on its way to the router, counted in flight until
/// it ends, and ended early when the replica is cut (or, `movable`, moved).
fn guarded(resp: Response<Incoming>, guard: Guard, state: &Arc<Front>, movable: bool) -> Response<FrontBody> {
    let (parts, inner) = resp.into_parts();
    let events = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    // Only a stream moves: a whole answer already on its way is let
    // finish (the router could not continue it half-read).
    let movable = movable && events;
    let cut = Box::pin(match movable {
        true => state.moving.clone().cancelled_owned(),
        false => state.cut.clone().cancelled_owned(),
    });
    let body = GuardedBody { inner, _guard: guard, cut, events, movable, ended: false, state: state.clone() };
    Response::from_parts(parts, body.boxed_unsync())
}

/// Serves the front proxy until the process ends.
pub async fn serve_front(listener: TcpListener, cfg: Arc<FrontConfig>, state: Arc<Front>) {
    // A new connection per request: the server is on this node (a loopback
    // connect costs microseconds), and a kept-alive one races the server's
    // own idle close (llama-server's is 5 s): a request written as the
    // server closes fails, and its streamed body cannot be sent again. Seen
    // as 502s with llama-server replicas before this.
    let client: onepool_client::Pooled<Limited<Incoming>> =
        onepool_client::pooled(onepool_client::Settings { max_idle_per_host: 0, ..Default::default() });
    let slots = Arc::new(Semaphore::new(cfg.bounds.max_connections.max(1)));
    let closing = state.closing.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = closing.cancelled() => {
                // The drain is over: the port closes, so that the router's
                // next connection is refused (it sends the request to
                // another replica) rather than accepted and closed unread.
                // The connections the kernel already completed are served
                // first (they are answered "draining"): dropping them with
                // the listener would reset requests already written.
                // Asked of the kernel itself: the runtime may not have
                // seen them yet.
                let Ok(listener) = listener.into_std() else { return };
                while let Ok((stream, _)) = listener.accept() {
                    let Ok(stream) = stream.set_nonblocking(true).and_then(|()| tokio::net::TcpStream::from_std(stream))
                    else {
                        continue;
                    };
                    state.connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve_accepted(stream, state.clone(), client.clone(), cfg.clone(), None));
                }
                return;
            }
        };
        let Ok((stream, _)) = accepted else { continue };
        // Over the cap: closed at once, before a byte is read.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            state.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(serve_accepted(stream, state.clone(), client.clone(), cfg.clone(), Some(slot)));
    }
}

/// One accepted connection (counted in `state.connections` by the caller)
/// until it closes: the TLS handshake, if any, then HTTP.
async fn serve_accepted(
    stream: tokio::net::TcpStream,
    state: Arc<Front>,
    client: onepool_client::Pooled<Limited<Incoming>>,
    cfg: Arc<FrontConfig>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let _slot = slot;
    let _open = OpenConnection(state.clone());
    match &cfg.tls {
        None => serve_connection(stream, state, client, cfg).await,
        Some(tls) => {
            // The handshake is part of the head: a peer that stalls in it
            // holds a connection no longer than one that stalls in its head.
            let accept = tokio_rustls::TlsAcceptor::from(tls.clone()).accept(stream);
            match tokio::time::timeout(cfg.bounds.header_read_timeout, accept).await {
                Ok(Ok(tls)) => serve_connection(tls, state, client, cfg).await,
                Ok(Err(e)) => {
                    state.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("TLS handshake refused: {e}");
                }
                Err(_) => {
                    state.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One client connection, clear or TLS, until it closes or the drain ends.
async fn serve_connection<S>(
    io: S,
    state: Arc<Front>,
    client: onepool_client::Pooled<Limited<Incoming>>,
    cfg: Arc<FrontConfig>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_read_timeout = cfg.bounds.header_read_timeout;
    // hyper's smallest read buffer; the head must fit in it.
    let max_buf = cfg.bounds.max_header_bytes.max(8192);
    let closing = state.closing.clone();
    // A connection that began after the drain ended still has its request
    // read and answered ("draining"), once: shut at once, it would be
    // closed with the request unread, which the router cannot tell from a
    // replica that failed on it.
    let late = closing.is_cancelled();
    let svc = service_fn(move |req| {
        let (state, client, cfg) = (state.clone(), client.clone(), cfg.clone());
        async move { Ok::<_, std::convert::Infallible>(front(req, state, client, cfg).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(max_buf)
        .keep_alive(!late)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    if late {
        let _ = conn.await;
        return;
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = closing.cancelled() => {
            // Finish the response being written, then close.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Counts a client connection until its task ends.
struct OpenConnection(Arc<Front>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
        self.0.closed.notify_waiters();
    }
}
