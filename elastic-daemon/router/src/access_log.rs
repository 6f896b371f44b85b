//! onepoold's access log (issue #26): one JSON line per request that
//! reached an endpoint, as a gateway's user expects — when it came, the
//! endpoint and model, the status, the tokens in and out where the model
//! server counted them, the time to the first byte and to the last, and
//! the replica that answered ([`AccessEntry`]). `onepool simulate` reads
//! the file back as an inference trace.
//!
//! The request path never waits for the disk ([`crate::line_log`]): a
//! line that finds the writer's queue full is dropped and counted
//! (`onepool_router_access_log_dropped_total`) rather than slowing
//! requests, and the file rotates before a line would take it past its
//! size. What a client chose (the model's name: the other fields are the
//! router's own, the endpoint's configured name and the replica's address)
//! is bounded by [`client_field`], so a line is never more than a few KiB
//! whatever a client sends.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;

pub use crate::line_log::{LineLog as AccessLog, LineLogSettings as AccessLogSettings};
use onepool_decisions::trace::{format_time_ms, AccessEntry};

/// The response bytes kept to find the server's token counts in: its
/// `usage` object is at the end of a completion (and of a stream's last
/// event).
const TAIL: usize = 2048;

/// The most bytes of a value a client chose that a line keeps. A model's
/// name is tens of bytes; a 4 MB one made each line 4 MB, and so each file,
/// whatever `max_file_bytes` said.
pub const MAX_CLIENT_FIELD_BYTES: usize = 256;

/// A value a client chose, as the log keeps it: past
/// [`MAX_CLIENT_FIELD_BYTES`] it is cut (at a character boundary) and ends
/// in a mark with the length it had, so that a reader sees it was cut and
/// the line is still one JSON object of the same shape.
pub fn client_field(mut value: String) -> String {
    if value.len() <= MAX_CLIENT_FIELD_BYTES {
        return value;
    }
    let len = value.len();
    let mut cut = MAX_CLIENT_FIELD_BYTES;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    value.truncate(cut);
    let _ = write!(value, "...[truncated from {len} bytes]");
    // The long value's memory goes now, not when the answer ends.
    value.shrink_to_fit();
    value
}

/// What the access log needs from a request's body: its model (bounded:
/// [`client_field`]) and whether it streams. Read only when the log is on.
#[derive(Default)]
pub struct RequestFacts {
    model: Option<String>,
    stream: bool,
}

impl RequestFacts {
    pub fn of(body: &[u8]) -> RequestFacts {
        #[derive(serde::Deserialize)]
        struct Fields {
            #[serde(default)]
            model: Option<serde_json::Value>,
            #[serde(default)]
            stream: Option<serde_json::Value>,
        }
        if body.is_empty() {
            return RequestFacts::default();
        }
        let Ok(f) = serde_json::from_slice::<Fields>(body) else { return RequestFacts::default() };
        RequestFacts {
            model: match f.model {
                Some(serde_json::Value::String(m)) => Some(client_field(m)),
                _ => None,
            },
            stream: matches!(f.stream, Some(serde_json::Value::Bool(true))),
        }
    }
}

/// Watches one response on its way to the client and writes its line when
/// it ends (or is dropped: the client went away).
pub struct Tap {
    log: Arc<AccessLog>,
    endpoint: String,
    facts: RequestFacts,
    arrived: SystemTime,
    start: Instant,
    status: u16,
    replica: Option<SocketAddr>,
    first_byte: Option<Instant>,
    tail: Vec<u8>,
    written: bool,
    /// Times the answer moved to another replica.
    pub moved: u32,
    /// The request's class (issue #44), on an endpoint with classes.
    pub class: Option<String>,
    /// Why the router answered it itself ([`Refused`]).
    pub reason: Option<&'static str>,
    /// Whether its answer was followed, or why not (issue #51 item 6).
    pub followed: Option<&'static str>,
}

