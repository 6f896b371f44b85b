//! Which requests can continue on another replica, and what their first
//! attempt must ask of the engine so that they can.

use serde_json::{Map, Value};

use super::transcript::MAX_INDEX;
use super::Method;

/// The OpenAI API a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
}

impl Api {
    pub fn of_path(path: &str) -> Option<Api> {
        match path.split('?').next()? {
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/completions" => Some(Api::Completion),
            _ => None,
        }
    }
}

/// Whether a generation request at `path` asks for its answer whole (its
/// body's top-level `stream` is not `true`): such an answer is sent again
/// whole whatever its shape, so it needs no plan and only a look at its
/// keys (issue #51 item 5). `false` for another path, or a body that names
/// `stream` (however escaped) and is no JSON object.
pub fn asks_whole(path: &str, body: &[u8]) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // A key that decodes to `stream` is written with these letters, or
    // with a `\u` escape: a body with neither has no such key, and needs
    // no walk through its members (most whole requests).
    static STREAM: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"stream"));
    static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\\u"));
    if Api::of_path(path).is_none() {
        return false;
    }
    if STREAM.find(body).is_none() && ESCAPE.find(body).is_none() {
        return true;
    }
    matches!(crate::prompt_scan::member(body, b"stream"), Ok(s) if s != Some(b"true"))
}

/// A request the router can continue elsewhere, and what it asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub api: Api,
    pub method: Method,
    pub stream: bool,
    /// The client asked for a last event with `usage`.
    pub include_usage: bool,
    /// The client's token budget (`max_completion_tokens`, `max_tokens` or
    /// llama.cpp's `n_predict`); `None`: the engine's own.
    pub max_tokens: Option<u64>,
    /// The router asked for log-probabilities to learn the token ids; they
    /// are taken out of what the client gets.
    pub ids_asked: bool,
    /// The model the client named (for events the router writes itself
    /// before the engine named one).
    pub model: String,
    /// The client asked for its answer whole; the router streams it from
    /// the engine (so that it can yield its slot and continue, issue #44)
    /// and sends the client the whole answer at its end
    /// ([`crate::proxy`]'s whole answers). `stream` is then true.
    pub whole: bool,
    /// A grammar, JSON schema or several choices: continued only by
    /// generating it again ([`super::replay`]), never by a prefill (the
    /// grammar would start over at the junction); it does not yield.
    pub replay_only: bool,
    /// Choices in the answer (`n`).
    pub choices: u32,
}

/// Why a request is not continued (for the debug log; such requests pass
/// as they did before resumption existed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotResumable {
    NotJson,
    /// `best_of` above 1: answers the engine chooses among.
    SeveralChoices,
    /// `echo`, `suffix` or a prompt that is not one string.
    CompletionShape,
}

impl NotResumable {
    /// Its name in metrics, the access log and `onepool status`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotResumable::NotJson => "not_json",
            NotResumable::SeveralChoices => "several_choices",
            NotResumable::CompletionShape => "completion_shape",
        }
    }
}

/// Whether a generation request's answer is followed (issue #51 item 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Followed {
    /// Followed: it can yield its slot and move.
    Yes,
    /// Followed, moved by generating it again; it does not yield.
    Replay,
    /// Asked for whole (not by a lower class): sent again whole if its
    /// replica fails before its head, passed as it comes after.
    Whole,
    Not(NotResumable),
}

impl Followed {
    pub fn as_str(self) -> &'static str {
        match self {
            Followed::Yes => "yes",
            Followed::Replay => "replay",
            Followed::Whole => "whole",
            Followed::Not(why) => why.as_str(),
        }
    }
}

/// A plan, and the body its first attempt sends when that differs from
/// the client's.
#[derive(Debug, PartialEq)]
pub struct Planned {
    pub plan: Plan,
    pub first: Option<Vec<u8>>,
}

