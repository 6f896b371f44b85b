//! The demo's and the serving benchmarks' clients: the Azure LLM
//! conversation trace (real arrival
//! times, prompt and answer sizes) replayed against the endpoint's stable
//! address, each row one OpenAI chat completion for the real model, every
//! other one streamed (server-sent events). Prompt and answer are the
//! trace's sizes scaled down ([`ChatShape`]) so that a 2-core machine
//! serving several replicas on its CPU copes.
//! The replay speed (trace seconds per wall second) can be changed while it
//! runs, which is how the demo ramps from light to heavy load; every request
//! is counted in the phase it was sent in, and recorded with when it was
//! sent and when it ended ([`Load::requests`]).

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod mooncake;

use anyhow::{bail, Context};
use onepool_decisions::trace::read_azure;
use tokio::runtime::Handle;

/// The trace as (seconds since its first request, context tokens,
/// generated tokens).
#[derive(Clone, Debug)]
pub struct Trace {
    pub rows: Vec<(f64, u32, u32)>,
}

/// How a trace row becomes a request: its context and generated tokens
/// divided, then kept within bounds (the conversation trace's medians, 1020
/// and 129, become 31 prompt words and 8 answer tokens).
#[derive(Clone, Copy, Debug)]
pub struct ChatShape {
    pub prompt_div: u32,
    pub prompt_words: (u32, u32),
    pub answer_div: u32,
    pub answer_tokens: (u32, u32),
}

impl ChatShape {
    pub const DEMO: ChatShape =
        ChatShape { prompt_div: 32, prompt_words: (8, 64), answer_div: 16, answer_tokens: (1, 32) };

    /// (prompt words, max_tokens) of a row.
    pub fn of(&self, context_tokens: u32, generated_tokens: u32) -> (u32, u32) {
        let (pw, at) = (self.prompt_words, self.answer_tokens);
        ((context_tokens / self.prompt_div).clamp(pw.0, pw.1), (generated_tokens / self.answer_div).clamp(at.0, at.1))
    }

    /// The request body of trace row `i` (odd rows stream).
    pub fn body(&self, model: &str, i: usize, context_tokens: u32, generated_tokens: u32) -> (String, bool) {
        const WORDS: [&str; 16] = [
            "the", "pool", "shares", "its", "GPUs", "between", "training", "and", "serving", "so", "no", "island",
            "sits", "idle", "while", "work",
        ];
        let (words, max_tokens) = self.of(context_tokens, generated_tokens);
        let prompt: Vec<&str> = (0..words as usize).map(|w| WORDS[(w + i) % WORDS.len()]).collect();
        let stream = i % 2 == 1;
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt.join(" ")}],
            "max_tokens": max_tokens,
            "stream": stream,
        });
        (body.to_string(), stream)
    }
}

/// A row's own prompt, for traces that say what their prompts share
/// ([`mooncake`]); sent as one streamed chat message.
#[derive(Clone, Debug)]
pub struct Prompted {
    pub prompt: Arc<str>,
    pub max_tokens: u32,
}

/// What each trace row is sent as.
#[derive(Clone)]
enum Bodies {
    /// Words of the row's size ([`ChatShape`]).
    Shaped(ChatShape),
    /// Row `i` is prompt `i`, streamed (its first token timed).
    Prompted(Arc<[Prompted]>),
}

impl Bodies {
    /// Row `i`'s body, whether it streams, and the tokens it asks for.
    fn of(&self, model: &str, i: usize, (context, generated): (u32, u32)) -> (String, bool, u32) {
        match self {
            Bodies::Shaped(shape) => {
                let (body, stream) = shape.body(model, i, context, generated);
                (body, stream, shape.of(context, generated).1)
            }
            Bodies::Prompted(prompts) => {
                let p = &prompts[i % prompts.len().max(1)];
                let body = serde_json::json!({
                    "model": model,
                    "messages": [{"role": "user", "content": &*p.prompt}],
                    "max_tokens": p.max_tokens,
                    "stream": true,
                });
                (body.to_string(), true, p.max_tokens)
            }
        }
    }
}

