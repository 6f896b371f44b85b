//! The reverse proxy: a listener per endpoint, or a shared listener that
//! picks the endpoint by `Host`, path prefix or the OpenAI `model` field;
//! HTTP/1.1 and HTTP/2 (h2c prior knowledge) from clients, HTTP/1.1 to
//! replicas. Response bodies
//! stream through frame by frame; the replica's lease ends with the last
//! frame (or when the client goes away), so drains wait for streams too.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use onepool_launcher::conventions::DRAINING_HEADER;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::access_log::{AccessLog, RequestFacts, ServedBy, Tap};
use crate::prefix::prefix_key;
use crate::backend_pool::{self, BackendBody, SendError, HOP_BY_HOP, IDLE_TIMEOUT};
use crate::endpoint::{AcquireError, Endpoint, Lease};
use crate::metrics::{ListenerLabels, Metrics, RefusedLabels, RequestCounters, Unavailable};
use crate::settings::{ConnSettings, ProxySettings, Routes, MODEL_PATHS};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A response body: the router's own answer, or a replica's passing
/// through (no box per response).
pub struct ProxyBody {
    kind: BodyKind,
    /// Its request's hold on the connection, let go with the body.
    hold: Option<RequestHold>,
    /// The access log's watch on it, when the log is on.
    tap: Option<Box<Tap>>,
}

enum BodyKind {
    Own(Full<Bytes>),
    Replica(LeasedBody),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let me = self.get_mut();
        let r = match &mut me.kind {
            BodyKind::Own(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            BodyKind::Replica(b) => Pin::new(b).poll_frame(cx),
        };
        if let Some(tap) = &mut me.tap {
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
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Own(b) => b.size_hint(),
            BodyKind::Replica(b) => b.size_hint(),
        }
    }
}

/// One endpoint as the proxy sees it: shared by its own listener and by
/// every shared listener that routes to it (one backend connection pool
/// per replica).
pub struct Target {
    endpoint: Arc<Endpoint>,
    settings: ProxySettings,
    metrics: Arc<Metrics>,
    budget: Arc<BodyBudget>,
    access: Option<Arc<AccessLog>>,
}

impl Target {
    pub fn new(
        endpoint: Arc<Endpoint>,
        settings: ProxySettings,
        metrics: Arc<Metrics>,
        budget: Arc<BodyBudget>,
        access: Option<Arc<AccessLog>>,
    ) -> Arc<Target> {
        // Closes keep-alive connections left unused (by a replica that is
        // no longer busy, or after a burst), until the endpoint is gone.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let endpoint = Arc::downgrade(&endpoint);
            rt.spawn(async move {
                let mut tick = tokio::time::interval(IDLE_TIMEOUT / 2);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match endpoint.upgrade() {
                        Some(e) => e.prune_idle(IDLE_TIMEOUT),
                        None => break,
                    }
                }
            });
        }
        if let Some(prefix) = settings.prefix {
            endpoint.set_prefix_routing(prefix);
        }
        Arc::new(Target { endpoint, settings, metrics, budget, access })
    }
}

/// The request body bytes all requests in flight may hold, daemon-wide:
/// bodies are kept whole until their last attempt (for retries), so
/// without a bound many large ones at once grow memory without end. A
/// body takes its bytes as they arrive and gives them back when its
/// request is done; one that finds the budget spent gets 503.
pub struct BodyBudget {
    /// Bytes held now (the `onepool_router_buffered_body_bytes` gauge).
    held: Gauge,
    limit: i64,
    refused: Counter,
}

impl BodyBudget {
    pub fn new(limit: usize, metrics: &Metrics) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            held: metrics.buffered_body_bytes.clone(),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            refused: metrics.body_budget_refused.clone(),
        })
    }

    /// Bytes held by requests in flight now.
    pub fn held(&self) -> i64 {
        self.held.get()
    }

    /// Takes `n` bytes if the budget has them (one atomic update).
    fn take(&self, n: usize) -> bool {
        let n = n as i64;
        self.held
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |h| (h + n <= self.limit).then_some(h + n))
            .is_ok()
    }
}

/// A request body's bytes in the budget, given back when dropped.
struct BodyShare<'a> {
    budget: &'a BodyBudget,
    bytes: usize,
}

impl Drop for BodyShare<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.dec_by(self.bytes as i64);
        }
    }
}

/// Why a request body was not read whole.
enum BodyError {
    TooLarge,
    TimedOut,
    /// The budget had no room for it.
    OverBudget,
    Unreadable,
}

/// Reads a request body whole: at most `max` bytes, within `timeout` (for
/// the whole body, so a client cannot hold its connection and bytes by
/// trickling), each frame's bytes taken from `budget` as it arrives.
async fn read_whole(
    mut body: Incoming,
    max: usize,
    timeout: Duration,
    budget: &BodyBudget,
) -> Result<(Bytes, BodyShare<'_>), BodyError> {
    let hint = body.size_hint();
    if hint.lower() > max as u64 {
        return Err(BodyError::TooLarge);
    }
    let read = async move {
        let mut share = BodyShare { budget, bytes: 0 };
        // The first frame is kept as it is (most bodies come in one); a
        // second starts a buffer, of the Content-Length when there is one,
        // whose pages fill as the bytes come.
        let (mut first, mut rest) = (Bytes::new(), BytesMut::new());
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| BodyError::Unreadable)?.into_data() else { continue };
            if share.bytes + data.len() > max {
                return Err(BodyError::TooLarge);
            }
            if !budget.take(data.len()) {
                return Err(BodyError::OverBudget);
            }
            share.bytes += data.len();
            if share.bytes == data.len() {
                first = data;
                continue;
            }
            if rest.is_empty() {
                let whole = hint.exact().map_or(share.bytes, |n| n as usize);
                rest.reserve(whole.max(share.bytes));
                rest.extend_from_slice(&std::mem::take(&mut first));
            }
            rest.extend_from_slice(&data);
        }
        Ok((if rest.is_empty() { first } else { rest.freeze() }, share))
    };
    tokio::time::timeout(timeout, read).await.unwrap_or(Err(BodyError::TimedOut))
}