impl Plan {
    /// The plan for a `POST` to `path` with `body`. `Err` when the request
    /// cannot be continued; `Ok(None)` when it is no generation request at
    /// all. `whole_as_stream`: a request for a whole answer is streamed
    /// from the engine ([`Plan::whole`]), else it is followed as it is.
    /// `pin_seed`: a stream without the client's seed gets one.
    pub fn of(
        path: &str,
        body: &[u8],
        method: Method,
        whole_as_stream: bool,
        pin_seed: bool,
    ) -> Result<Option<Planned>, NotResumable> {
        let Some(api) = Api::of_path(path) else { return Ok(None) };
        let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(body) else {
            return Err(NotResumable::NotJson);
        };
        // Tools and the client's log-probabilities: continued by the
        // engine's own chat (its parser, its log-probabilities), and a
        // whole answer is read whole (the router assembles text only).
        let Shape { engine_s_own, replay_only, choices } = check(api, &req)?;
        let method = if engine_s_own || replay_only { Method::Text } else { method };
        let asked_stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let whole = whole_as_stream && !asked_stream && !engine_s_own && !replay_only;
        let stream = asked_stream || whole;
        // A whole answer has its usage, so the stream it is read from must.
        let include_usage = whole
            || stream
                && req
                    .get("stream_options")
                    .and_then(|o| o.get("include_usage"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
        let max_tokens = ["max_completion_tokens", "max_tokens", "n_predict"]
            .iter()
            .find_map(|k| req.get(*k).and_then(Value::as_i64))
            .and_then(|n| u64::try_from(n).ok());
        let model = req.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
        // Token ids come only with log-probabilities; only streams need them
        // (an answer read whole is sent again whole).
        let ids_asked = stream && method == Method::Tokens;
        // A stream may have to be generated again elsewhere (a tool call
        // cut half-way, reasoning, a grammar): with the same seed, a
        // sampling engine makes the same answer.
        let seed = (pin_seed && stream && !req.contains_key("seed")).then(fresh_seed);
        let mut fields = Vec::new();
        if ids_asked {
            fields.extend_from_slice(logprob_fields(api));
        }
        if let Some(seed) = seed {
            fields.extend_from_slice(if fields.is_empty() { b"" } else { b"," });
            fields.extend_from_slice(format!("\"seed\":{seed}").as_bytes());
        }
        let first = if whole {
            req.insert("stream".into(), Value::Bool(true));
            req.insert("stream_options".into(), serde_json::json!({"include_usage": true}));
            let streamed = serde_json::to_vec(&req).expect("a JSON object serializes");
            Some(with_fields(&streamed, &fields))
        } else {
            (!fields.is_empty()).then(|| with_fields(body, &fields))
        };
        let plan =
            Plan { api, method, stream, include_usage, max_tokens, ids_asked, model, whole, replay_only, choices };
        Ok(Some(Planned { plan, first }))
    }
}

/// How a followed request continues.
struct Shape {
    /// Only through the engine's own chat (by text, whatever the
    /// endpoint's method): tools (the engine parses a tool call that
    /// begins after the junction; one cut half-way is generated again) or
    /// the client's own log-probabilities (the continuation's are the
    /// engine's, in its form).
    engine_s_own: bool,
    /// Only by generating it again ([`Plan::replay_only`]).
    replay_only: bool,
    choices: u32,
}

/// A seed for a stream's sampling, fresh for each request (so that
/// answers vary as they would without one), below 2^31 (every engine
/// takes it).
fn fresh_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 33) as u32
}

