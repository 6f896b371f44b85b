//! Agents and evaluation as they really call (issue #51 item 1): streams
//! with tools, reasoning kept apart, a JSON schema, several choices or
//! the client's own log-probabilities are followed and, cut anywhere,
//! read by their client as the uninterrupted answer. Plain text before a
//! tool call is continued through the engine's own chat (a prefill);
//! anything a prefill cannot continue (a tool call begun, reasoning, a
//! grammar, several choices) is generated again from its start with the
//! seed the router gave the first attempt, and what the client has is
//! checked and left out. An answer that comes out otherwise ends with the
//! error event, never spliced. Whole answers go whole to another replica.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::engine::{engine_sampling, Cut, Engine, Received, REASONING, TOOL_AFTER};
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use onepool_router::resume::{Method, ResumeSettings};
use serde_json::{json, Value};

/// What a client reads of an answer, per choice: its reasoning, its text,
/// its tool calls assembled by index (ids left out: an engine makes a new
/// one each time), the token ids of its log-probabilities; and how many
/// roles, finish reasons, usages, tool call ids and ends it got.
#[derive(Debug, Default, PartialEq)]
struct Read {
    reasoning: Vec<String>,
    text: Vec<String>,
    tool_calls: Vec<Value>,
    tool_ids: usize,
    logprob_ids: Vec<u64>,
    roles: usize,
    finish: Vec<String>,
    usages: Vec<Value>,
    done: usize,
    error: Option<String>,
}

fn grow(v: &mut Vec<String>, i: usize) -> &mut String {
    if v.len() <= i {
        v.resize(i + 1, String::new());
    }
    &mut v[i]
}

fn read(raw: &str) -> Read {
    let mut r = Read::default();
    for event in raw.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if event == "[DONE]" {
            r.done += 1;
            continue;
        }
        let v: Value = serde_json::from_str(event).unwrap_or_else(|e| panic!("{e}: {event}"));
        if let Some(code) = v["error"]["code"].as_str() {
            r.error = Some(code.to_string());
            continue;
        }
        if !v["usage"].is_null() {
            r.usages.push(v["usage"].clone());
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            let d = &c["delta"];
            r.roles += usize::from(d.get("role").is_some());
            grow(&mut r.reasoning, i).push_str(d["reasoning_content"].as_str().unwrap_or_default());
            grow(&mut r.text, i).push_str(d["content"].as_str().unwrap_or_default());
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let j = tc["index"].as_u64().unwrap() as usize;
                if r.tool_calls.len() <= j {
                    r.tool_calls.push(json!({"type": null, "function": {"name": null, "arguments": ""}}));
                }
                let call = &mut r.tool_calls[j];
                r.tool_ids += usize::from(tc.get("id").is_some());
                if let Some(x) = tc.get("type") {
                    call["type"] = x.clone();
                }
                if let Some(name) = tc["function"].get("name") {
                    call["function"]["name"] = name.clone();
                }
                let more = tc["function"]["arguments"].as_str().unwrap_or_default();
                let args = call["function"]["arguments"].as_str().unwrap().to_string() + more;
                call["function"]["arguments"] = json!(args);
            }
            for t in c["logprobs"]["content"].as_array().into_iter().flatten() {
                r.logprob_ids.push(t["id"].as_u64().unwrap());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                r.finish.push(format!("{i}:{f}"));
            }
        }
    }
    r
}

/// A router in front of two sampling engines (salts `salts`), the first
/// cut as `cut` (its first answer only), continuing by tokens
/// (llama-server's method: the shapes here go another way whatever it is).
async fn router(cut: Cut, salts: [u64; 2]) -> (Harness, Engine, Engine) {
    router_seeding(cut, salts, true).await
}

/// [`router`], `[endpoint.resume] seed` as given.
async fn router_seeding(cut: Cut, salts: [u64; 2], seed: bool) -> (Harness, Engine, Engine) {
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(5));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Tokens, max_moves: 3, seed });
    let first = engine_sampling(cut, Duration::from_millis(5), Some(salts[0])).await;
    let second = engine_sampling(Cut::Never, Duration::from_millis(2), Some(salts[1])).await;
    let h = Harness::new(cfg, &[first.addr, second.addr]).await;
    (h, first, second)
}

