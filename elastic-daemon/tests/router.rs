//! The router in-process against real local backends.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use onepool_control::{api, Control, ControlError};
use onepool_elastic_daemon::control;
use onepool_router::registry::ReplicaState;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `onepool_router_unavailable_total` of the endpoint, as (reason, count).
fn unavailable(h: &Harness) -> Vec<(String, u64)> {
    let text = h.daemon.metrics.encode();
    text.lines()
        .filter_map(|l| l.strip_prefix("onepool_router_unavailable_total{"))
        .map(|l| {
            let reason = l.split("reason=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
            let n = l.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
            (reason.to_string(), n)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_replica_gets_the_next_request() {
    let (a, b) = (backend(Mode::Normal).await, backend(Mode::Normal).await);
    let h = Harness::new(endpoint_config(8, 8, Duration::from_secs(5)), &[a.addr, b.addr]).await;
    let c = client();
    // One long request occupies a; every short one then goes to b.
    let long = {
        let (c, url) = (c.clone(), format!("{}/sleep/800", h.url));
        tokio::spawn(async move { get(&c, &url).await })
    };
    until("the long request is in flight", || a.stats.in_flight.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    for _ in 0..10 {
        let (s, body) = get(&c, &format!("{}/ok", h.url)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, b.addr.to_string());
    }
    assert_eq!(long.await.unwrap().0, StatusCode::OK);
    assert_eq!((a.stats.served(), b.stats.served()), (1, 10));
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_queue_and_503_when_full() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(2, 2, Duration::from_secs(10)), &[a.addr]).await;
    let c = client();
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let (c, url) = (c.clone(), format!("{}/sleep/400", h.url));
        waiting.push(tokio::spawn(async move { get(&c, &url).await.0 }));
    }
    until("two requests queue", || h.snapshot().queued == 2).await;
    assert_eq!(h.snapshot().replicas[0].in_flight, 2);
    let (s, headers, _) = send(&c, "GET", &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers.get("retry-after").unwrap(), "10");
    for w in waiting {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(a.stats.peak(), 2);
    assert_eq!(a.stats.served(), 4);
    assert_eq!(h.snapshot().queued, 0);
    assert_eq!(unavailable(&h), [("queue_full".to_string(), 1)]);
    h.daemon.shutdown().await;
}

/// A client that gives up on a queued request takes it out of the queue:
/// no replica spends time on an answer nobody reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_never_reaches_a_replica() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(1, 4, Duration::from_secs(10)), &[a.addr]).await;
    let c = client();
    let busy = {
        let (c, url) = (c.clone(), format!("{}/sleep/600", h.url));
        tokio::spawn(async move { get(&c, &url).await.0 })
    };
    until("the replica is busy", || h.snapshot().replicas[0].in_flight == 1).await;
    let mut s = TcpStream::connect(h.url.trim_start_matches("http://")).await.unwrap();
    s.write_all(b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
    until("the request queues", || h.snapshot().queued == 1).await;
    drop(s);
    until("it leaves the queue with its client", || h.snapshot().queued == 0).await;
    assert_eq!(h.snapshot().replicas[0].in_flight, 1, "the busy request still holds the replica");
    assert_eq!(busy.await.unwrap(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.stats.served(), 1, "only the busy request reached the replica");
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_past_the_queue_timeout_gets_503() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(1, 4, Duration::from_millis(100)), &[a.addr]).await;
    let c = client();
    let busy = {
        let (c, url) = (c.clone(), format!("{}/sleep/600", h.url));
        tokio::spawn(async move { get(&c, &url).await.0 })
    };
    until("the replica is busy", || h.snapshot().replicas[0].in_flight == 1).await;
    let (s, headers, _) = send(&c, "GET", &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(busy.await.unwrap(), StatusCode::OK);
    assert_eq!(unavailable(&h), [("queue_timeout".to_string(), 1)]);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_under_concurrent_load_loses_no_request() {
    let backends = [backend(Mode::Normal).await, backend(Mode::Normal).await, backend(Mode::Normal).await];
    let addrs: Vec<_> = backends.iter().map(|b| b.addr).collect();
    let h = Harness::new(endpoint_config(20, 500, Duration::from_secs(20)), &addrs).await;
    let c = client();
    let mut requests = Vec::new();
    for i in 0..200u64 {
        let (c, url) = (c.clone(), format!("{}/sleep/{}", h.url, 20 + i % 30));
        requests.push(tokio::spawn(async move { get(&c, &url).await.0 }));
    }
    let total = || backends.iter().map(|b| b.stats.served()).sum::<u64>();
    until("some requests are served", || total() >= 40).await;
    let socket = h.daemon.control_socket.clone();
    let drained = addrs[0];
    let drain = tokio::spawn(async move {
        let r = api::ReplicaRef { address: drained, deadline: Some("10s".into()) };
        Control::new(&socket, Duration::from_secs(30)).drain_replica("chat", &r).await.unwrap()
    });
    until("the replica is draining", || h.snapshot().replicas[0].state == ReplicaState::Draining).await;
    // Nothing is handed to a draining replica, so this count is final.
    let served_before_drain = h.snapshot().replicas[0].served;
    let outcome = drain.await.unwrap();
    assert!(matches!(outcome, api::DrainOutcome::Drained { .. }), "{outcome:?}");
    for r in requests {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(backends[0].stats.served(), served_before_drain);
    assert_eq!(total(), 200);
    assert!(served_before_drain < 200);
    let s = h.snapshot();
    assert_eq!(s.replicas.iter().map(|r| r.served).sum::<u64>(), 200);
    assert!(s.replicas.iter().all(|r| r.in_flight == 0));
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_response_passes_through_incrementally() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a.addr]).await;
    let req = Request::get(format!("{}/stream", h.url)).body(Full::new(Bytes::new())).unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The backend holds its last chunk until we have seen the first one.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("first chunk is not held back");
    assert_eq!(first.unwrap().unwrap().into_data().unwrap(), Bytes::from_static(b"data: first\n\n"));
    assert_eq!(h.snapshot().replicas[0].in_flight, 1, "the stream holds its replica");
    a.release_stream.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from_static(b"data: last\n\n"));
    until("the stream's replica is released", || h.snapshot().replicas[0].in_flight == 0).await;
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_served() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a.addr]).await;
    let c: HttpClient = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let (s, body) = get(&c, &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body, a.addr.to_string());
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_retried_even_for_post() {
    let dead = closed_port().await;
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[dead, a.addr]).await;
    let c = client();
    for _ in 0..4 {
        let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, a.addr.to_string());
    }
    assert_eq!(a.stats.served(), 4);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_status_takes_replica_out_and_retries() {
    let d = backend(Mode::Draining).await;
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[d.addr, a.addr]).await;
    let c = client();
    for _ in 0..5 {
        let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, a.addr.to_string());
    }
    assert_eq!(d.stats.served(), 1, "out of rotation after its first draining answer");
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Draining);
    // Retried elsewhere: no 503 reached a client.
    assert_eq!(unavailable(&h), []);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_503_is_counted_by_its_reason() {
    // The only replica drains: nowhere else to go once the queue wait ends.
    let d = backend(Mode::Draining).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_millis(200)), &[d.addr]).await;
    let c = client();
    let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("the replica is draining and no other one could take the request"), "{body}");
    assert_eq!(unavailable(&h), [("draining".to_string(), 1)]);
    h.daemon.shutdown().await;
    // A server's own 503 is passed on, and counted as the replica's.
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a.addr]).await;
    let (s, _, body) = send(&c, "GET", &format!("{}/status/503", h.url)).await;
    assert_eq!((s, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "the server's own answer"));
    assert_eq!(unavailable(&h), [("replica".to_string(), 1)]);
    h.daemon.shutdown().await;
}

