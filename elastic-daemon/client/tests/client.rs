//! The client against real sockets: a small HTTP/1.1 server on loopback
//! and on a unix socket that answers what each test needs.

use std::net::SocketAddr;
use std::time::Duration;

use onepool_client::{blocking, unix_client, Caller, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

/// How the test server answers each request: it echoes the request head
/// in the body, after `delay`, padded to at least `size` bytes.
#[derive(Clone, Copy)]
struct Serve {
    delay: Duration,
    size: usize,
}

async fn answer<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S, serve: Serve) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    tokio::time::sleep(serve.delay).await;
    let mut body = String::from_utf8_lossy(&buf).into_owned();
    while body.len() < serve.size {
        body.push('.');
    }
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(body.as_bytes()).await;
}

async fn tcp_server(serve: Serve) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer(s, serve));
        }
    });
    addr
}

const QUICK: Serve = Serve { delay: Duration::ZERO, size: 0 };

#[tokio::test]
async fn a_get_carries_the_callers_headers_and_reads_the_answer_whole() {
    let addr = tcp_server(QUICK).await;
    let caller = Caller::tcp(Duration::from_secs(5))
        .with_header(http::HeaderName::from_static("x-onepool-replica-key"), http::HeaderValue::from_static("k1"));
    let a = caller.get(&format!("http://{addr}/metrics"), 1 << 20).await.unwrap();
    assert_eq!(a.status, 200);
    let echoed = a.text().to_ascii_lowercase();
    assert!(echoed.starts_with("get /metrics http/1.1"), "{echoed}");
    assert!(echoed.contains("x-onepool-replica-key: k1"), "{echoed}");
}

#[tokio::test]
async fn a_post_sends_its_json_with_its_type() {
    let addr = tcp_server(QUICK).await;
    let caller = Caller::tcp(Duration::from_secs(5));
    let a = caller.post_json(&format!("http://{addr}/v1/x"), r#"{"a":1}"#, 1 << 20).await.unwrap();
    let echoed = a.text().to_ascii_lowercase();
    assert!(echoed.starts_with("post /v1/x"), "{echoed}");
    assert!(echoed.contains("content-type: application/json"), "{echoed}");
    assert!(echoed.contains("content-length: 7"), "{echoed}");
}

#[tokio::test]
async fn an_answer_over_its_bound_is_refused_not_read() {
    let addr = tcp_server(Serve { delay: Duration::ZERO, size: 10_000 }).await;
    let e = Caller::tcp(Duration::from_secs(5)).get(&format!("http://{addr}/big"), 4096).await.unwrap_err();
    assert!(matches!(e, ClientError::TooLong { limit: 4096, .. }), "{e}");
    assert!(!e.retryable());
    assert!(e.to_string().contains("longer than 4096 bytes"), "{e}");
}

#[tokio::test]
async fn a_slow_answer_times_out_and_may_be_retried() {
    let addr = tcp_server(Serve { delay: Duration::from_secs(5), size: 0 }).await;
    let e = Caller::tcp(Duration::from_millis(200)).get(&format!("http://{addr}/slow"), 4096).await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(e.retryable());
    assert!(e.to_string().contains("no answer within 0.200 s"), "{e}");
}

#[tokio::test]
async fn a_refused_connection_says_so_with_the_os_error() {
    // A port just freed: nothing listens there.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let e = Caller::tcp(Duration::from_secs(5)).get(&format!("http://{addr}/"), 4096).await.unwrap_err();
    assert_eq!(e.connect_error().map(std::io::Error::kind), Some(std::io::ErrorKind::ConnectionRefused), "{e}");
    assert!(e.retryable());
    assert!(e.to_string().starts_with(&format!("GET http://{addr}/: connecting: ")), "{e}");
}

#[tokio::test]
async fn a_malformed_request_is_the_callers_error() {
    let caller = Caller::tcp(Duration::from_secs(5));
    let e = caller.get("http://bad host/", 4096).await.unwrap_err();
    assert!(matches!(e, ClientError::Request { .. }), "{e}");
    assert!(!e.retryable());
    let e = caller.build(http::Method::GET, "http://127.0.0.1/", None, &[("x-a", "line\nbreak")]).unwrap_err();
    assert!(e.to_string().contains("header x-a's value"), "{e}");
}

#[tokio::test]
async fn the_unix_client_reaches_its_socket_whatever_the_uri() {
    let dir = std::env::temp_dir().join(format!("onepool-client-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("control.sock");
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer(s, QUICK));
        }
    });
    let caller = Caller::new(unix_client(&path), Duration::from_secs(5));
    let a = caller.get("http://onepoold/v1/state", 4096).await.unwrap();
    assert!(a.text().starts_with("GET /v1/state HTTP/1.1"), "{}", a.text());

    let missing = Caller::new(unix_client(dir.join("absent.sock")), Duration::from_secs(5));
    let e = missing.get("http://onepoold/v1/state", 4096).await.unwrap_err();
    assert_eq!(e.connect_error().map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_blocking_client_needs_no_runtime_of_its_callers() {
    // The server on a thread of its own, as a replica would be.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let server = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        server.block_on(async {
            tx.send(tcp_server(QUICK).await).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let addr = rx.recv().unwrap();
    let client = blocking::Client::new(Duration::from_secs(5));
    for _ in 0..3 {
        let a = client.request(http::Method::PUT, &format!("http://{addr}/p"), Some("{}"), &[("x-b", "2")], 4096);
        let text = a.unwrap().text().to_ascii_lowercase();
        assert!(text.starts_with("put /p") && text.contains("x-b: 2"), "{text}");
    }
}
