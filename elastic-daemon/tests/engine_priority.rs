//! The engine's own priority (issue #51 item 3): each generation request
//! of an endpoint that tells its engine carries its class's value as
//! `priority`, whatever the client sent, and so does an answer continued
//! on another replica. Neither SGLang nor vLLM runs on these machines: the
//! engine here is the tests' stand-in, which records what it is sent.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::engine::{engine, engine_paced, Cut, Received};
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use onepool_router::classes::{Rank, RequestClasses};
use onepool_router::engine_priority::{Engine, EnginePriority};
use onepool_router::resume::{Method, ResumeSettings};
use onepool_router::settings::BearerTokens;

const LIVE_KEY: &str = "live-key-0123456789abcdef";
const AGENTS_KEY: &str = "agents-key-0123456789abcdef";

/// A chat with `key`, streamed or whole, with the client's own `priority`
/// (an agent trying to raise itself); read to its end.
async fn chat(url: &str, key: &str, stream: bool, own: Option<i64>) -> (u16, Bytes) {
    let mut body = serde_json::json!({"model": "fake", "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 30, "stream": stream});
    if let Some(p) = own {
        body["priority"] = p.into();
    }
    let req = Request::post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// The `priority` of each generation request an engine received, as a
/// JSON parser reads it, and how many members of that name its body had.
fn priorities(r: &Received) -> Vec<(serde_json::Value, usize)> {
    let got = r.lock().unwrap();
    got.iter()
        .filter(|(path, _)| path == "/v1/chat/completions")
        .map(|(_, b)| {
            let v: serde_json::Value = serde_json::from_slice(b).unwrap();
            let text = String::from_utf8_lossy(b);
            (v["priority"].clone(), text.matches("\"priority\"").count())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_carries_its_class_s_priority_and_a_client_cannot_set_its_own() {
    // The first replica's first stream is cut after 5 tokens (its server
    // killed): its answer continues on the second.
    let first = engine_paced(Cut::Close(5), Duration::from_millis(20)).await;
    let second = engine(Cut::Never).await;
    let mut cfg = endpoint_config(4, 100, Duration::from_secs(10));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Text, max_moves: 3, seed: true });
    cfg.proxy.auth = Some(BearerTokens::with_classes([
        (LIVE_KEY.to_string(), None),
        (AGENTS_KEY.to_string(), Some("agents".to_string())),
    ]));
    let ranks = [("inference", 2), ("agents", 3)];
    let classes = RequestClasses::new("inference", ranks.map(|(n, r)| (n.to_string(), r))).unwrap();
    // SGLang's scale: higher first.
    let p = EnginePriority::new(Engine::HigherFirst, &[Rank(2), Rank(3)], &[]);
    cfg.proxy.classes = Some(Arc::new(classes.with_engine_priority(p)));
    let h = Harness::new(cfg, &[first.addr]).await;

    // The cut stream, an agent's, with its own priority of 1000, on the
    // first replica; the second joins before the cut.
    let url = h.url.clone();
    let cut = tokio::spawn(async move { chat(&url, AGENTS_KEY, true, Some(1000)).await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    h.daemon.endpoint("chat").unwrap().endpoint.add(second.addr, None, true).unwrap();
    let (status, body) = cut.await.unwrap();
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.ends_with("data: [DONE]\n\n"), "the moved stream ends whole: {text}");
    for (key, stream, own) in [(LIVE_KEY, false, None), (LIVE_KEY, true, Some(-7)), (AGENTS_KEY, false, None)] {
        let (status, _) = chat(&h.url, key, stream, own).await;
        assert_eq!(status, 200);
    }
    let (a, b) = (priorities(&first.received), priorities(&second.received));
    eprintln!("first replica got {a:?}; second {b:?}");
    let all: Vec<(serde_json::Value, usize)> = a.into_iter().chain(b).collect();
    // The agent's stream, its continuation, then live, live, agents (each
    // request to the replica with fewer in flight, so on either).
    let mut values: Vec<i64> = all.iter().map(|(v, _)| v.as_i64().unwrap()).collect();
    values.sort_unstable();
    assert_eq!(values, [0, 0, 0, 1, 1], "agents 0 (three requests, one moved), live 1 (two): {all:?}");
    assert!(all.iter().all(|(_, n)| *n == 1), "the client's own priority is gone, ours alone: {all:?}");
}