async fn post(h: &Harness, body: &Value) -> (u16, String) {
    let req =
        Request::post(format!("{}/v1/chat/completions", h.url)).body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The request shapes of agents and evaluation, and how many pieces
/// (tokens, tool call parts) their streamed answer has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// Text, then a tool call.
    Tools,
    /// Reasoning, text, then a tool call.
    ReasoningTools,
    /// A JSON schema (a grammar in the engine).
    JsonSchema,
    /// Reasoning, then a JSON schema's answer.
    ReasoningJson,
    /// Two choices.
    Choices,
}

const SHAPES: [Shape; 5] =
    [Shape::Tools, Shape::ReasoningTools, Shape::JsonSchema, Shape::ReasoningJson, Shape::Choices];

impl Shape {
    fn body(self, stream: bool, logprobs: bool, seed: Option<u64>) -> Value {
        let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "max_tokens": 14, "temperature": 0.7, "stream": stream});
        if matches!(self, Shape::Tools | Shape::ReasoningTools) {
            b["max_tokens"] = json!(30);
            b["tool_choice"] = json!("auto");
            b["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        }
        if matches!(self, Shape::ReasoningTools | Shape::ReasoningJson) {
            b["chat_template_kwargs"] = json!({"enable_thinking": true});
        }
        if matches!(self, Shape::JsonSchema | Shape::ReasoningJson) {
            b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "weather",
                "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        }
        if self == Shape::Choices {
            b["n"] = json!(2);
            b["max_tokens"] = json!(6);
        }
        if stream {
            b["stream_options"] = json!({"include_usage": true});
        }
        if logprobs {
            b["logprobs"] = json!(true);
            b["top_logprobs"] = json!(1);
        }
        if let Some(s) = seed {
            b["seed"] = json!(s);
        }
        b
    }

    /// Pieces of the streamed answer: cut points.
    fn pieces(self) -> u32 {
        match self {
            Shape::Tools => TOOL_AFTER as u32 + 3,
            Shape::ReasoningTools => (REASONING + TOOL_AFTER) as u32 + 3,
            Shape::JsonSchema | Shape::ReasoningJson => 14,
            Shape::Choices => 6,
        }
    }
}

/// The seeds of the generation requests an engine received.
fn seeds(received: &Received) -> Vec<Option<u64>> {
    let got = received.lock().unwrap();
    got.iter()
        .filter(|(path, _)| path == "/v1/chat/completions")
        .map(|(_, b)| serde_json::from_slice::<Value>(b).unwrap()["seed"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_agents_and_evaluation_stream_reads_as_uninterrupted_wherever_it_was_cut() {
    for shape in SHAPES {
        for logprobs in [false, true] {
            if logprobs && shape == Shape::Choices {
                continue;
            }
            let body = shape.body(true, logprobs, Some(11));
            let (whole, ..) = router(Cut::Never, [42, 42]).await;
            let (status, raw) = post(&whole, &body).await;
            assert_eq!(status, 200);
            let want = read(&raw);
            assert_eq!((want.done, want.usages.len(), want.error.as_deref()), (1, 1, None), "{shape:?}: {raw}");
            let choices = if shape == Shape::Choices { 2 } else { 1 };
            assert_eq!((want.roles, want.finish.len()), (choices, choices), "{shape:?}");
            for k in 0..shape.pieces() {
                let (h, ..) = router(Cut::Close(k), [42, 42]).await;
                let (status, raw) = post(&h, &body).await;
                assert_eq!(status, 200, "{shape:?} cut at {k}");
                let got = read(&raw);
                assert_eq!(got, want, "{shape:?} (logprobs {logprobs}) cut at {k}: {raw}");
                h.daemon.shutdown().await;
            }
            whole.daemon.shutdown().await;
        }
    }
}

/// Without a seed of the client's, the router gives the first attempt one
/// (every stream its own), and an answer generated again gets the same: on
/// an engine whose every token depends on the seed, a tool call cut
/// half-way comes back whole and of a piece with the text before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_generated_again_gets_its_first_attempt_s_seed() {
    let body = Shape::ReasoningTools.body(true, false, None);
    let cut = (REASONING + TOOL_AFTER) as u32 + 2;
    let (h, first, second) = router(Cut::Close(cut), [42, 42]).await;
    let (status, raw) = post(&h, &body).await;
    assert_eq!(status, 200);
    let got = read(&raw);
    assert_eq!((got.done, got.error.as_deref(), got.tool_ids), (1, None, 1), "{raw}");
    let (s1, s2) = (seeds(&first.received), seeds(&second.received));
    assert_eq!((s1.len(), s2.len()), (1, 1));
    assert!(s1[0].is_some() && s1 == s2, "{s1:?} {s2:?}");
    // The flavor the seed gave every piece is one.
    let flavor = got.text[0].split_whitespace().next().unwrap().trim_start_matches("w0").to_string();
    assert!(flavor.starts_with('~'), "{}", got.text[0]);
    assert!(got.reasoning[0].split_whitespace().all(|t| t.ends_with(&flavor)), "{got:?}");
    let args = got.tool_calls[0]["function"]["arguments"].as_str().unwrap();
    assert_eq!(args, format!("{{\"city\":\"Paris{flavor}\"}}"));
    assert_eq!(got.finish, ["0:tool_calls"]);
    assert_eq!(h.metric("onepool_router_streams_moved_total", "failed"), 1);
    // With resume.seed = false the engine picks a seed each time: the
    // answer generated again is another, which is said.
    let (unseeded, first, _) = router_seeding(Cut::Close(cut), [42, 42], false).await;
    let (status, raw) = post(&unseeded, &body).await;
    assert_eq!((status, read(&raw).error.as_deref()), (200, Some("stream_not_continued")), "{raw}");
    assert_eq!(seeds(&first.received), [None]);
    unseeded.daemon.shutdown().await;
    // Two streams, two seeds.
    let (h2, first, second) = router(Cut::Never, [42, 42]).await;
    for _ in 0..2 {
        assert_eq!(post(&h2, &body).await.0, 200);
    }
    let s = [seeds(&first.received), seeds(&second.received)].concat();
    assert!(s.len() == 2 && s[0] != s[1], "{s:?}");
    h.daemon.shutdown().await;
    h2.daemon.shutdown().await;
}

/// A replica whose answer for the same request and seed is another (its
/// engine, build or hardware differ) gives no splice: the client gets what
/// it had, then the error event, and the divergence is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_comes_out_otherwise_on_another_replica_ends_with_the_error_event() {
    for shape in [Shape::ReasoningTools, Shape::JsonSchema, Shape::Choices] {
        let (h, ..) = router(Cut::Close(4), [42, 7]).await;
        let (status, raw) = post(&h, &shape.body(true, false, None)).await;
        assert_eq!(status, 200);
        let got = read(&raw);
        assert_eq!((got.error.as_deref(), got.done), (Some("stream_not_continued"), 0), "{shape:?}: {raw}");
        assert!(raw.contains("came out otherwise"), "{raw}");
        assert_eq!(h.metric("onepool_router_stream_moves_failed_total", "diverged"), 1);
        h.daemon.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_s_whole_answer_is_the_uninterrupted_one_wherever_it_was_cut() {
    for shape in SHAPES {
        let body = shape.body(false, false, Some(3));
        let (h, ..) = router(Cut::Never, [42, 42]).await;
        let (status, raw) = post(&h, &body).await;
        assert_eq!(status, 200);
        let want: Value = serde_json::from_str(&raw).unwrap();
        h.daemon.shutdown().await;
        for cut in [Cut::CloseBeforeHead(100), Cut::Close(0)] {
            let (h, first, second) = router(cut, [42, 42]).await;
            let (status, raw) = post(&h, &body).await;
            assert_eq!(status, 200, "{shape:?} {cut:?}");
            let got: Value = serde_json::from_str(&raw).unwrap();
            let ids = |v: &Value| {
                let mut v = v.clone();
                for c in v.as_array_mut().unwrap() {
                    if let Some(calls) = c["message"]["tool_calls"].as_array_mut() {
                        calls.iter_mut().for_each(|t| t["id"] = json!("-"));
                    }
                }
                v
            };
            assert_eq!(ids(&got["choices"]), ids(&want["choices"]), "{shape:?} {cut:?}");
            assert_eq!(got["usage"], want["usage"], "{shape:?} {cut:?}");
            let generations = |e: &Engine| e.generations.load(Ordering::SeqCst);
            assert_eq!((generations(&first), generations(&second)), (1, 1), "{shape:?} {cut:?}");
            h.daemon.shutdown().await;
        }
    }
}
