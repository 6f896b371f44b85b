//! The router's resource bounds under abuse, in-process against local
//! replicas: slow bodies, too many connections, too many large bodies at
//! once, a replica silent mid-body, idle HTTP/2 connections. Each also
//! checks that an ordinary request meanwhile is served.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use onepool_router::metrics::{ListenerLabels, RefusedLabels};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

fn addr_of(h: &Harness) -> SocketAddr {
    h.url.trim_start_matches("http://").parse().unwrap()
}

/// Reads until the peer closes (or resets) the connection, for at most
/// `limit`; what came, and whether it closed within the limit.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_get_408_after_body_read_timeout_not_request_timeout() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.body_read_timeout = Duration::from_millis(300);
    cfg.proxy.request_timeout = Duration::from_secs(20);
    let h = Harness::new(cfg, &[a.addr]).await;
    let addr = addr_of(&h);
    let mut slow = Vec::new();
    for _ in 0..20 {
        slow.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n").await.unwrap();
            let (mut r, mut w) = s.into_split();
            // One body byte every 50 ms until the router hangs up (at most 10 s).
            let trickle = tokio::spawn(async move {
                for _ in 0..200 {
                    if w.write_all(b"x").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut out)).await;
            trickle.abort();
            (String::from_utf8_lossy(&out).into_owned(), started.elapsed())
        }));
    }
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    }
    for s in slow {
        let (answer, took) = s.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(took >= Duration::from_millis(300), "answered after {took:?}");
        assert!(took < Duration::from_secs(5), "the connection stayed {took:?}");
    }
    assert_eq!(a.stats.served(), 5, "no trickled body reached the replica");
    h.daemon.shutdown().await;
}

/// A connection to `to` from the loopback address `from` (any of 127/8).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    s.connect(to).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_caps_are_refused_at_once() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.conn.max_connections = 8;
    cfg.proxy.conn.max_connections_per_ip = 4;
    let h = Harness::new(cfg, &[a.addr]).await;
    let addr = addr_of(&h);
    let m = h.daemon.metrics.clone();
    let open = || m.connections.get_or_create(&ListenerLabels { listener: addr.to_string() }).get();
    let refused = |reason: &str| {
        let labels = RefusedLabels { listener: addr.to_string(), reason: reason.to_string() };
        m.connections_refused.get_or_create(&labels).get()
    };
    // Four from 127.0.0.1, the client's cap; one of them for real requests.
    let mut ours = connect_from([127, 0, 0, 1], addr).await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(connect_from([127, 0, 0, 1], addr).await);
    }
    until("four connections are open", || open() == 4).await;
    let mut fifth = connect_from([127, 0, 0, 1], addr).await;
    let started = Instant::now();
    let (answer, closed) = read_to_close(&mut fifth, Duration::from_secs(3)).await;
    assert!(closed && answer.starts_with("HTTP/1.1 503"), "{closed} {answer:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(refused("max_connections_per_ip"), 1);
    // Four from another address fill the listener's cap.
    for _ in 0..4 {
        idle.push(connect_from([127, 0, 0, 2], addr).await);
    }
    until("eight connections are open", || open() == 8).await;
    let mut ninth = connect_from([127, 0, 0, 3], addr).await;
    let (answer, closed) = read_to_close(&mut ninth, Duration::from_secs(3)).await;
    assert!(closed && answer.starts_with("HTTP/1.1 503"), "{closed} {answer:?}");
    assert_eq!(refused("max_connections"), 1);
    // A connection within the caps is served all along.
    let mut buf = Vec::new();
    ours.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (status, _) = read_response(&mut ours, &mut buf).await.expect("answered");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // One closes: a new connection from its client is served again.
    drop(idle.remove(0));
    until("one connection has closed", || open() == 7).await;
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    assert_eq!(a.stats.served(), 2);
    h.daemon.shutdown().await;
}

