//! Answers that outlive their replica (issue #43), against an in-process
//! engine that speaks llama-server's forms (OpenAI streams with token ids
//! in their log-probabilities, `/apply-template`, `/tokenize`, the native
//! `/completion`) and an OpenAI server's assistant prefill, whose answer is
//! the same whatever replica generates it (as llama-server's at
//! temperature 0): a continued answer must equal the uninterrupted one,
//! byte for byte.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use onepool_router::resume::{Method, ResumeSettings};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// How an engine ends its first stream.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    Never,
    /// After N tokens: the launcher's reclaim event, then the body's end.
    Reclaim(u32),
    /// After N tokens: the connection dropped (a model server killed).
    Close(u32),
    /// After N tokens: nothing more, the connection left open.
    Silent(u32),
    /// After N tokens: a tool call the router cannot continue, then the
    /// reclaim event.
    ToolThenReclaim(u32),
}

/// The answer's token `i`: its bytes. Every seventh token pair is one
/// two-byte character split across two tokens, as byte-level tokenizers
/// do with accents.
fn token(i: u64) -> Vec<u8> {
    match i % 7 {
        3 => vec![0xC3],
        4 => [&[0xA9][..], format!("x{i} ").as_bytes()].concat(),
        _ => format!("w{i} ").into_bytes(),
    }
}

fn answer_bytes(from: u64, n: u64) -> Vec<u8> {
    (from..from + n).flat_map(token).collect()
}

fn answer(from: u64, n: u64) -> String {
    String::from_utf8(answer_bytes(from, n)).unwrap()
}

const FIRST_ID: u32 = 1000;

struct Engine {
    addr: SocketAddr,
    /// Generation requests served (the stream's or a continuation's).
    generations: Arc<AtomicU64>,
}

