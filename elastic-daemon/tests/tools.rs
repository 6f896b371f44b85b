//! Agents and evaluation as they really call (issue #51 item 1): a stream
//! with tools or the client's own log-probabilities is followed and, cut,
//! continued through the engine's own chat, so that a tool call that
//! begins after the junction comes as the engine parses it and the
//! log-probabilities keep their form. Cut at every point, each answer is
//! read by its client as the uninterrupted one, except inside a tool call
//! the first replica had begun: that one ends with the error event. Whole
//! answers go whole to another replica, whatever the cut.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::engine::{engine, engine_paced, tool_call, Cut, TOOL_AFTER};
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use onepool_router::resume::{Method, ResumeSettings};
use serde_json::{json, Value};

/// What a client reads of an answer: its text, its tool calls assembled
/// by index, the token ids of its log-probabilities, and how many roles,
/// finish reasons, usages and ends it got (each once in a whole answer).
#[derive(Debug, Default, PartialEq)]
struct Read {
    text: String,
    tool_calls: Vec<Value>,
    logprob_ids: Vec<u64>,
    roles: usize,
    finish: Vec<String>,
    usages: Vec<Value>,
    done: usize,
    error: Option<String>,
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
        let Some(c) = v["choices"].get(0) else { continue };
        let d = &c["delta"];
        r.roles += usize::from(d.get("role").is_some());
        r.text.push_str(d["content"].as_str().unwrap_or_default());
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if r.tool_calls.len() <= i {
                r.tool_calls.push(json!({"id": null, "type": null, "function": {"name": null, "arguments": ""}}));
            }
            let call = &mut r.tool_calls[i];
            for k in ["id", "type"] {
                if let Some(x) = tc.get(k) {
                    call[k] = x.clone();
                }
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
            r.finish.push(f.to_string());
        }
    }
    r
}

/// A router in front of two engines, the first cut as `cut` (its first
/// answer only), continuing by tokens (llama-server's method: tools and
/// log-probabilities go by the engine's own chat whatever it is).
async fn router(cut: Cut) -> Harness {
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(5));
    cfg.proxy.resume = Some(ResumeSettings { method: Method::Tokens, max_moves: 3 });
    let first = engine_paced(cut, Duration::from_millis(5)).await;
    let second = engine(Cut::Never).await;
    Harness::new(cfg, &[first.addr, second.addr]).await
}

async fn post(h: &Harness, body: &Value) -> (u16, String) {
    let req =
        Request::post(format!("{}/v1/chat/completions", h.url)).body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn agents_call(stream: bool, logprobs: bool) -> Value {
    let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 30, "temperature": 0, "stream": stream, "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]});
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if logprobs {
        b["logprobs"] = json!(true);
        b["top_logprobs"] = json!(1);
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_tool_call_is_read_as_uninterrupted_wherever_its_answer_was_cut_before_it() {
    for logprobs in [false, true] {
        let body = agents_call(true, logprobs);
        let whole = router(Cut::Never).await;
        let (status, raw) = post(&whole, &body).await;
        assert_eq!(status, 200);
        let want = read(&raw);
        assert_eq!(want.tool_calls, [tool_call()]);
        assert_eq!(
            (want.roles, want.finish.as_slice(), want.usages.len(), want.done),
            (1, &["tool_calls".to_string()][..], 1, 1)
        );
        assert_eq!(want.logprob_ids.len(), if logprobs { TOOL_AFTER as usize } else { 0 });
        // Cut before every token of the text and before the tool call.
        for k in 0..=TOOL_AFTER as u32 {
            let h = router(Cut::Close(k)).await;
            let (status, raw) = post(&h, &body).await;
            assert_eq!(status, 200, "cut at {k}");
            let got = read(&raw);
            assert_eq!(got, want, "cut at {k} (logprobs {logprobs})");
        }
        // Inside the tool call the first replica began: not continued, and
        // said (no [DONE]).
        for k in [TOOL_AFTER as u32 + 1, TOOL_AFTER as u32 + 2] {
            let h = router(Cut::Close(k)).await;
            let (_, raw) = post(&h, &body).await;
            let got = read(&raw);
            assert_eq!((got.error.as_deref(), got.done), (Some("replica_failed"), 0), "cut at {k}: {got:?} {raw}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_with_tools_is_the_uninterrupted_one_wherever_it_was_cut() {
    let body = agents_call(false, false);
    let (status, raw) = post(&router(Cut::Never).await, &body).await;
    assert_eq!(status, 200);
    let want: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(want["choices"][0]["message"]["tool_calls"], json!([tool_call()]));
    for cut in [Cut::CloseBeforeHead(100), Cut::Close(0)] {
        let (status, raw) = post(&router(cut).await, &body).await;
        assert_eq!(status, 200, "{cut:?}");
        let got: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(got["choices"], want["choices"], "{cut:?}");
        assert_eq!(got["usage"], want["usage"], "{cut:?}");
    }
}
