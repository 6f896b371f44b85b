//! The replica launcher (`onepool replica -- CMD ...`): the batch script's
//! main process on a compute node. It runs the model server, fronts it with
//! a small proxy that counts requests in flight, and on Slurm's preemption
//! notice (the `--signal=B:USR1@N` the daemon submits replicas with) or a
//! SIGTERM it drains: new requests get 503 with `x-onepool-draining: 1`
//! (the router takes the replica out and retries them elsewhere, so no
//! unauthenticated call to the daemon is needed), requests in flight finish
//! up to the drain timeout (what is still in flight then is told why, see
//! [`Front::cut_off`]), then the server is stopped and the launcher
//! exits, so the job ends and Slurm hands the GPUs to the preemptor at once
//! instead of at its next periodic kill.
//!
//! Issue #25 closed its side doors: it listens where the kernel chooses
//! (a port in a known range could be taken first by any user's job) and
//! reports the port ([`crate::report`]); it answers only requests that
//! carry onepoold's replica key and ask for a path the endpoint serves
//! ([`crate::access`]); its front has the router's bounds (header read
//! timeout, header and body size, connections); and its server gets a key
//! of its own, so the server's loopback port answers nobody else on the
//! node. Issue #24: a server that ends by itself is named — signal, exit
//! code, the last lines it printed ([`crate::exit_cause`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{Notify, Semaphore};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::access::{Access, Refused};
use crate::conventions::{
    DrainNote, ReplicaNote, BACKEND_KEY_ALIASES, BACKEND_KEY_ENV, DRAINING_HEADER, REPLICA_KEY_ENV, REPLICA_KEY_HEADER,
};
use crate::exit_cause::{self, OutputTail};
use crate::report::{Patience, Report};
use onepool_decisions::annotation::ReclaimMode;

/// How long the answers of requests cut off at the drain timeout get to
/// leave before the server is stopped.
const CUT_FLUSH: Duration = Duration::from_secs(1);
/// How long the front's connections get to write out their last bytes
/// after the drain (idle ones close at once).
const CONNECTIONS_CLOSE: Duration = Duration::from_secs(2);
/// How long a server stopped after a timed-out drain gets before SIGKILL.
const CUT_STOP_GRACE: Duration = Duration::from_secs(1);
/// A notice that comes this soon after the server ended was sent with the
/// signal that ended it (Slurm signals every process of the job at once).
const SIMULTANEOUS: Duration = Duration::from_millis(200);

/// What Slurm's SIGTERM means to a replica whose class is reclaimed
/// `mode` (onepoold passes `--reclaim immediate` for an immediate class).
///
/// A graceful class gets GraceTime to drain, so a SIGTERM, whether the
/// grace's notice or an admin's scancel, drains the replica. An immediate
/// class has GraceTime 0: the SIGTERM *is* the preemption, the protected
/// job waits for these GPUs, and Slurm's SIGKILL follows after KillWait
/// (30 s by default). Draining then would only hold the GPUs until that
/// SIGKILL (CI measured 5.5 s with KillWait=5, the whole of it), so the
/// launcher cuts what is in flight at once, stops the server and exits.
fn cuts_at_sigterm(mode: ReclaimMode) -> bool {
    mode == ReclaimMode::Immediate
}

/// `--reclaim`: the two modes a replica's class may have.
pub fn parse_reclaim(s: &str) -> Result<ReclaimMode, String> {
    match ReclaimMode::parse(s) {
        Some(m @ (ReclaimMode::Graceful | ReclaimMode::Immediate)) => Ok(m),
        _ => Err(format!("{s:?} is neither \"graceful\" nor \"immediate\"")),
    }
}

#[derive(Debug, Clone)]
pub struct LauncherConfig {
    /// Where the router reaches this replica; port 0 (what onepoold asks
    /// for): a port the kernel chooses, reported through `report`.
    pub listen: SocketAddr,
    /// Where the model server listens (on this node); `None`: a free
    /// loopback port chosen at start.
    pub backend: Option<SocketAddr>,
    /// Longest drain after the notice; Slurm's GraceTime must cover it.
    pub drain_timeout: Duration,
    /// How long the server gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The class's reclaim mode: a SIGTERM drains, or cuts at once
    /// ([`cuts_at_sigterm`]).
    pub reclaim: ReclaimMode,
    /// The model server's command line.
    pub command: Vec<String>,
    /// Who may send what.
    pub access: Access,
    pub bounds: FrontBounds,
    /// Where the listening port and the server's end are reported.
    pub report: Report,
    /// Serve the front over TLS with a certificate made at start, its
    /// fingerprint reported with the port ([`crate::hop_tls`]).
    pub tls: bool,
}

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

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("no server command given (onepool replica [OPTIONS] -- CMD ARGS...)")]
    NoCommand,
    #[error("cannot start `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find a free loopback port for the model server: {0}")]
    BackendPort(#[source] std::io::Error),
    #[error("cannot make the model server's key: {0}")]
    Key(#[source] std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error("{0}")]
    Tls(String),
}

/// How a server that ended by itself ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// "killed by SIGSEGV", "exited with code 1" ([`exit_cause::describe`]).
    pub cause: String,
    /// The launcher's exit code for it (the server's, or 128 + signal).
    pub code: i32,
    /// The last lines the server printed.
    pub tail: Vec<String>,
}

