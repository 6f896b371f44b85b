//! An in-process model engine for the router's tests of continued answers
//! (issue #43) and request classes (issue #44): it speaks llama-server's
//! forms (OpenAI streams with token ids in their log-probabilities,
//! `/apply-template`, `/tokenize`, the native `/completion`) and an OpenAI
//! server's assistant prefill, and its answer is the same whatever replica
//! generates it (as llama-server's at temperature 0).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// How an engine ends its first stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cut {
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
    /// After N tokens: the body's clean end, without the answer's (a
    /// server whose answer ends without `[DONE]`).
    EndEarly(u32),
    /// The first connection is closed with its request read and nothing
    /// answered, after this many milliseconds (a model server killed while
    /// it computes the answer).
    CloseBeforeHead(u64),
    /// After N tokens: nothing more on any connection, health checks
    /// included (a node cut off the network).
    Lost(u32),
}

/// The answer's token `i`: its bytes. Every seventh token pair is one
/// two-byte character split across two tokens, as byte-level tokenizers
/// do with accents.
pub fn token(i: u64) -> Vec<u8> {
    match i % 7 {
        3 => vec![0xC3],
        4 => [&[0xA9][..], format!("x{i} ").as_bytes()].concat(),
        _ => format!("w{i} ").into_bytes(),
    }
}

pub fn answer_bytes(from: u64, n: u64) -> Vec<u8> {
    (from..from + n).flat_map(token).collect()
}

pub fn answer(from: u64, n: u64) -> String {
    String::from_utf8(answer_bytes(from, n)).unwrap()
}

pub const FIRST_ID: u32 = 1000;

pub struct Engine {
    pub addr: SocketAddr,
    /// Generation requests served (the stream's or a continuation's).
    pub generations: Arc<AtomicU64>,
    /// Every request but health checks: its path and body, as received.
    pub received: Received,
}

pub type Received = Arc<std::sync::Mutex<Vec<(String, Bytes)>>>;

pub async fn engine(cut: Cut) -> Engine {
    engine_paced(cut, Duration::from_millis(2)).await
}

/// [`engine`], a token every `pace`.
pub async fn engine_paced(cut: Cut, pace: Duration) -> Engine {
    engine_sampling(cut, pace, None).await
}

