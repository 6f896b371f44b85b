//! One prioritized pool down to the request (issue #44): live requests
//! (the endpoint's own class) beside an agents' flood (a key of the agents
//! class) on one replica, against the in-process engine. With classes, live
//! requests go first in the queue and agents' streams yield their slots to
//! them, continuing later; without, live requests wait behind the flood.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::engine::{engine_paced, Cut};
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use onepool_router::classes::{Rank, RequestClasses};
use onepool_router::headroom::Headroom;
use onepool_router::resume::{Method, ResumeSettings};
use onepool_router::settings::BearerTokens;

const LIVE_KEY: &str = "live-key-0123456789abcdef";
const AGENTS_KEY: &str = "agents-key-0123456789abcdef";
/// One replica of 4 slots; answers of 26 tokens (whole characters: see
/// the engine), a token every 20 ms:
/// 0.5 s each, 8 answers a second at most.
const SLOTS: u32 = 4;
const TOKENS: u64 = 26;
const PACE: Duration = Duration::from_millis(20);
/// Live requests at half the replica's capacity.
const LIVE_EVERY: Duration = Duration::from_millis(250);
const LIVE_FOR: Duration = Duration::from_secs(6);
/// The agents' flood: ten times the slots, back to back.
const AGENTS: usize = 40;

async fn router(classes: bool) -> Harness {
    let e = engine_paced(Cut::Never, PACE).await;
    let mut cfg = endpoint_config(SLOTS, 1000, Duration::from_secs(60));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Text, max_moves: 3, seed: true });
    cfg.proxy.request_timeout = Duration::from_secs(60);
    let agents_class = classes.then(|| "agents".to_string());
    cfg.proxy.auth =
        Some(BearerTokens::with_classes([(LIVE_KEY.to_string(), None), (AGENTS_KEY.to_string(), agents_class)]));
    if classes {
        let ranks = [("inference-baseline", 0), ("training", 1), ("inference", 2), ("agents", 3)];
        cfg.proxy.classes = RequestClasses::new("inference", ranks.map(|(n, r)| (n.to_string(), r))).map(Arc::new);
    }
    Harness::new(cfg, &[e.addr]).await
}

/// The endpoint's own class (inference) and the agents' below it: the
/// live key names none, the agents' key its class.
fn with_two_classes(cfg: &mut onepool_elastic_daemon::config::EndpointConfig) {
    cfg.proxy.auth = Some(BearerTokens::with_classes([
        (LIVE_KEY.to_string(), None),
        (AGENTS_KEY.to_string(), Some("agents".to_string())),
    ]));
    let ranks = [("inference", 2), ("agents", 3)];
    cfg.proxy.classes = RequestClasses::new("inference", ranks.map(|(n, r)| (n.to_string(), r))).map(Arc::new);
}

/// What a stream's client saw: its status, the time to its first body
/// byte, and whether it ended whole.
struct Seen {
    status: u16,
    ttfb: Duration,
    whole: bool,
}

/// One streamed chat of `TOKENS` tokens with `key`; `tokens` counts its
/// text events as they arrive while `counting` is set.
async fn stream(url: &str, key: &str, tokens: Option<(&AtomicU64, &AtomicBool)>) -> Seen {
    let t0 = Instant::now();
    let Ok(resp) = client().request(streamed_chat(url, key)).await else {
        return Seen { status: 0, ttfb: t0.elapsed(), whole: false };
    };
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let (mut ttfb, mut raw) = (None, Vec::new());
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else { continue };
        ttfb.get_or_insert_with(|| t0.elapsed());
        if let Some((count, on)) = tokens {
            if on.load(Ordering::Relaxed) {
                let n = data.windows(11).filter(|w| w == b"\"content\":\"").count() as u64;
                count.fetch_add(n, Ordering::Relaxed);
            }
        }
        raw.extend_from_slice(&data);
    }
    // Whole: the engine's answer exactly, then [DONE].
    let raw = String::from_utf8_lossy(&raw);
    let mut text = String::new();
    let mut done = false;
    for event in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        match serde_json::from_str::<serde_json::Value>(event) {
            Ok(v) => text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or_default()),
            Err(_) => done |= event == "[DONE]",
        }
    }
    let whole = done && text == common::engine::answer(0, TOKENS);
    if status == 200 && !whole {
        eprintln!("not whole: {raw}");
    }
    if status != 200 {
        eprintln!("status {status}: {raw}");
    }
    Seen { status, ttfb: ttfb.unwrap_or_else(|| t0.elapsed()), whole }
}