impl Ended {
    /// The cause with the last lines, as reported to onepoold.
    pub fn report(&self) -> String {
        if self.tail.is_empty() {
            return format!("{}; it printed nothing", self.cause);
        }
        format!("{}; last output:\n{}", self.cause, self.tail.join("\n"))
    }
}

/// How the launcher ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server exited by itself.
    ServerExited(Ended),
    /// Drained after a notice: every request in flight finished.
    Drained { waited: Duration },
    /// The drain timeout passed with requests still in flight; they were
    /// cut off with an answer that says so ([`Front::cut_off`]).
    TimedOut { in_flight: u64 },
    /// Reclaimed at once (an immediate class's SIGTERM, [`cuts_at_sigterm`]):
    /// what was in flight was cut off without waiting.
    Cut { in_flight: u64 },
}

impl Outcome {
    /// The process exit code: 0 for a clean drain.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::ServerExited(e) => {
                if e.code == 0 {
                    1
                } else {
                    e.code
                }
            }
            Outcome::Drained { .. } => 0,
            Outcome::TimedOut { .. } | Outcome::Cut { .. } => 1,
        }
    }
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
        self.cut.cancel();
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
            self.state.cut_short.fetch_add(1, Ordering::SeqCst);
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
    let (mut parts, body) = req.into_parts();
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
    let answer = tokio::select! {
        r = client.request(Request::from_parts(parts, body)) => r,
        _ = state.cut.cancelled() => {
            state.cut_short.fetch_add(1, Ordering::SeqCst);
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the replica was reclaimed before the model server answered; retry elsewhere\n",
                true,
            );
        }
    };
    match answer {
        Ok(resp) => {
            let (parts, inner) = resp.into_parts();
            let events = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
            let cut = Box::pin(state.cut.clone().cancelled_owned());
            let body = GuardedBody { inner, _guard: guard, cut, events, ended: false, state: state.clone() };
            Response::from_parts(parts, body.boxed_unsync())
        }
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
            plain(StatusCode::BAD_GATEWAY, &format!("model server failed: {e}\n"), false)
        }
    }
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

/// SIGTERM to the server's process group, SIGKILL to it after `grace`.
async fn stop(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    // The server leads its own process group.
    let group = child.id();
    if let Some(g) = group {
        let _ = onepool_os::signal_group(g, onepool_os::SIGTERM);
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    if let Some(g) = group {
        // What the server left behind in its group goes with it (the
        // group may be empty by now: ESRCH).
        let _ = onepool_os::signal_group(g, onepool_os::SIGKILL);
    }
    status
}

/// A loopback port nothing listens on now, for the model server. Another
/// process could take it before the server binds it; the server then
/// fails to start, and says why in its output, which is reported.
fn free_loopback_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

/// Copies a pipe of the server's to this process's standard error (the
/// job's output file) and keeps its last lines.
async fn copy_output(mut from: impl AsyncRead + Unpin, tail: Arc<Mutex<OutputTail>>) {
    let mut err = tokio::io::stderr();
    let mut buf = vec![0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let _ = err.write_all(&buf[..n]).await;
                tail.lock().unwrap_or_else(|e| e.into_inner()).push(&buf[..n]);
            }
        }
    }
}

