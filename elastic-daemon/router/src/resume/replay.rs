//! An answer generated again from its start on another replica (issue
//! #51): the shapes a prefill cannot continue (a tool call cut half-way,
//! reasoning kept apart, a grammar or JSON schema, several choices) are
//! asked again as their first attempt was, with the seed the router gave
//! it, and the engine parses them itself. What the client has is checked
//! against what comes again and left out; only what is new passes. An
//! answer that comes out otherwise is said, never spliced.

use serde_json::{Map, Value};

use super::transcript::{Sent, Transcript, MAX_INDEX};

/// How far the answer generated again has come through what the client
/// has, per choice.
#[derive(Debug, Default)]
pub struct Replay {
    at: Vec<Cursor>,
}

#[derive(Debug, Default, Clone)]
struct Cursor {
    reasoning: usize,
    content: usize,
    /// Per tool call: bytes of its name and of its arguments.
    tools: Vec<(usize, usize)>,
    logprobs: usize,
}

static EMPTY: Sent =
    Sent { reasoning: String::new(), content: String::new(), tools: Vec::new(), logprobs: 0, finished: false };

impl Cursor {
    /// Past what the client had (a cursor goes on with what passes, which
    /// the client then has).
    fn caught_up(&self, sent: &Sent) -> bool {
        self.reasoning >= sent.reasoning.len()
            && self.content >= sent.content.len()
            && sent
                .tools
                .iter()
                .enumerate()
                .all(|(j, t)| self.tools.get(j).is_some_and(|&(n, a)| n >= t.name.len() && a >= t.arguments.len()))
    }
}

/// What `s`, the next text of a field whose client has `have`, adds,
/// `at` bytes of it come again so far: `""` while it repeats what the
/// client has. `at` goes on with what it adds.
fn consume<'s>(have: &str, at: &mut usize, s: &'s str) -> Result<&'s str, String> {
    let differs = || "its text differs from what the client has".to_string();
    let left = have.as_bytes().get(*at..).unwrap_or_default();
    if s.len() <= left.len() {
        if !left.starts_with(s.as_bytes()) {
            return Err(differs());
        }
        *at += s.len();
        return Ok("");
    }
    if !s.as_bytes().starts_with(left) {
        return Err(differs());
    }
    *at += s.len();
    s.get(left.len()..).ok_or_else(differs)
}

/// Sets the string at `key` of `obj` to what it adds, or takes the key
/// out when it adds nothing. `Ok(true)`: it added something.
fn trim(obj: &mut Map<String, Value>, key: &str, have: &str, at: &mut usize) -> Result<bool, String> {
    let Some(Value::String(s)) = obj.get(key) else { return Ok(false) };
    if *at >= have.len() {
        // All new, an empty one too (a token whose character is not whole
        // yet: the client counts it as the uninterrupted answer's).
        *at += s.len();
        return Ok(!s.is_empty());
    }
    let new = consume(have, at, s)?.to_string();
    let added = !new.is_empty();
    match added {
        true => obj.insert(key.into(), Value::String(new)),
        false => obj.remove(key),
    };
    Ok(added)
}

impl Replay {
    /// The event `e` of the answer generated again, with what the client
    /// has of it taken out; `Err` when the answer differs from it.
    pub fn skip(&mut self, sent: &Transcript, e: &mut Map<String, Value>) -> Result<(), String> {
        let Some(Value::Array(choices)) = e.get_mut("choices") else { return Ok(()) };
        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
            let i = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            let have = sent.choices.get(i).unwrap_or(&EMPTY);
            if self.at.len() <= i {
                if i >= MAX_INDEX {
                    return Err(format!("choice {i} is no answer's"));
                }
                self.at.resize(i + 1, Cursor::default());
            }
            let at = &mut self.at[i];
            let mut added = false;
            if let Some(Value::Object(d)) = c.get_mut("delta") {
                added |= trim(d, "reasoning_content", &have.reasoning, &mut at.reasoning)?;
                added |= trim(d, "reasoning", &have.reasoning, &mut at.reasoning)?;
                added |= trim(d, "content", &have.content, &mut at.content)?;
                added |= tool_calls(d, have, at)?;
            }
            if c.get("text").is_some_and(Value::is_string) {
                added |= trim(c, "text", &have.content, &mut at.content)?;
                c.entry("text").or_insert(Value::String(String::new()));
            }
            if let Some(list) = c.get_mut("logprobs").and_then(|l| l.get_mut("content")).and_then(Value::as_array_mut) {
                let had = have.logprobs.saturating_sub(at.logprobs).min(list.len());
                list.drain(..had);
                at.logprobs += had + list.len();
                if list.is_empty() && had > 0 {
                    c.insert("logprobs".into(), Value::Null);
                }
            }
            let caught_up = at.caught_up(have);
            if added && (!caught_up || have.finished) {
                return Err(format!("choice {i} goes another way than what the client has"));
            }
            if c.get("finish_reason").is_some_and(|f| !f.is_null()) {
                if !caught_up {
                    return Err(format!("choice {i} ended short of what the client has"));
                }
                if have.finished {
                    // The client has this choice's end already.
                    c.insert("finish_reason".into(), Value::Null);
                }
            }
        }
        Ok(())
    }
}

