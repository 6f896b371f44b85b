//! One event of an engine's stream, as the router reads it: OpenAI's
//! chunks, or llama.cpp's native ones from a continuation.

use std::borrow::Cow;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
    #[serde(default)]
    pub function_call: Option<IgnoredAny>,
    /// llama-server's and SGLang's name; vLLM's newer one is `reasoning`.
    #[serde(borrow, default, alias = "reasoning")]
    pub reasoning_content: Option<Cow<'a, str>>,
}

/// A part of a streamed tool call.
#[derive(Deserialize, Default)]
pub struct ToolCallDelta<'a> {
    #[serde(default)]
    pub index: usize,
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize, Default)]
pub struct FunctionDelta<'a> {
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<Cow<'a, str>>,
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

    /// A legacy `function_call`: its parts are not checked by a replay, so
    /// the router does not follow it.
    pub fn legacy_function_call(&self) -> bool {
        let Some(choices) = &self.choices else { return false };
        choices.iter().any(|c| c.delta.as_ref().is_some_and(|d| d.function_call.is_some()))
    }
}