async fn engine(cut: Cut) -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let generations = Arc::new(AtomicU64::new(0));
    let served = generations.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let served = served.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let served = served.clone();
                    async move { Ok::<_, Infallible>(serve(req, cut, served).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    Engine { addr, generations }
}

type EngineBody = UnsyncBoxBody<Bytes, std::io::Error>;

fn json_answer(v: Value) -> Response<EngineBody> {
    Response::new(Full::new(Bytes::from(v.to_string())).map_err(|n| match n {}).boxed_unsync())
}

fn templated(messages: &Value) -> String {
    let mut p = String::from("<chat>");
    for m in messages.as_array().unwrap() {
        p.push_str(m["content"].as_str().unwrap_or_default());
        p.push('|');
    }
    p
}

fn tokenize(text: &str) -> Vec<u32> {
    text.chars().map(|c| c as u32 % 900 + 1).collect()
}

async fn serve(req: Request<Incoming>, cut: Cut, served: Arc<AtomicU64>) -> Response<EngineBody> {
    let path = req.uri().path().to_string();
    let body: Value = serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap_or(json!({}));
    match path.as_str() {
        "/apply-template" => return json_answer(json!({"prompt": templated(&body["messages"])})),
        "/tokenize" => return json_answer(json!({"tokens": tokenize(body["content"].as_str().unwrap())})),
        _ => {}
    }
    let nth = served.fetch_add(1, Ordering::SeqCst);
    let native = path == "/completion";
    let chat = path == "/v1/chat/completions";
    let (from, prompt_tokens) = start_of(&body, native, chat);
    let gen = Generation {
        cut: if nth == 0 { cut } else { Cut::Never },
        native,
        chat,
        from,
        prompt_tokens,
        n: body.get("n_predict").or(body.get("max_tokens")).and_then(Value::as_u64).unwrap_or(40),
        ids_asked: body.get("logprobs").is_some_and(|v| v != &json!(false)) || native,
        include_usage: body["stream_options"]["include_usage"] == json!(true),
        id: format!("chatcmpl-{}", nth + 1),
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(64);
    tokio::spawn(gen.run(tx));
    let mut r = Response::new(Frames(rx).boxed_unsync());
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// Where an answer starts (after the ids or the text it continues), and
/// its prompt's tokens.
fn start_of(body: &Value, native: bool, chat: bool) -> (u64, u64) {
    if native {
        let ids: Vec<u32> = body["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let answered: Vec<u32> = ids.iter().copied().filter(|&i| i >= FIRST_ID).collect();
        assert!(answered.iter().enumerate().all(|(k, &id)| id == FIRST_ID + k as u32), "ids out of order");
        (answered.len() as u64, (ids.len() - answered.len()) as u64)
    } else if chat && body["continue_final_message"] == json!(true) {
        let messages = body["messages"].as_array().unwrap();
        let prefill = messages.last().unwrap()["content"].as_str().unwrap().to_string();
        let from = (0..10_000u64).find(|&i| answer_bytes(0, i).len() >= prefill.len()).unwrap();
        assert_eq!(answer_bytes(0, from), prefill.as_bytes(), "the prefill is not the answer's start");
        let original = json!(messages[..messages.len() - 1].to_vec());
        (from, tokenize(&templated(&original)).len() as u64 + from)
    } else if chat {
        (0, tokenize(&templated(&body["messages"])).len() as u64)
    } else {
        (0, tokenize(body["prompt"].as_str().unwrap()).len() as u64)
    }
}

/// One answer as the engine streams it.
struct Generation {
    cut: Cut,
    native: bool,
    chat: bool,
    from: u64,
    prompt_tokens: u64,
    n: u64,
    ids_asked: bool,
    include_usage: bool,
    id: String,
}

type Sender = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

async fn send(tx: &Sender, s: String) -> bool {
    tx.send(Ok(Frame::data(Bytes::from(format!("data: {s}\n\n"))))).await.is_ok()
}

const RECLAIM_EVENT: &str = r#"{"error":{"message":"reclaimed","type":"server_error","code":"replica_reclaimed"}}"#;

impl Generation {
    fn event(&self, choice: Value) -> Value {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        json!({"id": self.id, "object": object, "created": 7, "model": "fake", "choices": [choice]})
    }

    /// How the stream ends at token `k` when it is cut there; false: it
    /// goes on.
    async fn cut_at(&self, k: u64, tx: &Sender) -> bool {
        let at = match self.cut {
            Cut::Reclaim(at) | Cut::Close(at) | Cut::Silent(at) | Cut::ToolThenReclaim(at) => at as u64,
            Cut::Never => return false,
        };
        if k != at {
            return false;
        }
        match self.cut {
            Cut::Reclaim(_) => {
                send(tx, RECLAIM_EVENT.into()).await;
            }
            Cut::ToolThenReclaim(_) => {
                send(tx, self.event(json!({"index": 0, "delta": {"tool_calls": [{"index": 0}]}})).to_string()).await;
                send(tx, RECLAIM_EVENT.into()).await;
            }
            Cut::Close(_) => {
                let _ = tx.send(Err(std::io::Error::other("killed"))).await;
            }
            Cut::Silent(_) => tokio::time::sleep(Duration::from_secs(3600)).await,
            Cut::Never => unreachable!(),
        }
        true
    }

    /// Token `i`'s event: its whole characters only (llama-server holds a
    /// character's first bytes back until it is whole).
    fn token_event(&self, i: u64, held: &mut Vec<u8>) -> Value {
        let bytes = token(i);
        held.extend_from_slice(&bytes);
        let valid = match std::str::from_utf8(held) {
            Ok(_) => held.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = String::from_utf8(held.drain(..valid).collect()).unwrap();
        let id = FIRST_ID + i as u32;
        let tok = json!([{"id": id, "token": "", "bytes": bytes, "logprob": 0.0}]);
        if self.native {
            return json!({"index": 0, "content": text, "tokens": [id], "stop": false, "completion_probabilities": tok});
        }
        let mut choice = match self.chat {
            true => json!({"index": 0, "delta": {"content": text}, "finish_reason": null}),
            false => json!({"index": 0, "text": text, "finish_reason": null}),
        };
        if self.ids_asked {
            choice["logprobs"] = json!({"content": tok});
        }
        self.event(choice)
    }

    async fn run(self, tx: Sender) {
        if !self.native && self.chat {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": null}, "finish_reason": null});
            send(&tx, self.event(role).to_string()).await;
        }
        let mut held = Vec::new();
        for k in 0..self.n {
            if self.cut_at(k, &tx).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            if !send(&tx, self.token_event(self.from + k, &mut held).to_string()).await {
                return;
            }
        }
        if self.native {
            let end =
                json!({"index": 0, "content": "", "stop": true, "stop_type": "limit", "tokens_predicted": self.n});
            send(&tx, end.to_string()).await;
            return;
        }
        let finish = match self.chat {
            true => json!({"index": 0, "delta": {}, "finish_reason": "length"}),
            false => json!({"index": 0, "text": "", "finish_reason": "length"}),
        };
        send(&tx, self.event(finish).to_string()).await;
        if self.include_usage {
            let mut u = self.event(json!(null));
            u["choices"] = json!([]);
            let (p, n) = (self.prompt_tokens, self.n);
            u["usage"] = json!({"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n});
            send(&tx, u.to_string()).await;
        }
        send(&tx, "[DONE]".into()).await;
    }
}

/// A body of the frames a channel brings (an error aborts it).
struct Frames(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx)
    }
}

struct Setup {
    harness: Harness,
    engines: Vec<Engine>,
}

/// A router with resumption by `method` in front of the first engine; the
/// others join once the first stream has begun on it.
async fn setup(method: Method, max_moves: u32, cuts: &[Cut]) -> Setup {
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(2));
    cfg.proxy.resume = Some(ResumeSettings { method, max_moves });
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

    fn metric(&self, name: &str, reason: &str) -> u64 {
        let text = self.harness.daemon.metrics.encode();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&format!("reason=\"{reason}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
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
        assert_eq!(s.metric("onepool_router_streams_moved_total", "reclaimed"), 1);
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
            .map(|r| s.metric("onepool_router_streams_moved_total", r))
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
    // A tool call: the reclaim event passes as the launcher sent it.
    let s = setup(Method::Tokens, 3, &[Cut::ToolThenReclaim(5), Cut::Never]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.errors().len(), 1, "{}", got.raw);
    assert_eq!(got.errors()[0]["error"]["code"], "replica_reclaimed");
    assert_eq!(s.metric("onepool_router_streams_moved_total", "reclaimed"), 0);
    // Both replicas cut it, and the endpoint allows one move.
    let s = setup(Method::Tokens, 1, &[Cut::Reclaim(5), Cut::Reclaim(5)]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.text, answer(0, 10), "the text up to the second cut, then the error");
    assert_eq!(got.errors().len(), 1, "{}", got.raw);
    assert_eq!(got.errors()[0]["error"]["code"], "stream_not_continued");
    assert_eq!(s.metric("onepool_router_stream_moves_failed_total", "max_moves"), 1);
    // No replica left to continue on: the queue's timeout bounds the wait.
    let s = setup(Method::Tokens, 3, &[Cut::Reclaim(5)]).await;
    let got = s.stream("/v1/chat/completions", chat(40, false)).await;
    assert_eq!(got.errors()[0]["error"]["code"], "stream_not_continued", "{}", got.raw);
    assert_eq!(s.metric("onepool_router_stream_moves_failed_total", "queue_timeout"), 1);
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
    assert_eq!(s.metric("onepool_router_streams_moved_total", "reclaimed"), 0);
}
