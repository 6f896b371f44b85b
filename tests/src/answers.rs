//! Answers of the real model as their clients read them (issues #43 and
//! #50): whole, or read as they come with the time each piece of text
//! arrived, so that a test knows what a client had at a given moment (a
//! moved answer's junction).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::elastic::{local, send};

/// An answer of the real model as its client read it (issue #43): its
/// text, its ends and its usage, streamed or not.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub stream: bool,
    pub text: String,
    pub finish_reasons: Vec<String>,
    /// (prompt, completion) tokens of the last usage seen.
    pub usage: Option<(u64, u64)>,
    /// `data: [DONE]` lines.
    pub done: usize,
    /// Error events (or the connection's error).
    pub errors: Vec<String>,
    /// The answer's ids (one for one answer).
    pub ids: BTreeSet<String>,
    /// When it ended.
    pub ended: Instant,
}

impl Answer {
    /// Why it is not one whole answer of `max_tokens` (as with
    /// `ignore_eos`): `None` when it is.
    pub fn flaw(&self, max_tokens: u64) -> Option<String> {
        let want_done = usize::from(self.stream);
        let ok = self.status == 200
            && self.errors.is_empty()
            && self.done == want_done
            && self.finish_reasons == ["length"]
            && self.usage.is_some_and(|(_, c)| c == max_tokens)
            && self.ids.len() == 1;
        (!ok).then(|| format!("{self:?}"))
    }
}

/// A chat completion of the real model at temperature 0 that generates
/// exactly `max_tokens` (`ignore_eos`), read whole by [`Answer`].
pub fn long_chat(port: u16, prompt: &str, max_tokens: u64, stream: bool) -> Answer {
    let body = long_chat_body(prompt, max_tokens, stream).to_string();
    let mut a = Answer::new(stream);
    let answer = match send(local(port), "POST", "/v1/chat/completions", Some(&body), &[]) {
        Ok(answer) => answer,
        Err(e) => {
            a.errors.push(e.to_string());
            a.ended = Instant::now();
            return a;
        }
    };
    a.status = answer.status.as_u16();
    let text = answer.text();
    if stream {
        for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
            a.read_event(event);
        }
    } else {
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => a.read(&v),
            Err(_) => a.errors.push(format!("unreadable answer {text:?}")),
        }
    }
    a.ended = Instant::now();
    a
}

/// The tool list an agent sends with each call (issue #51): one function.
/// SmolLM2-135M answers such a call in text on this llama-server.
pub fn tool_list() -> serde_json::Value {
    serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// [`long_chat`]'s request, for a test to add to.
pub fn long_chat_body(prompt: &str, max_tokens: u64, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": onepool_dev_cluster::model_server::MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": stream,
        "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { serde_json::Value::Null },
    })
}

impl Answer {
    fn new(stream: bool) -> Answer {
        Answer {
            status: 0,
            stream,
            text: String::new(),
            finish_reasons: Vec::new(),
            usage: None,
            done: 0,
            errors: Vec::new(),
            ids: BTreeSet::new(),
            ended: Instant::now(),
        }
    }

    /// One event of a stream, or a whole answer.
    fn read(&mut self, v: &serde_json::Value) {
        if let Some(e) = v.get("error") {
            self.errors.push(e.to_string());
            return;
        }
        if let Some(id) = v["id"].as_str() {
            self.ids.insert(id.to_string());
        }
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str().or(choice["message"]["content"].as_str()) {
            self.text.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish_reasons.push(f.to_string());
        }
        if let (Some(p), Some(c)) = (v["usage"]["prompt_tokens"].as_u64(), v["usage"]["completion_tokens"].as_u64()) {
            self.usage = Some((p, c));
        }
    }

    /// One event's text as a stream carries it (`data: ...`).
    fn read_event(&mut self, event: &str) {
        match event.strip_prefix("data: ") {
            Some("[DONE]") => self.done += 1,
            Some(data) => match serde_json::from_str::<serde_json::Value>(data) {
                Ok(v) => self.read(&v),
                Err(_) => self.errors.push(format!("unreadable event {data:?}")),
            },
            None => self.errors.push(format!("not an event: {event:?}")),
        }
    }
}

/// An answer read as it came: [`Answer`], and after each event the time
/// and the length of the text so far.
#[derive(Debug, Clone)]
pub struct Timed {
    pub answer: Answer,
    pub arrivals: Vec<(Instant, usize)>,
}

impl Timed {
    /// Bytes of text the client had at `t`.
    pub fn text_at(&self, t: Instant) -> usize {
        self.arrivals.iter().take_while(|(at, _)| *at <= t).last().map_or(0, |(_, n)| *n)
    }
}

/// A chat completion with `body` (as a client sends it) through `port`, on
/// a connection of its own, read as it comes (HTTP/1.1, chunked or sized).
pub fn timed_chat(port: u16, body: &serde_json::Value) -> Timed {
    let stream = body["stream"] == serde_json::json!(true);
    let mut t = Timed { answer: Answer::new(stream), arrivals: Vec::new() };
    if let Err(e) = read_timed(local(port), body, &mut t) {
        t.answer.errors.push(format!("the connection: {e}"));
    }
    t.answer.ended = Instant::now();
    t
}

fn read_timed(address: SocketAddr, body: &serde_json::Value, t: &mut Timed) -> std::io::Result<()> {
    let body = body.to_string();
    let mut s = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    t.answer.status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        chunked |= l == "transfer-encoding: chunked";
        if let Some(n) = l.strip_prefix("content-length:") {
            length = n.trim().parse::<usize>().ok();
        }
    }
    let mut held = Vec::new();
    let pass = |t: &mut Timed, held: &mut Vec<u8>, bytes: &[u8], end: bool| {
        held.extend_from_slice(bytes);
        if !t.answer.stream {
            if end {
                match serde_json::from_slice::<serde_json::Value>(held) {
                    Ok(v) => t.answer.read(&v),
                    Err(_) => t.answer.errors.push(format!("unreadable answer {:?}", String::from_utf8_lossy(held))),
                }
                t.arrivals.push((Instant::now(), t.answer.text.len()));
            }
            return;
        }
        while let Some(at) = held.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = held.drain(..at + 2).collect();
            let event = String::from_utf8_lossy(&event);
            if !event.trim().is_empty() {
                t.answer.read_event(event.trim());
                t.arrivals.push((Instant::now(), t.answer.text.len()));
            }
        }
    };
    match (chunked, length) {
        (true, _) => loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| std::io::Error::other(format!("not a chunk's size: {line:?}")))?;
            if size == 0 {
                pass(t, &mut held, b"", true);
                return Ok(());
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            pass(t, &mut held, &chunk[..size], false);
        },
        (false, Some(n)) => {
            let mut all = vec![0; n];
            r.read_exact(&mut all)?;
            pass(t, &mut held, &all, true);
        }
        (false, None) => {
            let mut all = Vec::new();
            r.read_to_end(&mut all)?;
            pass(t, &mut held, &all, true);
        }
    }
    Ok(())
}