/// Runs the server behind the front proxy until it exits or a notice
/// (SIGUSR1, SIGTERM, SIGINT) drains it.
pub async fn run(cfg: LauncherConfig, state: Arc<Front>) -> Result<Outcome, LauncherError> {
    let (program, args) = cfg.command.split_first().ok_or(LauncherError::NoCommand)?;
    let listener =
        TcpListener::bind(cfg.listen).await.map_err(|source| LauncherError::Listen { addr: cfg.listen, source })?;
    let listening = listener.local_addr().map_err(|source| LauncherError::Listen { addr: cfg.listen, source })?;
    let backend = match cfg.backend {
        Some(b) => b,
        None => free_loopback_port().map_err(LauncherError::BackendPort)?,
    };
    // The server's key: one given in the environment (a site or a
    // benchmark that talks to the server itself), else a new one.
    let backend_key = match std::env::var(BACKEND_KEY_ENV) {
        Ok(k) if k.len() >= 16 => k,
        _ => crate::access::random_key().map_err(LauncherError::Key)?,
    };
    let mut notices = Notices::install()?;
    let oom_before = exit_cause::oom_kills();
    // Made before the server starts: a launcher that cannot serve TLS
    // must not hold GPUs for a server nobody can reach.
    let identity = match cfg.tls {
        true => Some(crate::hop_tls::Identity::generate().map_err(LauncherError::Tls)?),
        false => None,
    };
    let mut server = Server::spawn(&cfg, program, args, backend, &backend_key)?;
    let front_cfg = Arc::new(FrontConfig {
        tls: identity.as_ref().map(|i| i.config.clone()),
        backend,
        access: cfg.access.clone(),
        backend_auth: http::HeaderValue::from_str(&format!("Bearer {backend_key}")).ok(),
        bounds: cfg.bounds,
    });
    let front_task = tokio::spawn(serve_front(listener, front_cfg, state.clone()));
    let pin = identity.map(|i| i.fingerprint);
    tracing::info!(%listening, %backend, tls = ?pin, "replica front listening; model server starting");
    let mut note = ReplicaNote::default();
    cfg.report.listening(&mut note, listening.port(), pin).await;
    let which = tokio::select! {
        status = server.child.wait() => {
            // Slurm's kill signals the server with this process, and the
            // server may go first: a notice already here makes it a
            // reclaim, not a server that ended by itself.
            match tokio::time::timeout(SIMULTANEOUS, notices.next()).await {
                Ok(which) => which,
                Err(_) => {
                    front_task.abort();
                    let ended = server.ended(status, oom_before).await;
                    tracing::error!(cause = %ended.cause, "the model server ended by itself");
                    cfg.report.ended(&mut note, &ended.report()).await;
                    return Ok(Outcome::ServerExited(ended));
                }
            }
        }
        which = notices.next() => which,
    };
    let outcome = drain(&cfg, &state, which, &mut notices, &mut server.child, &mut note).await;
    front_task.abort();
    Ok(outcome)
}

/// The signals that tell a replica to yield.
struct Notices {
    usr1: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    /// The notice of a replica in a per-node job (crate::replica_group):
    /// Slurm signals every process of a step, and SIGURG, unlike SIGUSR1,
    /// leaves a model server that does not handle it running.
    urg: tokio::signal::unix::Signal,
}

impl Notices {
    fn install() -> Result<Notices, LauncherError> {
        let on = |kind| signal(kind).map_err(LauncherError::Signals);
        Ok(Notices {
            usr1: on(SignalKind::user_defined1())?,
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            urg: on(SignalKind::from_raw(libc::SIGURG))?,
        })
    }

    /// The first notice to come, by name and number.
    async fn next(&mut self) -> (&'static str, libc::c_int) {
        tokio::select! {
            _ = self.usr1.recv() => ("SIGUSR1", libc::SIGUSR1),
            _ = self.term.recv() => ("SIGTERM", libc::SIGTERM),
            _ = self.int.recv() => ("SIGINT", libc::SIGINT),
            _ = self.urg.recv() => ("SIGURG", libc::SIGURG),
        }
    }
}

/// The model server's process and what it printed last.
struct Server {
    child: tokio::process::Child,
    tail: Arc<Mutex<OutputTail>>,
    copies: tokio::task::JoinSet<()>,
}