impl Trace {
    pub fn load(path: &Path) -> anyhow::Result<Trace> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the trace {}", path.display()))?;
        let at = |line: usize, what: &str| anyhow::anyhow!("{}:{line}: {what}", path.display());
        let mut rows = Vec::new();
        for (line, row) in read_azure(&text).map_err(|e| at(e.line, &e.what))? {
            let r = row.map_err(|e| at(line, &e))?;
            rows.push((r.t, r.context_tokens, r.generated_tokens));
        }
        let Some(first) = rows.iter().map(|r| r.0).reduce(f64::min) else {
            bail!("{}: no requests in the trace", path.display());
        };
        for r in &mut rows {
            r.0 -= first;
        }
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Trace { rows })
    }

    /// The start of the `window` seconds of trace time holding the most
    /// requests, and how many.
    pub fn busiest(&self, window: f64) -> (f64, usize) {
        let mut best = (0.0, 0);
        let mut end = 0;
        for (i, r) in self.rows.iter().enumerate() {
            while end < self.rows.len() && self.rows[end].0 < r.0 + window {
                end += 1;
            }
            if end - i > best.1 {
                best = (r.0, end - i);
            }
        }
        best
    }

    /// The trace from `offset` seconds of trace time on, starting at 0.
    pub fn from(&self, offset: f64) -> Trace {
        let rows = self.rows.iter().filter(|r| r.0 >= offset).map(|r| (r.0 - offset, r.1, r.2)).collect();
        Trace { rows }
    }

    /// Requests per second of trace time between `from` and `to`.
    pub fn rate(&self, from: f64, to: f64) -> f64 {
        let n = self.rows.iter().filter(|r| r.0 >= from && r.0 < to).count();
        n as f64 / (to - from).max(1e-9)
    }
}

/// Counts of one load phase.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: String,
    pub speed: f64,
    /// Seconds on the demo's clock.
    pub start: f64,
    pub end: Option<f64>,
    pub sent: u64,
    pub served: u64,
    pub failed: u64,
    /// Seconds, of the requests answered 2xx.
    pub latencies: Vec<f64>,
    /// Seconds to the first generated token, of the streams answered 2xx.
    pub ttfts: Vec<f64>,
}

impl Phase {
    /// The `q` quantile (0..=1) of the served requests' latency.
    pub fn latency(&self, q: f64) -> Option<f64> {
        quantile(&self.latencies, q)
    }

    /// The `q` quantile of the served streams' time to first token.
    pub fn ttft(&self, q: f64) -> Option<f64> {
        quantile(&self.ttfts, q)
    }
}

fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut v = v.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i])
}

/// One request of a replay, in seconds on the load's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub sent: f64,
    pub ended: f64,
    pub stream: bool,
    /// The tokens it asked for (a stand-in server's service time follows them).
    pub max_tokens: u32,
    /// Why it failed; `None` when answered whole with 2xx.
    pub failure: Option<String>,
    /// Seconds to its first generated token (streams answered 2xx).
    pub ttft: Option<f64>,
}

pub struct Load {
    target: SocketAddr,
    model: String,
    bodies: Bodies,
    t0: Instant,
    /// Trace seconds per wall second, as f64 bits; 0 pauses the replay.
    speed: AtomicU64,
    stop: AtomicBool,
    in_flight: AtomicU64,
    phases: Mutex<Vec<Phase>>,
    /// Why requests failed, as (status or error, count).
    failures: Mutex<Vec<(String, u64)>>,
    requests: Mutex<Vec<Request>>,
}

impl Load {
    /// Starts the replay paused; [`Load::phase`] sets it going.
    pub fn start(
        rt: &Handle,
        trace: Trace,
        target: SocketAddr,
        model: &str,
        shape: ChatShape,
        t0: Instant,
    ) -> Arc<Load> {
        Load::start_with(rt, trace, target, model, Bodies::Shaped(shape), t0)
    }

    /// [`Load::start`] with each row's own prompt (`prompts[i]` for row
    /// `i`), every request streamed.
    pub fn start_prompted(
        rt: &Handle,
        trace: Trace,
        prompts: Vec<Prompted>,
        target: SocketAddr,
        model: &str,
        t0: Instant,
    ) -> Arc<Load> {
        Load::start_with(rt, trace, target, model, Bodies::Prompted(prompts.into()), t0)
    }

    fn start_with(
        rt: &Handle,
        trace: Trace,
        target: SocketAddr,
        model: &str,
        bodies: Bodies,
        t0: Instant,
    ) -> Arc<Load> {
        let load = Arc::new(Load {
            target,
            model: model.to_string(),
            bodies,
            t0,
            speed: AtomicU64::new(0f64.to_bits()),
            stop: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            phases: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
        });
        let l = load.clone();
        rt.spawn(async move { l.replay(trace).await });
        load
    }