/// The access log (issue #26): a line per request with what the server
/// counted, the replica, the router's own answers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_leaves_an_access_line() {
    let a = backend(Mode::Normal).await;
    let dir = std::env::temp_dir().join(format!("onepool-access-router-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.jsonl");
    let mut config = common::config(endpoint_config(1, 0, Duration::from_millis(100)), 256 << 20);
    config.access_log = Some(onepool_router::access_log::AccessLogSettings {
        path: path.clone(),
        max_file_bytes: 1 << 20,
        keep_files: 2,
    });
    let daemon = onepool_elastic_daemon::daemon::Daemon::start(config).await.unwrap();
    let ep = daemon.endpoint("chat").unwrap();
    ep.endpoint.add(a.addr, None, true).unwrap();
    let url = format!("http://{}", ep.listen.unwrap());
    let c = client();
    let post = |path: &str, body: &'static str| {
        let req = Request::builder()
            .method("POST")
            .uri(format!("{url}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let c = c.clone();
        async move {
            let r = c.request(req).await.unwrap();
            let s = r.status();
            r.into_body().collect().await.unwrap();
            s
        }
    };
    assert_eq!(post("/usage", r#"{"model":"m","stream":false,"messages":[]}"#).await, StatusCode::OK);
    // The one replica busy and no queue: the router answers 503 itself.
    let busy = {
        let (c, u) = (c.clone(), format!("{url}/sleep/500"));
        tokio::spawn(async move { get(&c, &u).await.0 })
    };
    until("the replica is busy", || a.stats.in_flight.load(Ordering::SeqCst) == 1).await;
    assert_eq!(post("/ok", r#"{"model":"m"}"#).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.await.unwrap(), StatusCode::OK);
    // A class asked of an endpoint without classes is refused, and the
    // refusal has its line too (issue #50).
    let classed = Request::post(format!("{url}/v1/chat/completions"))
        .header("x-request-class", "inference-baseline")
        .body(Full::new(Bytes::from_static(br#"{"model":"m","messages":[]}"#)))
        .unwrap();
    let r = c.request(classed).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let why = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(why.contains("serves its requests in one class"), "{why}");
    let lines = || std::fs::read_to_string(&path).unwrap_or_default();
    until("four access lines", || lines().lines().count() == 4).await;
    let entries: Vec<onepool_decisions::trace::AccessEntry> =
        lines().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let e = &entries[0];
    assert_eq!((e.endpoint.as_str(), e.model.as_deref(), e.status, e.stream), ("chat", Some("m"), 200, false));
    assert_eq!((e.prompt_tokens, e.completion_tokens, e.complete), (Some(7), Some(3), true));
    assert_eq!(e.replica, Some(a.addr.to_string()));
    assert!(e.ttfb_s.is_some_and(|t| t <= e.latency_s), "{e:?}");
    let refused = entries.iter().find(|e| e.status == 503).expect("the router's 503 is logged");
    assert_eq!((refused.replica.as_deref(), refused.prompt_tokens), (None, None));
    assert_eq!(refused.reason.as_deref(), Some("queue_full"));
    let class = entries.iter().find(|e| e.status == 400).expect("the refused class is logged");
    assert_eq!((class.reason.as_deref(), class.model.as_deref()), (Some("class_refused"), Some("m")));
    assert_eq!(e.reason, None, "a replica's answer");
    let slept = entries.iter().find(|e| e.status == 200 && e.model.is_none()).unwrap();
    assert!(slept.latency_s >= 0.5, "{slept:?}");
    assert_eq!(daemon.metrics.access_log_dropped.get(), 0);
    daemon.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client chooses the model's name, and a 4 MB one made every access
/// line, so every file, 4 MB whatever `max_file_bytes` said: its line is now
/// written with the name cut and marked, and no file passes the size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_line_is_bounded_whatever_model_name_a_client_sends() {
    let a = backend(Mode::Normal).await;
    let dir = std::env::temp_dir().join(format!("onepool-access-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let settings = onepool_router::access_log::AccessLogSettings {
        path: dir.join("access.jsonl"),
        // The least onepoold.toml takes.
        max_file_bytes: 64 << 10,
        keep_files: 3,
    };
    let mut endpoint = endpoint_config(4, 4, Duration::from_secs(5));
    endpoint.proxy.max_request_body = 8 << 20;
    let mut config = common::config(endpoint, 256 << 20);
    config.access_log = Some(settings.clone());
    let daemon = onepool_elastic_daemon::daemon::Daemon::start(config).await.unwrap();
    let ep = daemon.endpoint("chat").unwrap();
    ep.endpoint.add(a.addr, None, true).unwrap();
    let url = format!("http://{}/ok", ep.listen.unwrap());
    let c = client();
    let huge = serde_json::json!({ "model": "m".repeat(4 << 20), "messages": [] }).to_string();
    for body in [huge.clone(), huge, r#"{"model":"SmolLM2-135M-Instruct"}"#.to_string()] {
        let req = Request::post(&url).body(Full::new(Bytes::from(body))).unwrap();
        let r = c.request(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.into_body().collect().await.unwrap();
    }
    let entries = || -> Vec<(std::path::PathBuf, String)> {
        settings
            .files_oldest_first()
            .into_iter()
            .filter_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
            .collect()
    };
    until("three access lines", || entries().iter().map(|(_, t)| t.lines().count()).sum::<usize>() == 3).await;
    let mut models = Vec::new();
    for (p, text) in entries() {
        assert!(text.len() <= 64 << 10, "{}: {} bytes", p.display(), text.len());
        for line in text.lines() {
            // As `onepool report` and `onepool simulate` read it.
            let e: onepool_decisions::trace::AccessEntry = serde_json::from_str(line).unwrap();
            models.push(e.model.unwrap_or_default());
        }
    }
    let cut = format!("{}...[truncated from {} bytes]", "m".repeat(256), 4 << 20);
    assert_eq!(models, [cut.as_str(), cut.as_str(), "SmolLM2-135M-Instruct"]);
    assert_eq!(daemon.metrics.access_log_dropped.get(), 0);
    daemon.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_reset_is_retried_when_safe_else_502() {
    let (reset, count) = resetting_backend().await;
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[reset, a.addr]).await;
    let c = client();
    let (s, body) = get(&c, &format!("{}/ok", h.url)).await;
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Both replicas have served one; the tie goes to the first, which resets.
    let (s, _, _) = send(&c, "POST", &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
    let (s, _) = get(&c, &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::OK);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_backend_times_out_with_504_and_others_are_fine() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.request_timeout = Duration::from_millis(300);
    let h = Harness::new(cfg, &[a.addr]).await;
    let c = client();
    let hung = {
        let (c, url) = (c.clone(), format!("{}/hang", h.url));
        tokio::spawn(async move { get(&c, &url).await.0 })
    };
    for _ in 0..5 {
        assert_eq!(get(&c, &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    }
    assert_eq!(hung.await.unwrap(), StatusCode::GATEWAY_TIMEOUT);
    until("the hung request's slot is back", || h.snapshot().replicas[0].in_flight == 0).await;
    h.daemon.shutdown().await;
}

/// A bare HTTP/1.1 replica, byte for byte: `answer(method, path, body
/// length)` gives the bytes to send back for each request and whether to
/// close the connection after them. It counts the connections it accepts.
async fn scripted_backend(
    answer: impl Fn(&str, &str, usize) -> (Vec<u8>, bool) + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some((line, body)) = read_message(&mut s, &mut buf).await {
                    let mut words = line.split(' ');
                    let (method, path) = (words.next().unwrap().to_string(), words.next().unwrap().to_string());
                    let len = body.len();
                    let (bytes, close) = answer(&method, &path, len);
                    if s.write_all(&bytes).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// Answers "ok" to every request, keeping the connection open or closing
/// it right after the answer without saying so (as a replica whose
/// keep-alive timeout passed does).
async fn counting_backend(close_after_answer: bool) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    scripted_backend(move |_, _, _| (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(), close_after_answer))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_connections_are_kept_alive_and_reused() {
    let (addr, accepted) = counting_backend(false).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[addr]).await;
    let c = client();
    for method in ["GET", "POST", "GET", "PUT", "GET", "POST"] {
        let (s, _, body) = send(&c, method, &format!("{}/ok", h.url)).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for requests one after the other");
    h.daemon.shutdown().await;
}

/// The replica's keep-alive timeout fires as our request arrives on the
/// connection it held: it closes without an answer. The request is sent
/// again on a new connection (every other request here meets that race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_connection_closed_before_any_answer_is_retried_on_a_new_one() {
    let requests = Arc::new(AtomicU64::new(0));
    let n = requests.clone();
    let (addr, accepted) = scripted_backend(move |_, _, _| {
        if n.fetch_add(1, Ordering::SeqCst) & 1 == 0 {
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(), false)
        } else {
            (Vec::new(), true)
        }
    })
    .await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[addr]).await;
    let c = client();
    for _ in 0..4 {
        let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
    }
    assert_eq!(requests.load(Ordering::SeqCst), 7, "each POST after the first went out twice");
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "a new connection for each retry");
    h.daemon.shutdown().await;
}

/// A replica that closes a reused connection unanswered only after working
/// on the request a while (it died on it) may have done the work: the POST
/// is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_connection_closed_late_without_an_answer_fails_a_post() {
    let requests = Arc::new(AtomicU64::new(0));
    let n = requests.clone();
    let (addr, _) = scripted_backend(move |_, _, _| {
        if n.fetch_add(1, Ordering::SeqCst) == 0 {
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(), false)
        } else {
            // Blocks this backend task's thread: fine for one request.
            std::thread::sleep(onepool_router::backend_pool::KEEP_ALIVE_RACE * 3);
            (Vec::new(), true)
        }
    })
    .await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[addr]).await;
    let c = client();
    assert_eq!(send(&c, "POST", &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    assert_eq!(send(&c, "POST", &format!("{}/ok", h.url)).await.0, StatusCode::BAD_GATEWAY);
    assert_eq!(requests.load(Ordering::SeqCst), 2, "the POST went out once");
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_closed_by_the_replica_is_not_an_error() {
    let (addr, accepted) = counting_backend(true).await;
    // No other replica to retry on: a POST on a connection found closed goes
    // out again on a new one.
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[addr]).await;
    let c = client();
    for _ in 0..5 {
        let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "ok"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_responses_of_every_framing_pass_through() {
    let (addr, accepted) = scripted_backend(|method, path, body_len| {
        let ok = |body: &str| format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        let (text, close) = match (method, path) {
            ("HEAD", _) => ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_string(), false),
            (_, "/chunked") => (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 1\r\n\r\n"
                    .to_string(),
                false,
            ),
            (_, "/until-close") => ("HTTP/1.1 200 OK\r\n\r\nread until the end".to_string(), true),
            (_, "/http10") => ("HTTP/1.0 200 OK\r\ncontent-length: 6\r\n\r\nold ok".to_string(), true),
            (_, "/interim") => (format!("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n{}", ok("final")), false),
            (_, "/no-content") => ("HTTP/1.1 204 No Content\r\n\r\n".to_string(), false),
            (_, "/closing") => ("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbye".to_string(), true),
            (_, "/big") => (ok(&"x".repeat(1 << 20)), false),
            (_, "/garbage") => ("this is not HTTP\r\n\r\n".to_string(), true),
            (_, "/bad-length") => ("HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\nok".to_string(), true),
            _ => (ok(&format!("{method} {path} {body_len}")), false),
        };
        (text.into_bytes(), close)
    })
    .await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[addr]).await;
    let c = client();
    let url = |p: &str| format!("{}{p}", h.url);
    let (s, headers, body) = send(&c, "GET", &url("/chunked")).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "hello world"));
    assert!(!headers.contains_key("content-length"));
    let (s, _, body) = send(&c, "GET", &url("/interim")).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "final"));
    let (s, headers, body) = send(&c, "HEAD", &url("/ok")).await;
    assert_eq!((s, body.as_str(), headers["content-length"].to_str().unwrap()), (StatusCode::OK, "", "5"));
    let (s, _, body) = send(&c, "DELETE", &url("/no-content")).await;
    assert_eq!((s, body.as_str()), (StatusCode::NO_CONTENT, ""));
    let (s, _, body) = send(&c, "GET", &url("/big")).await;
    assert_eq!((s, body.len()), (StatusCode::OK, 1 << 20));
    assert!(body.bytes().all(|b| b == b'x'));
    let big = Request::post(url("/upload")).body(Full::new(Bytes::from(vec![b'y'; 600_000]))).unwrap();
    let resp = c.request(big).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"POST /upload 600000");
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "all of these on one kept-alive connection");
    for (path, answer) in [("/until-close", "read until the end"), ("/http10", "old ok"), ("/closing", "bye")] {
        let (s, _, body) = send(&c, "GET", &url(path)).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, answer), "{path}");
        let (s, _, body) = send(&c, "POST", &url("/after")).await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "POST /after 0"), "after {path}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "a new connection after each of those three");
    for path in ["/garbage", "/bad-length"] {
        let (s, _, _) = send(&c, "POST", &url(path)).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY, "{path}");
    }
    let (s, _, body) = send(&c, "GET", &url("/fine")).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "GET /fine 0"));
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_head_reaches_the_replica_as_sent() {
    let echo = echo_replica().await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[echo]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let answer = raw(
        &addr,
        b"GET /a/b?c=d HTTP/1.1\r\nHost: chat.example\r\nConnection: close, x-hop\r\nx-hop: 1\r\nKeep-Alive: 5\r\nx-forwarded-for: 10.0.0.1\r\nx-kept: yes\r\n\r\n",
    )
    .await;
    let head = answer.split_once("\r\n\r\n").unwrap().1.to_ascii_lowercase();
    assert!(head.starts_with("get /a/b?c=d http/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nhost: chat.example\r\n"), "{head}");
    assert!(head.contains("\r\nx-kept: yes\r\n"), "{head}");
    assert!(head.contains("\r\nx-forwarded-for: 10.0.0.1, 127.0.0.1\r\n"), "{head}");
    for gone in ["connection", "x-hop", "keep-alive", "content-length"] {
        assert!(!head.contains(&format!("\r\n{gone}:")), "{gone} in {head}");
    }
    // HTTP/1.0 without a Host: the replica's address names the host.
    let answer = raw(&addr, b"POST /p HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc").await;
    let head = answer.split_once("\r\n\r\n").unwrap().1.to_ascii_lowercase();
    assert!(head.starts_with("post /p http/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("\r\nhost: {echo}\r\n")), "{head}");
    assert!(head.contains("\r\ncontent-length: 3\r\n"), "{head}");
    h.daemon.shutdown().await;
}

/// A replica that answers each request with the head it got as its body,
/// after reading the whole request body (its length in `x-body`).
async fn echo_replica() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(mut buf) = read_head(&mut s).await else { return };
                let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len = content_length(&head);
                while buf.len() < end + len {
                    let mut chunk = [0u8; 65536];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let answer =
                    format!("HTTP/1.1 200 OK\r\nx-body: {len}\r\ncontent-length: {}\r\n\r\n{head}", head.len());
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    echo
}

/// The answers on a connection, read to its end: each one's head and body
/// (Content-Length framed).
fn answers(text: &str) -> Vec<(String, String)> {
    let mut rest = text;
    let mut seen = Vec::new();
    while let Some((head, after)) = rest.split_once("\r\n\r\n") {
        let len = content_length(head);
        seen.push((head.to_string(), after[..len].to_string()));
        rest = &after[len..];
    }
    seen
}

/// The lean HTTP/1.1 path (proxy/lean.rs) takes plain requests without
/// hyper; what it does not take goes to hyper from that request on, on the
/// same connection. The two tell apart by field names: the lean path
/// passes them as the client wrote them, hyper's lower case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lean_path_forwards_heads_as_sent_and_hands_over_what_it_does_not_take() {
    let echo = echo_replica().await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[echo]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    // Three pipelined requests in one write: a POST and a GET the lean
    // path takes, then one with `Connection: close` it hands over.
    let answer = raw(
        &addr,
        b"POST /lean?x=1 HTTP/1.1\r\nHost: chat.example\r\nX-Forwarded-For: 10.0.0.1\r\nx-onepool-replica-key: forged\r\nX-Kept: yes\r\ncontent-length: 3\r\n\r\nabc\
          GET /second HTTP/1.1\r\nhost: chat.example\r\nX-Kept: 2\r\n\r\n\
          GET /third HTTP/1.1\r\nHost: chat.example\r\nX-Kept: 3\r\nConnection: close\r\n\r\n",
    )
    .await;
    let seen = answers(&answer);
    assert_eq!(seen.len(), 3, "{answer}");
    for (head, _) in &seen {
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
    }
    let (head, post) = &seen[0];
    assert!(post.starts_with("POST /lean?x=1 HTTP/1.1\r\n"), "{post}");
    for field in ["Host: chat.example", "X-Kept: yes", "x-forwarded-for: 10.0.0.1, 127.0.0.1", "content-length: 3"] {
        assert!(post.contains(&format!("\r\n{field}\r\n")), "{field} not in {post}");
    }
    assert!(head.contains("\r\nx-body: 3\r\n"), "{head}");
    assert!(!post.contains("forged"), "a client's replica key reached the replica: {post}");
    assert!(seen[1].1.contains("\r\nX-Kept: 2\r\n"), "{}", seen[1].1);
    assert!(seen[1].1.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"), "{}", seen[1].1);
    // hyper's: it answers with connection: close, and nothing of the
    // client's hop-by-hop fields passes.
    assert!(seen[2].1.contains("\r\nx-kept: 3\r\n"), "{}", seen[2].1);
    assert!(!seen[2].1.to_ascii_lowercase().contains("connection:"), "{}", seen[2].1);
    assert!(seen[2].0.contains("\r\nconnection: close\r\n"), "{}", seen[2].0);

    // A body larger than one read, all in the socket: the lean path's.
    let mut request = b"POST /big HTTP/1.1\r\nHost: h\r\nX-Kept: big\r\ncontent-length: 20000\r\n\r\n".to_vec();
    request.extend_from_slice(&[b'y'; 20_000]);
    request.extend_from_slice(b"GET /end HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
    let seen = answers(&raw(&addr, &request).await);
    assert_eq!(seen.len(), 2);
    assert!(seen[0].0.contains("\r\nx-body: 20000\r\n") && seen[0].1.contains("\r\nX-Kept: big\r\n"), "{seen:?}");

    // A body that comes after its head: hyper's, and served whole.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /late HTTP/1.1\r\nHost: h\r\nX-Kept: late\r\ncontent-length: 5\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"hello").await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let seen = answers(&String::from_utf8_lossy(&out));
    assert_eq!(seen.len(), 1);
    assert!(seen[0].0.contains("\r\nx-body: 5\r\n") && seen[0].1.contains("\r\nx-kept: late\r\n"), "{seen:?}");
    h.daemon.shutdown().await;
}

async fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_gets_400_and_others_are_unaffected() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(8, 8, Duration::from_secs(5)), &[a.addr]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let answer = raw(&addr, b"GET / HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    let answer = raw(&addr, b"\x16\x03\x01 not http at all\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400") || answer.is_empty(), "{answer:?}");
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    assert_eq!(a.stats.served(), 1);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(8, 8, Duration::from_secs(5)), &[a.addr]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let big = format!("GET /ok HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "a".repeat(20_000));
    let answer = raw(&addr, big.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    assert_eq!(a.stats.served(), 1);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_while_others_succeed() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.conn.header_read_timeout = Duration::from_millis(300);
    let h = Harness::new(cfg, &[a.addr]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let slow = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        // One header byte every 50 ms, for at most 5 s.
        for _ in 0..100 {
            if s.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut buf = [0u8; 64];
            match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
        }
        started.elapsed()
    });
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    }
    let took = slow.await.unwrap();
    assert!(took < Duration::from_secs(4), "slow client kept its connection for {took:?}");
    assert_eq!(a.stats.served(), 5);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_timeout_spares_long_answers_and_busy_connections_but_not_idle_ones() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(8, 8, Duration::from_secs(5));
    cfg.proxy.conn.header_read_timeout = Duration::from_millis(300);
    let h = Harness::new(cfg, &[a.addr]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let mut buf = Vec::new();
    // An answer that takes twice the head timeout: the head was in long ago.
    s.write_all(b"GET /sleep/600 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (status, body) = read_response(&mut s, &mut buf).await.expect("answered");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, a.addr.to_string());
    // Requests one after the other for three times the head timeout, each
    // head sent at once: the connection stays.
    let started = std::time::Instant::now();
    let mut last_answer = started;
    while started.elapsed() < Duration::from_millis(900) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (status, _) = read_response(&mut s, &mut buf).await.expect("answered");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        last_answer = std::time::Instant::now();
    }
    // Idle (no request head) past the head timeout: closed.
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut byte)).await.expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let idle = last_answer.elapsed();
    assert!(idle >= Duration::from_millis(250), "closed {idle:?} after the last answer");
    h.daemon.shutdown().await;
}

/// An idle keep-alive connection (its answer out, no next request begun)
/// closes `header_read_timeout` after its last answer, on both HTTP/1.1
/// paths. A request right after the connection opened is the worst case of
/// a timer that looks once per timeout whether anything happened: it kept
/// such a connection for twice the timeout (1.19-1.20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_closes_at_the_head_timeout_on_both_paths() {
    let echo = echo_replica().await;
    let timeout = Duration::from_millis(600);
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
    cfg.proxy.conn.header_read_timeout = timeout;
    let h = Harness::new(cfg, &[echo]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    // The lean path passes field names as sent; a `Connection` field sends
    // the request to hyper, which passes them in lower case.
    for (path, request, seen) in [
        ("lean", "GET /lean HTTP/1.1\r\nHost: h\r\nX-Kept: 1\r\n\r\n", "\r\nX-Kept: 1\r\n"),
        ("hyper", "GET /hyper HTTP/1.1\r\nHost: h\r\nX-Kept: 1\r\nConnection: keep-alive\r\n\r\n", "\r\nx-kept: 1\r\n"),
    ] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut buf = Vec::new();
        s.write_all(request.as_bytes()).await.unwrap();
        let (status, body) = read_response(&mut s, &mut buf).await.expect("answered");
        let answered = std::time::Instant::now();
        assert!(status.starts_with("HTTP/1.1 200") && body.contains(seen), "{path}: {status} {body}");
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(timeout * 4, s.read(&mut byte)).await.expect("closed in time");
        assert!(matches!(n, Ok(0) | Err(_)), "{path}: {n:?}");
        let idle = answered.elapsed();
        eprintln!("{path}: an idle keep-alive connection lived {idle:?} (header_read_timeout {timeout:?})");
        assert!(
            idle >= timeout - Duration::from_millis(50) && idle < timeout + Duration::from_millis(250),
            "{path}: an idle keep-alive connection lived {idle:?} (header_read_timeout {timeout:?})"
        );
    }
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_at_once_and_busy_ones_after_their_answer() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(8, 8, Duration::from_secs(5)), &[a.addr]).await;
    let addr = h.url.trim_start_matches("http://").to_string();
    let (mut idle, mut busy) = (TcpStream::connect(&addr).await.unwrap(), TcpStream::connect(&addr).await.unwrap());
    let (mut idle_buf, mut busy_buf, mut fresh_buf) = (Vec::new(), Vec::new(), Vec::new());
    idle.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(read_response(&mut idle, &mut idle_buf).await.is_some());
    busy.write_all(b"GET /sleep/500 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    until("the slow request is in flight", || a.stats.in_flight.load(Ordering::SeqCst) == 1).await;
    // Accepted before the shutdown, its request not sent yet (a restart
    // under load: it left the listening socket's queue, so no other
    // process will ever see it).
    let mut fresh = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let stop = tokio::spawn(h.daemon.shutdown());
    // The idle connection closes at once; the busy one gets its answer.
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(1), idle.read(&mut byte)).await.expect("idle one closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(started.elapsed() < Duration::from_millis(400), "{:?}", started.elapsed());
    // The fresh one's request, sent after the shutdown began, is answered.
    fresh.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (status, _) = read_response(&mut fresh, &mut fresh_buf).await.expect("the fresh connection answered");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let (status, _) = read_response(&mut busy, &mut busy_buf).await.expect("busy one answered");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    stop.await.unwrap();
    // Every connection ended by itself: the 2 s grace never ran out.
    assert!(started.elapsed() < Duration::from_millis(1950), "stopped after {:?} (grace 2 s)", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_socket_adds_drains_removes_and_reports() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[]).await;
    let socket = h.daemon.control_socket.clone();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    let control = Control::new(&socket, Duration::from_secs(10));
    let add = api::AddReplica { address: a.addr, concurrency: Some(3), ready: None, pin: None };
    control.add_replica("chat", &add).await.unwrap();
    match control.add_replica("chat", &add).await {
        Err(ControlError::Refused { status, message }) => {
            assert_eq!(status, StatusCode::CONFLICT);
            assert!(message.contains("already"), "{message}");
        }
        other => panic!("a second add of the same replica: {other:?}"),
    }
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    let state = control.state().await.unwrap();
    let r = &state.endpoint("chat").unwrap().replicas[0];
    assert_eq!((r.state, r.limit, r.served), (ReplicaState::Ready, 3, 1), "{state:?}");
    let drain = api::ReplicaRef { address: a.addr, deadline: Some("1s".into()) };
    let outcome = control.drain_replica("chat", &drain).await.unwrap();
    assert!(matches!(outcome, api::DrainOutcome::Drained { .. }), "{outcome:?}");
    let (s, _, _) = send(&client(), "GET", &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "no replica takes requests after the drain");
    let removed = control.remove_replica("chat", &api::ReplicaRef { address: a.addr, deadline: None }).await.unwrap();
    assert_eq!(removed.removed.address, a.addr);
    // What no typed client sends: an unknown endpoint, a body that is not
    // the request's.
    let (s, v) = control.call(Method::POST, "/v1/endpoints/nope/replicas", Some(&json!({}))).await.unwrap();
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(v["error"].as_str().unwrap().contains("\"chat\""), "{v}");
    let (s, v) =
        control.call(Method::POST, "/v1/endpoints/chat/replicas", Some(&json!({"adress": "x"}))).await.unwrap();
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("unknown field `adress`"), "{v}");
    h.daemon.shutdown().await;
}