/// Why the router answered a request itself (a refusal, or no replica's
/// answer), put in the response's extensions for its access line.
#[derive(Clone, Copy, Debug)]
pub struct Refused(pub &'static str);

impl Tap {
    pub fn new(
        log: Arc<AccessLog>,
        endpoint: &str,
        facts: RequestFacts,
        start: Instant,
        status: u16,
        replica: Option<SocketAddr>,
    ) -> Tap {
        let arrived = SystemTime::now().checked_sub(start.elapsed()).unwrap_or_else(SystemTime::now);
        Tap {
            log,
            endpoint: endpoint.to_string(),
            facts,
            arrived,
            start,
            status,
            replica,
            first_byte: None,
            tail: Vec::new(),
            written: false,
            moved: 0,
            class: None,
            reason: None,
            followed: None,
        }
    }

    pub fn data(&mut self, data: &Bytes) {
        if data.is_empty() {
            return;
        }
        self.first_byte.get_or_insert_with(Instant::now);
        self.tail.extend_from_slice(&data[data.len().saturating_sub(TAIL)..]);
        if self.tail.len() > TAIL {
            self.tail.drain(..self.tail.len() - TAIL);
        }
    }

    /// The response ended: whole (`complete`) or not.
    pub fn end(&mut self, complete: bool) {
        if std::mem::replace(&mut self.written, true) {
            return;
        }
        let now = Instant::now();
        let since = |t: Instant| t.saturating_duration_since(self.start).as_secs_f64();
        let unix = self.arrived.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let entry = AccessEntry {
            time: format_time_ms(unix),
            endpoint: self.endpoint.clone(),
            model: self.facts.model.take(),
            status: self.status,
            stream: self.facts.stream,
            prompt_tokens: prompt_tokens(&self.tail),
            completion_tokens: count_after(&self.tail, b"\"completion_tokens\":")
                .or_else(|| count_after(&self.tail, b"\"predicted_n\":")),
            ttfb_s: self.first_byte.map(since),
            latency_s: since(now),
            replica: self.replica.map(|r| r.to_string()),
            complete,
            moved: self.moved,
            class: self.class.take(),
            reason: self.reason.map(str::to_string),
            followed: self.followed.map(str::to_string),
        };
        if let Ok(line) = serde_json::to_string(&entry) {
            self.log.send(line);
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// The prompt's tokens: the OpenAI `usage`, else llama.cpp's `timings`,
/// which a stream's last chunk carries without being asked (`usage` only
/// with `stream_options.include_usage`): the tokens it processed
/// (`prompt_n`) and those its prompt cache held (`cache_n`).
fn prompt_tokens(tail: &[u8]) -> Option<u64> {
    count_after(tail, b"\"prompt_tokens\":").or_else(|| {
        let n = count_after(tail, b"\"prompt_n\":")?;
        Some(n + count_after(tail, b"\"cache_n\":").unwrap_or(0))
    })
}

/// The number after the last `key` in `tail` (`"prompt_tokens": 31`).
fn count_after(tail: &[u8], key: &[u8]) -> Option<u64> {
    let at = tail.windows(key.len()).rposition(|w| w == key)? + key.len();
    let rest = &tail[at..];
    let digits: Vec<u8> =
        rest.iter().skip_while(|b| b.is_ascii_whitespace()).take_while(|b| b.is_ascii_digit()).copied().collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Which replica answered, put in the response's extensions by the proxy.
#[derive(Clone, Copy, Debug)]
pub struct ServedBy(pub SocketAddr);

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::path::PathBuf;
    use std::time::Duration;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onepool-access-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn usage_counts_are_read_from_the_end_of_the_answer() {
        let body = br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens": 8,"prompt_tokens":31,"total_tokens":39}}"#;
        assert_eq!(count_after(body, b"\"prompt_tokens\":"), Some(31));
        assert_eq!(count_after(body, b"\"completion_tokens\":"), Some(8));
        assert_eq!(count_after(b"data: [DONE]", b"\"prompt_tokens\":"), None);
        assert_eq!(count_after(br#""prompt_tokens":x"#, b"\"prompt_tokens\":"), None);
    }

    /// llama-server's last stream chunk (this build, measured): no
    /// `usage` unless asked, but `timings`.
    #[test]
    fn a_llama_server_stream_is_counted_from_its_timings() {
        let tail = br#"data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk","timings":{"cache_n":12,"prompt_n":31,"prompt_ms":124.2,"predicted_n":5,"predicted_ms":52.7}}

data: [DONE]

"#;
        assert_eq!(prompt_tokens(tail), Some(43));
        let usage = br#"{"usage":{"completion_tokens":8,"prompt_tokens":31},"timings":{"prompt_n":2}}"#;
        assert_eq!(prompt_tokens(usage), Some(31), "usage first");
        assert_eq!(prompt_tokens(b"data: [DONE]"), None);
    }

    #[test]
    fn what_a_client_chose_is_cut_with_a_mark_at_a_character_boundary() {
        assert_eq!(client_field("SmolLM2-135M-Instruct".into()), "SmolLM2-135M-Instruct");
        let exact = "m".repeat(MAX_CLIENT_FIELD_BYTES);
        assert_eq!(client_field(exact.clone()), exact);
        let long = client_field("x".repeat(4 << 20));
        assert_eq!(long, format!("{}...[truncated from 4194304 bytes]", "x".repeat(MAX_CLIENT_FIELD_BYTES)));
        // 'é' is two bytes: the cut falls inside the last one that fits.
        let cut = client_field(format!("a{}", "é".repeat(200)));
        assert_eq!(cut, format!("a{}...[truncated from 401 bytes]", "é".repeat(127)));
    }

    /// A 4 MB model name made every line, and so every file, 4 MB against
    /// a 200 KB `max_file_bytes`: now its line is written, bounded and
    /// marked, and still reads as an entry.
    #[test]
    fn a_huge_model_name_is_logged_cut_and_no_file_passes_its_size() {
        let d = dir("huge");
        let path = d.join("access.jsonl");
        let s = AccessLogSettings { path: path.clone(), max_file_bytes: 4096, keep_files: 3 };
        let dropped = Counter::default();
        let log = AccessLog::start("access log", s.clone(), dropped.clone()).unwrap();
        let body = serde_json::json!({ "model": "x".repeat(4 << 20), "stream": true }).to_string();
        for _ in 0..4 {
            drop(Tap::new(log.clone(), "chat", RequestFacts::of(body.as_bytes()), Instant::now(), 200, None));
        }
        drop(Tap::new(log.clone(), "last", RequestFacts::of(br#"{"model":"m"}"#), Instant::now(), 200, None));
        drop(log);
        let wait = Instant::now();
        while !std::fs::read_to_string(&path).unwrap_or_default().contains("\"last\"") {
            assert!(wait.elapsed() < Duration::from_secs(10), "the last line never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut entries = Vec::new();
        for p in s.files_oldest_first().iter().filter(|p| p.exists()) {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.len() <= 4096, "{}: {} bytes", p.display(), text.len());
            entries.extend(text.lines().map(|l| serde_json::from_str::<AccessEntry>(l).unwrap()));
        }
        assert_eq!(entries.len(), 5, "{entries:#?}");
        let cut = format!("{}...[truncated from 4194304 bytes]", "x".repeat(MAX_CLIENT_FIELD_BYTES));
        assert!(entries[..4].iter().all(|e| e.model.as_deref() == Some(cut.as_str()) && e.stream), "{entries:#?}");
        assert_eq!(entries[4].model.as_deref(), Some("m"));
        assert_eq!(dropped.get(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_file_rotates_at_its_size_and_keeps_what_it_is_told() {
        let d = dir("rotate");
        let path = d.join("access.jsonl");
        let s = AccessLogSettings { path: path.clone(), max_file_bytes: 600, keep_files: 2 };
        let dropped = Counter::default();
        let log = AccessLog::start("access log", s, dropped.clone()).unwrap();
        for i in 0..12 {
            let name = if i == 11 { "last" } else { "chat" };
            drop(Tap::new(log.clone(), name, RequestFacts::default(), Instant::now(), 200, None));
        }
        drop(log);
        let wait = Instant::now();
        while !std::fs::read_to_string(&path).unwrap_or_default().contains("\"last\"") {
            assert!(wait.elapsed() < Duration::from_secs(10), "the last line never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        let files = [path.with_extension("jsonl.2"), path.with_extension("jsonl.1"), path.clone()];
        let mut lines: Vec<String> = Vec::new();
        for p in &files {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.len() <= 600 && !text.is_empty(), "{}: {} bytes", p.display(), text.len());
            lines.extend(text.lines().map(str::to_string));
        }
        assert!(!path.with_extension("jsonl.3").exists(), "only 2 rotated files are kept");
        // 12 lines of about 170 bytes, 3 to a file: the oldest went.
        assert!(lines.len() < 12, "{lines:#?}");
        let entries: Vec<AccessEntry> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(entries.last().map(|e| e.endpoint.as_str()), Some("last"));
        assert_eq!(dropped.get(), 0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_first_lines_say_what_happened() {
        let d = dir("lines");
        let path = d.join("a.jsonl");
        let log = AccessLog::start(
            "access log",
            AccessLogSettings { path: path.clone(), max_file_bytes: 1 << 20, keep_files: 1 },
            Counter::default(),
        )
        .unwrap();
        let facts = RequestFacts::of(br#"{"model":"m","stream":true}"#);
        let mut tap = Tap::new(log.clone(), "chat", facts, Instant::now(), 200, Some("127.0.0.1:9".parse().unwrap()));
        tap.data(&Bytes::from_static(b"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n"));
        tap.end(true);
        drop(tap);
        drop(Tap::new(log.clone(), "chat", RequestFacts::of(b"not json"), Instant::now(), 503, None));
        drop(log);
        let wait = Instant::now();
        while std::fs::read_to_string(&path).unwrap_or_default().lines().count() < 2
            && wait.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let e: Vec<AccessEntry> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(e.len(), 2, "{text}");
        assert_eq!((e[0].model.as_deref(), e[0].stream, e[0].status, e[0].complete), (Some("m"), true, 200, true));
        assert_eq!((e[0].prompt_tokens, e[0].completion_tokens), (Some(5), Some(2)));
        assert_eq!(e[0].replica.as_deref(), Some("127.0.0.1:9"));
        assert!(e[0].ttfb_s.is_some() && e[0].latency_s >= e[0].ttfb_s.unwrap());
        assert_eq!(
            (e[1].status, e[1].replica.as_deref(), e[1].complete, e[1].model.as_deref()),
            (503, None, false, None)
        );
        assert!(e[0].as_request().is_ok() && e[1].as_request().is_err());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o640);
        let _ = std::fs::remove_dir_all(&d);
    }
}