    fn lock_phases(&self) -> std::sync::MutexGuard<'_, Vec<Phase>> {
        self.phases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins a phase: from now on the trace is replayed `speed` times faster
    /// than it was recorded (0: no new requests).
    pub fn phase(&self, name: &str, speed: f64) {
        let now = self.t0.elapsed().as_secs_f64();
        let mut p = self.lock_phases();
        if let Some(last) = p.last_mut() {
            last.end.get_or_insert(now);
        }
        p.push(Phase { name: name.to_string(), speed, start: now, ..Phase::default() });
        self.speed.store(speed.to_bits(), Ordering::SeqCst);
    }

    /// No new requests; the phase being replayed ends.
    pub fn pause(&self) {
        self.speed.store(0f64.to_bits(), Ordering::SeqCst);
        let now = self.t0.elapsed().as_secs_f64();
        if let Some(last) = self.lock_phases().last_mut() {
            last.end.get_or_insert(now);
        }
    }

    pub fn stop(&self) {
        self.pause();
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn phases(&self) -> Vec<Phase> {
        self.lock_phases().clone()
    }

    pub fn failures(&self) -> Vec<(String, u64)> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every request that ended so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (sent, served, failed) over every phase.
    pub fn totals(&self) -> (u64, u64, u64) {
        self.lock_phases().iter().fold((0, 0, 0), |(s, o, f), p| (s + p.sent, o + p.served, f + p.failed))
    }

    async fn replay(self: Arc<Self>, trace: Trace) {
        let mut i = 0usize;
        // Trace time replayed so far; restarts from the top at the end.
        let mut at = 0.0f64;
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let now = Instant::now();
            let speed = f64::from_bits(self.speed.load(Ordering::SeqCst));
            at += now.duration_since(last).as_secs_f64() * speed;
            last = now;
            if speed <= 0.0 {
                continue;
            }
            while i < trace.rows.len() && trace.rows[i].0 <= at {
                let (_, context, generated) = trace.rows[i];
                let (body, stream, max_tokens) = self.bodies.of(&self.model, i, (context, generated));
                self.send((body, stream), max_tokens);
                i += 1;
            }
            if i == trace.rows.len() {
                at -= trace.rows.last().map(|r| r.0).unwrap_or(0.0);
                i = 0;
            }
        }
    }

    fn send(self: &Arc<Self>, (body, stream): (String, bool), max_tokens: u32) {
        let phase = {
            let mut p = self.lock_phases();
            let Some(cur) = p.last_mut() else { return };
            cur.sent += 1;
            p.len() - 1
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let r = chat(me.target, &body, stream).await;
            let took = start.elapsed().as_secs_f64();
            let ended = me.t0.elapsed().as_secs_f64();
            let (failure, ttft) = match r {
                Ok(a) => (None, a.first_token.map(|t| t.duration_since(start).as_secs_f64())),
                Err(e) => (Some(e), None),
            };
            me.requests.lock().unwrap_or_else(|e| e.into_inner()).push(Request {
                sent: start.saturating_duration_since(me.t0).as_secs_f64(),
                ended,
                stream,
                max_tokens,
                failure: failure.clone(),
                ttft,
            });
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
            {
                let mut p = me.lock_phases();
                let cur = &mut p[phase];
                match failure {
                    None => {
                        cur.served += 1;
                        cur.latencies.push(took);
                        cur.ttfts.extend(ttft);
                    }
                    Some(_) => cur.failed += 1,
                }
            }
            if let Some(f) = failure {
                let mut fs = me.failures.lock().unwrap_or_else(|e| e.into_inner());
                match fs.iter_mut().find(|(k, _)| *k == f) {
                    Some((_, n)) => *n += 1,
                    None => fs.push((f, 1)),
                }
            }
        });
    }
}

/// What a server sustains of a trace's requests when it is never idle
/// ([`closed_loop`]).
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    pub served: u64,
    pub failed: u64,
    pub seconds: f64,
    /// The answer tokens the served requests asked for.
    pub answer_tokens: u64,
}

impl Capacity {
    pub fn requests_per_second(&self) -> f64 {
        self.served as f64 / self.seconds.max(1e-9)
    }
}

