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

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::conventions::DRAINING_HEADER;

/// How long the answers of requests cut off at the drain timeout get to
/// leave before the server is stopped.
const CUT_FLUSH: Duration = Duration::from_secs(1);
/// How long a server stopped after a timed-out drain gets before SIGKILL.
const CUT_STOP_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct LauncherConfig {
    /// Where the router reaches this replica.
    pub listen: SocketAddr,
    /// Where the model server listens (on this node).
    pub backend: SocketAddr,
    /// Longest drain after the notice; Slurm's GraceTime must cover it.
    pub drain_timeout: Duration,
    /// How long the server gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The model server's command line.
    pub command: Vec<String>,
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
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
}

/// How the launcher ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server exited by itself.
    ServerExited(Option<i32>),
    /// Drained after a notice: every request in flight finished.
    Drained { waited: Duration },
    /// The drain timeout passed with requests still in flight; they were
    /// cut off with an answer that says so ([`Front::cut_off`]).
    TimedOut { in_flight: u64 },
}

impl Outcome {
    /// The process exit code: 0 for a clean drain.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::ServerExited(code) => code.unwrap_or(1),
            Outcome::Drained { .. } => 0,
            Outcome::TimedOut { .. } => 1,
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

/// The last event of a stream cut off at the drain timeout: the shape
/// OpenAI's API uses for an error in the middle of a stream, which its
/// clients raise as an API error.
const CUT_EVENT: &str = "data: {\"error\":{\"message\":\"the replica serving this stream was reclaimed for higher-priority work and its drain timeout passed before the stream finished; retry the request\",\"type\":\"server_error\",\"code\":\"replica_reclaimed\"}}\n\n";

/// A response body from the server that counts as in flight until it
/// ends, and ends early (see [`Front::cut_off`]) when the drain times out.
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
                Err("the drain timeout passed before the response was complete".into())
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

async fn front(
    req: Request<Incoming>,
    state: Arc<Front>,
    client: Client<HttpConnector, Incoming>,
    backend: SocketAddr,
) -> Response<FrontBody> {
    if state.is_draining() {
        state.turned_away.fetch_add(1, Ordering::SeqCst);
        return plain(StatusCode::SERVICE_UNAVAILABLE, "replica is draining; retry elsewhere\n", true);
    }
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = Guard(state.clone());
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("http://{backend}{path}").parse() {
        Ok(u) => u,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "bad request target\n", false),
    };
    let answer = tokio::select! {
        r = client.request(Request::from_parts(parts, body)) => r,
        _ = state.cut.cancelled() => {
            state.cut_short.fetch_add(1, Ordering::SeqCst);
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the replica's drain timeout passed before the model server answered; retry elsewhere\n",
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
        Err(e) => {
            tracing::warn!("the model server failed a request: {e:?}");
            plain(StatusCode::BAD_GATEWAY, &format!("model server failed: {e}\n"), false)
        }
    }
}

/// Serves the front proxy until the process ends.
pub async fn serve_front(listener: TcpListener, backend: SocketAddr, state: Arc<Front>) {
    // A new connection per request: the server is on this node (a loopback
    // connect costs microseconds), and a kept-alive one races the server's
    // own idle close (llama-server's is 5 s): a request written as the
    // server closes fails, and its streamed body cannot be sent again. Seen
    // as 502s with llama-server replicas before this.
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (state, client) = (state.clone(), client.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let (state, client) = (state.clone(), client.clone());
                async move { Ok::<_, std::convert::Infallible>(front(req, state, client, backend).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// SIGTERM to the server's process group, SIGKILL to it after `grace`.
async fn stop(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    let group = child.id().map(|pid| -(pid as i32));
    if let Some(g) = group {
        // SAFETY: kill(2) on the process group our child leads.
        unsafe { libc::kill(g, libc::SIGTERM) };
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    if let Some(g) = group {
        // What the server left behind in its group goes with it.
        // SAFETY: as above; the group may be empty by now (ESRCH).
        unsafe { libc::kill(g, libc::SIGKILL) };
    }
    status
}

/// Runs the server behind the front proxy until it exits or a notice
/// (SIGUSR1, SIGTERM, SIGINT) drains it.
pub async fn run(cfg: LauncherConfig, state: Arc<Front>) -> Result<Outcome, LauncherError> {
    let (program, args) = cfg.command.split_first().ok_or(LauncherError::NoCommand)?;
    let listener =
        TcpListener::bind(cfg.listen).await.map_err(|source| LauncherError::Listen { addr: cfg.listen, source })?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(LauncherError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(LauncherError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(LauncherError::Signals)?;
    // The notice of a replica in a per-node job (crate::replica_group):
    // Slurm signals every process of a step, and SIGURG, unlike SIGUSR1,
    // leaves a model server that does not handle it running.
    let mut urg = signal(SignalKind::from_raw(libc::SIGURG)).map_err(LauncherError::Signals)?;
    let mut child = Command::new(program)
        .args(args)
        .env("ONEPOOL_BACKEND_PORT", cfg.backend.port().to_string())
        // Its own process group, so that stopping it reaches the worker
        // processes servers such as vLLM fork (they hold GPUs too).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| LauncherError::Spawn { cmd: cfg.command.join(" "), source })?;
    let front_task = tokio::spawn(serve_front(listener, cfg.backend, state.clone()));
    let which = tokio::select! {
        status = child.wait() => {
            front_task.abort();
            return Ok(Outcome::ServerExited(status.ok().and_then(|s| s.code())));
        }
        _ = usr1.recv() => "SIGUSR1",
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = urg.recv() => "SIGURG",
    };
    state.start_draining();
    tracing::info!(signal = which, in_flight = state.in_flight(), "notice received: draining");
    let outcome = match state.wait_idle(cfg.drain_timeout).await {
        Ok(waited) => Outcome::Drained { waited },
        Err(in_flight) => {
            // Tell what is left why it ends, and give those answers a
            // moment to leave before the server (and this process) goes.
            state.cut_off();
            let _ = state.wait_idle(CUT_FLUSH).await;
            Outcome::TimedOut { in_flight }
        }
    };
    tracing::info!(
        ?outcome,
        turned_away = state.turned_away.load(Ordering::SeqCst),
        "drain finished; stopping the server"
    );
    // After a timed-out drain nothing is left for the server to finish,
    // and the job's GraceTime is nearly spent: a server that does not exit
    // at once is killed. (llama-server stopped with its slots still
    // generating hung until the 10 s SIGKILL on 24.11, and the protected
    // job waited for it.)
    let grace = match outcome {
        Outcome::TimedOut { .. } => cfg.stop_grace.min(CUT_STOP_GRACE),
        _ => cfg.stop_grace,
    };
    stop(&mut child, grace).await;
    front_task.abort();
    Ok(outcome)
}
