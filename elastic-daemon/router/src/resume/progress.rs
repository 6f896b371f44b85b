//! What a stream has given its client so far: the engine's events read
//! (OpenAI's chunks, or llama.cpp's native ones from a continuation), and
//! what is kept to continue the stream elsewhere and finish it as one
//! answer.

use std::borrow::Cow;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::plan::Plan;
use super::Method;

/// Token ids kept per stream at most (4 bytes each); a longer answer is
/// no longer continued (its client gets today's error event).
pub const MAX_IDS: usize = 256 * 1024;
/// Answer text kept per stream at most, continuing by text.
pub const MAX_TEXT: usize = 1 << 20;

/// One event of an engine's stream, OpenAI's or llama.cpp's native one:
/// only what the router reads, borrowed where no escape forbids it.
#[derive(Deserialize, Default)]
pub struct Event<'a> {
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub created: Option<u64>,
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub system_fingerprint: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(borrow, default)]
    pub error: Option<ErrorField<'a>>,
    /// llama.cpp's native stream: its text, whether it ended and how.
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(default)]
    pub stop: Option<bool>,
    #[serde(borrow, default)]
    pub stop_type: Option<Cow<'a, str>>,
    #[serde(default)]
    pub completion_probabilities: Option<Vec<Token>>,
}

#[derive(Deserialize, Default)]
pub struct Choice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default)]
    pub delta: Option<Delta<'a>>,
    /// `/v1/completions`' text.
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
}

#[derive(Deserialize, Default)]
pub struct Delta<'a> {
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(default)]
    pub tool_calls: Option<IgnoredAny>,
    #[serde(default)]
    pub function_call: Option<IgnoredAny>,
    #[serde(borrow, default)]
    pub reasoning_content: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub struct Logprobs {
    #[serde(default)]
    pub content: Option<Vec<Token>>,
}

/// A generated token: its id and how many bytes of text it is.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// llama-server's; vLLM's log-probabilities have none (0 here: only
    /// the tokens method, llama-server's, reads ids).
    #[serde(default)]
    pub id: u32,
    #[serde(default)]
    pub bytes: ByteCount,
}

/// The length of a token's `bytes` list, read without keeping the list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteCount(pub usize);

impl<'de> Deserialize<'de> for ByteCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteCount, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = ByteCount;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of bytes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ByteCount, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(ByteCount(n))
            }
            fn visit_unit<E>(self) -> Result<ByteCount, E> {
                Ok(ByteCount(0))
            }
        }
        d.deserialize_any(Count)
    }
}

#[derive(Deserialize, Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

#[derive(Deserialize, Default)]
pub struct ErrorField<'a> {
    #[serde(borrow, default)]
    pub code: Option<Cow<'a, str>>,
}

/// The code of the launcher's event for a stream it ends because its
/// replica is reclaimed (`onepool_launcher::front`).
pub const RECLAIMED: &str = "replica_reclaimed";

impl<'a> Event<'a> {
    pub fn parse(data: &'a [u8]) -> Option<Event<'a>> {
        serde_json::from_slice(data).ok()
    }

    /// The first choice (the only one: a plan has one).
    pub fn choice(&self) -> Option<&Choice<'a>> {
        self.choices.as_ref()?.first()
    }

    /// The text this event adds, in either API or llama.cpp's own.
    pub fn text(&self) -> Option<&str> {
        match self.choice() {
            Some(c) => c.delta.as_ref().and_then(|d| d.content.as_deref()).or(c.text.as_deref()),
            None => self.content.as_deref(),
        }
    }

    /// The token ids this event adds (with log-probabilities asked for).
    pub fn tokens(&self) -> &[Token] {
        match self.choice() {
            Some(c) => c.logprobs.as_ref().and_then(|l| l.content.as_deref()).unwrap_or_default(),
            None => self.completion_probabilities.as_deref().unwrap_or_default(),
        }
    }

    /// The answer's end, as OpenAI names it.
    pub fn finish_reason(&self) -> Option<Cow<'a, str>> {
        if let Some(c) = self.choice() {
            return c.finish_reason.clone();
        }
        if self.stop != Some(true) {
            return None;
        }
        Some(Cow::Borrowed(match self.stop_type.as_deref() {
            Some("limit") => "length",
            _ => "stop",
        }))
    }

    /// What the router cannot continue: tool calls, reasoning kept apart
    /// from the answer, a choice other than the first.
    pub fn unfollowable(&self) -> bool {
        let Some(choices) = &self.choices else { return false };
        choices.iter().any(|c| {
            c.index != 0
                || c.delta.as_ref().is_some_and(|d| {
                    d.tool_calls.is_some()
                        || d.function_call.is_some()
                        || d.reasoning_content.as_deref().is_some_and(|r| !r.is_empty())
                })
        })
    }
}