/// Sends the trace's requests (its sizes, not its times) to `target` with
/// `concurrency` always in flight for `duration`: the rate a server
/// sustains of this mix, which is what makes a serving benchmark's figures
/// comparable across machines (a replica on a slower CPU is a smaller
/// share of the same offered load).
pub async fn closed_loop(
    target: SocketAddr,
    model: &str,
    shape: ChatShape,
    trace: &Trace,
    concurrency: usize,
    duration: Duration,
) -> Capacity {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (next, model) = (next.clone(), model.to_string());
            let rows: Arc<[(f64, u32, u32)]> = trace.rows.clone().into();
            tokio::spawn(async move {
                let (mut served, mut failed, mut tokens) = (0u64, 0u64, 0u64);
                while start.elapsed() < duration && !rows.is_empty() {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize % rows.len();
                    let (_, context, generated) = rows[i];
                    let (body, stream) = shape.body(&model, i, context, generated);
                    match chat(target, &body, stream).await {
                        Ok(_) => {
                            served += 1;
                            tokens += u64::from(shape.of(context, generated).1);
                        }
                        Err(_) => failed += 1,
                    }
                }
                (served, failed, tokens)
            })
        })
        .collect();
    let mut c = Capacity { served: 0, failed: 0, seconds: 0.0, answer_tokens: 0 };
    for w in workers {
        if let Ok((s, f, t)) = w.await {
            c.served += s;
            c.failed += f;
            c.answer_tokens += t;
        }
    }
    c.seconds = start.elapsed().as_secs_f64();
    c
}

/// A chat completion answered whole: for a stream, every event up to
/// `data: [DONE]`.
struct Answer {
    /// When the first generated text arrived (streams only).
    first_token: Option<Instant>,
}

/// The load generator's client, on onepool's one client stack; the bound
/// is the whole answer's, streams included.
fn client() -> &'static onepool_client::Caller {
    static CLIENT: std::sync::OnceLock<onepool_client::Caller> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| onepool_client::Caller::tcp(Duration::from_secs(180)))
}

/// One chat completion, answered whole (for a stream, up to `data:
/// [DONE]`): when its first generated text arrived (streams only), or what
/// went wrong.
pub async fn chat_once(target: SocketAddr, body: &str, stream: bool) -> Result<Option<Instant>, String> {
    chat(target, body, stream).await.map(|a| a.first_token)
}

/// The HTTPS client, once [`use_https`] was called.
static HTTPS: std::sync::OnceLock<onepool_client::Caller<onepool_client::tls::HttpsConnector>> =
    std::sync::OnceLock::new();

/// From now on every request of this process's loads goes over HTTPS to
/// an endpoint whose certificate `ca_pem` vouches for (an endpoint with
/// `[endpoint.tls]`: prompts and answers cross the network encrypted).
pub fn use_https(ca_pem: &[u8]) -> anyhow::Result<()> {
    let client =
        onepool_client::pooled_tls(onepool_client::Settings::with_connect_timeout(Duration::from_secs(180)), ca_pem)?;
    let caller = onepool_client::Caller::new(client, Duration::from_secs(180));
    HTTPS.set(caller).map_err(|_| anyhow::anyhow!("the load generator's HTTPS client is set already"))
}

/// One chat completion over its own connection (`connection: close`, so
/// the figures stay comparable with earlier runs and with clients that
/// come and go); what went wrong unless it was answered whole with 2xx.
async fn chat(target: SocketAddr, body: &str, stream: bool) -> Result<Answer, String> {
    match HTTPS.get() {
        Some(c) => exchange(c, &format!("https://{target}/v1/chat/completions"), body, stream).await,
        None => exchange(client(), &format!("http://{target}/v1/chat/completions"), body, stream).await,
    }
}

