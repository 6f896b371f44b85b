//! Both sides of a junction: the requests that continue an answer on
//! another replica, and the events the client gets from a continuation,
//! written as the answer's first replica would have (its id, its model,
//! its API's shape).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::plan::{Api, Plan};
use super::progress::Meta;

/// The end of every OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Paths of llama.cpp's server that a continuation by tokens uses; the
/// launcher passes them for the router's own requests only
/// (`onepool_launcher::access::CONTINUATION_PATHS`).
pub const TEMPLATE_PATH: &str = "/apply-template";
pub const TOKENIZE_PATH: &str = "/tokenize";
pub const NATIVE_PATH: &str = "/completion";

/// Fields of the client's request that a continuation sets itself.
const SET_BY_CONTINUATION: [&str; 13] = [
    "messages",
    "prompt",
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "n",
    "logprobs",
    "top_logprobs",
    "n_probs",
    "return_tokens",
];

pub fn object(body: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice(body).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

fn to_body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap_or_default()
}

/// `/apply-template`'s request: the chat's messages (and the template's
/// own arguments, when the client gave some).
pub fn template_request(client: &[u8]) -> Option<Vec<u8>> {
    let req = object(client)?;
    let mut out = Map::new();
    out.insert("messages".into(), req.get("messages")?.clone());
    if let Some(k) = req.get("chat_template_kwargs") {
        out.insert("chat_template_kwargs".into(), k.clone());
    }
    Some(to_body(Value::Object(out)))
}

/// `/tokenize`'s request for a prompt, tokenized as llama-server does a
/// completion's (special tokens added and read).
pub fn tokenize_request(prompt: &str) -> Vec<u8> {
    to_body(json!({"content": prompt, "add_special": true, "parse_special": true}))
}

/// The prompt text of a completion request, or the templated prompt in
/// `/apply-template`'s answer.
pub fn prompt_of(body: &[u8]) -> Option<String> {
    Some(object(body)?.get("prompt")?.as_str()?.to_string())
}

