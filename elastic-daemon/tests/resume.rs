//! Answers that outlive their replica (issue #43), against an in-process
//! engine that speaks llama-server's forms (OpenAI streams with token ids
//! in their log-probabilities, `/apply-template`, `/tokenize`, the native
//! `/completion`) and an OpenAI server's assistant prefill, whose answer is
//! the same whatever replica generates it (as llama-server's at
//! temperature 0): a continued answer must equal the uninterrupted one,
//! byte for byte.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::engine::{answer, engine, templated, tokenize, Cut, Engine};
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use onepool_router::resume::{Method, ResumeSettings};
use serde_json::{json, Value};

struct Setup {
    harness: Harness,
    engines: Vec<Engine>,
}

/// A router with resumption by `method` in front of the first engine; the
/// others join once the first stream has begun on it.
async fn setup(method: Method, max_moves: u32, cuts: &[Cut]) -> Setup {
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(2));
    cfg.proxy.resume = Some(ResumeSettings { method, max_moves, seed: true });
    cfg.proxy.response_idle_timeout = Duration::from_millis(400);
    let mut engines = Vec::new();
    for c in cuts {
        engines.push(engine(*c).await);
    }
    let harness = Harness::new(cfg, &[engines[0].addr]).await;
    Setup { harness, engines }
}

impl Setup {
    fn join_the_others(&self) {
        let ep = self.harness.daemon.endpoint("chat").unwrap();
        for e in &self.engines[1..] {
            ep.endpoint.add(e.addr, None, true).unwrap();
        }
    }

    /// Sends `body` to `path` and reads the whole stream, the other
    /// engines joining after its head.
    async fn stream(&self, path: &str, body: Value) -> Streamed {
        let client = client();
        let req = Request::post(format!("{}{path}", self.harness.url))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let status = resp.status().as_u16();
        self.join_the_others();
        let raw = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        Streamed::read(status, &raw)
    }
}

#[derive(Debug)]
struct Streamed {
    status: u16,
    text: String,
    events: Vec<Value>,
    done: usize,
    raw: String,
}

impl Streamed {
    fn read(status: u16, raw: &[u8]) -> Streamed {
        let raw = String::from_utf8(raw.to_vec()).expect("the client got valid UTF-8");
        let mut events = Vec::new();
        let mut done = 0;
        for e in raw.split("\n\n").filter(|e| !e.is_empty()) {
            let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an event: {e:?}"));
            if data == "[DONE]" {
                done += 1;
                continue;
            }
            events.push(serde_json::from_str::<Value>(data).unwrap_or_else(|_| json!({"unreadable": data})));
        }
        let text = events
            .iter()
            .filter_map(|e| {
                let c = &e["choices"][0];
                c["delta"]["content"].as_str().or(c["text"].as_str()).map(str::to_string)
            })
            .collect();
        Streamed { status, text, events, done, raw }
    }

    fn finish_reasons(&self) -> Vec<String> {
        self.events.iter().filter_map(|e| e["choices"][0]["finish_reason"].as_str().map(str::to_string)).collect()
    }

    fn usage(&self) -> Option<(u64, u64)> {
        let u = self.events.iter().rev().find(|e| e.get("usage").is_some_and(|u| !u.is_null()))?;
        Some((u["usage"]["prompt_tokens"].as_u64()?, u["usage"]["completion_tokens"].as_u64()?))
    }

    fn errors(&self) -> Vec<&Value> {
        self.events.iter().filter(|e| e.get("error").is_some()).collect()
    }

    /// One answer: no error, one finish, one `[DONE]`, one id.
    fn assert_whole(&self, expected_text: &str, reason: &str) {
        assert_eq!(self.status, 200);
        assert!(self.errors().is_empty(), "an error reached the client: {}", self.raw);
        assert_eq!(self.text, expected_text, "the answer differs from the uninterrupted one");
        assert_eq!(self.finish_reasons(), [reason], "{}", self.raw);
        assert_eq!(self.done, 1, "{}", self.raw);
        let ids: std::collections::BTreeSet<_> = self.events.iter().filter_map(|e| e["id"].as_str()).collect();
        assert_eq!(ids.len(), 1, "one answer, one id: {ids:?}");
        assert!(!self.raw.contains("\"logprobs\":{"), "the ids the router asked for reached the client: {}", self.raw);
    }
}

fn chat(max_tokens: u64, usage: bool) -> Value {
    json!({"model": "fake", "messages": [{"role": "user", "content": "Tell me a story"}], "stream": true,
           "max_tokens": max_tokens, "temperature": 0, "stream_options": {"include_usage": usage}})
}

fn prompt_len() -> u64 {
    tokenize(&templated(&json!([{"role": "user", "content": "Tell me a story"}]))).len() as u64
}