impl BodyError {
    /// The answer to the client, made by `make`; `what` names the limit
    /// passed.
    fn answer(
        self,
        budget: &BodyBudget,
        max: usize,
        what: &str,
        make: fn(StatusCode, &str) -> Response<ProxyBody>,
    ) -> Response<ProxyBody> {
        match self {
            BodyError::TooLarge => {
                make(StatusCode::PAYLOAD_TOO_LARGE, &format!("request body larger than {max} bytes{what}"))
            }
            BodyError::TimedOut => make(StatusCode::REQUEST_TIMEOUT, "request body not received in time"),
            BodyError::OverBudget => {
                budget.refused.inc();
                let mut r = make(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the router holds as many request bodies as it may; retry later",
                );
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            BodyError::Unreadable => make(StatusCode::BAD_REQUEST, "request body could not be read"),
        }
    }
}

/// How a listener picks the endpoint for a request.
pub enum Dispatch {
    /// An endpoint's own listener.
    Single(Arc<Target>),
    /// A shared listener.
    Routed(Box<Routed>),
}

/// A shared listener's routes, and its count of the requests it answered
/// itself (refused: no such host, path or model; bad request), under
/// `endpoint=""` (no endpoint chosen).
pub struct Routed {
    by: By,
    answered: Option<RequestCounters>,
}

enum By {
    /// By `Host` (or HTTP/2 `:authority`), lower case, port ignored.
    Host(HashMap<String, Arc<Target>>),
    /// By path prefix on whole segments, longest first.
    Path(Vec<(String, bool, Arc<Target>)>),
    /// By the `model` field of POSTs to [`MODEL_PATHS`].
    Model { max_body: usize, body_timeout: Duration, models: BTreeMap<String, Arc<Target>>, budget: Arc<BodyBudget> },
}

impl Dispatch {
    /// Builds a shared listener's dispatch; every route's endpoint must be
    /// in `targets` (the configuration checked that).
    pub fn routed(routes: &Routes, targets: &HashMap<String, Arc<Target>>, budget: &Arc<BodyBudget>) -> Dispatch {
        let t = |name: &str| targets.get(name).expect("routes name configured endpoints").clone();
        let by = match routes {
            Routes::Host(r) => By::Host(r.iter().map(|(h, e)| (h.clone(), t(e))).collect()),
            Routes::Path(r) => {
                let mut v: Vec<_> = r.iter().map(|p| (p.prefix.clone(), p.strip, t(&p.endpoint))).collect();
                v.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
                By::Path(v)
            }
            Routes::Model { max_body, body_timeout, routes } => By::Model {
                max_body: *max_body,
                body_timeout: *body_timeout,
                models: routes.iter().map(|(m, e)| (m.clone(), t(e))).collect(),
                budget: budget.clone(),
            },
        };
        // Every target shares the daemon's metrics.
        let answered = targets.values().next().map(|t| t.metrics.request_counters("", ""));
        Dispatch::Routed(Box::new(Routed { by, answered }))
    }