async fn exchange<C>(caller: &onepool_client::Caller<C>, uri: &str, body: &str, stream: bool) -> Result<Answer, String>
where
    C: onepool_client::Connect + Clone + Send + Sync + 'static,
{
    let req =
        caller.build(http::Method::POST, uri, Some(body), &[("connection", "close")]).map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = caller.open(req).await.map_err(|e| match e.connect_error() {
            Some(io) => format!("connect: {io}"),
            None => e.to_string(),
        })?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut answer = Vec::new();
        let mut first_token = None;
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
            let Ok(data) = frame.into_data() else { continue };
            answer.extend_from_slice(&data);
            // The first event with text in its delta (the first one only
            // names the role).
            if stream && first_token.is_none() && contains(&answer, b"\"delta\":{\"content\":\"") {
                first_token = Some(Instant::now());
            }
        }
        let text = String::from_utf8_lossy(&answer);
        if !status.is_success() {
            // Who answered and why: the router's own 503s differ from a
            // replica's only in their message.
            let status = status.as_u16();
            return Err(match error_message(&text) {
                Some(m) => format!("HTTP {status} ({m})"),
                None => format!("HTTP {status}"),
            });
        }
        let whole = if stream { text.contains("data: [DONE]") } else { text.contains("\"choices\"") };
        if !whole {
            return Err(if stream { "stream cut off before [DONE]" } else { "answer without choices" }.to_string());
        }
        Ok(Answer { first_token })
    };
    match tokio::time::timeout(Duration::from_secs(180), exchange).await {
        Ok(r) => r,
        Err(_) => Err("no whole answer within 180 s".to_string()),
    }
}

/// The message of an error answer's body: an OpenAI error's `message`,
/// else the body's first line (at most 100 characters).
fn error_message(body: &str) -> Option<String> {
    let title = || Some(body.split_once("<title>")?.1.split_once("</title>")?.0.trim().to_string());
    let message = match serde_json::from_str::<serde_json::Value>(body.trim()) {
        Ok(v) => v["error"]["message"].as_str().map(str::to_string),
        // An HTML error page (nginx's) says it in its title.
        Err(_) => title().or_else(|| body.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)),
    }?;
    Some(message.chars().take(100).collect())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(name: &str, text: &str) -> anyhow::Result<Trace> {
        let path = std::env::temp_dir().join(format!("onepool-demo-trace-{}-{name}.csv", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let r =
            Trace::load(&path).map_err(|e| anyhow::anyhow!("{}", e.to_string().replace(&*path.to_string_lossy(), "T")));
        std::fs::remove_file(&path).unwrap();
        r
    }

    #[test]
    fn an_error_answer_says_its_message() {
        let openai =
            "{\"error\":{\"message\":\"no replica became free in time; retry later\",\"type\":\"server_error\"}}";
        assert_eq!(error_message(openai).as_deref(), Some("no replica became free in time; retry later"));
        let plain = "\nreplica is draining; retry elsewhere\n";
        assert_eq!(error_message(plain).as_deref(), Some("replica is draining; retry elsewhere"));
        assert_eq!(error_message(""), None);
        let html = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n";
        assert_eq!(error_message(html).as_deref(), Some("502 Bad Gateway"));
    }

    #[test]
    fn rows_are_seconds_after_the_first_request_sorted() {
        let t = load("ok", "TIMESTAMP,ContextTokens,GeneratedTokens\n12.5,1,30\n\n10,2,20\n11,3,10\n").unwrap();
        assert_eq!(t.rows, vec![(0.0, 2, 20), (1.0, 3, 10), (2.5, 1, 30)]);
        assert_eq!(t.rate(0.0, 2.0), 1.0);
    }

    #[test]
    fn rows_become_small_chat_completions_every_other_one_streamed() {
        let s = ChatShape::DEMO;
        assert_eq!(s.of(1020, 129), (31, 8));
        assert_eq!((s.of(0, 0), s.of(100_000, 100_000)), ((8, 1), (64, 32)));
        let (body, stream) = s.body("m", 3, 320, 48);
        assert!(stream);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["max_tokens"].as_u64(), v["stream"].as_bool()),
            (Some("m"), Some(3), Some(true))
        );
        assert_eq!(v["messages"][0]["content"].as_str().unwrap().split(' ').count(), 10);
        assert!(!s.body("m", 4, 320, 48).1);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = |name, text| load(name, text).err().unwrap().to_string();
        assert_eq!(
            e("header", "a,b\n1,2,3\n"),
            "T:1: header is \"a,b\"; expected \"TIMESTAMP,ContextTokens,GeneratedTokens\""
        );
        assert_eq!(
            e("row", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n"),
            "T:2: 2 fields; expected 3 (TIMESTAMP,ContextTokens,GeneratedTokens)"
        );
        assert_eq!(e("none", "TIMESTAMP,ContextTokens,GeneratedTokens\n"), "T: no requests in the trace");
        assert_eq!(e("empty", ""), "T: no requests in the trace");
    }
}
