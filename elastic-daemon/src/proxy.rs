//! The reverse proxy: one listener per endpoint, HTTP/1.1 and HTTP/2 (h2c
//! prior knowledge) from clients, HTTP/1.1 to replicas. Response bodies
//! stream through frame by frame; the replica's lease ends with the last
//! frame (or when the client goes away), so drains wait for streams too.

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

pub fn backend_client(connect_timeout: Duration) -> BackendClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
}

struct Ctx {
    endpoint: Arc<Endpoint>,
    settings: ProxySettings,
    client: BackendClient,
    metrics: Arc<Metrics>,
}

/// Serves one endpoint on `listener` until `shutdown` turns true, then
/// stops accepting and lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    endpoint: Arc<Endpoint>,
    settings: ProxySettings,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let client = backend_client(settings.connect_timeout);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192));
    builder.http2().timer(TokioTimer::new()).max_header_list_size(settings.max_header_bytes as u32);
    let ctx = Arc::new(Ctx { endpoint, settings, client, metrics });
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off a moment
                    // instead of spinning on the error.
                    tracing::warn!(endpoint = %ctx.endpoint.name(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::daemon::stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        let svc = service_fn(move |req| {
            let ctx = ctx.clone();
            async move { Ok::<_, Infallible>(handle(req, &ctx, peer).await) }
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
        tracing::warn!(endpoint = %ctx.endpoint.name(), "shutdown grace period over; closing open connections");
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

fn unavailable(ctx: &Ctx, message: &str) -> Response<ProxyBody> {
    let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, message);
    let secs = ctx.endpoint.queue_settings().timeout.as_secs().max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

async fn handle(req: Request<Incoming>, ctx: &Ctx, peer: SocketAddr) -> Response<ProxyBody> {
    let start = Instant::now();
    let name = ctx.endpoint.name().to_string();
    let answer = |r: Response<ProxyBody>| {
        ctx.metrics.count_request(&name, "", r.status().as_u16());
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
                ctx.metrics.count_request(&name, &replica, 504);
                return r;
            }
            Ok(Err(e)) => {
                let not_sent = e.is_connect();
                tracing::info!(endpoint = %name, %replica, not_sent, "replica request failed: {e}");
                ctx.metrics.count_request(&name, &replica, 502);
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
                    ctx.metrics.count_request(&name, &replica, 503);
                    last_failure =
                        Some(unavailable(ctx, "the replica is draining and no other one could take the request"));
                    continue;
                }
                ctx.metrics.count_request(&name, &replica, resp.status().as_u16());
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

fn client_response(resp: Response<Incoming>, lease: Lease, ctx: &Ctx, start: Instant) -> Response<ProxyBody> {
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