    fn name(&self) -> &str {
        match self {
            Dispatch::Single(t) => t.endpoint.name(),
            Dispatch::Routed(r) => match r.by {
                By::Host(_) => "(by host)",
                By::Path(_) => "(by path)",
                By::Model { .. } => "(by model)",
            },
        }
    }
}

/// A client connection as requests on it see it.
struct ClientConn {
    dispatch: Arc<Dispatch>,
    /// The client's address as `X-Forwarded-For` names it.
    forwarded_for: HeaderValue,
    /// Requests received so far.
    received: AtomicU64,
    /// Requests whose answer has gone out to its end (or was dropped).
    done: AtomicU64,
    /// An HTTP/2 connection (its streams have no head timeout).
    http2: AtomicBool,
}

/// One request's hold on its connection, from its head until its answer
/// has gone out (or was dropped): while one is held, no request head is
/// awaited, so the head timeout does not run.
struct RequestHold(Arc<ClientConn>);

impl RequestHold {
    fn new(client: Arc<ClientConn>, version: Version) -> RequestHold {
        if version == Version::HTTP_2 {
            client.http2.store(true, Ordering::Relaxed);
        }
        client.received.fetch_add(1, Ordering::Relaxed);
        RequestHold(client)
    }
}

impl Drop for RequestHold {
    fn drop(&mut self) {
        self.0.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// A listener's connections: held to its caps as they come, and for a
/// graceful stop, each told to finish what it serves and close, the stop
/// waiting until all have.
struct Connections {
    stopping: AtomicBool,
    open: Mutex<Open>,
    next: AtomicU64,
    all_closed: tokio::sync::Notify,
    max: usize,
    max_per_ip: usize,
    gauge: Gauge,
    refused_total: Counter,
    refused_per_ip: Counter,
}

#[derive(Default)]
struct Open {
    /// Each open connection's task, to wake it for the stop.
    wakers: HashMap<u64, Option<Waker>>,
    /// Open connections by client address (none listed at zero).
    per_ip: HashMap<IpAddr, usize>,
}

impl Connections {
    fn new(conn: &ConnSettings, listener: &str, metrics: &Metrics) -> Connections {
        let refused = |reason: &str| {
            let labels = RefusedLabels { listener: listener.to_string(), reason: reason.to_string() };
            metrics.connections_refused.get_or_create(&labels).clone()
        };
        Connections {
            stopping: AtomicBool::new(false),
            open: Mutex::default(),
            next: AtomicU64::new(0),
            all_closed: tokio::sync::Notify::new(),
            max: conn.max_connections,
            max_per_ip: conn.max_connections_per_ip,
            gauge: metrics.connections.get_or_create(&ListenerLabels { listener: listener.to_string() }).clone(),
            refused_total: refused("max_connections"),
            refused_per_ip: refused("max_connections_per_ip"),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection from `ip`, or `None` (counted) if it would pass
    /// the listener's cap or its client's.
    fn add(&self, ip: IpAddr) -> Option<u64> {
        let mut open = self.table();
        let refused = if open.wakers.len() >= self.max {
            &self.refused_total
        } else if open.per_ip.get(&ip).is_some_and(|&n| n >= self.max_per_ip) {
            &self.refused_per_ip
        } else {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            open.wakers.insert(id, None);
            *open.per_ip.entry(ip).or_default() += 1;
            self.gauge.inc();
            return Some(id);
        };
        refused.inc();
        None
    }

    fn remove(&self, id: u64, ip: IpAddr) {
        let mut open = self.table();
        open.wakers.remove(&id);
        if let Some(n) = open.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&ip);
            }
        }
        self.gauge.dec();
        if open.wakers.is_empty() {
            self.all_closed.notify_waiters();
        }
    }

    /// Tells every connection to close once its requests are answered, and
    /// waits until all have closed.
    async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for w in self.table().wakers.values().flatten() {
            w.wake_by_ref();
        }
        loop {
            let closed = self.all_closed.notified();
            let mut closed = std::pin::pin!(closed);
            closed.as_mut().enable();
            if self.table().wakers.is_empty() {
                return;
            }
            closed.await;
        }
    }
}

/// A client connection's future, with the two things it needs from
/// outside hyper's own state machine: the graceful stop, and the request
/// head timeout (slowloris). The head timeout is kept here, per connection,
/// rather than by hyper per request (which makes and removes a timer entry
/// for every request, and reads the clock): one timer, which looks when it
/// fires whether the connection has been waiting for a request head all
/// along since it was set; if so, the connection closes; if not, the timer
/// is set again from then. So a connection that waits for a head is closed
/// between one and two head timeouts after it started to wait, and busy
/// connections cost the timer nothing per request. HTTP/2 connections are
/// held to it only until their first request (hyper had no head timeout
/// for HTTP/2 at all; a connection that never sends one now closes too);
/// after it, the same timer closes them once no stream has been open for
/// the HTTP/2 idle timeout (GOAWAY first; if the client keeps the
/// connection open one more idle timeout, it is dropped).
struct Guarded<C> {
    conn: Pin<Box<C>>,
    client: Arc<ClientConn>,
    conns: Arc<Connections>,
    id: u64,
    ip: IpAddr,
    waker: Option<Waker>,
    stopping: bool,
    head_timeout: Duration,
    http2_idle_timeout: Duration,
    /// The connection is known to be HTTP/2 (the timer runs its idle
    /// timeout).
    http2: bool,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// (received, done) when the timer was set.
    armed_at: (u64, u64),
}

impl<C> Guarded<C> {
    /// `id` is the connection's in `conns`, from `ip`.
    fn new(
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
trait GracefulStop {
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
            let now = (this.client.received.load(Ordering::Relaxed), this.client.done.load(Ordering::Relaxed));
            // No request since the timer was set, and none open then.
            if now == this.armed_at && now.0 == now.1 {
                if !this.http2 || this.stopping {
                    return Poll::Ready(Err(HeadTimeout::Elapsed));
                }
                this.stopping = true;
                this.conn.as_mut().graceful_stop();
                // Polled again to send the GOAWAY.
                cx.waker().wake_by_ref();
            }
            this.armed_at = now;
            let period = if this.http2 { this.http2_idle_timeout } else { this.head_timeout };
            this.timer.as_mut().reset(tokio::time::Instant::now() + period);
        }
        Poll::Pending
    }
}

/// How a guarded connection ended badly.
enum HeadTimeout<E> {
    Conn(E),
    /// No complete request head within the head timeout (HTTP/2: no
    /// stream within its idle timeout).
    Elapsed,
}

/// Serves `dispatch` on `listener` until `shutdown` turns true, then
/// stops accepting and lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    dispatch: Arc<Dispatch>,
    conn: ConnSettings,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The head timeout is the guard's (see `Guarded`), not hyper's.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None).max_buf_size(conn.max_header_bytes.max(8192));
    builder.http2().timer(TokioTimer::new()).max_header_list_size(conn.max_header_bytes as u32);
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let conns = Arc::new(Connections::new(&conn, &address, metrics));
    let acceptor = conn.tls.as_ref().map(|t| t.acceptor());
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off a moment
                    // instead of spinning on the error.
                    tracing::warn!(listener = %dispatch.name(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::shutdown::stopped(&mut shutdown) => break,
        };
        let Some(id) = conns.add(peer.ip()) else {
            // Refused before anything is made for it; the answer is a
            // courtesy (it may not be read), the close is what counts.
            let _ = stream.try_write(REFUSED);
            tracing::debug!(listener = %dispatch.name(), %peer, "connection refused: over the connection cap");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let forwarded_for =
            HeaderValue::from_str(&peer.ip().to_string()).unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        let client = Arc::new(ClientConn {
            dispatch: dispatch.clone(),
            forwarded_for,
            received: AtomicU64::new(0),
            done: AtomicU64::new(0),
            http2: AtomicBool::new(false),
        });
        let requests = client.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let hold = RequestHold::new(requests.clone(), req.version());
            // Decided before the future is made, so that it carries only
            // what the request needs (every request's future is moved
            // around whole).
            let plan = plan(req, &hold.0);
            async move {
                let mut r = match plan {
                    Plan::Answer(r) => *r,
                    Plan::Forward(p, t) => forward(p, &t).await,
                    Plan::Later(f) => f.await,
                };
                r.body_mut().hold = Some(hold);
                Ok::<_, Infallible>(r)
            }
        });
        let (builder, conns, conn, acceptor) = (builder.clone(), conns.clone(), conn.clone(), acceptor.clone());
        tokio::spawn(async move {
            // The handshake in the connection's own task, so a slow client
            // never holds up the accept loop; it gets the head's time.
            let stream = match acceptor {
                None => ClientStream::Plain(stream),
                Some(a) => match tokio::time::timeout(conn.header_read_timeout, a.accept(stream)).await {
                    Ok(Ok(s)) => ClientStream::Tls(Box::new(s)),
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, "TLS handshake failed: {e}");
                        conns.remove(id, peer.ip());
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "no TLS handshake in time; connection closed");
                        conns.remove(id, peer.ip());
                        return;
                    }
                },
            };
            let served = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
            let served = Guarded::new(served, client, (conns, id, peer.ip()), &conn);
            match served.await {
                Ok(()) => {}
                Err(HeadTimeout::Elapsed) => tracing::debug!(%peer, "no request head in time; connection closed"),
                Err(HeadTimeout::Conn(e)) => tracing::debug!(%peer, "client connection ended: {e}"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, conns.stop()).await.is_err() {
        tracing::warn!(listener = %dispatch.name(), "shutdown grace period over; closing open connections");
    }
}