#[test]
fn control_socket_refuses_other_uids() {
    // Switching uid needs root and another account; the check itself:
    assert!(control::peer_allowed(0, 4242));
    assert!(control::peer_allowed(4242, 4242));
    assert!(!control::peer_allowed(4243, 4242));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_bring_replicas_in() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
    cfg.health = Some(onepool_router::settings::HealthCheck {
        path: "/health".into(),
        interval: Duration::from_millis(20),
        timeout: Duration::from_millis(500),
    });
    let h = Harness::new(cfg, &[]).await;
    let socket = h.daemon.control_socket.clone();
    let add = api::AddReplica { address: a.addr, concurrency: None, ready: None, pin: None };
    Control::new(&socket, Duration::from_secs(10)).add_replica("chat", &add).await.unwrap();
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Starting);
    // A request sent now waits in the queue until the replica is ready.
    let (s, body) = get(&client(), &format!("{}/ok", h.url)).await;
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Ready);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a.addr]).await;
    assert_eq!(get(&client(), &format!("{}/ok", h.url)).await.0, StatusCode::OK);
    let url = format!("http://{}/metrics", h.daemon.metrics_address.unwrap());
    let (s, text) = get(&client(), &url).await;
    assert_eq!(s, StatusCode::OK);
    let line = format!("onepool_router_requests_total{{endpoint=\"chat\",replica=\"{}\",class=\"2xx\"}} 1", a.addr);
    assert!(text.contains(&line), "{text}");
    assert!(text.contains("onepool_router_queue_depth"), "{text}");
    assert!(text.contains("onepool_router_request_duration_seconds_count"), "{text}");
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let a = backend(Mode::Normal).await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a.addr]).await;
    let c = client();
    let slow = {
        let (c, url) = (c.clone(), format!("{}/sleep/300", h.url));
        tokio::spawn(async move { get(&c, &url).await.0 })
    };
    until("the request is in flight", || a.stats.in_flight.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    let url = h.url.clone();
    h.daemon.shutdown().await;
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    let refused = Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>()
        .request(Request::get(format!("{url}/ok")).body(Full::new(Bytes::new())).unwrap())
        .await;
    assert!(refused.is_err(), "no new connections after shutdown");
}

