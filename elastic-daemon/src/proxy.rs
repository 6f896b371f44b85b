//! The reverse proxy: a listener per endpoint, or a shared listener that
//! picks the endpoint by `Host`, path prefix or the OpenAI `model` field;
//! HTTP/1.1 and HTTP/2 (h2c prior knowledge) from clients, HTTP/1.1 to
//! replicas. Response bodies
//! stream through frame by frame; the replica's lease ends with the last
//! frame (or when the client goes away), so drains wait for streams too.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Routes, MODEL_PATHS};
use crate::endpoint::{AcquireError, Endpoint, Lease};
use crate::metrics::{replica_labels, Metrics};

/// The launcher's answer while a replica drains: 503 with this header set
/// to "1". The request was not processed, so it is always retried.
pub const DRAINING_HEADER: &str = "x-onepool-draining";

pub type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;
pub type BackendClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Longest wait for a replica's response head; past it the client gets 504.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Largest request body; larger gets 413. Bodies are read whole before
    /// forwarding so a failed attempt can be retried on another replica.
    pub max_request_body: usize,
    /// Longest time a client may take to send its request head (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head in bytes; larger gets 431. At least 8192.
    pub max_header_bytes: usize,
    /// Attempts after the first, each on a replica not yet tried.
    pub retries: u32,
    /// Every request may be retried, not only safe methods.
    pub idempotent: bool,
}

/// What a listener applies to each connection, before any routing.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnSettings {
    /// Longest time a client may take to send its request head (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head in bytes; larger gets 431. At least 8192.
    pub max_header_bytes: usize,
}

impl ProxySettings {
    /// An endpoint's own listener takes its connection limits from the
    /// endpoint.
    pub fn conn(&self) -> ConnSettings {
        ConnSettings { header_read_timeout: self.header_read_timeout, max_header_bytes: self.max_header_bytes }
    }
}

pub fn backend_client(connect_timeout: Duration) -> BackendClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
}

/// One endpoint as the proxy sees it: shared by its own listener and by
/// every shared listener that routes to it (one backend connection pool).
pub struct Target {
    endpoint: Arc<Endpoint>,
    settings: ProxySettings,
    client: BackendClient,
    metrics: Arc<Metrics>,
}

impl Target {
    pub fn new(endpoint: Arc<Endpoint>, settings: ProxySettings, metrics: Arc<Metrics>) -> Arc<Target> {
        let client = backend_client(settings.connect_timeout);
        Arc::new(Target { endpoint, settings, client, metrics })
    }
}

/// How a listener picks the endpoint for a request.
pub enum Dispatch {
    /// An endpoint's own listener.
    Single(Arc<Target>),
    /// By `Host` (or HTTP/2 `:authority`), lower case, port ignored.
    Host(HashMap<String, Arc<Target>>),
    /// By path prefix on whole segments, longest first.
    Path(Vec<(String, bool, Arc<Target>)>),
    /// By the `model` field of POSTs to [`MODEL_PATHS`].
    Model { max_body: usize, body_timeout: Duration, models: BTreeMap<String, Arc<Target>> },
}

impl Dispatch {
    /// Builds a shared listener's dispatch; every route's endpoint must be
    /// in `targets` (the configuration checked that).
    pub fn routed(routes: &Routes, targets: &HashMap<String, Arc<Target>>) -> Dispatch {
        let t = |name: &str| targets.get(name).expect("routes name configured endpoints").clone();
        match routes {
            Routes::Host(r) => Dispatch::Host(r.iter().map(|(h, e)| (h.clone(), t(e))).collect()),
            Routes::Path(r) => {
                let mut v: Vec<_> = r.iter().map(|p| (p.prefix.clone(), p.strip, t(&p.endpoint))).collect();
                v.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
                Dispatch::Path(v)
            }
            Routes::Model { max_body, body_timeout, routes } => Dispatch::Model {
                max_body: *max_body,
                body_timeout: *body_timeout,
                models: routes.iter().map(|(m, e)| (m.clone(), t(e))).collect(),
            },
        }
    }

    fn name(&self) -> &str {
        match self {
            Dispatch::Single(t) => t.endpoint.name(),
            Dispatch::Host(_) => "(by host)",
            Dispatch::Path(_) => "(by path)",
            Dispatch::Model { .. } => "(by model)",
        }
    }
}