/// The token ids in `/tokenize`'s answer.
pub fn tokens_of(body: &[u8]) -> Option<Vec<u32>> {
    object(body)?.get("tokens")?.as_array()?.iter().map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

/// llama.cpp's native `/completion` request that continues the answer:
/// the prompt's ids and the answer's so far as its prompt, the client's
/// sampling fields as they were, the tokens left of its budget.
pub fn native_request(client: &[u8], prompt: &[u32], answer: &[u32], left: Option<u64>) -> Option<Vec<u8>> {
    let mut req = object(client)?;
    for k in SET_BY_CONTINUATION {
        req.remove(k);
    }
    let ids: Vec<u32> = prompt.iter().chain(answer).copied().collect();
    req.insert("prompt".into(), json!(ids));
    req.insert("n_predict".into(), left.map_or(json!(-1), |n| json!(n)));
    req.insert("stream".into(), json!(true));
    req.insert("n_probs".into(), json!(1));
    req.insert("cache_prompt".into(), json!(true));
    Some(to_body(Value::Object(req)))
}

/// The OpenAI request that continues the answer by its text: the chat
/// with the answer so far as the assistant's last message to continue
/// (`continue_final_message`, vLLM's and SGLang's name; llama-server
/// continues a last assistant message by itself), or the completion's
/// prompt with the text after it.
pub fn text_request(plan: &Plan, client: &[u8], text: &str, left: Option<u64>) -> Option<Vec<u8>> {
    let mut req = object(client)?;
    match plan.api {
        Api::Chat => {
            let Some(Value::Array(messages)) = req.get_mut("messages") else { return None };
            messages.push(json!({"role": "assistant", "content": text}));
            req.insert("continue_final_message".into(), json!(true));
            req.insert("add_generation_prompt".into(), json!(false));
        }
        Api::Completion => {
            let prompt = req.get("prompt")?.as_str()?.to_string() + text;
            req.insert("prompt".into(), json!(prompt));
        }
    }
    for k in ["max_completion_tokens", "n_predict", "max_tokens"] {
        req.remove(k);
    }
    if let Some(n) = left {
        req.insert("max_tokens".into(), json!(n));
    }
    req.insert("stream".into(), json!(true));
    req.insert("stream_options".into(), json!({"include_usage": true}));
    Some(to_body(Value::Object(req)))
}

/// Events of the answer, written by the router.
impl Meta {
    fn event(&self, api: Api, choices: Value, usage: Option<Value>) -> Bytes {
        let object = match api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut e = Map::new();
        e.insert("id".into(), json!(self.id));
        e.insert("object".into(), json!(object));
        e.insert("created".into(), json!(self.created));
        e.insert("model".into(), json!(self.model));
        if let Some(f) = &self.fingerprint {
            e.insert("system_fingerprint".into(), json!(f));
        }
        e.insert("choices".into(), choices);
        if let Some(u) = usage {
            e.insert("usage".into(), u);
        }
        let mut out = b"data: ".to_vec();
        out.extend(to_body(Value::Object(e)));
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    fn choice(api: Api, text: &str, finish: Option<&str>) -> Value {
        match api {
            Api::Chat => {
                let delta = if text.is_empty() { json!({}) } else { json!({"content": text}) };
                json!([{"index": 0, "delta": delta, "finish_reason": finish}])
            }
            Api::Completion => json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]),
        }
    }

    pub fn text_event(&self, api: Api, text: &str) -> Bytes {
        self.event(api, Self::choice(api, text, None), None)
    }

    pub fn finish_event(&self, api: Api, reason: &str) -> Bytes {
        self.event(api, Self::choice(api, "", Some(reason)), None)
    }

    /// A continuation's event from the engine's own chat, as its client
    /// reads it: the answer's id, creation time, model and fingerprint in
    /// place of the continuation's, without the role its first delta
    /// repeats (unless `first`: the client has had no event yet) or the
    /// usage the router counts itself (issue #51: tool calls,
    /// log-probabilities and any other field the engine writes go as they
    /// came). The first `regenerated` log-probabilities are left out: the
    /// client has them from the tokens the continuation generates again.
    /// `None` when nothing is left for the client.
    pub fn restamp(&self, data: &[u8], first: bool, regenerated: &mut usize) -> Option<Bytes> {
        self.restamp_map(object(data)?, first, regenerated)
    }

    /// [`Meta::restamp`] of an event already read.
    pub fn restamp_map(&self, mut e: Map<String, Value>, first: bool, regenerated: &mut usize) -> Option<Bytes> {
        e.remove("usage");
        let choices = e.get_mut("choices").and_then(Value::as_array_mut)?;
        for c in choices.iter_mut() {
            if let Some(list) = c.get_mut("logprobs").and_then(|l| l.get_mut("content")).and_then(Value::as_array_mut) {
                let had = (*regenerated).min(list.len());
                list.drain(..had);
                *regenerated -= had;
                if list.is_empty() && had > 0 {
                    c["logprobs"] = Value::Null;
                }
            }
            if let Some(d) = c.get_mut("delta").and_then(Value::as_object_mut) {
                if !first {
                    d.remove("role");
                }
                if d.get("content").is_some_and(Value::is_null) {
                    d.remove("content");
                }
            }
        }
        let carries = choices.iter().any(|c| {
            c.get("delta").and_then(Value::as_object).is_some_and(|d| !d.is_empty())
                || c.get("text").and_then(Value::as_str).is_some_and(|t| !t.is_empty())
                || c.get("finish_reason").is_some_and(|f| !f.is_null())
                || c.get("logprobs").is_some_and(|l| !l.is_null())
        });
        if !carries {
            return None;
        }
        e.insert("id".into(), json!(self.id));
        e.insert("created".into(), json!(self.created));
        e.insert("model".into(), json!(self.model));
        match &self.fingerprint {
            Some(f) => e.insert("system_fingerprint".into(), json!(f)),
            None => e.remove("system_fingerprint"),
        };
        let mut out = b"data: ".to_vec();
        out.extend(to_body(Value::Object(e)));
        out.extend_from_slice(b"\n\n");
        Some(Bytes::from(out))
    }

    /// The last event before `[DONE]` when the client asked for usage.
    pub fn usage_event(&self, api: Api, prompt: u64, completion: u64) -> Bytes {
        let usage =
            json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
        self.event(api, json!([]), Some(usage))
    }
}

/// The event that ends a stream the router could not continue: the
/// launcher's reclaim event's shape (OpenAI's error in a stream), saying
/// why.
pub fn error_event(message: &str) -> Bytes {
    coded_error_event("stream_not_continued", message)
}

