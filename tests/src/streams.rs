//! Completions on the stand-in model server through the router, read as
//! they come, and how each ended as its client saw it: streams whole (one
//! finish, their usage that of the tokens sent), cut, refused or hung.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How one request through the router ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// 200 and whole (a stream up to `data: [DONE]`).
    Done,
    /// 200, some of the stream, then the connection ended without
    /// `[DONE]`: the error a stream's client sees.
    CutMidStream,
    /// An answer other than 200.
    Status(u16),
    /// No answer at all (the connection failed before a status line).
    NoAnswer,
    /// Nothing for [`HUNG`]: the client would still be waiting.
    Hung,
}

/// A client waiting this long with nothing read counts as hung.
pub const HUNG: Duration = Duration::from_secs(45);

#[derive(Debug, Clone)]
pub struct Sent {
    pub start: Instant,
    /// When the status line arrived.
    pub answered: Option<Instant>,
    pub end: Instant,
    pub ending: Ending,
    /// Tokens of a stream's text (the stand-in server's "x" each).
    pub tokens: usize,
}

/// One completion through the router at `router`, streamed or not, read as
/// it comes, on a connection of its own; with `key`, as that API key's.
pub fn request_once(router: SocketAddr, max_tokens: u32, stream: bool, key: Option<&str>) -> Sent {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens},"stream":{stream},"stream_options":{{"include_usage":{stream}}}}}"#
    );
    request_body(router, &body, stream, key)
}

/// [`request_once`] as an agent calls: with a tool list (issue #51).
pub fn agents_call(router: SocketAddr, max_tokens: u32, stream: bool, key: Option<&str>) -> Sent {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": max_tokens, "stream": stream, "stream_options": {"include_usage": stream},
        "tool_choice": "auto", "tools": crate::answers::tool_list()});
    request_body(router, &body.to_string(), stream, key)
}

/// One chat completion of `body` (its `stream` said), as [`request_once`].
pub fn request_body(router: SocketAddr, body: &str, stream: bool, key: Option<&str>) -> Sent {
    let start = Instant::now();
    let (mut tokens, mut finishes, mut usage) = (0, 0, None);
    let done = |answered, ending, tokens| Sent { start, answered, end: Instant::now(), ending, tokens };
    let Ok(mut s) = TcpStream::connect_timeout(&router, Duration::from_secs(5)) else {
        return done(None, Ending::NoAnswer, 0);
    };
    s.set_read_timeout(Some(HUNG)).unwrap();
    let auth = key.map(|k| format!("authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {router}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{auth}connection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes())).is_err() {
        return done(None, Ending::NoAnswer, 0);
    }
    let mut r = BufReader::new(s);
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => return done(None, Ending::NoAnswer, 0),
        Ok(_) => {}
        Err(e) if is_timeout(&e) => return done(None, Ending::Hung, 0),
        Err(_) => return done(None, Ending::NoAnswer, 0),
    }
    let answered = Some(Instant::now());
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    if status != 200 {
        return done(answered, Ending::Status(status), 0);
    }
    if !stream {
        let mut rest = Vec::new();
        return match std::io::Read::read_to_end(&mut r, &mut rest) {
            Ok(_) => done(answered, Ending::Done, 0),
            Err(e) if is_timeout(&e) => done(answered, Ending::Hung, 0),
            Err(_) => done(answered, Ending::CutMidStream, 0),
        };
    }
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return done(answered, Ending::CutMidStream, tokens),
            Ok(_) if line.starts_with("data: [DONE]") => {
                // Whole: its tokens, one finish and a usage that says so.
                let whole = finishes == 1 && usage == Some(tokens as u64);
                return done(answered, if whole { Ending::Done } else { Ending::CutMidStream }, tokens);
            }
            Ok(_) => {
                let event = line.strip_prefix("data: ").and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok());
                let Some(e) = event else { continue };
                tokens += e["choices"][0]["delta"]["content"].as_str().map_or(0, str::len);
                // One answer: one finish, its usage that of the tokens sent.
                if e["choices"][0]["finish_reason"].as_str() == Some("length") {
                    finishes += 1;
                }
                if let Some(n) = e["usage"]["completion_tokens"].as_u64() {
                    usage = Some(n);
                }
            }
            Err(e) if is_timeout(&e) => return done(answered, Ending::Hung, tokens),
            Err(_) => return done(answered, Ending::CutMidStream, tokens),
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// `n` requests, each on its own thread, started `every` apart (an open
/// loop: one that waits does not hold the next back); their endings.
pub fn paced(n: usize, every: Duration, request: impl Fn() -> Sent + Send + Clone + 'static) -> Vec<Sent> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let h = std::thread::spawn(request.clone());
            std::thread::sleep(every);
            h
        })
        .collect();
    threads.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `clients` threads sending completions back to back until stopped.
pub struct Clients {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Clients {
    /// `clients` threads from now on; with `key`, as that API key's.
    pub fn start(router: SocketAddr, clients: usize, max_tokens: u32, stream: bool, key: Option<&str>) -> Clients {
        let key = key.map(str::to_string);
        Clients::with(clients, move |_| request_once(router, max_tokens, stream, key.as_deref()))
    }

    /// `clients` threads from now on, client `i` sending `request(i)`.
    pub fn with(clients: usize, request: impl Fn(usize) -> Sent + Send + Sync + 'static) -> Clients {
        let request = Arc::new(request);
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|i| {
                let (stop, sent, request) = (stop.clone(), sent.clone(), request.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let s = request(i);
                        let failed = s.ending != Ending::Done;
                        sent.lock().unwrap().push(s);
                        if failed {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
            })
            .collect();
        Clients { stop, sent, threads }
    }

    /// Stops sending; every request's ending, once all have ended.
    pub fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        let v = self.sent.lock().unwrap().clone();
        v
    }
}