/// A client's connection, in clear or TLS (`[endpoint.tls]`).
enum ClientStream {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tokio::io::AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The answer on a connection refused for the connection caps.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 34\r\n\r\ntoo many connections; retry later\n";

fn full(body: impl Into<Bytes>) -> ProxyBody {
    ProxyBody { kind: BodyKind::Own(Full::new(body.into())), hold: None, tap: None }
}

fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("{message}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn unavailable(ctx: &Target, message: &str) -> Response<ProxyBody> {
    let mut r = openai_error(StatusCode::SERVICE_UNAVAILABLE, message);
    let secs = ctx.endpoint.queue_settings().timeout.as_secs().max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// 401 unless the request carries one of the endpoint's bearer tokens
/// (endpoints with `[endpoint.auth]`).
fn unauthorized(t: &Target, headers: &HeaderMap) -> Option<Response<ProxyBody>> {
    let auth = t.settings.auth.as_ref()?;
    if auth.allows(headers) {
        return None;
    }
    t.endpoint.count_answer(401);
    let mut r = openai_error(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs an API key: send Authorization: Bearer <key> with one of its keys",
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

/// `GET /v1/models`, which the endpoint answers itself from all its
/// replicas' lists.
fn is_models_list<B>(req: &Request<B>) -> bool {
    req.method() == Method::GET && req.uri().path() == "/v1/models"
}

async fn list_models(t: Arc<Target>, authorization: Option<HeaderValue>) -> Response<ProxyBody> {
    let r = match crate::models::list(&t.endpoint, t.settings.connect_timeout, authorization).await {
        Ok(list) => json_response(StatusCode::OK, list),
        Err((status, why)) => openai_error(status, &why),
    };
    t.endpoint.count_answer(r.status().as_u16());
    r
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An OpenAI-style error answer, which OpenAI clients show as it is: the
/// endpoint's own answers (no replica, the replica failed) are read by the
/// same clients that read the model server's.
fn openai_error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    json_response(status, serde_json::json!({ "error": { "message": message, "type": kind, "code": status.as_u16() } }))
}

/// The host a request names, lower case, without a port.
fn request_host(parts: &http::request::Parts) -> Option<String> {
    let raw = match parts.headers.get(header::HOST).and_then(|v| v.to_str().ok()) {
        Some(h) => h,
        None => parts.uri.authority()?.as_str(),
    };
    let host = match raw.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') || raw.starts_with('[') => {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                raw
            }
        }
        _ => raw,
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// Whether `prefix` matches `path` on whole segments.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/" || (path.starts_with(prefix) && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/')))
}

fn strip_prefix(uri: &Uri, prefix: &str) -> Result<Uri, String> {
    let rest = &uri.path()[if prefix == "/" { 0 } else { prefix.len() }..];
    let path = if rest.is_empty() { "/" } else { rest };
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().map_err(|e| format!("request target {pq:?}: {e}"))?);
    Uri::from_parts(parts).map_err(|e| format!("request target {pq:?}: {e}"))
}

#[derive(serde::Deserialize)]
struct ModelField {
    model: Option<serde_json::Value>,
}

/// What to do with a request, decided as it arrives.
enum Plan {
    /// Answered by the listener already (boxed: rare, and large).
    Answer(Box<Response<ProxyBody>>),
    /// A request without a body, for the endpoint's replicas.
    Forward(Prepared, Arc<Target>),
    /// A body to read first (or a model to find in it).
    Later(Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>),
}

fn plan(req: Request<Incoming>, client: &Arc<ClientConn>) -> Plan {
    let later = |req| Plan::Later(Box::pin(route(req, client.clone())));
    if !req.body().is_end_stream() {
        return later(req);
    }
    let (req, t) = match &*client.dispatch {
        Dispatch::Single(t) => (req, t),
        Dispatch::Routed(routed) => match routed.by {
            By::Model { .. } => return later(req),
            _ => match pick(req, routed) {
                Picked::Endpoint(req, t) => (req, t),
                Picked::Answered(r) => return Plan::Answer(Box::new(r)),
                Picked::ByModel { req, .. } => return later(req),
            },
        },
    };
    if let Some(r) = unauthorized(t, req.headers()) {
        return Plan::Answer(Box::new(r));
    }
    if is_models_list(&req) {
        return Plan::Later(Box::pin(list_models(t.clone(), req.headers().get(header::AUTHORIZATION).cloned())));
    }
    let start = Instant::now();
    let (parts, _) = req.into_parts();
    let mut p = Prepared::new(parts, Bytes::new(), t, client, start);
    // Nothing read since `start`: the first attempt's clock starts there.
    p.start_is_now = true;
    Plan::Forward(p, t.clone())
}

/// Picks the endpoint for one request, reads its body, then proxies it
/// there.
async fn route(req: Request<Incoming>, client: Arc<ClientConn>) -> Response<ProxyBody> {
    let client = &*client;
    // One `forward` await for every way to an endpoint: each await of it
    // would add its state to this future.
    let (req, t) = match &*client.dispatch {
        Dispatch::Single(t) => (req, t),
        Dispatch::Routed(routed) => match pick(req, routed) {
            Picked::Endpoint(req, t) => (req, t),
            Picked::Answered(r) => return r,
            Picked::ByModel { req, max_body, body_timeout, models, budget } => {
                // Boxed: its body reading and JSON parsing would otherwise
                // make every request's future as large.
                let routing = route_by_model(req, max_body, body_timeout, models, budget, client);
                return match Box::pin(routing).await {
                    Routing::Endpoint(r) => r,
                    Routing::Listener(r) => routed.listener_answer(r),
                };
            }
        },
    };
    // Before its body is read: a client without a token costs nothing more.
    if let Some(r) = unauthorized(t, req.headers()) {
        return r;
    }
    if is_models_list(&req) {
        return Box::pin(list_models(t.clone(), req.headers().get(header::AUTHORIZATION).cloned())).await;
    }
    // The body, read whole (bounded) so that a failed attempt can be
    // retried; then the request goes to one of the endpoint's replicas.
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    // Held until the last attempt is over.
    let (body, _share) = if body.is_end_stream() {
        (Bytes::new(), None)
    } else {
        let s = &t.settings;
        // Boxed, as only requests with a body need its state.
        match Box::pin(read_whole(body, s.max_request_body, s.body_read_timeout, &t.budget)).await {
            Ok((b, share)) => (b, Some(share)),
            Err(e) => {
                let r = e.answer(&t.budget, s.max_request_body, "", error_response);
                t.endpoint.count_answer(r.status().as_u16());
                return r;
            }
        }
    };
    forward(Prepared::new(parts, body, t, client, start), t).await
}

enum Picked<'a> {
    Endpoint(Request<Incoming>, &'a Arc<Target>),
    /// Refused by the listener (counted).
    Answered(Response<ProxyBody>),
    /// To be read for its `model`.
    ByModel {
        req: Request<Incoming>,
        max_body: usize,
        body_timeout: Duration,
        models: &'a BTreeMap<String, Arc<Target>>,
        budget: &'a BodyBudget,
    },
}

impl Routed {
    /// Counts an answer the listener gave itself.
    fn listener_answer(&self, r: Response<ProxyBody>) -> Response<ProxyBody> {
        if let Some(c) = &self.answered {
            c.count(r.status().as_u16());
        }
        r
    }
}

/// The endpoint for a request on a shared listener, by host or path.
fn pick(req: Request<Incoming>, routed: &Routed) -> Picked<'_> {
    match &routed.by {
        By::Host(hosts) => {
            let (parts, body) = req.into_parts();
            let Some(host) = request_host(&parts) else {
                return Picked::Answered(routed.listener_answer(error_response(
                    StatusCode::BAD_REQUEST,
                    "the request names no host; this listener routes by Host",
                )));
            };
            match hosts.get(&host) {
                Some(t) => Picked::Endpoint(Request::from_parts(parts, body), t),
                None => Picked::Answered(routed.listener_answer(error_response(
                    StatusCode::NOT_FOUND,
                    &format!("no endpoint is served for host {host:?} here"),
                ))),
            }
        }
        By::Path(routes) => {
            let (mut parts, body) = req.into_parts();
            let Some((prefix, strip, t)) = routes.iter().find(|(p, _, _)| prefix_matches(p, parts.uri.path())) else {
                let known: Vec<&str> = routes.iter().map(|(p, _, _)| p.as_str()).collect();
                let msg =
                    format!("no endpoint is served under {:?}; the path prefixes here are {known:?}", parts.uri.path());
                return Picked::Answered(routed.listener_answer(error_response(StatusCode::NOT_FOUND, &msg)));
            };
            if *strip {
                match strip_prefix(&parts.uri, prefix) {
                    Ok(u) => parts.uri = u,
                    Err(msg) => {
                        t.endpoint.count_answer(400);
                        return Picked::Answered(error_response(StatusCode::BAD_REQUEST, &msg));
                    }
                }
            }
            Picked::Endpoint(Request::from_parts(parts, body), t)
        }
        By::Model { max_body, body_timeout, models, budget } => {
            Picked::ByModel { req, max_body: *max_body, body_timeout: *body_timeout, models, budget }
        }
    }
}

/// Who answered a request routed by model: an endpoint (which counted
/// it), or the listener itself (its model list, or a refusal).
enum Routing {
    Endpoint(Response<ProxyBody>),
    Listener(Response<ProxyBody>),
}

async fn route_by_model(
    req: Request<Incoming>,
    max_body: usize,
    body_timeout: Duration,
    models: &BTreeMap<String, Arc<Target>>,
    budget: &BodyBudget,
    client: &ClientConn,
) -> Routing {
    let known = || models.keys().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ");
    let refuse = |status, msg: &str| Routing::Listener(openai_error(status, msg));
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/v1/models" {
        let data: Vec<_> =
            models.keys().map(|m| serde_json::json!({ "id": m, "object": "model", "owned_by": "onepool" })).collect();
        return Routing::Listener(json_response(StatusCode::OK, serde_json::json!({ "object": "list", "data": data })));
    }
    if !MODEL_PATHS.contains(&path) {
        let msg = format!(
            "this listener routes by the \"model\" of POST {}; {path:?} is not one of them",
            MODEL_PATHS.join(", ")
        );
        return refuse(StatusCode::NOT_FOUND, &msg);
    }
    if req.method() != Method::POST {
        let mut r = openai_error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes POST"));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Routing::Listener(r);
    }
    let (parts, body) = req.into_parts();
    let (body, _share) = match read_whole(body, max_body, body_timeout, budget).await {
        Ok(b) => b,
        Err(e) => {
            let what = ", the most this listener reads to find \"model\" (max_model_body)";
            return Routing::Listener(e.answer(budget, max_body, what, openai_error));
        }
    };
    let model = match serde_json::from_slice::<ModelField>(&body) {
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("request body is not a JSON object: {e}")),
        Ok(ModelField { model: None }) => {
            let msg = format!("the request names no \"model\"; the models served here are {}", known());
            return refuse(StatusCode::NOT_FOUND, &msg);
        }
        Ok(ModelField { model: Some(serde_json::Value::String(m)) }) => m,
        Ok(ModelField { model: Some(other) }) => {
            let msg = format!("\"model\" must be a string, not {other}; the models served here are {}", known());
            return refuse(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let Some(t) = models.get(&model) else {
        let msg = format!("model {model:?} is not served here; the models served here are {}", known());
        return refuse(StatusCode::NOT_FOUND, &msg);
    };
    if let Some(r) = unauthorized(t, &parts.headers) {
        return Routing::Endpoint(r);
    }
    if body.len() > t.settings.max_request_body {
        let msg = format!("request body larger than {} bytes", t.settings.max_request_body);
        t.endpoint.count_answer(413);
        return Routing::Endpoint(error_response(StatusCode::PAYLOAD_TOO_LARGE, &msg));
    }
    Routing::Endpoint(forward(Prepared::new(parts, body, t, client, Instant::now()), t).await)
}

/// The request as it goes to a replica: origin-form target, HTTP/1.1,
/// hop-by-hop headers left out, `X-Forwarded-For` extended, the body whole
/// with its length. Its head is serialized once for every attempt, from
/// the client's header map as it is (the map then takes the response's
/// headers: see `backend_pool::send`).
struct Forwarded {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    /// The client's host from HTTP/2's :authority, for want of a Host header.
    authority: Option<HeaderValue>,
    forwarded_for: HeaderValue,
    /// The client sent a Content-Length (so an empty body says "0").
    had_length: bool,
    /// The client named no host: each attempt names its replica.
    host_from_replica: bool,
    /// Hop-by-hop fields to leave out (those `Connection` names); only
    /// looked at when `hop_by_hop`.
    connection_names: Vec<HeaderName>,
    hop_by_hop: bool,
    /// onepoold's replica key for the replica (a client's own
    /// `x-onepool-replica-key` never passes).
    replica_key: Option<HeaderValue>,
}

impl Forwarded {
    fn new(parts: http::request::Parts, body: Bytes, client: &ClientConn) -> Forwarded {
        let http::request::Parts { method, uri, headers, .. } = parts;
        // One look at each field instead of a look-up per name.
        let (mut hop_by_hop, mut has_host, mut had_length, mut prev_forwarded) = (false, false, false, None);
        for (name, value) in &headers {
            if name == header::HOST {
                has_host = true;
            } else if name == header::CONTENT_LENGTH {
                had_length = true;
            } else if name == X_FORWARDED_FOR {
                prev_forwarded = prev_forwarded.or(Some(value));
            } else if is_hop_by_hop(name) {
                hop_by_hop = true;
            }
        }
        let connection_names = if hop_by_hop { connection_names(&headers) } else { Vec::new() };
        // HTTP/2 clients name the host in :authority, not in a Host header.
        let authority = match has_host {
            true => None,
            false => uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
        };
        let host_from_replica = authority.is_none() && !has_host;
        let forwarded_for = match prev_forwarded.and_then(|v| v.to_str().ok()) {
            Some(prev) => {
                let ip = client.forwarded_for.to_str().unwrap_or_default();
                HeaderValue::from_str(&format!("{prev}, {ip}")).unwrap_or_else(|_| client.forwarded_for.clone())
            }
            None => client.forwarded_for.clone(),
        };
        Forwarded {
            method,
            uri,
            headers,
            body,
            authority,
            forwarded_for,
            had_length,
            host_from_replica,
            connection_names,
            hop_by_hop,
            replica_key: None,
        }
    }

    /// Whether a client header field goes to the replica as it is.
    fn passes(&self, name: &HeaderName) -> bool {
        name != header::CONTENT_LENGTH
            && name != X_FORWARDED_FOR
            && name != crate::REPLICA_KEY_HEADER
            && !(self.hop_by_hop && (is_hop_by_hop(name) || self.connection_names.contains(name)))
    }

    /// The request line and header section, naming `host` if the client
    /// named none, for a body of `body_len` bytes.
    fn head(&self, host: Option<&str>, body_len: usize) -> Vec<u8> {
        fn field(b: &mut Vec<u8>, name: &[u8], value: &[u8]) {
            b.extend_from_slice(name);
            b.extend_from_slice(b": ");
            b.extend_from_slice(value);
            b.extend_from_slice(b"\r\n");
        }
        let target = self.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let target = if target.is_empty() { "/" } else { target };
        let method = self.method.as_str();
        let fields: usize = self.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
        let mut b = Vec::with_capacity(method.len() + target.len() + fields + self.forwarded_for.len() + 96);
        b.extend_from_slice(method.as_bytes());
        b.push(b' ');
        b.extend_from_slice(target.as_bytes());
        b.extend_from_slice(b" HTTP/1.1\r\n");
        match (&self.authority, host) {
            (Some(a), _) => field(&mut b, b"host", a.as_bytes()),
            (None, Some(h)) => field(&mut b, b"host", h.as_bytes()),
            (None, None) => {}
        }
        for (name, value) in &self.headers {
            if self.passes(name) {
                field(&mut b, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        field(&mut b, b"x-forwarded-for", self.forwarded_for.as_bytes());
        if let Some(k) = &self.replica_key {
            field(&mut b, crate::REPLICA_KEY_HEADER.as_str().as_bytes(), k.as_bytes());
        }
        if body_len > 0 || self.had_length {
            field(&mut b, b"content-length", body_len.to_string().as_bytes());
        }
        b.extend_from_slice(b"\r\n");
        b
    }
}

/// Why an attempt got no answer to pass on, for the answer once no
/// attempt is left.
#[derive(Clone, Copy)]
enum Failure {
    /// 502: no connection, or the exchange failed.
    Replica,
    /// 503: the replica said it drains.
    Draining,
}

/// A request ready for its attempts.
struct Prepared {
    /// The head for every attempt (empty with `per_replica`).
    head: Vec<u8>,
    body: Bytes,
    /// A header map for the response head.
    spare: HeaderMap,
    /// The request, kept (boxed: the future is moved around whole) only
    /// when each attempt names its replica as the host.
    per_replica: Option<Box<Forwarded>>,
    head_request: bool,
    retry_any: bool,
    /// When the request came (its latency counts from there).
    start: Instant,
    /// `start` is as good as now for the first attempt's deadline (one
    /// clock reading less).
    start_is_now: bool,
}

impl Prepared {
    fn new(parts: http::request::Parts, body: Bytes, ctx: &Target, client: &ClientConn, start: Instant) -> Prepared {
        let retry_any = ctx.settings.idempotent || is_safe(&parts.method);
        let mut out = Forwarded::new(parts, body, client);
        out.replica_key = ctx.endpoint.replica_key().cloned();
        let head_request = out.method == Method::HEAD;
        let head = if out.host_from_replica { Vec::new() } else { out.head(None, out.body.len()) };
        // Serialized, the client's header map takes the response's fields:
        // no map is made or freed per request (hyper reuses the response's
        // map for the next request on the connection).
        let spare = if out.host_from_replica { HeaderMap::new() } else { std::mem::take(&mut out.headers) };
        let body = std::mem::take(&mut out.body);
        let per_replica = out.host_from_replica.then(|| Box::new(out));
        Prepared { head, body, spare, per_replica, head_request, retry_any, start, start_is_now: false }
    }
}

/// [`forward_to`] a replica, and with the access log on, its line.
async fn forward(p: Prepared, ctx: &Target) -> Response<ProxyBody> {
    let Some(log) = &ctx.access else { return forward_to(p, ctx).await };
    let (facts, start) = (RequestFacts::of(&p.body), p.start);
    // Boxed: the log's state would otherwise grow every request's future.
    let mut r = Box::pin(forward_to(p, ctx)).await;
    let replica = r.extensions().get::<ServedBy>().map(|s| s.0);
    let mut tap = Tap::new(log.clone(), ctx.endpoint.name(), facts, start, r.status().as_u16(), replica);
    if r.body().is_end_stream() {
        // No frame will pass (an empty answer): whole as it is.
        tap.end(true);
    }
    r.body_mut().tap = Some(Box::new(tap));
    r
}

async fn forward_to(mut p: Prepared, ctx: &Target) -> Response<ProxyBody> {
    let name = ctx.endpoint.name();
    let failed = |f: Failure| match f {
        Failure::Replica => openai_error(StatusCode::BAD_GATEWAY, "the replica failed before answering"),
        Failure::Draining => {
            ctx.endpoint.count_unavailable(Unavailable::Draining);
            unavailable(ctx, "the replica is draining and no other one could take the request")
        }
    };
    let mut tried = Vec::new();
    let mut last_failure = None;
    // Read once: every attempt routes by the same prompt.
    let prefix = ctx.settings.prefix.map(|s| prefix_key(&p.body, s.block_bytes)).unwrap_or_default();
    for attempt in 0..=ctx.settings.retries {
        let lease = match ctx.endpoint.acquire_for(&tried, &prefix).await {
            Ok(l) => l,
            Err(e) => {
                let r = match (last_failure, e) {
                    (Some(f), _) => failed(f),
                    (None, AcquireError::QueueFull) => {
                        ctx.endpoint.count_unavailable(Unavailable::QueueFull);
                        unavailable(ctx, "every replica is busy and the queue is full; retry later")
                    }
                    (None, AcquireError::TimedOut) => {
                        ctx.endpoint.count_unavailable(Unavailable::QueueTimeout);
                        unavailable(ctx, "no replica became free in time; retry later")
                    }
                };
                ctx.endpoint.count_answer(r.status().as_u16());
                return r;
            }
        };
        let replica = lease.replica();
        let own_head;
        let head = match &p.per_replica {
            Some(out) => {
                own_head = out.head(Some(&replica.address.to_string()), p.body.len());
                &own_head
            }
            None => &p.head,
        };
        let attempt_start = match attempt == 0 && p.start_is_now {
            true => tokio::time::Instant::from_std(p.start),
            false => tokio::time::Instant::now(),
        };
        let deadline = attempt_start + ctx.settings.request_timeout;
        let request = backend_pool::Outgoing {
            head,
            body: &p.body,
            head_request: p.head_request,
            headers: &mut p.spare,
            body_idle_timeout: ctx.settings.response_idle_timeout,
        };
        let sent =
            backend_pool::send(&replica.conns, replica.address, ctx.settings.connect_timeout, deadline, request).await;
        let counted = |status: u16| replica.metrics.requests.count(status);
        match sent {
            Err(SendError::TimedOut) => {
                // Not retried: the replica may still be working on it, and a
                // second attempt would double the wait.
                counted(504);
                return openai_error(StatusCode::GATEWAY_TIMEOUT, "the replica did not answer in time");
            }
            Err(e) => {
                let replica = replica.address;
                let not_sent = matches!(e, SendError::NotSent(_));
                tracing::info!(endpoint = %name, %replica, not_sent, "replica request failed: {e}");
                counted(502);
                ctx.endpoint.exchange_failed(lease.id());
                if not_sent || p.retry_any {
                    tried.push(lease.id());
                    last_failure = Some(Failure::Replica);
                    continue;
                }
                return failed(Failure::Replica);
            }
            Ok(resp) => {
                if resp.status() == StatusCode::SERVICE_UNAVAILABLE
                    && resp.headers().get(DRAINING_HEADER).is_some_and(|v| v.as_bytes() == b"1")
                {
                    ctx.endpoint.backend_draining(lease.id());
                    tried.push(lease.id());
                    counted(503);
                    last_failure = Some(Failure::Draining);
                    continue;
                }
                if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
                    ctx.endpoint.count_unavailable(Unavailable::Replica);
                }
                counted(resp.status().as_u16());
                return client_response(resp, lease, p.start, ctx.access.is_some());
            }
        }
    }
    let r = failed(last_failure.unwrap_or(Failure::Replica));
    ctx.endpoint.count_answer(r.status().as_u16());
    r
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// The fields a `Connection` header names (hop-by-hop too).
fn connection_names(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are not
/// forwarded; HTTP/2 refuses them outright.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages have none: one look at each name, nothing removed.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    for n in connection_names(headers) {
        headers.remove(n);
    }
    for n in &HOP_BY_HOP {
        headers.remove(n);
    }
}

/// `served_by`: name the replica in the response's extensions (for the
/// access log; an allocation per response otherwise spared).
fn client_response(resp: Response<BackendBody>, lease: Lease, start: Instant, served_by: bool) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    if body.hop_by_hop() {
        strip_hop_by_hop(&mut parts.headers);
    }
    if served_by {
        parts.extensions.insert(ServedBy(lease.replica().address));
    }
    let body = LeasedBody { inner: body, lease: Some(lease), start };
    Response::from_parts(parts, ProxyBody { kind: BodyKind::Replica(body), hold: None, tap: None })
}

/// A replica's response body that holds the replica's lease until the last
/// frame has passed (or the client went away), then records the latency.
struct LeasedBody {
    inner: BackendBody,
    lease: Option<Lease>,
    start: Instant,
}

impl LeasedBody {
    fn finish(&mut self) {
        if let Some(lease) = self.lease.take() {
            let now = Instant::now();
            // The connection first, so that the next request finds it idle.
            self.inner.finish(tokio::time::Instant::from_std(now));
            lease.replica().metrics.latency.observe(now.saturating_duration_since(self.start).as_secs_f64());
        }
    }
}

impl Drop for LeasedBody {
    fn drop(&mut self) {
        self.finish();
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
        if let (Poll::Ready(Some(Err(e))), Some(lease)) = (&r, &self.lease) {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let replica = lease.replica();
                replica.metrics.response_idle_timeouts.inc();
                tracing::info!(replica = %replica.address, "response cut off: {e}");
            }
        }
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.finish();
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