fn check(api: Api, req: &Map<String, Value>) -> Result<Shape, NotResumable> {
    let above_one = |k: &str| req.get(k).and_then(Value::as_u64).is_some_and(|n| n > 1);
    if above_one("best_of") {
        return Err(NotResumable::SeveralChoices);
    }
    let choices = match req.get("n").and_then(Value::as_u64) {
        Some(n) if n > MAX_INDEX as u64 => return Err(NotResumable::SeveralChoices),
        Some(n) => n.max(1) as u32,
        None => 1,
    };
    let present = |k: &str| req.get(k).is_some_and(|v| !v.is_null());
    let tool_choice_none = req.get("tool_choice").and_then(Value::as_str) == Some("none");
    let tools = req.get("tools").or(req.get("functions")).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
    let format_is_text = req
        .get("response_format")
        .is_none_or(|f| f.is_null() || f.get("type").and_then(Value::as_str).is_some_and(|t| t == "text"));
    let constrained = !format_is_text
        || [
            "grammar",
            "json_schema",
            "guided_json",
            "guided_regex",
            "guided_grammar",
            "guided_choice",
            "regex",
            "ebnf",
            "structured_outputs",
        ]
        .iter()
        .any(|k| present(k));
    let asks_logprobs = match req.get("logprobs") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_u64().is_some_and(|n| n > 0),
        _ => false,
    };
    let engine_s_own = (tools && !tool_choice_none) || asks_logprobs || present("top_logprobs") || present("n_probs");
    if api == Api::Completion {
        let echo = req.get("echo").and_then(Value::as_bool).unwrap_or(false);
        if echo || present("suffix") || !req.get("prompt").is_some_and(Value::is_string) {
            return Err(NotResumable::CompletionShape);
        }
    }
    if api == Api::Chat && !req.get("messages").is_some_and(Value::is_array) {
        return Err(NotResumable::NotJson);
    }
    let replay_only = constrained || choices > 1;
    Ok(Shape { engine_s_own: engine_s_own && !replay_only, replay_only, choices })
}

/// The log-probability fields that bring token ids (the top one only,
/// the least the engines send).
fn logprob_fields(api: Api) -> &'static [u8] {
    match api {
        Api::Chat => b"\"logprobs\":true,\"top_logprobs\":1",
        Api::Completion => b"\"logprobs\":1",
    }
}

