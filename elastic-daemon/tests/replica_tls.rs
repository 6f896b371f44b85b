//! The hop from the router to a replica over TLS pinned to the certificate
//! its launcher reported (issue #36): requests and health checks reach the
//! replica with that certificate, nothing of them is readable on the wire,
//! and a replica with another certificate gets no byte of a request (the
//! replica key included).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use onepool_launcher::hop_tls::{pinned_client, Identity};
use onepool_router::backend_pool::Transport;
use onepool_router::registry::ReplicaState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "replica-key-3a9f0c1d2e4b5a6978";
const PROMPT: &str = "the prompt nobody on the network may read";

type Seen = Arc<Mutex<Vec<u8>>>;

fn text(seen: &Seen) -> String {
    String::from_utf8_lossy(&seen.lock().unwrap()).into_owned()
}

/// A replica serving TLS with `identity`, answering "ok" to every request
/// (its health path too); keeps every byte it was sent, decrypted.
async fn tls_replica(identity: Identity) -> (SocketAddr, Seen) {
    tls_replica_closing(identity, usize::MAX).await
}

/// [`tls_replica`] that drops a connection unanswered at its
/// `close_at`-th request (counted from 1), its TCP closed without TLS's
/// close_notify: a replica whose keep-alive timeout fired as the request
/// arrived.
async fn tls_replica_closing(identity: Identity, close_at: usize) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let acceptor = tokio_rustls::TlsAcceptor::from(identity.config);
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, seen) = (acceptor.clone(), s.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = Vec::new();
                for n in 1.. {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let len = content_length(&String::from_utf8_lossy(&buf[..end]));
                    while buf.len() < end + len {
                        let mut chunk = [0u8; 4096];
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    seen.lock().unwrap().extend(buf.drain(..end + len));
                    if n == close_at {
                        // Dropped, not shut down: no close_notify.
                        return;
                    }
                    if tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// A TCP relay to `to` that keeps every byte that passes towards it: what
/// someone reading the network between router and replica sees.
async fn wire(to: SocketAddr) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((from, _)) = listener.accept().await else { return };
            let Ok(upstream) = TcpStream::connect(to).await else { continue };
            let seen = s.clone();
            let (mut from_r, mut from_w) = from.into_split();
            let (mut up_r, mut up_w) = upstream.into_split();
            tokio::spawn(async move {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = from_r.read(&mut chunk).await {
                    if n == 0 || up_w.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                    seen.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
                let _ = up_w.shutdown().await;
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut up_r, &mut from_w).await;
            });
        }
    });
    (addr, seen)
}

fn health_checked() -> onepool_elastic_daemon::config::EndpointConfig {
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(2));
    cfg.health = Some(onepool_router::settings::HealthCheck {
        path: "/health".into(),
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(500),
    });
    cfg
}

async fn post_prompt(url: &str) -> (StatusCode, String) {
    let body = format!(r#"{{"messages": [{{"role": "user", "content": "{PROMPT}"}}]}}"#);
    let req = Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = client().request(req).await.unwrap();
    let status = r.status();
    (status, String::from_utf8_lossy(&r.into_body().collect().await.unwrap().to_bytes()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_replica_is_health_checked_and_served_and_the_wire_shows_neither_key_nor_prompt() {
    let identity = Identity::generate().unwrap();
    let pin = identity.fingerprint;
    let (replica, decrypted) = tls_replica(identity).await;
    let (relay, on_the_wire) = wire(replica).await;
    let h = Harness::new(health_checked(), &[]).await;
    let ep = &h.daemon.endpoint("chat").unwrap().endpoint;
    ep.set_replica_key(http::HeaderValue::from_static(KEY));
    ep.add_with(relay, Transport::Pinned(pinned_client(pin).unwrap()), None, false).unwrap();
    until("the health check over TLS brings the replica in", || {
        h.snapshot().replicas.first().is_some_and(|r| r.state == ReplicaState::Ready)
    })
    .await;
    for _ in 0..3 {
        assert_eq!(post_prompt(&h.url).await, (StatusCode::OK, "ok".to_string()));
    }
    let seen = text(&decrypted);
    assert!(seen.contains("GET /health ") && seen.contains(PROMPT), "{seen}");
    assert!(seen.to_ascii_lowercase().contains(&format!("x-onepool-replica-key: {KEY}")), "{seen}");
    let wire = text(&on_the_wire);
    assert!(!wire.is_empty());
    for secret in [KEY, PROMPT, "chat/completions", "/health"] {
        assert!(!wire.contains(secret), "{secret:?} crossed the wire in clear");
    }
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_certificate_is_not_the_pinned_one_gets_no_request_and_never_the_key() {
    let (pinned, other) = (Identity::generate().unwrap(), Identity::generate().unwrap());
    let pin = pinned.fingerprint;
    let (impostor, decrypted) = tls_replica(other).await;
    let (relay, on_the_wire) = wire(impostor).await;
    let h = Harness::new(health_checked(), &[]).await;
    let ep = &h.daemon.endpoint("chat").unwrap().endpoint;
    ep.set_replica_key(http::HeaderValue::from_static(KEY));
    // Health-checked: its checks fail at the handshake, so it never serves.
    ep.add_with(relay, Transport::Pinned(pinned_client(pin).unwrap()), None, false).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Starting);
    assert!(!text(&on_the_wire).is_empty(), "the health checks tried");
    // Taken as ready: the proxy's own connections refuse it too.
    ep.add_with(impostor, Transport::Pinned(pinned_client(pin).unwrap()), None, true).unwrap();
    let (status, _) = post_prompt(&h.url).await;
    assert_ne!(status, StatusCode::OK);
    assert_eq!(text(&decrypted), "", "the impostor read nothing");
    let wire = text(&on_the_wire);
    assert!(!wire.contains(KEY) && !wire.contains(PROMPT), "{wire}");
    h.daemon.shutdown().await;
}

/// A reused connection the replica closes unanswered as the request
/// arrives (its keep-alive timeout), without TLS's close_notify, is the
/// same race as on the clear hop: the request goes out once more on a new
/// connection instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_tls_connection_closed_before_any_answer_is_retried_on_a_new_one() {
    let identity = Identity::generate().unwrap();
    let pin = identity.fingerprint;
    let (replica, decrypted) = tls_replica_closing(identity, 2).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[]).await;
    let ep = &h.daemon.endpoint("chat").unwrap().endpoint;
    ep.add_with(replica, Transport::Pinned(pinned_client(pin).unwrap()), None, true).unwrap();
    for _ in 0..4 {
        assert_eq!(post_prompt(&h.url).await, (StatusCode::OK, "ok".to_string()));
    }
    let posts = text(&decrypted).matches("POST ").count();
    assert_eq!(posts, 7, "each POST after the first went out twice");
    h.daemon.shutdown().await;
}
