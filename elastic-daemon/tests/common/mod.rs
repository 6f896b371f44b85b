//! Test aids: real local HTTP backends with counters, a router started
//! in-process from a config, and a plain HTTP client.
#![allow(dead_code)]

pub mod engine;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use onepool_elastic_daemon::config::{Config, EndpointConfig};
use onepool_elastic_daemon::daemon::Daemon;
use onepool_router::registry::HealthThresholds;
use onepool_router::settings::{ConnSettings, ProxySettings};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// A backend's own counts, to hold the router's against.
#[derive(Default)]
pub struct Stats {
    pub served: AtomicU64,
    pub in_flight: AtomicU32,
    pub peak: AtomicU32,
}

impl Stats {
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
    pub fn peak(&self) -> u32 {
        self.peak.load(Ordering::SeqCst)
    }
}

pub struct Backend {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    /// `/stream` sends its last chunk only once this is notified.
    pub release_stream: Arc<Notify>,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    Normal,
    /// Every request answered 503 with `x-onepool-draining: 1`.
    Draining,
}

type TestBody = UnsyncBoxBody<Bytes, Infallible>;

struct ChanBody(mpsc::Receiver<Bytes>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

struct InFlight(Arc<Stats>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn text(s: impl Into<Bytes>) -> TestBody {
    Full::new(s.into()).boxed_unsync()
}

/// Answers carry `x-seen-path` and `x-seen-body-bytes`. Paths: `/ok`,
/// `/sleep/MS`, `/tokens/N` (0.1 ms per token, at most
/// 100 ms), `/stream`, `/hang`, `/health`.
pub async fn backend(mode: Mode) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(Stats::default());
    let release_stream = Arc::new(Notify::new());
    let (s, r) = (stats.clone(), release_stream.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (stats, release) = (s.clone(), r.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (stats, release) = (stats.clone(), release.clone());
                    async move { Ok::<_, Infallible>(answer(req, mode, stats, release, addr).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    Backend { addr, stats, release_stream }
}

async fn answer(
    req: Request<Incoming>,
    mode: Mode,
    stats: Arc<Stats>,
    release: Arc<Notify>,
    addr: SocketAddr,
) -> Response<TestBody> {
    let path = req.uri().path().to_string();
    if path == "/health" {
        return Response::new(text("ok"));
    }
    stats.served.fetch_add(1, Ordering::SeqCst);
    let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    stats.peak.fetch_max(now, Ordering::SeqCst);
    let guard = InFlight(stats.clone());
    if mode == Mode::Draining {
        let mut r = Response::new(text("draining"));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r.headers_mut().insert("x-onepool-draining", "1".parse().unwrap());
        return r;
    }
    let seen = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let body_len = req.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["sleep", ms] => tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await,
        ["tokens", n] => {
            let n: u64 = n.parse().unwrap();
            tokio::time::sleep(Duration::from_micros((n * 100).min(100_000))).await;
        }
        ["hang"] => tokio::time::sleep(Duration::from_secs(3600)).await,
        // A completion with the server's token counts at its end.
        ["usage"] => {
            return Response::new(text(
                r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#,
            ))
        }
        ["status", code] => {
            let mut r = Response::new(text("the server's own answer"));
            *r.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
            return r;
        }
        ["stream"] => {
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                let _guard = guard;
                tx.send(Bytes::from_static(b"data: first\n\n")).await.unwrap();
                release.notified().await;
                let _ = tx.send(Bytes::from_static(b"data: last\n\n")).await;
            });
            let mut r = Response::new(ChanBody(rx).boxed_unsync());
            r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            return r;
        }
        _ => {}
    }
    drop(guard);
    let mut r = Response::new(text(addr.to_string()));
    // What arrived, for routing tests: the request target and body size.
    r.headers_mut().insert("x-seen-path", seen.parse().unwrap());
    r.headers_mut().insert("x-seen-body-bytes", body_len.into());
    r
}

/// A backend that reads a request and closes the connection without answering.
pub async fn resetting_backend() -> (SocketAddr, Arc<AtomicU64>) {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                if let Ok(n) = stream.read(&mut buf).await {
                    if n > 0 {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                }
                drop(stream);
            });
        }
    });
    (addr, count)
}

/// A port nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

pub fn proxy_settings() -> ProxySettings {
    ProxySettings {
        prefix: None,
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(1),
        max_request_body: 1 << 20,
        body_read_timeout: Duration::from_secs(5),
        response_idle_timeout: Duration::from_secs(5),
        retries: 2,
        idempotent: false,
        conn: ConnSettings {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 8192,
            max_connections: 1024,
            max_connections_per_ip: 1024,
            http2_idle_timeout: Duration::from_secs(5),
            tls: None,
        },
        auth: None,
        resume: None,
        classes: None,
    }
}