/// [`engine_paced`], its answers sampled (issue #51): with `Some(salt)`,
/// every text of an answer depends on the request's `seed` (a random one
/// without), and on `salt` (replicas of one model and build share it), and
/// each tool call gets a new id, as engines make them.
pub async fn engine_sampling(cut: Cut, pace: Duration, salt: Option<u64>) -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let generations = Arc::new(AtomicU64::new(0));
    let served = generations.clone();
    let received = Received::default();
    let record = received.clone();
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            if let (Cut::CloseBeforeHead(ms), true) = (cut, std::mem::take(&mut first)) {
                served.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(close_before_head(stream, Duration::from_millis(ms)));
                continue;
            }
            let (served, lost, record) = (served.clone(), lost.clone(), record.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (served, lost, record) = (served.clone(), lost.clone(), record.clone());
                    async move {
                        if lost.load(Ordering::SeqCst) {
                            // Cut off: no answer ever comes.
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Infallible>(serve(req, cut, served, pace, lost, record, salt).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    Engine { addr, generations, received }
}

/// Reads a request's head, waits, and closes the connection unanswered.
async fn close_before_head(mut stream: tokio::net::TcpStream, wait: Duration) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 1 << 16];
    let _ = stream.read(&mut buf).await;
    tokio::time::sleep(wait).await;
    drop(stream);
}

type EngineBody = UnsyncBoxBody<Bytes, std::io::Error>;

fn json_answer(v: Value) -> Response<EngineBody> {
    Response::new(Full::new(Bytes::from(v.to_string())).map_err(|n| match n {}).boxed_unsync())
}

pub fn templated(messages: &Value) -> String {
    let mut p = String::from("<chat>");
    for m in messages.as_array().unwrap() {
        p.push_str(m["content"].as_str().unwrap_or_default());
        p.push('|');
    }
    p
}

pub fn tokenize(text: &str) -> Vec<u32> {
    text.chars().map(|c| c as u32 % 900 + 1).collect()
}

async fn serve(
    req: Request<Incoming>,
    cut: Cut,
    served: Arc<AtomicU64>,
    pace: Duration,
    lost: Arc<std::sync::atomic::AtomicBool>,
    record: Received,
    salt: Option<u64>,
) -> Response<EngineBody> {
    let path = req.uri().path().to_string();
    if path == "/health" {
        return json_answer(json!({"status": "ok"}));
    }
    let raw = req.into_body().collect().await.unwrap().to_bytes();
    record.lock().unwrap().push((path.clone(), raw.clone()));
    let body: Value = serde_json::from_slice(&raw).unwrap_or(json!({}));
    match path.as_str() {
        "/apply-template" => return json_answer(json!({"prompt": templated(&body["messages"])})),
        "/tokenize" => return json_answer(json!({"tokens": tokenize(body["content"].as_str().unwrap())})),
        _ => {}
    }
    let nth = served.fetch_add(1, Ordering::SeqCst);
    let native = path == "/completion";
    let chat = path == "/v1/chat/completions";
    let flavor = match salt {
        None => String::new(),
        Some(salt) => {
            let seed = body["seed"].as_u64().unwrap_or_else(|| rand_seed(nth));
            format!("~{:x}", (seed ^ salt.wrapping_mul(0x9E37_79B9)) & 0xffff_ffff)
        }
    };
    let (from, prompt_tokens) = start_of(&body, native, chat, &flavor);
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
        pace,
        lost,
        tools: chat && body["tools"].as_array().is_some_and(|t| !t.is_empty()) && body["tool_choice"] != json!("none"),
        thinking: chat && body["chat_template_kwargs"]["enable_thinking"] == json!(true),
        json: body["response_format"]["type"].as_str().is_some_and(|t| t.starts_with("json")),
        choices: body["n"].as_u64().unwrap_or(1),
        flavor,
        call_id: match salt {
            None => "call_0".into(),
            Some(_) => format!("call_{nth}"),
        },
    };
    if gen.thinking || gen.json || gen.choices > 1 {
        assert!(body["continue_final_message"] != json!(true) && !native, "{path}: this answer has no prefill");
    }
    if body["stream"] != json!(true) && !native {
        return gen.whole().await;
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(64);
    tokio::spawn(gen.run(tx));
    let mut r = Response::new(Frames(rx).boxed_unsync());
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// The text of a plain token `i`, in an answer's flavor.
fn flavored_token(i: u64, flavor: &str) -> Vec<u8> {
    let mut b = token(i);
    if !flavor.is_empty() && b.last() == Some(&b' ') {
        b.pop();
        b.extend_from_slice(format!("{flavor} ").as_bytes());
    }
    b
}

/// A seed of the engine's own for a request without one.
fn rand_seed(nth: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(nth);
    h.finish()
}

/// Where an answer starts (after the ids or the text it continues), and
/// its prompt's tokens.
fn start_of(body: &Value, native: bool, chat: bool, flavor: &str) -> (u64, u64) {
    let answer_bytes =
        |from: u64, n: u64| -> Vec<u8> { (from..from + n).flat_map(|i| flavored_token(i, flavor)).collect() };
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
    pace: Duration,
    /// Set at a [`Cut::Lost`]: the engine answers nothing more.
    lost: Arc<std::sync::atomic::AtomicBool>,
    /// Tools offered: the answer is [`TOOL_AFTER`] tokens of text, then a
    /// tool call ([`tool_call`]), as a model with a tool format answers.
    tools: bool,
    /// `enable_thinking`: [`REASONING`] tokens of reasoning kept apart
    /// (`reasoning_content`) come first.
    thinking: bool,
    /// A JSON `response_format`: the answer is [`json_text`].
    json: bool,
    /// `n`: the answer's choices, their events one after the other.
    choices: u64,
    /// Added to every text (a sampling engine's, per seed).
    flavor: String,
    call_id: String,
}

/// With `enable_thinking`, the reasoning tokens before the answer.
pub const REASONING: u64 = 5;

/// A JSON answer (a JSON `response_format`) opens with this token, goes
/// on with the plain tokens and closes with [`JSON_TAIL`] as its last
/// token, as a grammar lets a model write it within its budget.
pub const JSON_HEAD: &str = "{\"city\": \"Paris\", \"notes\": \"";
pub const JSON_TAIL: &str = "\"}";

/// The JSON answer of `n` tokens, unflavored.
pub fn json_text(n: u64) -> String {
    let notes: String = (0..n - 2).map(|i| format!("w{i} ")).collect();
    format!("{JSON_HEAD}{notes}{JSON_TAIL}")
}

/// Reasoning token `i`.
pub fn thought(i: u64, flavor: &str) -> String {
    format!("think{i}{flavor} ")
}

/// What a piece of an answer is.
enum Piece {
    Reasoning(String),
    Token(u64),
    Tool(u64),
    Json(String),
}

/// With tools, the text tokens before the tool call.
pub const TOOL_AFTER: u64 = 8;

/// The tool call of an answer with tools, as its three deltas stream it
/// (positions `TOOL_AFTER` to `TOOL_AFTER + 2`): its head, then its
/// arguments in two parts.
pub fn tool_call_delta(part: u64) -> Value {
    tool_call_delta_of(part, "call_0", "")
}

fn tool_call_delta_of(part: u64, id: &str, flavor: &str) -> Value {
    match part {
        0 => json!([{"index": 0, "id": id, "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]),
        1 => json!([{"index": 0, "function": {"arguments": "{\"city\":"}}]),
        _ => json!([{"index": 0, "function": {"arguments": format!("\"Paris{flavor}\"}}")}}]),
    }
}

/// The whole answer's tool call.
pub fn tool_call() -> Value {
    tool_call_of("call_0", "")
}

fn tool_call_of(id: &str, flavor: &str) -> Value {
    let arguments = format!("{{\"city\":\"Paris{flavor}\"}}");
    json!({"id": id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}})
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
            Cut::Reclaim(at)
            | Cut::Close(at)
            | Cut::Silent(at)
            | Cut::ToolThenReclaim(at)
            | Cut::EndEarly(at)
            | Cut::Lost(at) => at as u64,
            Cut::Never | Cut::CloseBeforeHead(_) => return false,
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
                // What was sent reaches the router first (as it would from a
                // server killed between two tokens).
                tokio::time::sleep(self.pace).await;
                let _ = tx.send(Err(std::io::Error::other("killed"))).await;
            }
            Cut::Silent(_) => tokio::time::sleep(Duration::from_secs(3600)).await,
            Cut::EndEarly(_) => {}
            Cut::Lost(_) => {
                self.lost.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Cut::Never | Cut::CloseBeforeHead(_) => unreachable!(),
        }
        true
    }

    /// Token `i`'s event: its whole characters only (llama-server holds a
    /// character's first bytes back until it is whole).
    fn token_event(&self, i: u64, held: &mut Vec<u8>) -> Value {
        let bytes = self.token_bytes(i);
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

    /// The answer's pieces from its position `from` on, at most `n`.
    fn pieces(&self) -> Vec<Piece> {
        let reasoning = if self.thinking { REASONING } else { 0 };
        let mut out = Vec::new();
        for at in self.from..self.from + self.n {
            if at < reasoning {
                out.push(Piece::Reasoning(thought(at, &self.flavor)));
                continue;
            }
            let p = at - reasoning;
            if self.json && p == 0 {
                out.push(Piece::Json(JSON_HEAD.into()));
            } else if self.json && at + 1 == self.n {
                out.push(Piece::Json(JSON_TAIL.into()));
            } else if self.json {
                out.push(Piece::Json(format!("w{}{} ", p - 1, self.flavor)));
            } else if self.tools && p >= TOOL_AFTER {
                out.push(Piece::Tool(p - TOOL_AFTER));
                if p == TOOL_AFTER + 2 {
                    break;
                }
            } else {
                out.push(Piece::Token(p));
            }
        }
        out
    }

    fn finish_reason(&self, pieces: &[Piece]) -> &'static str {
        match pieces.last() {
            Some(Piece::Tool(_)) => "tool_calls",
            Some(Piece::Json(t)) if t == JSON_TAIL => "stop",
            _ => "length",
        }
    }

    fn token_bytes(&self, i: u64) -> Vec<u8> {
        flavored_token(i, &self.flavor)
    }

    /// The answer whole (`stream` not asked for), once all of it is made.
    async fn whole(self) -> Response<EngineBody> {
        tokio::time::sleep(self.pace * self.n as u32).await;
        let pieces = self.pieces();
        let n = pieces.len() as u64;
        let (mut reasoning, mut text, mut called) = (String::new(), Vec::new(), false);
        for piece in &pieces {
            match piece {
                Piece::Reasoning(r) => reasoning.push_str(r),
                Piece::Token(i) => text.extend(self.token_bytes(*i)),
                Piece::Json(t) => text.extend_from_slice(t.as_bytes()),
                Piece::Tool(_) => called = true,
            }
        }
        // A character cut at the last token is left out, as a server does.
        let text = String::from_utf8_lossy(&text).trim_end_matches('\u{FFFD}').to_string();
        let p = self.prompt_tokens;
        let usage = json!({"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n});
        let finish_reason = self.finish_reason(&pieces);
        let (object, choice) = match self.chat {
            true => {
                let mut message = json!({"role": "assistant", "content": text});
                if called {
                    message["tool_calls"] = json!([tool_call_of(&self.call_id, &self.flavor)]);
                }
                if !reasoning.is_empty() {
                    message["reasoning_content"] = json!(reasoning);
                }
                ("chat.completion", json!({"index": 0, "message": message, "finish_reason": finish_reason}))
            }
            false => ("text_completion", json!({"index": 0, "text": text, "finish_reason": finish_reason})),
        };
        let mut choices = vec![choice];
        for c in 1..self.choices {
            let text: String = (0..n).map(|i| format!("w{i}c{c}{} ", self.flavor)).collect();
            choices[0]["message"]["content"] =
                json!((0..n).map(|i| format!("w{i}c0{} ", self.flavor)).collect::<String>());
            choices.push(
                json!({"index": c, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}),
            );
        }
        let whole =
            json!({"id": self.id, "object": object, "created": 7, "model": "fake", "choices": choices, "usage": usage});
        let mut r = match self.cut {
            // Killed while writing it: its length said, half of it sent.
            Cut::Close(_) => {
                let bytes = Bytes::from(whole.to_string());
                let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
                let half = bytes.slice(..bytes.len() / 2);
                tokio::spawn(async move {
                    let _ = tx.send(Ok(Frame::data(half))).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = tx.send(Err(std::io::Error::other("killed"))).await;
                });
                let mut r = Response::new(Frames(rx).boxed_unsync());
                r.headers_mut().insert("content-length", bytes.len().into());
                r
            }
            _ => json_answer(whole),
        };
        r.headers_mut().insert("content-type", "application/json".parse().unwrap());
        r
    }

    async fn run(self, tx: Sender) {
        if !self.native && self.chat {
            for c in 0..self.choices {
                let role = json!({"index": c, "delta": {"role": "assistant", "content": null}, "finish_reason": null});
                send(&tx, self.event(role).to_string()).await;
            }
        }
        let mut held = Vec::new();
        let pieces = self.pieces();
        for (k, piece) in pieces.iter().enumerate() {
            if self.cut_at(k as u64, &tx).await {
                return;
            }
            tokio::time::sleep(self.pace).await;
            let delta = match piece {
                Piece::Reasoning(r) => Some(json!({"reasoning_content": r})),
                Piece::Json(t) => Some(json!({"content": t})),
                Piece::Tool(part) => {
                    Some(json!({"tool_calls": tool_call_delta_of(*part, &self.call_id, &self.flavor)}))
                }
                Piece::Token(_) if self.choices > 1 => None,
                Piece::Token(i) => {
                    if !send(&tx, self.token_event(*i, &mut held).to_string()).await {
                        return;
                    }
                    continue;
                }
            };
            for c in 0..self.choices {
                let delta = match (&delta, piece) {
                    (Some(d), _) => d.clone(),
                    (None, Piece::Token(i)) => json!({"content": format!("w{i}c{c}{} ", self.flavor)}),
                    (None, _) => unreachable!(),
                };
                let e = self.event(json!({"index": c, "delta": delta, "finish_reason": null}));
                if !send(&tx, e.to_string()).await {
                    return;
                }
            }
        }
        let generated = pieces.len() as u64;
        let finish_reason = self.finish_reason(&pieces);
        if self.native {
            let end =
                json!({"index": 0, "content": "", "stop": true, "stop_type": "limit", "tokens_predicted": self.n});
            send(&tx, end.to_string()).await;
            return;
        }
        for c in 0..self.choices {
            let finish = match self.chat {
                true => json!({"index": c, "delta": {}, "finish_reason": finish_reason}),
                false => json!({"index": c, "text": "", "finish_reason": finish_reason}),
            };
            send(&tx, self.event(finish).to_string()).await;
        }
        if self.include_usage {
            let mut u = self.event(json!(null));
            u["choices"] = json!([]);
            let (p, n) = (self.prompt_tokens, generated * self.choices);
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