/// Live requests every `LIVE_EVERY` for `LIVE_FOR`, each on its own.
async fn live(url: &str) -> Vec<Seen> {
    live_for(url, LIVE_FOR).await
}

async fn live_for(url: &str, time: Duration) -> Vec<Seen> {
    let mut tasks = Vec::new();
    let start = Instant::now();
    while start.elapsed() < time {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move { stream(&url, LIVE_KEY, None).await }));
        tokio::time::sleep(LIVE_EVERY).await;
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.unwrap());
    }
    seen
}

fn p99(seen: &[Seen]) -> Duration {
    let mut t: Vec<Duration> = seen.iter().map(|s| s.ttfb).collect();
    t.sort();
    t[(t.len() * 99).div_ceil(100).saturating_sub(1)]
}

/// The live requests beside the flood, and the agents' tokens while they ran.
async fn beside_the_flood(url: &str) -> (Vec<Seen>, u64, Duration) {
    let (stop, counting) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (tokens, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let mut flood = Vec::new();
    for _ in 0..AGENTS {
        let (url, stop, counting, tokens, failed) =
            (url.to_string(), stop.clone(), counting.clone(), tokens.clone(), failed.clone());
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let s = stream(&url, AGENTS_KEY, Some((&tokens, &counting))).await;
                if !s.whole {
                    failed.lock().unwrap().push(s.status);
                }
            }
        }));
    }
    // The flood fills the slots and the queue first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    counting.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let seen = live(url).await;
    let window = t0.elapsed();
    counting.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = tokio::time::timeout(Duration::from_secs(60), f).await;
    }
    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "agents' streams that did not end whole (statuses): {failed:?}");
    (seen, tokens.load(Ordering::Relaxed), window)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_requests_wait_for_nothing_agents_hold_and_agents_get_what_live_leaves() {
    let h = router(true).await;
    let alone = live(&h.url).await;
    assert!(alone.iter().all(|s| s.status == 200 && s.whole));
    let (beside, agent_tokens, window) = beside_the_flood(&h.url).await;
    let (p_alone, p_beside) = (p99(&alone), p99(&beside));
    // What live leaves of the replica's capacity: its slots' tokens a
    // second, less live's (each live answer holds a slot for its tokens).
    let capacity = f64::from(SLOTS) / PACE.as_secs_f64();
    let live_rate = TOKENS as f64 / LIVE_EVERY.as_secs_f64();
    let left = (capacity - live_rate) * window.as_secs_f64();
    let share = agent_tokens as f64 / left;
    let text = h.daemon.metrics.encode();
    let yielded: f64 = text
        .lines()
        .filter(|l| l.starts_with("onepool_router_class_yielded_total{") && l.contains("class=\"agents\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    eprintln!(
        "classes: live p99 time to first byte {p_alone:.3?} alone, {p_beside:.3?} beside {AGENTS} agents; \
         agents got {agent_tokens} tokens, {:.0}% of the {left:.0} live left; {yielded} agents' streams yielded",
        share * 100.0
    );
    let failed: Vec<u16> = beside.iter().filter(|s| !(s.status == 200 && s.whole)).map(|s| s.status).collect();
    assert!(failed.is_empty(), "live requests shed or failed beside the flood: {failed:?}");
    assert!(p_beside <= p_alone + Duration::from_millis(150), "live p99 {p_beside:?} against {p_alone:?} alone");
    assert!(share >= 0.7, "agents served {:.0}% of what live leaves", share * 100.0);
    assert!(yielded >= 1.0, "agents' streams yielded their slots to live requests");
    // What `onepool status` shows: each class, highest first.
    let classes = h.snapshot().classes;
    let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["inference-baseline", "training", "inference", "agents"]);
    assert_eq!(classes[3].yielded as f64, yielded);
    assert!(classes[2].requests >= 2 * (LIVE_FOR.as_millis() / LIVE_EVERY.as_millis()) as u64 - 2);

    // The same flood on one queue: live requests wait behind it.
    let off = router(false).await;
    let (beside_off, _, _) = beside_the_flood(&off.url).await;
    let p_off = p99(&beside_off);
    eprintln!("classes off: live p99 time to first byte {p_off:.3?} beside the same flood");
    assert!(p_off > p_alone + Duration::from_millis(150), "without classes the flood delays live requests");
}