/// The tool calls of a delta with what the client has of them taken out:
/// ids and types of calls it has (a replay's id is a new one), the parts
/// of their names and arguments it has.
fn tool_calls(d: &mut Map<String, Value>, have: &Sent, at: &mut Cursor) -> Result<bool, String> {
    let Some(Value::Array(calls)) = d.get_mut("tool_calls") else { return Ok(false) };
    let mut added = false;
    for tc in calls.iter_mut().filter_map(Value::as_object_mut) {
        let j = tc.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        if at.tools.len() <= j {
            if j >= MAX_INDEX {
                return Err(format!("tool call {j} is no answer's"));
            }
            at.tools.resize(j + 1, (0, 0));
        }
        let (name_at, args_at) = &mut at.tools[j];
        match have.tools.get(j) {
            Some(sent) => {
                if sent.id {
                    tc.remove("id");
                    tc.remove("type");
                }
                if let Some(Value::Object(f)) = tc.get_mut("function") {
                    added |= trim(f, "name", &sent.name, name_at)?;
                    added |= trim(f, "arguments", &sent.arguments, args_at)?;
                }
            }
            None => {
                let f = tc.get("function");
                let len = |k: &str| f.and_then(|f| f.get(k)).and_then(Value::as_str).map_or(0, str::len);
                (*name_at, *args_at) = (*name_at + len("name"), *args_at + len("arguments"));
                added = true;
            }
        }
    }
    calls.retain(|tc| {
        let f = tc.get("function").and_then(Value::as_object);
        tc.as_object().is_some_and(|o| o.keys().any(|k| k != "index" && k != "function"))
            || f.is_some_and(|f| !f.is_empty())
    });
    if calls.is_empty() {
        d.remove("tool_calls");
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::chunk::Event;
    use serde_json::json;

    fn transcript(events: &[Value]) -> Transcript {
        let mut t = Transcript::default();
        for e in events {
            t.record(&Event::parse(e.to_string().as_bytes()).unwrap());
        }
        t
    }

    fn delta(d: Value) -> Value {
        json!({"id": "x", "choices": [{"index": 0, "delta": d, "finish_reason": null}]})
    }

    /// Runs `events` through a replay of what `sent` gave the client (and
    /// then what passes, as the router records it); the choices that pass,
    /// or the first divergence.
    fn replay(sent: &mut Transcript, events: &[Value]) -> Result<Vec<Value>, String> {
        let mut r = Replay::default();
        let mut out = Vec::new();
        for e in events {
            let Value::Object(mut m) = e.clone() else { unreachable!() };
            r.skip(sent, &mut m)?;
            sent.record(&Event::parse(Value::Object(m.clone()).to_string().as_bytes()).unwrap());
            out.push(m["choices"][0].clone());
        }
        Ok(out)
    }

    /// The answer of a reasoning model that calls a tool, as an engine
    /// streams it (each event a token, the call's parts as llama-server
    /// sends them).
    fn answer() -> Vec<Value> {
        vec![
            delta(json!({"role": "assistant", "content": null})),
            delta(json!({"reasoning_content": "The user"})),
            delta(json!({"reasoning_content": " wants é"})),
            delta(json!({"content": "Let me check."})),
            delta(json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]})),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]
    }

    #[test]
    fn what_the_client_has_is_left_out_wherever_the_answer_was_cut() {
        let all = answer();
        for cut in 0..all.len() {
            let mut client = transcript(&all[..cut]);
            let passed = replay(&mut client, &all).unwrap();
            // What passes of the replay, after what the client has, reads
            // as the uninterrupted answer.
            let whole = transcript(&all);
            assert_eq!(client.choices, whole.choices, "cut at {cut}");
            // The call's id and type come once, from the first replica
            // when it had them.
            let ids = passed.iter().filter(|c| c["delta"]["tool_calls"][0].get("id").is_some()).count();
            assert_eq!(ids, usize::from(cut <= 4), "cut at {cut}");
        }
    }

    #[test]
    fn chunks_cut_otherwise_than_the_client_s_are_split_at_its_end() {
        let mut sent = transcript(&[delta(json!({"content": "Bonjour, "})), delta(json!({"content": "le mon"}))]);
        let again = [delta(json!({"content": "Bonjour, le"})), delta(json!({"content": " monde"}))];
        let passed = replay(&mut sent, &again).unwrap();
        assert_eq!(passed[0]["delta"], json!({}));
        assert_eq!(passed[1]["delta"], json!({"content": "de"}));
        // A tool call's arguments alike.
        let mut sent = transcript(&[delta(json!({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                                           "function": {"name": "f", "arguments": "{\"a\":1"}}]}))]);
        let again = [delta(json!({"tool_calls": [{"index": 0, "id": "z", "type": "function",
                                                  "function": {"name": "f", "arguments": "{\"a\":12}"}}]}))];
        let passed = replay(&mut sent, &again).unwrap();
        assert_eq!(passed[0]["delta"], json!({"tool_calls": [{"index": 0, "function": {"arguments": "2}"}}]}));
    }

    #[test]
    fn an_answer_that_comes_out_otherwise_is_refused() {
        let mut sent = transcript(&answer()[..5]);
        // Other reasoning.
        let mut other = answer();
        other[2] = delta(json!({"reasoning_content": " wants x"}));
        assert!(replay(&mut sent, &other).is_err());
        // Another tool.
        let mut other = answer();
        other[4] = delta(json!({"tool_calls": [{"index": 0, "id": "call_b", "type": "function",
                                                "function": {"name": "get_time", "arguments": ""}}]}));
        assert!(replay(&mut sent, &other).is_err());
        // New text before it came through what the client has: the
        // reasoning went on where the client's went to the answer.
        let mut other = answer();
        other[3] = delta(json!({"reasoning_content": " more"}));
        assert!(replay(&mut sent, &other).is_err());
        // Its end before it got there.
        let short = [answer()[1].clone(), json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})];
        assert!(replay(&mut sent, &short).is_err());
    }

    #[test]
    fn several_choices_each_come_through_their_own_and_a_finished_one_ends_once() {
        let c = |i: u64, d: Value, f: Value| json!({"choices": [{"index": i, "delta": d, "finish_reason": f}]});
        let all = [
            c(0, json!({"content": "a"}), Value::Null),
            c(1, json!({"content": "x"}), Value::Null),
            c(1, json!({}), json!("stop")),
            c(0, json!({"content": "b"}), Value::Null),
            c(0, json!({}), json!("length")),
        ];
        let mut sent = transcript(&all[..3]);
        let passed = replay(&mut sent, &all).unwrap();
        assert_eq!(passed[2]["finish_reason"], Value::Null);
        assert_eq!(
            (passed[3]["delta"].clone(), passed[4]["finish_reason"].clone()),
            (json!({"content": "b"}), json!("length"))
        );
        // A finished choice that goes on is another answer.
        let more = [c(1, json!({"content": "xy"}), Value::Null)];
        assert!(replay(&mut sent, &more).is_err());
    }

    #[test]
    fn log_probabilities_the_client_has_are_left_out_and_completions_keep_their_text_field() {
        let lp =
            |ids: &[u64]| json!({"content": ids.iter().map(|i| json!({"id": i, "bytes": [1]})).collect::<Vec<_>>()});
        let e = |text: &str, ids: &[u64]| json!({"choices": [{"index": 0, "text": text, "logprobs": lp(ids), "finish_reason": null}]});
        let mut sent = transcript(&[e("ab", &[1, 2])]);
        let passed = replay(&mut sent, &[e("a", &[1]), e("bc", &[2, 3])]).unwrap();
        assert_eq!((passed[0]["text"].clone(), passed[0]["logprobs"].clone()), (json!(""), Value::Null));
        assert_eq!(
            (passed[1]["text"].clone(), passed[1]["logprobs"]["content"][0]["id"].clone()),
            (json!("c"), json!(3))
        );
    }
}