fn health_every(interval: Duration) -> onepool_elastic_daemon::config::EndpointConfig {
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
    cfg.health = Some(onepool_router::settings::HealthCheck {
        path: "/health".into(),
        interval,
        timeout: Duration::from_millis(500),
    });
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_leaves_rotation_after_its_first_failed_request() {
    // Closes every connection unanswered, health checks included: a
    // replica whose server just died.
    let requests = Arc::new(AtomicU64::new(0));
    let probes = Arc::new(AtomicU64::new(0));
    let (r, p) = (requests.clone(), probes.clone());
    let (dead, _) = scripted_backend(move |_, path, _| {
        match path {
            "/health" => p.fetch_add(1, Ordering::SeqCst),
            _ => r.fetch_add(1, Ordering::SeqCst),
        };
        (Vec::new(), true)
    })
    .await;
    let a = backend(Mode::Normal).await;
    let h = Harness::new(health_every(Duration::from_secs(60)), &[dead, a.addr]).await;
    // The first round of checks (at start) has passed; the next is a minute off.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probes_before = probes.load(Ordering::SeqCst);
    let c = client();
    let (s, _, _) = send(&c, "POST", &format!("{}/ok", h.url)).await;
    // The first request chose the dead replica (a tie goes to the first):
    // written, then closed, so a POST is not retried.
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    for _ in 0..10 {
        let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    }
    assert_eq!(requests.load(Ordering::SeqCst), 1, "no request reached it after its first failed");
    until("the immediate health check", || probes.load(Ordering::SeqCst) > probes_before).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Out, "its health check failed too");
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_one_connection_is_back_after_one_health_check() {
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = failed_once.clone();
    let (flaky, _) = scripted_backend(move |_, path, _| match path {
        "/health" => (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(), false),
        // The first request's connection closes unanswered, then it serves.
        _ if !f.swap(true, Ordering::SeqCst) => (Vec::new(), true),
        _ => (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nflaky".to_vec(), false),
    })
    .await;
    // The regular interval is far off: only the probe after the failure
    // can bring it back.
    let h = Harness::new(health_every(Duration::from_secs(60)), &[flaky]).await;
    let c = client();
    // Let the first regular round (at start) pass.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A retry never goes back to the replica it failed on, and there is
    // no other one.
    let (s, _) = get(&c, &format!("{}/ok", h.url)).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(failed_once.load(Ordering::SeqCst));
    // `until` gives up after 10 s; the regular round is 60 s off.
    until("the replica back in rotation", || h.snapshot().replicas[0].state == ReplicaState::Ready).await;
    let (s, body) = get(&c, &format!("{}/ok", h.url)).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "flaky"));
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_health_checks_a_failed_request_ejects_nothing() {
    // Nothing would bring an ejected replica back.
    let (dead, count) = resetting_backend().await;
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[dead]).await;
    let c = client();
    for _ in 0..3 {
        let (s, _, _) = send(&c, "POST", &format!("{}/ok", h.url)).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(h.snapshot().replicas[0].state, ReplicaState::Ready);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_with_bearer_tokens_refuses_requests_without_one_before_any_replica_sees_them() {
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
    cfg.proxy.auth = Some(onepool_router::settings::BearerTokens::new(["0123456789abcdef-chat".to_string()]));
    let h = Harness::new(cfg, &[a.addr]).await;
    let c = client();
    let with = |auth: Option<&str>, method: &str, body: &'static str| {
        let mut r = Request::builder().method(method).uri(format!("{}/ok", h.url));
        if let Some(v) = auth {
            r = r.header("authorization", v);
        }
        let (c, req) = (c.clone(), r.body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap());
        async move {
            let resp = c.request(req).await.unwrap();
            let (status, headers) = (resp.status(), resp.headers().clone());
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, headers, String::from_utf8_lossy(&body).into_owned())
        }
    };
    for (auth, method, body) in [
        (None, "GET", ""),
        (Some("Bearer 0123456789abcdef-chaT"), "GET", ""),
        (Some("Basic 0123456789abcdef-chat"), "POST", "{\"model\": \"m\"}"),
    ] {
        let (s, headers, text) = with(auth, method, body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], 401, "{text}");
        assert!(v["error"]["message"].as_str().unwrap().contains("Authorization: Bearer"), "{text}");
    }
    assert_eq!(a.stats.served(), 0, "no refused request reached the replica");
    let (s, _, text) = with(Some("Bearer 0123456789abcdef-chat"), "POST", "{\"model\": \"m\"}").await;
    assert_eq!((s, text), (StatusCode::OK, a.addr.to_string()));
    assert_eq!(a.stats.served(), 1);
    h.daemon.shutdown().await;
}