/// An OpenAI error in a stream, with `code` (no `[DONE]` follows it, so a
/// client raises it rather than take the answer as whole).
pub fn coded_error_event(code: &str, message: &str) -> Bytes {
    let e = json!({"error": {"message": message, "type": "server_error", "code": code}});
    let mut out = b"data: ".to_vec();
    out.extend(to_body(e));
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::Method;

    fn plan(api: Api) -> Plan {
        Plan {
            api,
            method: Method::Text,
            stream: true,
            include_usage: true,
            max_tokens: Some(9),
            ids_asked: false,
            model: "m".into(),
            whole: false,
            replay_only: false,
            choices: 1,
        }
    }

    #[test]
    fn a_continuation_by_tokens_keeps_the_sampling_and_sets_what_it_must() {
        let client = br#"{"messages":[{"role":"user","content":"hi"}],"temperature":0,"seed":3,"stop":["\n\n"],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true},"model":"m"}"#;
        let t: Value = serde_json::from_slice(&template_request(client).unwrap()).unwrap();
        assert_eq!(t, json!({"messages": [{"role": "user", "content": "hi"}]}));
        let n: Value = serde_json::from_slice(&native_request(client, &[1, 2], &[7], Some(4)).unwrap()).unwrap();
        assert_eq!(
            n,
            json!({"prompt": [1, 2, 7], "n_predict": 4, "stream": true, "n_probs": 1, "cache_prompt": true,
                   "temperature": 0, "seed": 3, "stop": ["\n\n"]})
        );
        let n: Value = serde_json::from_slice(&native_request(client, &[1], &[], None).unwrap()).unwrap();
        assert_eq!(n["n_predict"], -1);
        assert_eq!(tokens_of(br#"{"tokens":[1,9690,198]}"#), Some(vec![1, 9690, 198]));
        assert_eq!(tokens_of(br#"{"tokens":[1,-2]}"#), None);
        assert_eq!(prompt_of(br#"{"prompt":"<|im_start|>"}"#).as_deref(), Some("<|im_start|>"));
        let tk: Value = serde_json::from_slice(&tokenize_request("a")).unwrap();
        assert_eq!(tk, json!({"content": "a", "add_special": true, "parse_special": true}));
    }

    #[test]
    fn a_continuation_by_text_prefills_the_answer() {
        let client = br#"{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9,"stream":true}"#;
        let c: Value =
            serde_json::from_slice(&text_request(&plan(Api::Chat), client, "Bon", Some(8)).unwrap()).unwrap();
        assert_eq!(c["messages"][1], json!({"role": "assistant", "content": "Bon"}));
        assert_eq!(
            (c["continue_final_message"].clone(), c["add_generation_prompt"].clone()),
            (json!(true), json!(false))
        );
        assert_eq!((c["max_tokens"].clone(), c.get("max_completion_tokens")), (json!(8), None));
        assert_eq!(c["stream_options"], json!({"include_usage": true}));
        let client = br#"{"prompt":"Once","max_tokens":5}"#;
        let c: Value =
            serde_json::from_slice(&text_request(&plan(Api::Completion), client, " upon", None).unwrap()).unwrap();
        assert_eq!((c["prompt"].clone(), c.get("max_tokens")), (json!("Once upon"), None));
    }

    #[test]
    fn the_router_s_events_read_as_the_first_replica_s() {
        let m = Meta { id: "chatcmpl-1".into(), created: 5, model: "m".into(), fingerprint: Some("b1".into()) };
        let e = m.text_event(Api::Chat, "a\"é");
        let text = std::str::from_utf8(&e).unwrap();
        assert!(text.starts_with("data: {") && text.ends_with("}\n\n"));
        let v: Value = serde_json::from_str(&text[6..]).unwrap();
        assert_eq!(v["choices"][0]["delta"]["content"], "a\"é");
        assert_eq!(
            (v["id"].clone(), v["object"].clone(), v["system_fingerprint"].clone()),
            (json!("chatcmpl-1"), json!("chat.completion.chunk"), json!("b1"))
        );
        let v: Value = serde_json::from_slice(&m.finish_event(Api::Completion, "length")[6..]).unwrap();
        assert_eq!(
            (v["choices"][0]["finish_reason"].clone(), v["object"].clone()),
            (json!("length"), json!("text_completion"))
        );
        let v: Value = serde_json::from_slice(&m.usage_event(Api::Chat, 34, 5)[6..]).unwrap();
        assert_eq!(v["usage"], json!({"prompt_tokens": 34, "completion_tokens": 5, "total_tokens": 39}));
        assert_eq!(v["choices"], json!([]));
        let v: Value = serde_json::from_slice(&error_event("x")[6..]).unwrap();
        assert_eq!(v["error"]["code"], "stream_not_continued");
    }
}