/// The answer's identity, as its client first saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub fingerprint: Option<String>,
}

impl Meta {
    pub fn of(e: &Event<'_>) -> Option<Meta> {
        Some(Meta {
            id: e.id.as_deref()?.to_string(),
            created: e.created.unwrap_or_else(now),
            model: e.model.as_deref().unwrap_or_default().to_string(),
            fingerprint: e.system_fingerprint.as_deref().map(str::to_string),
        })
    }

    /// For an answer whose first replica named none (cut before its first
    /// event): an id of the router's own.
    pub fn made_up(plan: &Plan) -> Meta {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = match plan.api {
            super::plan::Api::Chat => "chatcmpl",
            super::plan::Api::Completion => "cmpl",
        };
        Meta {
            id: format!("{prefix}-onepool{nanos:x}{n:x}"),
            created: now(),
            model: plan.model.clone(),
            fingerprint: None,
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the client has of its answer.
#[derive(Debug)]
pub struct Progress {
    pub method: Method,
    pub meta: Option<Meta>,
    /// Token ids generated so far (continuing by tokens).
    ids: Vec<u32>,
    /// The first `settled` ids are in the client's text whole.
    settled: usize,
    /// Bytes of the ids after `settled`.
    token_bytes: usize,
    /// Bytes of text the client got after the settled ids.
    text_bytes: usize,
    /// The client's text (continuing by text).
    text: String,
    /// Text events counted (continuing by text, where ids are unknown),
    /// and how many of the last ones were empty: tokens whose character
    /// the engine holds back until it is whole, which a continuation by
    /// text generates again.
    text_events: u64,
    trailing_empty: u64,
    pub finish: Option<String>,
    pub usage_seen: bool,
    pub done: bool,
    /// Past what is kept: no longer continued.
    pub overflow: bool,
}

impl Progress {
    pub fn new(method: Method) -> Progress {
        Progress {
            method,
            meta: None,
            ids: Vec::new(),
            settled: 0,
            token_bytes: 0,
            text_bytes: 0,
            text: String::new(),
            text_events: 0,
            trailing_empty: 0,
            finish: None,
            usage_seen: false,
            done: false,
            overflow: false,
        }
    }

    /// Heap bytes kept for the stream.
    pub fn kept_bytes(&self) -> usize {
        self.ids.capacity() * 4 + self.text.capacity()
    }

    /// Tokens of the answer the client has (or will have: ids not yet in
    /// the text are regenerated by a continuation, not counted twice).
    pub fn completion_tokens(&self) -> u64 {
        match self.method {
            Method::Tokens => self.ids.len() as u64,
            Method::Text => self.text_events,
        }
    }

    pub fn note_tokens(&mut self, tokens: &[Token]) {
        if self.method != Method::Tokens || tokens.is_empty() {
            return;
        }
        if self.ids.len() + tokens.len() > MAX_IDS {
            self.overflow = true;
            return;
        }
        for t in tokens {
            self.ids.push(t.id);
            self.token_bytes += t.bytes.0;
        }
    }

    /// Text an event sent the client (after the tokens it came from); by
    /// text, each such event counts as a token (an empty one too: a
    /// token whose character is not whole yet).
    pub fn note_text(&mut self, text: &str) {
        match self.method {
            Method::Tokens if text.is_empty() => {}
            Method::Tokens => {
                self.text_bytes += text.len();
                if self.text_bytes >= self.token_bytes {
                    self.settled = self.ids.len();
                    (self.token_bytes, self.text_bytes) = (0, 0);
                }
            }
            Method::Text => {
                self.text_events += 1;
                self.trailing_empty = if text.is_empty() { self.trailing_empty + 1 } else { 0 };
                if self.text.len() + text.len() > MAX_TEXT {
                    self.overflow = true;
                } else {
                    self.text.push_str(text);
                }
            }
        }
    }

    /// By text, the tokens at the end whose character the client does not
    /// have whole: a continuation generates them again, and the client has
    /// their log-probabilities already.
    pub fn regenerated(&self) -> usize {
        self.trailing_empty as usize
    }

    /// Where a continuation starts: the ids whose text the client has
    /// whole (those after are generated again), and how many bytes of the
    /// continuation's first text the client already has (a character cut
    /// across tokens, sent in part).
    pub fn resume_point(&mut self) -> (&[u32], usize) {
        // By text, tokens whose character is not whole are generated again.
        self.text_events -= std::mem::take(&mut self.trailing_empty);
        self.ids.truncate(self.settled);
        self.token_bytes = 0;
        // The continuation's text is counted from the settled ids again.
        let skip = std::mem::take(&mut self.text_bytes);
        (&self.ids, skip)
    }

    /// The client's text so far (continuing by text).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(list: &[(u32, usize)]) -> Vec<Token> {
        list.iter().map(|&(id, n)| Token { id, bytes: ByteCount(n) }).collect()
    }

    #[test]
    fn llama_server_s_events_read_in_both_forms() {
        let chat = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Bon"},"logprobs":{"content":[{"id":30904,"token":"Bon","bytes":[66,111,110],"logprob":-1.85,"top_logprobs":[{"id":30904,"token":"Bon","bytes":[66,111,110],"logprob":-1.8}]}]}}],"created":1796604796,"id":"chatcmpl-v","model":"m.gguf","system_fingerprint":"b1","object":"chat.completion.chunk"}"#;
        let e = Event::parse(chat).unwrap();
        assert_eq!((e.text(), e.tokens(), e.finish_reason()), (Some("Bon"), &toks(&[(30904, 3)])[..], None));
        let m = Meta::of(&e).unwrap();
        assert_eq!((m.id.as_str(), m.created, m.fingerprint.as_deref()), ("chatcmpl-v", 1796604796, Some("b1")));
        let native = br##"{"index":0,"content":"#","tokens":[19],"stop":false,"id_slot":-1,"tokens_predicted":1,"completion_probabilities":[{"id":19,"token":"#","bytes":[35],"logprob":-1.9,"top_logprobs":[]}]}"##;
        let e = Event::parse(native).unwrap();
        assert_eq!((e.text(), e.tokens(), e.finish_reason()), (Some("#"), &toks(&[(19, 1)])[..], None));
        let end = br#"{"index":0,"content":"","tokens":[],"stop":true,"stop_type":"limit","tokens_predicted":3}"#;
        assert_eq!(Event::parse(end).unwrap().finish_reason().as_deref(), Some("length"));
        let eos = br#"{"content":"","stop":true,"stop_type":"eos"}"#;
        assert_eq!(Event::parse(eos).unwrap().finish_reason().as_deref(), Some("stop"));
        let completion = br#"{"choices":[{"text":"-","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"completion_tokens":2,"prompt_tokens":1}}"#;
        let e = Event::parse(completion).unwrap();
        assert_eq!((e.text(), e.finish_reason().as_deref()), (Some("-"), Some("length")));
        assert_eq!(e.usage, Some(Usage { prompt_tokens: 1, completion_tokens: 2 }));
        let cut = br#"{"error":{"message":"m","type":"server_error","code":"replica_reclaimed"}}"#;
        assert_eq!(Event::parse(cut).unwrap().error.unwrap().code.as_deref(), Some(RECLAIMED));
        let tool = br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#;
        assert!(Event::parse(tool).unwrap().unfollowable());
        let think = br#"{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#;
        assert!(Event::parse(think).unwrap().unfollowable());
        assert!(Event::parse(b"{\"choices\":[{\"index\":1}]}").unwrap().unfollowable());
        assert!(Event::parse(b"not json").is_none());
    }

    #[test]
    fn a_character_cut_across_tokens_is_generated_again_and_its_sent_part_skipped() {
        let mut p = Progress::new(Method::Tokens);
        p.note_tokens(&toks(&[(1, 2)]));
        p.note_text("ab");
        // "é" (2 bytes) and "ü" (2 bytes) over three tokens of 1, 2 and 1
        // bytes: after the second the server sends "é" alone.
        p.note_tokens(&toks(&[(2, 1)]));
        p.note_text("");
        p.note_tokens(&toks(&[(3, 2)]));
        p.note_text("é");
        assert_eq!(p.completion_tokens(), 3);
        let (ids, skip) = p.resume_point();
        assert_eq!((ids, skip), (&[1u32][..], 2));
        assert_eq!(p.completion_tokens(), 1);
        // A whole character settles every id before it.
        let mut p = Progress::new(Method::Tokens);
        p.note_tokens(&toks(&[(5, 1), (6, 1)]));
        p.note_text("é");
        assert_eq!(p.resume_point(), (&[5u32, 6][..], 0));
    }

    #[test]
    fn by_text_the_answer_is_kept_and_what_is_kept_is_bounded() {
        let mut p = Progress::new(Method::Text);
        p.note_text("Bon");
        p.note_text("jour");
        p.note_text("");
        assert_eq!((p.text(), p.completion_tokens()), ("Bonjour", 3));
        // The empty event was a token whose character is not whole yet: a
        // continuation by text generates it again.
        assert_eq!(p.resume_point(), (&[][..], 0));
        assert_eq!(p.completion_tokens(), 2);
        let big = "x".repeat(MAX_TEXT);
        p.note_text(&big);
        assert!(p.overflow);
        let mut p = Progress::new(Method::Tokens);
        p.note_tokens(&vec![Token { id: 1, bytes: ByteCount(1) }; MAX_IDS + 1]);
        assert!(p.overflow && p.kept_bytes() == 0);
    }
}