#[tokio::test]
async fn a_lower_class_past_its_bound_is_shed_with_429_and_a_higher_one_is_not() {
    let e = engine_paced(Cut::Never, Duration::from_millis(50)).await;
    let mut cfg = endpoint_config(1, 2, Duration::from_secs(10));
    with_two_classes(&mut cfg);
    let h = Harness::new(cfg, &[e.addr]).await;
    // One slot, held; two agents wait (their class's bound); the next is shed.
    let mut held = Vec::new();
    for _ in 0..3 {
        let url = h.url.clone();
        held.push(tokio::spawn(async move { (stream(&url, AGENTS_KEY, None).await.status, Instant::now()) }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shed = stream(&h.url, AGENTS_KEY, None).await;
    assert_eq!(shed.status, 429);
    // Live requests have a bound of their own: not shed by the agents'.
    let url = h.url.clone();
    let live = tokio::spawn(async move { (stream(&url, LIVE_KEY, None).await, Instant::now()) });
    // A request may lower its class, never raise it.
    let req = |class: &str| {
        Request::post(format!("{}/v1/chat/completions", h.url))
            .header("authorization", format!("Bearer {AGENTS_KEY}"))
            .header("x-request-class", class)
            .body(Full::new(Bytes::from(r#"{"messages":[],"stream":true,"max_tokens":1}"#)))
            .unwrap()
    };
    let raised = client().request(req("inference")).await.unwrap();
    assert_eq!(raised.status(), 400);
    let text = String::from_utf8(raised.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("never raise"), "{text}");
    let (live, live_done) = live.await.unwrap();
    assert_eq!(live.status, 200);
    let mut done = Vec::new();
    for t in held {
        let (status, at) = t.await.unwrap();
        assert_eq!(status, 200);
        done.push(at);
    }
    // The live request came after the waiting agents and went before them.
    assert!(done[0] < live_done && live_done < done[1] && live_done < done[2]);
    let metrics = h.daemon.metrics.encode();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("onepool_router_class_shed_total{") && l.contains("agents") && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// A whole answer (not streamed) of the agents' key on the endpoint's one
/// slot: a live request arriving meanwhile takes the slot at once, and the
/// agents' answer, streamed from the engine by the router, yields, goes on
/// once the live one is done, and reaches its client whole and exact, in
/// the API's shape of a whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_whole_answer_yields_its_slot_and_still_comes_whole() {
    const LONG: u64 = 100;
    let e = engine_paced(Cut::Never, PACE).await;
    let mut cfg = endpoint_config(1, 100, Duration::from_secs(30));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Text, max_moves: 3, seed: true });
    cfg.proxy.request_timeout = Duration::from_secs(60);
    with_two_classes(&mut cfg);
    let h = Harness::new(cfg, &[e.addr]).await;
    let url = h.url.clone();
    let agents = tokio::spawn(async move {
        let (status, kind, bytes) = agents_whole_chat(&url, "fake", LONG).await;
        (status, kind, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
    });
    // The agents' answer holds the slot (100 tokens: 2 s of it).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let live = stream(&h.url, LIVE_KEY, None).await;
    assert!(live.status == 200 && live.whole);
    assert!(live.ttfb < Duration::from_millis(300), "the live request waited {:?} for the agents' slot", live.ttfb);
    let (status, kind, v) = agents.await.unwrap();
    assert_eq!((status, kind.as_deref()), (200, Some("application/json")), "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], common::engine::answer(0, LONG), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], LONG, "{v}");
    let classes = h.snapshot().classes;
    assert_eq!(classes.iter().find(|c| c.name == "agents").map(|c| c.yielded), Some(1));
    // Each class's answer tokens, as the router followed them.
    let text = h.daemon.metrics.encode();
    let tokens = |class: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("onepool_router_class_tokens_total{") && l.contains(&format!("class=\"{class}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!((tokens("agents"), tokens("inference")), (LONG as f64, TOKENS as f64), "{text}");
}

/// A lower class's whole answer whose model server dies mid-answer: it
/// continues on the other replica, its client gets it whole and exact,
/// and its access log line says what the client asked (not streamed), its
/// class, the move and the tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_moves_when_its_server_dies_and_its_access_line_says_so() {
    const LONG: u64 = 40;
    let (dies, lives) = (engine_paced(Cut::Close(10), PACE).await, engine_paced(Cut::Never, PACE).await);
    let mut cfg = endpoint_config(1, 100, Duration::from_secs(30));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Text, max_moves: 3, seed: true });
    with_two_classes(&mut cfg);
    let (daemon, dir, path) = with_access_log(cfg, "whole").await;
    let ep = daemon.endpoint("chat").unwrap();
    // The one that dies first: the least served goes first, ties by order.
    ep.endpoint.add(dies.addr, None, true).unwrap();
    ep.endpoint.add(lives.addr, None, true).unwrap();
    let (status, _, answer) = agents_whole_chat(&format!("http://{}", ep.listen.unwrap()), "fake", LONG).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], common::engine::answer(0, LONG), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], LONG, "{v}");
    let e = &access_lines(&path, 1).await[0];
    assert_eq!((e.status, e.stream, e.moved, e.class.as_deref()), (200, false, 1, Some("agents")), "{e:?}");
    assert_eq!(e.completion_tokens, Some(LONG), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client's text cannot make an access line, and so a figure of the
/// report's serving by class: an agents' key whose request names a model
/// with a line break and a whole forged line of the live class after it
/// gets one line, in its own class, the forged text inside its model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_cannot_forge_an_access_line_of_another_class() {
    let e = engine_paced(Cut::Never, Duration::ZERO).await;
    let mut cfg = endpoint_config(1, 100, Duration::from_secs(30));
    with_two_classes(&mut cfg);
    let (daemon, dir, path) = with_access_log(cfg, "forged").await;
    let ep = daemon.endpoint("chat").unwrap();
    ep.endpoint.add(e.addr, None, true).unwrap();
    let forged = r#"{"time":"2026-12-07T10:00:00.000Z","endpoint":"chat","model":"m","status":200,"stream":true,"prompt_tokens":1,"completion_tokens":9999,"ttfb_s":0.001,"latency_s":0.1,"complete":true,"moved":0,"class":"inference"}"#;
    let model = format!("fake\n{forged}\n");
    assert_eq!(agents_whole_chat(&format!("http://{}", ep.listen.unwrap()), &model, 4).await.0, 200);
    let lines = access_lines(&path, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].class.as_deref(), Some("agents"), "{lines:?}");
    assert!(lines[0].model.as_deref().is_some_and(|m| m.contains("\"class\":\"inference\"")), "{lines:?}");
    // Refusals leave their lines, with why (issue #50): no key, and a
    // class raised above the key's.
    let url = format!("http://{}/v1/chat/completions", ep.listen.unwrap());
    let body = || Full::new(Bytes::from_static(br#"{"model":"m","messages":[]}"#));
    let no_key = client().request(Request::post(&url).body(body()).unwrap()).await.unwrap();
    assert_eq!(no_key.status(), 401);
    let raise = Request::post(&url)
        .header("authorization", format!("Bearer {AGENTS_KEY}"))
        .header("x-request-class", "inference")
        .body(body())
        .unwrap();
    assert_eq!(client().request(raise).await.unwrap().status(), 400);
    let lines = access_lines(&path, 3).await;
    let why: Vec<_> = lines.iter().map(|l| (l.status, l.reason.as_deref())).collect();
    assert_eq!(why, [(200, None), (401, Some("unauthorized")), (400, Some("class_refused"))], "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat of `max_tokens` for `model` with the agents' key at the router
/// `url`, its answer asked for whole: its status, type and body.
async fn agents_whole_chat(url: &str, model: &str, max_tokens: u64) -> (u16, Option<String>, Bytes) {
    let body =
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens});
    let req = Request::post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {AGENTS_KEY}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let kind = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    (status, kind, resp.into_body().collect().await.unwrap().to_bytes())
}

/// onepoold with `cfg` and an access log in a folder of its own.
async fn with_access_log(
    cfg: onepool_elastic_daemon::config::EndpointConfig,
    name: &str,
) -> (onepool_elastic_daemon::daemon::Daemon, std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("onepool-classes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.jsonl");
    let mut config = common::config(cfg, 256 << 20);
    config.access_log = Some(onepool_router::access_log::AccessLogSettings {
        path: path.clone(),
        max_file_bytes: 1 << 20,
        keep_files: 1,
    });
    (onepool_elastic_daemon::daemon::Daemon::start(config).await.unwrap(), dir, path)
}

/// The access log's lines, once it has `n` (5 s at most), each read as
/// the report reads it.
async fn access_lines(path: &std::path::Path, n: usize) -> Vec<onepool_decisions::trace::AccessEntry> {
    let text = || std::fs::read_to_string(path).unwrap_or_default();
    let t0 = Instant::now();
    while text().lines().count() < n && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    text().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Issue #51: an agents key flooding from 50 clients keeps its class's
/// queue (bound 20) full, and a second agents key sending a request every
/// 0.3 s is still admitted and served every time, in turn; the flood's
/// excess gets 429 with a `Retry-After` of the wait its key's turns would
/// take (the queue timeout, 60 s here, only before the class has a pace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flooding_its_class_does_not_shut_another_key_of_the_class_out() {
    const SECOND_KEY: &str = "agents-key-2-0123456789abcdef";
    let e = engine_paced(Cut::Never, PACE).await;
    let mut cfg = endpoint_config(SLOTS, 20, Duration::from_secs(60));
    cfg.proxy.request_timeout = Duration::from_secs(60);
    let agents = || Some("agents".to_string());
    cfg.proxy.auth = Some(BearerTokens::with_classes([
        (LIVE_KEY.to_string(), None),
        (AGENTS_KEY.to_string(), agents()),
        (SECOND_KEY.to_string(), agents()),
    ]));
    let ranks = [("inference", 2), ("agents", 3)];
    cfg.proxy.classes = RequestClasses::new("inference", ranks.map(|(n, r)| (n.to_string(), r))).map(Arc::new);
    let h = Harness::new(cfg, &[e.addr]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let shed = Arc::new(Mutex::new(Vec::new()));
    let flood: Vec<_> = (0..50)
        .map(|_| {
            let (url, stop, shed) = (h.url.clone(), stop.clone(), shed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let (status, retry_after) = status_of(&url, AGENTS_KEY).await;
                    if status == 429 {
                        shed.lock().unwrap().push(retry_after);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut second = Vec::new();
    for _ in 0..10 {
        let url = h.url.clone();
        second.push(tokio::spawn(async move { status_of(&url, SECOND_KEY).await.0 }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut statuses = Vec::new();
    for t in second {
        statuses.push(t.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.await.unwrap();
    }
    let shed = shed.lock().unwrap().clone();
    let last = &shed[shed.len().saturating_sub(8)..];
    eprintln!("second key: {statuses:?}; the flood shed {} times, the last with Retry-After {last:?}", shed.len());
    assert_eq!(statuses, [200; 10], "the second key is served every time");
    assert!(!shed.is_empty(), "the flood was shed");
    // The queue timeout only until the class has been served from its
    // queue twice (no pace yet); from then on, the wait its turns take.
    assert!(shed.iter().all(|s| s.is_some_and(|s| (1..=60).contains(&s))), "{shed:?}");
    assert!(last.iter().all(|s| s.is_some_and(|s| s < 60)), "the expected wait, not the queue timeout: {last:?}");
}

/// A streamed chat of `TOKENS` tokens with `key`, read to its end: its
/// status and `Retry-After`.
async fn status_of(url: &str, key: &str) -> (u16, Option<u64>) {
    let Ok(resp) = client().request(streamed_chat(url, key)).await else { return (0, None) };
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    let _ = resp.into_body().collect().await;
    (status, retry_after)
}

/// A streamed chat of `TOKENS` tokens at the router `url`, with `key`.
fn streamed_chat(url: &str, key: &str) -> Request<Full<Bytes>> {
    let body = serde_json::json!({"model": "fake", "messages": [{"role": "user", "content": "go"}],
        "max_tokens": TOKENS, "stream": true});
    Request::post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Agents' requests for structured output (a JSON schema on every call),
/// half streamed, half whole, 2 s each. The router continues such an
/// answer only by generating it again (a grammar would start over at a
/// prefill's junction), so none yields its slot: only headroom keeps a slot
/// free for live requests (issue #51 item 2).
const AGENTS_WITH_SCHEMAS: usize = 24;
const AGENT_TOKENS: u64 = 100;

/// Live p99 first byte alone and beside the agents, and the agents' tokens
/// in the window live ran `live_time` beside them.
async fn agents_with_schemas_beside_live(
    share: Option<f64>,
    live_time: Duration,
) -> (Duration, Duration, u64, Duration) {
    let e = engine_paced(Cut::Never, PACE).await;
    let mut cfg = endpoint_config(SLOTS, 1000, Duration::from_secs(60));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Text, max_moves: 3, seed: true });
    cfg.proxy.request_timeout = Duration::from_secs(60);
    with_two_classes(&mut cfg);
    if let (Some(share), Some(c)) = (share, cfg.proxy.classes.take()) {
        let headroom = Headroom::new([(Rank(3), share)], Duration::from_secs(2));
        cfg.proxy.classes = Some(Arc::new((*c).clone().with_headroom(headroom)));
    }
    let h = Harness::new(cfg, &[e.addr]).await;
    let alone = live_for(&h.url, live_time).await;
    assert!(alone.iter().all(|s| s.status == 200 && s.whole));
    let (stop, counting) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (tokens, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let flood: Vec<_> = (0..AGENTS_WITH_SCHEMAS)
        .map(|i| {
            let (url, stop, counting, tokens, failed) =
                (h.url.clone(), stop.clone(), counting.clone(), tokens.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let (status, text) = agents_call(&url, i % 2 == 0).await;
                    if status != 200 || text != common::engine::json_text(AGENT_TOKENS) {
                        failed.lock().unwrap().push(status);
                    } else if counting.load(Ordering::Relaxed) {
                        tokens.fetch_add(AGENT_TOKENS, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    counting.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let beside = live_for(&h.url, live_time).await;
    let window = t0.elapsed();
    counting.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    // Those still waiting would take many seconds more: the calls that
    // ended are the ones checked.
    for f in flood {
        f.abort();
    }
    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "agents' calls that did not end whole (statuses): {failed:?}");
    let bad: Vec<u16> = beside.iter().filter(|s| !(s.status == 200 && s.whole)).map(|s| s.status).collect();
    assert!(bad.is_empty(), "live requests shed or failed beside the agents: {bad:?}");
    (p99(&alone), p99(&beside), tokens.load(Ordering::Relaxed), window)
}

/// One agents' call with a JSON schema, read to its end: its status and
/// the text of its answer.
async fn agents_call(url: &str, streamed: bool) -> (u16, String) {
    let body = serde_json::json!({"model": "fake", "messages": [{"role": "user", "content": "go"}],
        "max_tokens": AGENT_TOKENS, "stream": streamed,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
            "schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}});
    let req = Request::post(format!("{url}/v1/chat/completions"))
        .header("authorization", format!("Bearer {AGENTS_KEY}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let Ok(resp) = client().request(req).await else { return (0, String::new()) };
    let status = resp.status().as_u16();
    let Ok(raw) = resp.into_body().collect().await.map(|b| b.to_bytes()) else { return (status, String::new()) };
    let raw = String::from_utf8_lossy(&raw);
    if !streamed {
        let v: serde_json::Value = serde_json::from_str(&raw).unwrap_or_default();
        return (status, v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string());
    }
    let mut text = String::new();
    for event in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(event) {
            text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
        }
    }
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_requests_find_headroom_beside_agents_whose_answers_cannot_yield() {
    let (alone, beside, tokens, window) = agents_with_schemas_beside_live(Some(0.25), LIVE_FOR).await;
    // Without: a few live requests show the wait (each waits for the
    // agents' queue, ten seconds and more).
    let (off_alone, off_beside, off_tokens, off_window) =
        agents_with_schemas_beside_live(None, Duration::from_secs(1)).await;
    let rate = |t: u64, w: Duration| t as f64 / w.as_secs_f64();
    eprintln!(
        "headroom 0.25: live p99 first byte {alone:.3?} alone, {beside:.3?} beside {AGENTS_WITH_SCHEMAS} agents with schemas \
         (agents {:.0} tokens/s); without: {off_alone:.3?} alone, {off_beside:.3?} beside (agents {:.0} tokens/s)",
        rate(tokens, window),
        rate(off_tokens, off_window)
    );
    assert!(beside <= alone + Duration::from_millis(150), "with headroom: live p99 {beside:?} against {alone:?} alone");
    assert!(off_beside > off_alone + Duration::from_millis(150), "without, live waits for the agents' answers");
    // Live at half the replica peaks at three slots (answers of 0.52 s
    // every 0.25 s): the agents keep their one slot of four busy while
    // live has requests.
    let one_slot = 1.0 / PACE.as_secs_f64();
    assert!(rate(tokens, window) >= 0.8 * one_slot, "agents served {:.0} tokens/s", rate(tokens, window));
}
