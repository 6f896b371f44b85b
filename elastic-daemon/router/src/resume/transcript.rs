//! What the client has of its answer, field by field and choice by
//! choice: the text a continuation by text prefills, and what an answer
//! generated again from its start must reproduce before anything new of
//! it passes (a replay, issue #51).

use super::chunk::Event;

/// Answer text kept per stream at most (its fields together); a longer
/// answer is no longer continued.
pub const MAX_SENT: usize = 1 << 20;

/// Choices of an answer, and tool calls of a choice, at most: an index
/// past them is no answer's (and would make the router keep a list as
/// long as the engine says).
pub const MAX_INDEX: usize = 128;

/// One choice as its client has it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sent {
    pub reasoning: String,
    /// `content`, or a completion's `text`.
    pub content: String,
    pub tools: Vec<ToolSent>,
    /// Log-probability entries that came with it (the client's, or those
    /// the router asked for and took out).
    pub logprobs: usize,
    pub finished: bool,
}

/// A streamed tool call as its client has it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ToolSent {
    /// The client has its id (an engine makes a new one each time it
    /// generates the call, so a replay's is left out).
    pub id: bool,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Default)]
pub struct Transcript {
    pub choices: Vec<Sent>,
    bytes: usize,
    /// Past [`MAX_SENT`]: no longer continued.
    pub overflow: bool,
}

impl Transcript {
    fn choice(&mut self, index: usize) -> Option<&mut Sent> {
        // Choices come in order; an index far past them is no answer's.
        if index > self.choices.len() || index >= MAX_INDEX {
            self.overflow = true;
            return None;
        }
        if index == self.choices.len() {
            self.choices.push(Sent::default());
        }
        self.choices.get_mut(index)
    }

    fn push(&mut self, index: usize, field: impl Fn(&mut Sent) -> &mut String, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.bytes + text.len() > MAX_SENT {
            self.overflow = true;
            return;
        }
        self.bytes += text.len();
        if let Some(c) = self.choice(index) {
            field(c).push_str(text);
        }
    }

    /// What an event passed to the client adds.
    pub fn record(&mut self, e: &Event<'_>) {
        let Some(choices) = &e.choices else {
            // llama.cpp's native stream: one choice, text only.
            let tokens = e.completion_probabilities.as_ref().map_or(0, Vec::len);
            return self.record_native(e.content.as_deref().unwrap_or_default(), tokens, e.stop == Some(true));
        };
        for c in choices {
            let i = c.index as usize;
            if let Some(d) = &c.delta {
                if let Some(r) = d.reasoning_content.as_deref() {
                    self.push(i, |s| &mut s.reasoning, r);
                }
                if let Some(t) = d.content.as_deref() {
                    self.push(i, |s| &mut s.content, t);
                }
                for tc in d.tool_calls.iter().flatten() {
                    let Some(sent) = self.choice(i) else { return };
                    if tc.index > sent.tools.len() || tc.index >= MAX_INDEX {
                        self.overflow = true;
                        return;
                    }
                    if tc.index == sent.tools.len() {
                        sent.tools.push(ToolSent::default());
                    }
                    sent.tools[tc.index].id |= tc.id.is_some();
                    let f = tc.function.as_ref();
                    let j = tc.index;
                    if let Some(n) = f.and_then(|f| f.name.as_deref()) {
                        self.push(i, |s| &mut s.tools[j].name, n);
                    }
                    if let Some(a) = f.and_then(|f| f.arguments.as_deref()) {
                        self.push(i, |s| &mut s.tools[j].arguments, a);
                    }
                }
            }
            if let Some(t) = c.text.as_deref() {
                self.push(i, |s| &mut s.content, t);
            }
            let Some(sent) = self.choice(i) else { return };
            sent.logprobs += c.logprobs.as_ref().and_then(|l| l.content.as_ref()).map_or(0, Vec::len);
            sent.finished |= c.finish_reason.is_some();
        }
    }

    /// What a continuation on llama.cpp's native API gave the client:
    /// `text` (after what it had), with `tokens` log-probability entries.
    pub fn record_native(&mut self, text: &str, tokens: usize, finished: bool) {
        self.push(0, |c| &mut c.content, text);
        if let Some(c) = self.choice(0) {
            c.logprobs += tokens;
            c.finished |= finished;
        }
    }

    /// Text of the first choice, for a continuation by text.
    pub fn content(&self) -> &str {
        self.choices.first().map_or("", |c| c.content.as_str())
    }

    /// A continuation by text cannot go on from here: the client has
    /// reasoning kept apart, a tool call begun, or another choice.
    pub fn beyond_text(&self) -> bool {
        self.choices.len() > 1 || self.choices.iter().any(|c| !c.reasoning.is_empty() || !c.tools.is_empty())
    }

    /// The client has nothing of the answer yet (a role at most): sending
    /// the request again is continuing it.
    pub fn is_empty(&self) -> bool {
        self.choices.iter().all(|c| c.reasoning.is_empty() && c.content.is_empty() && c.tools.is_empty())
    }

    /// Every one of `n` choices has its finish reason.
    pub fn finished(&self, n: u32) -> bool {
        self.choices.len() >= n as usize && self.choices.iter().all(|c| c.finished)
    }

    /// Heap bytes kept.
    pub fn kept_bytes(&self) -> usize {
        self.choices
            .iter()
            .map(|c| {
                c.reasoning.capacity()
                    + c.content.capacity()
                    + c.tools.iter().map(|t| t.name.capacity() + t.arguments.capacity()).sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(t: &mut Transcript, events: &[&str]) {
        for e in events {
            t.record(&Event::parse(e.as_bytes()).unwrap());
        }
    }

    #[test]
    fn each_field_of_each_choice_is_kept_in_order() {
        let mut t = Transcript::default();
        record(
            &mut t,
            &[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Let me"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning":" see"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"content":"Call"},"logprobs":{"content":[{"id":1,"bytes":[1]}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get","arguments":""}}]}}]}"#,
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#,
                r#"{"choices":[{"index":1,"delta":{"content":"other"}}]}"#,
            ],
        );
        assert!(!t.overflow && t.beyond_text());
        assert_eq!(t.choices[0].reasoning, "Let me see");
        assert_eq!(t.content(), "Call");
        assert_eq!(t.choices[0].tools, [ToolSent { id: true, name: "get".into(), arguments: "{\"a\":".into() }]);
        assert_eq!((t.choices[0].logprobs, t.choices[1].content.as_str()), (1, "other"));
        assert!(!t.finished(2));
        record(
            &mut t,
            &[
                r#"{"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            ],
        );
        assert!(t.finished(2) && !t.finished(3));
    }

    #[test]
    fn plain_text_stays_within_a_continuation_by_text_and_what_is_kept_is_bounded() {
        let mut t = Transcript::default();
        record(&mut t, &[r#"{"choices":[{"index":0,"text":"Once"}]}"#, r#"{"content":" upon","stop":true}"#]);
        assert_eq!((t.content(), t.beyond_text(), t.finished(1)), ("Once upon", false, true));
        // An index no answer has: not kept, and not continued.
        record(&mut t, &[r#"{"choices":[{"index":9,"delta":{"content":"x"}}]}"#]);
        assert!(t.overflow);
        let mut t = Transcript::default();
        let big = format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{}"}}}}]}}"#, "x".repeat(MAX_SENT));
        record(&mut t, &[r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#, &big]);
        assert!(t.overflow && t.content() == "a");
    }
}