/// The client's body with `fields` (members, comma-separated) added right
/// after its opening brace: the rest of the client's bytes go as they came.
fn with_fields(body: &[u8], fields: &[u8]) -> Vec<u8> {
    if fields.is_empty() {
        return body.to_vec();
    }
    let open = body.iter().position(|&b| b == b'{').unwrap_or(0);
    let rest = &body[open + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(body.len() + fields.len() + 1);
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(fields);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type Got = Result<Option<(Plan, Option<Vec<u8>>)>, NotResumable>;

    fn plan(path: &str, body: &str, method: Method) -> Got {
        Plan::of(path, body.as_bytes(), method, false, true).map(|p| p.map(|p| (p.plan, p.first)))
    }

    /// Issue #44: a request for a whole answer that may have to yield its
    /// slot is streamed from the engine, with its usage (and token ids by
    /// the tokens method); a streamed one is followed as it is.
    #[test]
    fn a_whole_answer_is_streamed_from_the_engine_when_it_may_yield() {
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":7,"model":"m"}"#;
        let planned =
            |method, whole| Plan::of("/v1/chat/completions", body.as_bytes(), method, whole, true).unwrap().unwrap();
        let p = planned(Method::Tokens, true);
        assert_eq!((p.plan.whole, p.plan.stream, p.plan.include_usage, p.plan.ids_asked), (true, true, true, true));
        let first: Value = serde_json::from_slice(&p.first.unwrap()).unwrap();
        assert_eq!(
            (first["stream"].clone(), first["stream_options"]["include_usage"].clone()),
            (true.into(), true.into())
        );
        assert_eq!((first["logprobs"].clone(), first["messages"][0]["content"].clone()), (true.into(), "hi".into()));
        let p = planned(Method::Text, true);
        let first: Value = serde_json::from_slice(&p.first.unwrap()).unwrap();
        assert!(first.get("logprobs").is_none() && first["stream"] == true);
        // Not asked to: a whole answer is read whole, as before.
        let p = planned(Method::Tokens, false);
        assert_eq!((p.plan.whole, p.plan.stream, p.plan.include_usage, p.first), (false, false, false, None));
        // A stream stays the client's stream.
        let streamed = r#"{"messages":[],"stream":true}"#;
        let p = Plan::of("/v1/chat/completions", streamed.as_bytes(), Method::Text, true, true).unwrap().unwrap();
        assert_eq!((p.plan.whole, p.plan.include_usage), (false, false));
        assert!(p.first.unwrap().ends_with(&streamed.as_bytes()[1..]));
    }

    #[test]
    fn a_streamed_chat_asks_for_token_ids_and_keeps_the_rest_of_its_bytes() {
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":7,"stream_options":{"include_usage":true},"model":"m"}"#;
        let (p, first) = plan("/v1/chat/completions", body, Method::Tokens).unwrap().unwrap();
        assert_eq!(
            (p.api, p.stream, p.include_usage, p.max_tokens, p.ids_asked),
            (Api::Chat, true, true, Some(7), true)
        );
        let first = String::from_utf8(first.unwrap()).unwrap();
        let v: Value = serde_json::from_str(&first).unwrap();
        let seed = v["seed"].as_u64().unwrap();
        assert!(seed < 1 << 31);
        assert_eq!(first, format!("{{\"logprobs\":true,\"top_logprobs\":1,\"seed\":{seed},{}", &body[1..]));
        assert_eq!(v["messages"][0]["content"], "hi");
        // By text: the body goes as it came, but for the seed; a client's
        // own seed is kept.
        let (p, first) = plan("/v1/chat/completions", body, Method::Text).unwrap().unwrap();
        let first = String::from_utf8(first.unwrap()).unwrap();
        assert!(!p.ids_asked && first.starts_with("{\"seed\":") && first.ends_with(&body[1..]));
        // resume.seed = false: by text, the body goes as it came.
        let p = Plan::of("/v1/chat/completions", body.as_bytes(), Method::Text, false, false).unwrap().unwrap();
        assert_eq!(p.first, None);
        let seeded = r#"{"messages":[],"stream":true,"seed":7}"#;
        assert_eq!(plan("/v1/chat/completions", seeded, Method::Text).unwrap().unwrap().1, None);
        // Each stream its own seed.
        let seeds: std::collections::HashSet<_> =
            (0..20).map(|_| plan("/v1/chat/completions", body, Method::Text).unwrap().unwrap().1.unwrap()).collect();
        assert_eq!(seeds.len(), 20);
    }

    #[test]
    fn a_whole_answer_is_told_from_a_stream_however_its_key_is_written() {
        let chat = "/v1/chat/completions";
        for (body, whole) in [
            (r#"{"messages":[]}"#, true),
            (r#"{"messages":[],"stream":false}"#, true),
            (r#"{"messages":[{"role":"user","content":"stream it"}]}"#, true),
            (r#"{"messages":[],"stream":true}"#, false),
            (r#"{"messages":[],"\u0073tream":true}"#, false),
            (r#"{"messages":[],"stre\u0061m":true}"#, false),
            (r#"{"messages":[{"content":"caf\u00e9"}]}"#, true),
            (r#"{"stream":true"#, false),
        ] {
            assert_eq!(asks_whole(chat, body.as_bytes()), whole, "{body}");
        }
        assert!(!asks_whole("/v1/embeddings", b"{}"));
    }

    #[test]
    fn completions_ask_for_logprobs_their_way_and_an_empty_object_stays_valid() {
        let body = r#" {"prompt":"a","stream":true,"seed":1}"#;
        let (_, first) = plan("/v1/completions", body, Method::Tokens).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(first.unwrap()).unwrap(),
            r#" {"logprobs":1,"prompt":"a","stream":true,"seed":1}"#
        );
        let fields = logprob_fields(Api::Chat);
        assert_eq!(with_fields(b"{ }", fields), b"{\"logprobs\":true,\"top_logprobs\":1 }".to_vec());
    }

    #[test]
    fn what_cannot_be_continued_is_said_and_other_paths_are_no_generation() {
        let chat = "/v1/chat/completions";
        let m = r#""messages":[]"#;
        let cases = [
            (format!(r#"{{{m},"best_of":2}}"#), NotResumable::SeveralChoices),
            (format!(r#"{{{m},"n":1000}}"#), NotResumable::SeveralChoices),
            ("[1]".to_string(), NotResumable::NotJson),
            ("{\"stream\":true}".to_string(), NotResumable::NotJson),
        ];
        for (body, why) in cases {
            assert_eq!(plan(chat, &body, Method::Tokens), Err(why), "{body}");
        }
        assert!(plan(chat, &format!(r#"{{{m},"tools":[],"n":1}}"#), Method::Tokens).unwrap().is_some());
        // A grammar, a JSON schema, several choices: only generated again,
        // with tools or without, and never read as a stream when asked whole.
        for extra in [
            r#""n":2"#,
            r#""response_format":{"type":"json_object"}"#,
            r#""response_format":{"type":"json_schema","json_schema":{"schema":{}}}"#,
            r#""grammar":"root ::= x""#,
            r#""guided_json":{},"tools":[{"type":"function"}]"#,
        ] {
            let (p, first) = plan(chat, &format!(r#"{{{m},{extra},"stream":true}}"#), Method::Tokens).unwrap().unwrap();
            assert_eq!((p.replay_only, p.method, p.ids_asked), (true, Method::Text, false), "{extra}");
            assert!(first.is_some_and(|f| f.starts_with(b"{\"seed\":")), "{extra}");
            let p =
                Plan::of(chat, format!(r#"{{{m},{extra}}}"#).as_bytes(), Method::Tokens, true, true).unwrap().unwrap();
            assert_eq!((p.plan.whole, p.plan.stream, p.first), (false, false, None), "{extra}");
        }
        let (p, _) = plan(chat, &format!(r#"{{{m},"n":3,"stream":true}}"#), Method::Text).unwrap().unwrap();
        assert_eq!(p.choices, 3);
        // Tools and the client's log-probabilities: by the engine's own
        // chat, whatever the endpoint's method; asked whole, read whole.
        for extra in [r#""tools":[{"type":"function"}]"#, r#""logprobs":true,"top_logprobs":2"#, r#""n_probs":1"#] {
            let streamed = format!(r#"{{{m},{extra},"stream":true}}"#);
            let (p, first) = plan(chat, &streamed, Method::Tokens).unwrap().unwrap();
            assert_eq!((p.method, p.ids_asked, p.replay_only), (Method::Text, false, false), "{extra}");
            assert!(first.unwrap().ends_with(&streamed.as_bytes()[1..]), "{extra}");
            let whole = format!(r#"{{{m},{extra}}}"#);
            let p = Plan::of(chat, whole.as_bytes(), Method::Tokens, true, true).unwrap().unwrap();
            assert_eq!((p.plan.whole, p.plan.stream, p.first), (false, false, None), "{extra}");
        }
        assert!(plan(chat, &format!(r#"{{{m},"tools":[{{}}],"tool_choice":"none"}}"#), Method::Text)
            .unwrap()
            .is_some());
        let c = "/v1/completions";
        assert_eq!(plan(c, r#"{"prompt":["a","b"]}"#, Method::Tokens), Err(NotResumable::CompletionShape));
        assert_eq!(plan(c, r#"{"prompt":"a","echo":true}"#, Method::Tokens), Err(NotResumable::CompletionShape));
        assert_eq!(plan("/v1/embeddings", "{}", Method::Tokens), Ok(None));
        assert_eq!(plan("/health", "", Method::Tokens), Ok(None));
    }
}