/// Serves `dispatch` on `listener` until `shutdown` turns true, then
/// stops accepting and lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    dispatch: Arc<Dispatch>,
    conn: ConnSettings,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(conn.header_read_timeout)
        .max_buf_size(conn.max_header_bytes.max(8192));
    builder.http2().timer(TokioTimer::new()).max_header_list_size(conn.max_header_bytes as u32);
    let graceful = GracefulShutdown::new();
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
            _ = crate::daemon::stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let dispatch = dispatch.clone();
        let svc = service_fn(move |req| {
            let dispatch = dispatch.clone();
            async move { Ok::<_, Infallible>(route(req, &dispatch, peer).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "client connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(listener = %dispatch.name(), "shutdown grace period over; closing open connections");
    }
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into()).map_err(|never| match never {}).boxed_unsync()
}

fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("{message}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn unavailable(ctx: &Target, message: &str) -> Response<ProxyBody> {
    let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, message);
    let secs = ctx.endpoint.queue_settings().timeout.as_secs().max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
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

/// An OpenAI-style error answer, which OpenAI clients show as it is.
fn openai_error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    json_response(status, serde_json::json!({ "error": { "message": message, "type": "invalid_request_error" } }))
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

/// Picks the endpoint for one request, then proxies it there.
async fn route(req: Request<Incoming>, dispatch: &Dispatch, peer: SocketAddr) -> Response<ProxyBody> {
    match dispatch {
        Dispatch::Single(t) => handle(req, t, peer).await,
        Dispatch::Host(hosts) => {
            let (parts, body) = req.into_parts();
            let Some(host) = request_host(&parts) else {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "the request names no host; this listener routes by Host",
                );
            };
            match hosts.get(&host) {
                Some(t) => handle(Request::from_parts(parts, body), t, peer).await,
                None => error_response(StatusCode::NOT_FOUND, &format!("no endpoint is served for host {host:?} here")),
            }
        }
        Dispatch::Path(routes) => {
            let (mut parts, body) = req.into_parts();
            let Some((prefix, strip, t)) = routes.iter().find(|(p, _, _)| prefix_matches(p, parts.uri.path())) else {
                let known: Vec<&str> = routes.iter().map(|(p, _, _)| p.as_str()).collect();
                let msg =
                    format!("no endpoint is served under {:?}; the path prefixes here are {known:?}", parts.uri.path());
                return error_response(StatusCode::NOT_FOUND, &msg);
            };
            if *strip {
                match strip_prefix(&parts.uri, prefix) {
                    Ok(u) => parts.uri = u,
                    Err(msg) => return error_response(StatusCode::BAD_REQUEST, &msg),
                }
            }
            handle(Request::from_parts(parts, body), t, peer).await
        }
        Dispatch::Model { max_body, body_timeout, models } => {
            route_by_model(req, *max_body, *body_timeout, models, peer).await
        }
    }
}

async fn route_by_model(
    req: Request<Incoming>,
    max_body: usize,
    body_timeout: Duration,
    models: &BTreeMap<String, Arc<Target>>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let known = || models.keys().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ");
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/v1/models" {
        let data: Vec<_> =
            models.keys().map(|m| serde_json::json!({ "id": m, "object": "model", "owned_by": "onepool" })).collect();
        return json_response(StatusCode::OK, serde_json::json!({ "object": "list", "data": data }));
    }
    if !MODEL_PATHS.contains(&path) {
        let msg = format!(
            "this listener routes by the \"model\" of POST {}; {path:?} is not one of them",
            MODEL_PATHS.join(", ")
        );
        return openai_error(StatusCode::NOT_FOUND, &msg);
    }
    if req.method() != Method::POST {
        let mut r = openai_error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes POST"));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(body_timeout, Limited::new(body, max_body).collect()).await {
        Err(_) => return openai_error(StatusCode::REQUEST_TIMEOUT, "request body not received in time"),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            let msg = format!(
                "request body larger than {max_body} bytes, the most this listener reads to find \"model\" (max_model_body)"
            );
            return openai_error(StatusCode::PAYLOAD_TOO_LARGE, &msg);
        }
        Ok(Err(_)) => return openai_error(StatusCode::BAD_REQUEST, "request body could not be read"),
        Ok(Ok(c)) => c.to_bytes(),
    };
    let model = match serde_json::from_slice::<ModelField>(&body) {
        Err(e) => return openai_error(StatusCode::BAD_REQUEST, &format!("request body is not a JSON object: {e}")),
        Ok(ModelField { model: None }) => {
            let msg = format!("the request names no \"model\"; the models served here are {}", known());
            return openai_error(StatusCode::NOT_FOUND, &msg);
        }
        Ok(ModelField { model: Some(serde_json::Value::String(m)) }) => m,
        Ok(ModelField { model: Some(other) }) => {
            let msg = format!("\"model\" must be a string, not {other}; the models served here are {}", known());
            return openai_error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let Some(t) = models.get(&model) else {
        let msg = format!("model {model:?} is not served here; the models served here are {}", known());
        return openai_error(StatusCode::NOT_FOUND, &msg);
    };
    let name = t.endpoint.name();
    if body.len() > t.settings.max_request_body {
        let msg = format!("request body larger than {} bytes", t.settings.max_request_body);
        t.metrics.count_request(name, "", 413);
        return error_response(StatusCode::PAYLOAD_TOO_LARGE, &msg);
    }
    forward(parts, body, t, peer, Instant::now()).await
}

/// Reads the request body (bounded), then proxies the request to one of
/// the target's replicas.
async fn handle(req: Request<Incoming>, ctx: &Target, peer: SocketAddr) -> Response<ProxyBody> {
    let start = Instant::now();
    let name = ctx.endpoint.name();
    let answer = |r: Response<ProxyBody>| {
        ctx.metrics.count_request(name, "", r.status().as_u16());
        r
    };
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        ctx.settings.request_timeout,
        Limited::new(body, ctx.settings.max_request_body).collect(),
    )
    .await
    {
        Err(_) => return answer(error_response(StatusCode::REQUEST_TIMEOUT, "request body not received in time")),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            let msg = format!("request body larger than {} bytes", ctx.settings.max_request_body);
            return answer(error_response(StatusCode::PAYLOAD_TOO_LARGE, &msg));
        }
        Ok(Err(_)) => return answer(error_response(StatusCode::BAD_REQUEST, "request body could not be read")),
        Ok(Ok(c)) => c.to_bytes(),
    };
    forward(parts, body, ctx, peer, start).await
}