/// The client's key is the router's to check: where the endpoint has keys,
/// no `Authorization` field of the client's reaches a replica, on either
/// HTTP/1.1 path (told apart by field-name case, as in
/// `the_lean_path_forwards_heads_as_sent_and_hands_over_what_it_does_not_take`)
/// nor with the models list; where it has none, the field passes as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_stops_at_the_router_where_the_endpoint_has_keys_and_passes_where_it_has_none() {
    const KEY: &str = "0123456789abcdef-chat";
    let echo = echo_replica().await;
    let (lists, heads) = recording_list_replica().await;
    for keys in [true, false] {
        let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
        if keys {
            cfg.proxy.auth = Some(onepool_router::settings::BearerTokens::new([KEY.to_string()]));
        }
        let h = Harness::new(cfg, &[echo]).await;
        let addr = h.url.trim_start_matches("http://").to_string();
        // A second field with another value too: the lean path checks the
        // first.
        let fields = format!("Authorization: Bearer {KEY}\r\nAUTHORIZATION: Bearer second-secret\r\n");
        for (path, extra, kept) in
            [("lean", "", "\r\nX-Kept: 1\r\n"), ("hyper", "Connection: close\r\n", "\r\nx-kept: 1\r\n")]
        {
            let request = format!("GET /{path} HTTP/1.1\r\nHost: h\r\n{fields}X-Kept: 1\r\n{extra}\r\n");
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let mut buf = Vec::new();
            s.write_all(request.as_bytes()).await.unwrap();
            let (status, seen) = read_response(&mut s, &mut buf).await.expect("answered");
            assert!(status.starts_with("HTTP/1.1 200") && seen.contains(kept), "{path}: {status} {seen}");
            let authorization = seen.to_ascii_lowercase().matches("\r\nauthorization: bearer ").count();
            match keys {
                true => {
                    assert_eq!(authorization, 0, "{path}: the client's key reached the replica: {seen}");
                    assert!(!seen.contains(KEY) && !seen.contains("second-secret"), "{path}: {seen}");
                }
                false => assert_eq!(authorization, 2, "{path}: the fields pass as sent: {seen}"),
            }
        }
        // The models list asks each replica with the client's field, or
        // without it.
        h.daemon.endpoint("chat").unwrap().endpoint.add(lists, None, true).unwrap();
        let req = Request::builder()
            .uri(format!("{}/v1/models", h.url))
            .header("authorization", format!("Bearer {KEY}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let head = heads.lock().unwrap().pop().expect("the list replica was asked").to_ascii_lowercase();
        assert_eq!(head.contains(&format!("\r\nauthorization: bearer {KEY}\r\n")), !keys, "keys {keys}: {head}");
        h.daemon.shutdown().await;
    }
}

/// A replica that lists one model to every request, and keeps each
/// request's head.
async fn recording_list_replica() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let Some(buf) = read_head(&mut s).await else { return };
                kept.lock().unwrap().push(String::from_utf8_lossy(&buf).into_owned());
                let body = r#"{"object":"list","data":[{"id":"m"}]}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, heads)
}