#[tokio::test]
async fn a_reclaimed_stream_continues_on_another_replica_by_its_token_ids_exactly() {
    // Cut after token 11: the 10th and 11th make one character.
    for at in [1, 4, 11, 12, 25] {
        let s = setup(Method::Tokens, 3, &[Cut::Reclaim(at), Cut::Never]).await;
        let got = s.stream("/v1/chat/completions", chat(40, true)).await;
        got.assert_whole(&answer(0, 40), "length");
        assert_eq!(got.usage(), Some((prompt_len(), 40)), "cut at {at}: {}", got.raw);
        assert_eq!(
            (s.engines[0].generations.load(Ordering::SeqCst), s.engines[1].generations.load(Ordering::SeqCst)),
            (1, 1)
        );
        assert_eq!(s.harness.metric("onepool_router_streams_moved_total", "reclaimed"), 1);
    }
}

#[tokio::test]
async fn a_killed_or_silent_server_s_stream_continues_and_the_budget_holds_across_the_junction() {
    for (cut, why) in [(Cut::Close(9), ["failed", "ended_early"]), (Cut::Silent(9), ["silent", "silent"])] {
        let s = setup(Method::Tokens, 3, &[cut, Cut::Never]).await;
        let got = s.stream("/v1/chat/completions", chat(30, false)).await;
        got.assert_whole(&answer(0, 30), "length");
        assert_eq!(got.usage(), None, "usage only when asked");
        let moved: u64 = why
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .iter()
            .map(|r| s.harness.metric("onepool_router_streams_moved_total", r))
            .sum();
        assert_eq!(moved, 1, "{cut:?}");
    }
}

#[tokio::test]
async fn by_text_the_answer_continues_as_the_assistant_s_message() {
    let s = setup(Method::Text, 3, &[Cut::Reclaim(13), Cut::Never]).await;
    let got = s.stream("/v1/chat/completions", chat(40, true)).await;
    got.assert_whole(&answer(0, 40), "length");
    assert_eq!(got.usage(), Some((prompt_len(), 40)));
}

#[tokio::test]
async fn a_completion_continues_too() {
    let s = setup(Method::Tokens, 3, &[Cut::Reclaim(6), Cut::Never]).await;
    let body =
        json!({"prompt": "Once upon", "stream": true, "max_tokens": 20, "stream_options": {"include_usage": true}});
    let got = s.stream("/v1/completions", body).await;
    got.assert_whole(&answer(0, 20), "length");
    assert_eq!(got.usage(), Some((tokenize("Once upon").len() as u64, 20)));
    assert!(got.events.iter().all(|e| e["object"] == "text_completion"));
}

#[tokio::test]
async fn what_cannot_be_continued_ends_as_before_and_moves_are_bounded() {
    // A tool call begun: the answer is generated again, and this engine's
    // second answer has no tool call: it came out otherwise, which is said
    // rather than spliced.
    let s = setup(Method::Tokens, 3, &[Cut::ToolThenReclaim(5), Cut::Never]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.errors().len(), 1, "{}", got.raw);
    assert_eq!(got.errors()[0]["error"]["code"], "stream_not_continued");
    assert!(got.errors()[0]["error"]["message"].as_str().unwrap().contains("came out otherwise"), "{}", got.raw);
    assert_eq!(s.harness.metric("onepool_router_streams_moved_total", "reclaimed"), 1);
    assert_eq!(s.harness.metric("onepool_router_stream_moves_failed_total", "diverged"), 1);
    // Both replicas cut it, and the endpoint allows one move.
    let s = setup(Method::Tokens, 1, &[Cut::Reclaim(5), Cut::Reclaim(5)]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.text, answer(0, 10), "the text up to the second cut, then the error");
    assert_eq!(got.errors().len(), 1, "{}", got.raw);
    assert_eq!(got.errors()[0]["error"]["code"], "stream_not_continued");
    assert_eq!(s.harness.metric("onepool_router_stream_moves_failed_total", "max_moves"), 1);
    // No replica left to continue on: the queue's timeout bounds the wait.
    let s = setup(Method::Tokens, 3, &[Cut::Reclaim(5)]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.errors()[0]["error"]["code"], "stream_not_continued", "{}", got.raw);
    assert_eq!(s.harness.metric("onepool_router_stream_moves_failed_total", "queue_timeout"), 1);
}

#[tokio::test]
async fn a_client_that_hung_up_is_never_resumed() {
    let s = setup(Method::Tokens, 3, &[Cut::Reclaim(20), Cut::Never]).await;
    let client = client();
    let req = Request::post(format!("{}/v1/chat/completions", s.harness.url))
        .body(Full::new(Bytes::from(chat(40, false).to_string())))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    s.join_the_others();
    let _ = resp.body_mut().frame().await;
    drop(resp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.engines[1].generations.load(Ordering::SeqCst), 0);
    assert_eq!(s.harness.metric("onepool_router_streams_moved_total", "reclaimed"), 0);
}