/// A POST of `len` bytes to `path` on a connection of its own; the status
/// line of the answer. Errors while writing are ignored: a refused body is
/// answered before it has all been read.
async fn post(addr: SocketAddr, path: &str, len: usize) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n").into_bytes();
    req.resize(req.len() + len, b'b');
    let (mut r, mut w) = s.split();
    let write = async {
        let _ = w.write_all(&req).await;
        std::future::pending::<()>().await
    };
    let read = async {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        while !out.windows(2).any(|w| w == b"\r\n") {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_string()
    };
    tokio::select! {
        line = read => line,
        _ = write => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_beyond_the_buffered_bytes_budget_get_503() {
    const BUDGET: usize = 1 << 20;
    const BODY: usize = 300 << 10;
    let a = backend(Mode::Normal).await;
    let daemon = start_with_budget(endpoint_config(16, 16, Duration::from_secs(5)), BUDGET).await;
    daemon.endpoint("chat").unwrap().endpoint.add(a.addr, None, true).unwrap();
    let addr = daemon.endpoint("chat").unwrap().listen.unwrap();
    let budget = daemon.body_budget.clone();
    // The most the budget ever held, sampled all along.
    let (peak, done) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicBool::new(false)));
    let watch = {
        let (budget, peak, done) = (budget.clone(), peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(budget.held(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
    };
    // Bodies held while the replica works on them, one after the other
    // (as many at once would each get a part and all be refused).
    let mut held = Vec::new();
    for i in 1..=3 {
        held.push(tokio::spawn(post(addr, "/sleep/2000", BODY)));
        until("the body is held", || budget.held() == (i * BODY) as i64).await;
    }
    for _ in 0..5 {
        let status = post(addr, "/ok", BODY).await;
        assert!(status.starts_with("HTTP/1.1 503"), "{status:?}");
        assert_eq!(budget.held(), (3 * BODY) as i64, "a refused body gives its bytes back");
    }
    assert_eq!(get(&client(), &format!("http://{addr}/ok")).await.0, StatusCode::OK);
    for r in held {
        let status = r.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
    }
    until("every body is given back", || budget.held() == 0).await;
    assert!(post(addr, "/ok", BODY).await.starts_with("HTTP/1.1 200"));
    done.store(true, Ordering::SeqCst);
    watch.await.unwrap();
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= BUDGET as i64 && peak >= (3 * BODY) as i64, "peak {peak}");
    assert_eq!(daemon.metrics.body_budget_refused.get(), 5);
    assert_eq!(a.stats.served(), 5, "the three held, the GET and the last POST reached the replica");
    daemon.shutdown().await;
}

/// A replica that answers `/stall` with a head and 10 of 100 body bytes,
/// then nothing, and `/drip` with 10 bytes 100 ms apart; it tells when the
/// router closes the stalled connection.
async fn stalling_backend() -> (SocketAddr, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let d = d.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789").await;
                if head.starts_with(b"GET /drip ") {
                    for _ in 0..9 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = s.write_all(b"0123456789").await;
                    }
                }
                // Holds the connection until the router lets it go.
                if matches!(s.read(&mut chunk).await, Ok(0) | Err(_)) {
                    d.store(true, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, dropped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_silent_mid_body_is_cut_off_after_response_idle_timeout() {
    let (stall, dropped) = stalling_backend().await;
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.response_idle_timeout = Duration::from_millis(300);
    cfg.proxy.request_timeout = Duration::from_secs(20);
    let h = Harness::new(cfg, &[stall, a.addr]).await;
    let addr = addr_of(&h);
    // A tie goes to the first replica: the stalling one.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /stall HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let cut = tokio::spawn(async move { read_to_close(&mut s, Duration::from_secs(10)).await });
    until("the stalled response holds its replica", || h.snapshot().replicas[0].in_flight == 1).await;
    let (s, body) = get(&client(), &format!("{}/ok", h.url)).await;
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    let (answer, closed) = cut.await.unwrap();
    let took = started.elapsed();
    assert!(closed, "the client connection stayed open");
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("0123456789"), "{answer:?}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "cut after {took:?}");
    until("the replica's connection is closed", || dropped.load(Ordering::SeqCst)).await;
    until("the replica's slot is back", || h.snapshot().replicas[0].in_flight == 0).await;
    let labels = onepool_router::metrics::replica_labels("chat", &stall.to_string());
    assert_eq!(h.daemon.metrics.response_idle_timeouts.get_or_create(&labels).get(), 1);
    // A body that keeps coming, a little at a time (each served one: the
    // tie goes to the stalling replica again), is not cut off.
    let (s, body) = get(&client(), &format!("{}/drip", h.url)).await;
    assert_eq!((s, body.len()), (StatusCode::OK, 100));
    assert_eq!(h.snapshot().replicas[0].served, 2);
    assert_eq!(h.daemon.metrics.response_idle_timeouts.get_or_create(&labels).get(), 1);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.conn.http2_idle_timeout = Duration::from_millis(300);
    let h = Harness::new(cfg, &[a.addr]).await;
    let stream = TcpStream::connect(addr_of(&h)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    // A stream open for longer than the idle timeout keeps the connection.
    for path in ["/sleep/800", "/ok"] {
        let req = Request::get(format!("{}{path}", h.url)).body(Full::new(Bytes::new())).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    let idle_since = Instant::now();
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    let closed_at = tokio::time::timeout(Duration::from_secs(5), conn).await.expect("closed").unwrap();
    let idle = closed_at.saturating_duration_since(idle_since);
    assert!(idle >= Duration::from_millis(250), "closed {idle:?} after its last stream");
    assert!(a.stats.served() >= 3);
    h.daemon.shutdown().await;
}

/// With `metrics_bearer_tokens_file`, the metrics listener answers a
/// scrape only with one of the file's tokens (issue #25: the metrics name
/// every replica's address and traffic, and the listener is open to every
/// process on the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_can_require_a_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("onepool-metrics-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("metrics.tokens");
    std::fs::write(&tokens, "prometheus-scrape-token-0123456789\n").unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = format!(
        "control_socket = {:?}\nmetrics_address = \"127.0.0.1:0\"\nmetrics_bearer_tokens_file = {:?}\n\
         [[endpoint]]\nname = \"e\"\nlisten = \"127.0.0.1:0\"\n",
        socket_path().display().to_string(),
        tokens.display().to_string()
    );
    let config = onepool_elastic_daemon::config::parse("t.toml", &text).unwrap_or_else(|e| panic!("{e}"));
    let d = onepool_elastic_daemon::daemon::Daemon::start(config).await.unwrap();
    let addr = d.metrics_address.unwrap();
    let scrape = |auth: &'static str| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        read_to_close(&mut s, Duration::from_secs(5)).await.0
    };
    let none = scrape("").await;
    assert!(
        none.starts_with("HTTP/1.1 401") && none.to_ascii_lowercase().contains("www-authenticate: bearer"),
        "{none}"
    );
    assert!(scrape("Authorization: Bearer wrong-token-0123456789\r\n").await.starts_with("HTTP/1.1 401"));
    let ok = scrape("Authorization: Bearer prometheus-scrape-token-0123456789\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("onepool_router_requests"), "{ok}");
    d.shutdown().await;
    // A token file others could read is refused at start, at its place.
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = onepool_elastic_daemon::config::parse("t.toml", &text).unwrap_err().to_string();
    assert!(e.contains("t.toml:3:") && e.contains("metrics_bearer_tokens_file") && e.contains("chmod 600"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