/// A replica that answers every request with `body` (JSON), once per
/// connection; with `key`, only requests that carry it as a bearer token
/// (else 401).
async fn json_backend(body: &'static str, key: Option<&'static str>) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                // The request head (a GET: no body).
                let Some(buf) = read_head(&mut s).await else { return };
                let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                let allowed = key.is_none_or(|k| head.contains(&format!("authorization: bearer {k}")));
                let (status, body) = if allowed { ("200 OK", body) } else { ("401 Unauthorized", "{}") };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_from_every_ready_replica_each_once() {
    let a =
        json_backend(r#"{"object":"list","data":[{"id":"SmolLM2-135M-Instruct","owned_by":"llamacpp"}]}"#, None).await;
    // A replica that checks keys itself gets the client's.
    let b = json_backend(
        r#"{"object":"list","data":[{"id":"SmolLM2-135M-Instruct"},{"id":"SmolLM2-360M-Instruct"}]}"#,
        Some("replica-key"),
    )
    .await;
    // A replica that is down is left out.
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[a, b, closed_port().await]).await;
    let req = Request::builder()
        .uri(format!("{}/v1/models", h.url))
        .header("authorization", "Bearer replica-key")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let s = resp.status();
    let text = String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    assert_eq!(s, StatusCode::OK, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!((v["object"].as_str(), ids), (Some("list"), vec!["SmolLM2-135M-Instruct", "SmolLM2-360M-Instruct"]));
    assert_eq!(v["data"][0]["owned_by"], "llamacpp", "the first replica's entry: {text}");
    h.daemon.shutdown().await;

    // No replica at all: the client reads why.
    let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[]).await;
    let (s, text) = get(&client(), &format!("{}/v1/models", h.url)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(text.contains("no replica is ready to list its models"), "{text}");
    h.daemon.shutdown().await;
}

/// A replica behind a cut link, as the router sees it: connections open
/// (the kernel's), requests written, and no byte ever comes back, to
/// health checks neither.
async fn silent_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            open.push(s);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_a_replica_that_no_longer_answers_anything_goes_to_another_once_it_is_lost() {
    let silent = silent_backend().await;
    let a = backend(Mode::Normal).await;
    let mut cfg = endpoint_config(4, 4, Duration::from_secs(5));
    cfg.proxy.request_timeout = Duration::from_secs(20);
    cfg.health = Some(onepool_router::settings::HealthCheck {
        path: "/health".into(),
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(200),
    });
    // Both in rotation at first: the request goes to the silent one (ties
    // go to the first).
    let h = Harness::new(cfg, &[silent, a.addr]).await;
    let c = client();
    let t0 = std::time::Instant::now();
    let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
    let took = t0.elapsed();
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()), "answered by the replica that still answers");
    // Three checks in a row (unhealthy_after) of at most 300 ms each, not
    // request_timeout.
    assert!(took < Duration::from_secs(5), "the request waited {took:?} for a replica that cannot answer");
    let text = h.daemon.metrics.encode();
    assert!(
        text.lines().any(|l| l.starts_with("onepool_router_retries_total{")
            && l.contains("reason=\"replica_lost\"")
            && l.ends_with(" 1")),
        "{text}"
    );
    h.daemon.shutdown().await;
}