async fn forward(
    parts: http::request::Parts,
    body: Bytes,
    ctx: &Target,
    peer: SocketAddr,
    start: Instant,
) -> Response<ProxyBody> {
    let name = ctx.endpoint.name();
    let answer = |r: Response<ProxyBody>| {
        ctx.metrics.count_request(name, "", r.status().as_u16());
        r
    };
    let retry_any = ctx.settings.idempotent || is_safe(&parts.method);
    let mut tried = Vec::new();
    let mut last_failure: Option<Response<ProxyBody>> = None;
    for _ in 0..=ctx.settings.retries {
        let lease = match ctx.endpoint.acquire(&tried).await {
            Ok(l) => l,
            Err(e) => {
                return answer(last_failure.unwrap_or_else(|| match e {
                    AcquireError::QueueFull => {
                        unavailable(ctx, "every replica is busy and the queue is full; retry later")
                    }
                    AcquireError::TimedOut => unavailable(ctx, "no replica became free in time; retry later"),
                }));
            }
        };
        tried.push(lease.id());
        let replica = lease.address().to_string();
        let out = match backend_request(&parts, body.clone(), lease.address(), peer) {
            Ok(r) => r,
            Err(msg) => return answer(error_response(StatusCode::BAD_REQUEST, &msg)),
        };
        let result = tokio::time::timeout(ctx.settings.request_timeout, ctx.client.request(out)).await;
        match result {
            Err(_) => {
                // Not retried: the replica may still be working on it, and a
                // second attempt would double the wait.
                let r = error_response(StatusCode::GATEWAY_TIMEOUT, "the replica did not answer in time");
                ctx.metrics.count_request(name, &replica, 504);
                return r;
            }
            Ok(Err(e)) => {
                let not_sent = e.is_connect();
                tracing::info!(endpoint = %name, %replica, not_sent, "replica request failed: {e}");
                ctx.metrics.count_request(name, &replica, 502);
                let r = error_response(StatusCode::BAD_GATEWAY, "the replica failed before answering");
                if not_sent || retry_any {
                    last_failure = Some(r);
                    continue;
                }
                return r;
            }
            Ok(Ok(resp)) => {
                if resp.status() == StatusCode::SERVICE_UNAVAILABLE
                    && resp.headers().get(DRAINING_HEADER).is_some_and(|v| v.as_bytes() == b"1")
                {
                    ctx.endpoint.backend_draining(lease.id());
                    ctx.metrics.count_request(name, &replica, 503);
                    last_failure =
                        Some(unavailable(ctx, "the replica is draining and no other one could take the request"));
                    continue;
                }
                ctx.metrics.count_request(name, &replica, resp.status().as_u16());
                return client_response(resp, lease, ctx, start);
            }
        }
    }
    answer(last_failure.unwrap_or_else(|| error_response(StatusCode::BAD_GATEWAY, "no replica could answer")))
}

/// Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are not
/// forwarded; HTTP/2 refuses them outright.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(n);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

fn backend_request(
    parts: &http::request::Parts,
    body: Bytes,
    replica: SocketAddr,
    peer: SocketAddr,
) -> Result<Request<Full<Bytes>>, String> {
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let uri: Uri = format!("http://{replica}{path}").parse().map_err(|e| format!("request target {path:?}: {e}"))?;
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    // HTTP/2 clients name the host in :authority, not in a Host header.
    if !headers.contains_key(header::HOST) {
        if let Some(a) = parts.uri.authority() {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                headers.insert(header::HOST, v);
            }
        }
    }
    let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert("x-forwarded-for", v);
    }
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Ok(req)
}

fn client_response(resp: Response<Incoming>, lease: Lease, ctx: &Target, start: Instant) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = LeasedBody { inner: body, lease: Some(lease), start, metrics: ctx.metrics.clone() };
    Response::from_parts(parts, body.boxed_unsync())
}

/// A replica's response body that holds the replica's lease until the last
/// frame has passed (or the client went away), then records the latency.
struct LeasedBody {
    inner: Incoming,
    lease: Option<Lease>,
    start: Instant,
    metrics: Arc<Metrics>,
}

impl LeasedBody {
    fn finish(&mut self) {
        if let Some(lease) = self.lease.take() {
            let labels = replica_labels(lease.endpoint().name(), &lease.address().to_string());
            self.metrics.latency.get_or_create(&labels).observe(self.start.elapsed().as_secs_f64());
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
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
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