impl Server {
    fn spawn(
        cfg: &LauncherConfig,
        program: &str,
        args: &[String],
        backend: SocketAddr,
        backend_key: &str,
    ) -> Result<Server, LauncherError> {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("ONEPOOL_BACKEND_PORT", backend.port().to_string())
            .env(BACKEND_KEY_ENV, backend_key)
            // onepoold's key is for this process only.
            .env_remove(REPLICA_KEY_ENV)
            .env_remove(crate::conventions::REPLICA_KEY_DIGEST_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that stopping it reaches the worker
            // processes servers such as vLLM fork (they hold GPUs too).
            .process_group(0)
            .kill_on_drop(true);
        for alias in BACKEND_KEY_ALIASES {
            command.env(alias, backend_key);
        }
        let mut child =
            command.spawn().map_err(|source| LauncherError::Spawn { cmd: cfg.command.join(" "), source })?;
        let tail = Arc::new(Mutex::new(OutputTail::default()));
        let mut copies = tokio::task::JoinSet::new();
        if let Some(out) = child.stdout.take() {
            copies.spawn(copy_output(out, tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            copies.spawn(copy_output(err, tail.clone()));
        }
        Ok(Server { child, tail, copies })
    }

    /// Why the server ended by itself, with what it printed last, up to a
    /// moment after it ended (a process it left behind may hold its pipes
    /// open).
    async fn ended(&mut self, status: std::io::Result<ExitStatus>, oom_before: Option<u64>) -> Ended {
        let copies = &mut self.copies;
        let _ =
            tokio::time::timeout(Duration::from_secs(1), async { while copies.join_next().await.is_some() {} }).await;
        match status {
            Ok(status) => Ended {
                cause: exit_cause::describe(status, oom_before, exit_cause::oom_kills()),
                code: exit_cause::exit_code(status),
                tail: self.tail.lock().unwrap_or_else(|e| e.into_inner()).lines(),
            },
            Err(e) => Ended { cause: format!("cannot wait for the server: {e}"), code: 1, tail: Vec::new() },
        }
    }
}

/// After a notice: stops routing new requests, lets those in flight finish
/// up to the drain timeout (an immediate class: not at all, see
/// [`cuts_at_sigterm`]), stops the server, and records the drain in the job's
/// comment.
async fn drain(
    cfg: &LauncherConfig,
    state: &Front,
    which: (&'static str, libc::c_int),
    notices: &mut Notices,
    child: &mut tokio::process::Child,
    note: &mut ReplicaNote,
) -> Outcome {
    let notice = (std::time::SystemTime::now(), Instant::now());
    state.start_draining();
    let in_flight_at_notice = state.in_flight();
    let immediate = cuts_at_sigterm(cfg.reclaim);
    let outcome = if immediate && which.1 == libc::SIGTERM {
        tracing::info!(signal = which.0, in_flight = in_flight_at_notice, "reclaimed at once (immediate class)");
        cut_now(state).await
    } else {
        tracing::info!(signal = which.0, in_flight = in_flight_at_notice, "notice received: draining");
        // An immediate class drains a time-limit notice, but Slurm's
        // SIGTERM during that drain is a preemption all the same.
        let killed = async {
            match immediate {
                true => notices.term.recv().await,
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            waited = state.wait_idle(cfg.drain_timeout) => match waited {
                Ok(waited) => Outcome::Drained { waited },
                Err(in_flight) => {
                    // Tell what is left why it ends, and give those answers
                    // a moment to leave before the server (and this
                    // process) goes.
                    state.cut_off();
                    let _ = state.wait_idle(CUT_FLUSH).await;
                    Outcome::TimedOut { in_flight }
                }
            },
            _ = killed => {
                tracing::info!("SIGTERM during the drain: reclaimed at once (immediate class)");
                cut_now(state).await
            }
        }
    };
    tracing::info!(
        ?outcome,
        turned_away = state.turned_away.load(Ordering::SeqCst),
        "drain finished; stopping the server"
    );
    // After a cut nothing is left for the server to finish, and either the
    // job's GraceTime is nearly spent or there is none: a server that does
    // not exit at once is killed. (llama-server stopped with its slots
    // still generating hung until the 10 s SIGKILL on 24.11, and the
    // protected job waited for it.)
    let (grace, close, patience) = match outcome {
        Outcome::Cut { .. } => (cfg.stop_grace.min(CUT_STOP_GRACE), CUT_FLUSH, Patience::AtKill),
        Outcome::TimedOut { .. } => (cfg.stop_grace.min(CUT_STOP_GRACE), CONNECTIONS_CLOSE, Patience::Retry),
        _ => (cfg.stop_grace, CONNECTIONS_CLOSE, Patience::Retry),
    };
    // What the front still writes to the router leaves before the server
    // and this process go.
    state.close_connections(close).await;
    // The record of the drain goes into the job's comment while the server
    // stops (one scontrol call; the GPUs wait for the server, not for it).
    let drain = DrainNote {
        notice_ms: notice.0.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        signal: which.1,
        in_flight: in_flight_at_notice,
        cut: match outcome {
            Outcome::TimedOut { in_flight } | Outcome::Cut { in_flight } => in_flight.min(in_flight_at_notice),
            _ => 0,
        },
        turned_away: state.turned_away.load(Ordering::SeqCst),
        took_ms: notice.1.elapsed().as_millis() as u64,
    };
    tokio::join!(stop(child, grace), cfg.report.drained(note, drain, patience));
    outcome
}

/// Cuts what is in flight now (each told why, [`Front::cut_off`]) and
/// gives those answers a moment to leave.
async fn cut_now(state: &Front) -> Outcome {
    let in_flight = state.in_flight();
    state.cut_off();
    let _ = state.wait_idle(CUT_FLUSH).await;
    Outcome::Cut { in_flight }
}