/// A launcher whose drain is over before the router saw it draining (an
/// idle replica reclaimed gracefully ends at once) closes its connections
/// and its port while requests keep coming. None of them may fail: each
/// the launcher never read is sent to the other replica. Many rounds, as
/// the race is a matter of microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_the_end_of_a_launcher_s_drain_are_all_answered() {
    use onepool_launcher::access::Access;
    use onepool_launcher::launcher::{serve_front, Front, FrontBounds, FrontConfig};
    let (server, served_by_launcher) = counting_backend(false).await;
    let (other, _) = counting_backend(false).await;
    let c = client();
    let mut failed = Vec::new();
    let mut raced = 0;
    for round in 0..30 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = listener.local_addr().unwrap();
        let state = Arc::new(Front::default());
        let cfg = Arc::new(FrontConfig {
            backend: server,
            access: Access::open(),
            backend_auth: None,
            bounds: FrontBounds::default(),
            tls: None,
        });
        let front = tokio::spawn(serve_front(listener, cfg, state.clone()));
        let h = Harness::new(endpoint_config(4, 4, Duration::from_secs(5)), &[front_addr, other]).await;
        // The router holds a kept-alive connection to the launcher.
        let before = served_by_launcher.load(Ordering::SeqCst);
        while served_by_launcher.load(Ordering::SeqCst) == before {
            assert_eq!(send(&c, "POST", &format!("{}/ok", h.url)).await.0, StatusCode::OK);
        }
        let drain = {
            let state = state.clone();
            tokio::spawn(async move {
                state.start_draining();
                let _ = state.wait_idle(Duration::from_secs(5)).await;
                state.close_connections(Duration::from_secs(2)).await;
                // The launcher process ends a moment later.
                tokio::time::sleep(Duration::from_millis(5)).await;
                front.abort();
            })
        };
        for n in 0..20 {
            let (s, _, body) = send(&c, "POST", &format!("{}/ok", h.url)).await;
            if s != StatusCode::OK {
                failed.push((round, n, s, body));
            }
        }
        drain.await.unwrap();
        if state.turned_away.load(Ordering::SeqCst) == 0 {
            raced += 1;
        }
        h.daemon.shutdown().await;
    }
    eprintln!("{raced} of 30 drains ended before the router was told");
    assert!(failed.is_empty(), "{} requests failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
}