pub fn endpoint_config(limit: u32, queue: usize, queue_timeout: Duration) -> EndpointConfig {
    EndpointConfig {
        name: "chat".into(),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        replica_concurrency: limit,
        queue_size: queue,
        queue_timeout,
        proxy: proxy_settings(),
        health: None,
        thresholds: HealthThresholds::default(),
        replicas: None,
        request_class: None,
        keyed_classes: Vec::new(),
        headroom: Default::default(),
        engine_priority: Default::default(),
    }
}

pub fn socket_path() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!("onepoold-test-{}-{}.sock", std::process::id(), N.fetch_add(1, Ordering::SeqCst)))
}

pub async fn start(endpoint: EndpointConfig) -> Daemon {
    start_with_budget(endpoint, 256 << 20).await
}

/// Starts a router whose requests in flight may hold `max_buffered_body_bytes`.
pub async fn start_with_budget(endpoint: EndpointConfig, max_buffered_body_bytes: usize) -> Daemon {
    Daemon::start(config(endpoint, max_buffered_body_bytes)).await.unwrap()
}

/// The configuration the helpers above start with.
pub fn config(endpoint: EndpointConfig, max_buffered_body_bytes: usize) -> Config {
    Config {
        control_socket: socket_path(),
        control_socket_mode: 0o600,
        metrics_address: Some("127.0.0.1:0".parse().unwrap()),
        shutdown_grace: Duration::from_secs(2),
        max_buffered_body_bytes,
        endpoints: vec![endpoint],
        listeners: Vec::new(),
        slurm_conf: None,
        policy: None,
        // No [endpoint.replicas] here: the key is neither made nor read.
        replica_key_file: "/nonexistent/replica.key".into(),
        replica_key_named: false,
        metrics_auth: None,
        access_log: None,
        decision_log: None,
        ha: onepool_elastic_daemon::config::HaSettings { instance: "test".into(), lock: None },
    }
}

pub struct Harness {
    pub daemon: Daemon,
    pub url: String,
}

impl Harness {
    pub async fn new(endpoint: EndpointConfig, replicas: &[SocketAddr]) -> Harness {
        let daemon = start(endpoint).await;
        let ep = daemon.endpoint("chat").unwrap();
        for r in replicas {
            ep.endpoint.add(*r, None, true).unwrap();
        }
        let url = format!("http://{}", ep.listen.unwrap());
        Harness { daemon, url }
    }

    /// The sum of the metric `name`'s series with `reason="{reason}"`.
    pub fn metric(&self, name: &str, reason: &str) -> u64 {
        let text = self.daemon.metrics.encode();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&format!("reason=\"{reason}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    pub fn snapshot(&self) -> onepool_router::endpoint::EndpointSnapshot {
        self.daemon.endpoint("chat").unwrap().endpoint.snapshot()
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// onepool's own client stack, as its other callers use it.
pub fn client() -> HttpClient {
    onepool_client::pooled(onepool_client::Settings::default())
}

/// Sends a request and reads the whole answer.
pub async fn send(client: &HttpClient, method: &str, url: &str) -> (StatusCode, http::HeaderMap, String) {
    let req = Request::builder().method(method).uri(url).body(Full::new(Bytes::new())).unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

pub async fn get(client: &HttpClient, url: &str) -> (StatusCode, String) {
    let (s, _, b) = send(client, "GET", url).await;
    (s, b)
}

/// Waits (bounded) until `cond` holds.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One response from a kept-alive connection: its status line and body.
#[allow(dead_code)] // not every test binary uses it
pub async fn read_response(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<(String, String)> {
    let (line, body) = read_message(s, buf).await?;
    Some((line, String::from_utf8_lossy(&body).into_owned()))
}

/// Reads up to the end of a request or response head, and returns what was
/// read (the head, and whatever of a body came with it); `None` if the
/// connection ended first.
pub async fn read_head(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf)
}

/// The Content-Length a message head names (0 if none).
#[allow(dead_code)] // not every test binary uses it
pub fn content_length(head: &str) -> usize {
    head.to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// One HTTP/1.1 message (request or response, Content-Length framed) from
/// a kept-alive connection: its first line and its body; what follows it
/// stays in `buf`. None when the peer closes first.
#[allow(dead_code)] // not every test binary uses it
pub async fn read_message(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = content_length(&head);
    while buf.len() < head_end + len {
        let mut chunk = [0u8; 65536];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((head.lines().next().unwrap_or_default().to_string(), body))
}
