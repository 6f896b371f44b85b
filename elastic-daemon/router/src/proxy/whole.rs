//! Whole answers read as streams (issue #44): a request of a class below
//! the endpoint's own that asked for its answer whole is streamed from the
//! engine, so that it can give its slot to a higher class's request and
//! continue later from where it was, like a stream. Its client still gets
//! one answer at the end, in the shape the API gives a whole answer; a
//! stream that could not be continued is its error, with a status.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};

use crate::proxy::answers::openai_error;
use crate::proxy::body::{BodyKind, ProxyBody};
use crate::resume::events::{data_of, Data, Splitter};
use crate::resume::plan::Api;

/// Times a whole answer moved to another replica, for its access log line
/// (its body, made here, is not the one that moved).
#[derive(Clone, Copy)]
pub(super) struct Moves(pub u32);

/// The most answer text kept to make one whole answer (the router keeps
/// at most 1 MiB of an answer's text to continue it).
const MOST: usize = 64 << 20;

/// The streamed answer `resp` (the router following it), read to its end
/// and given as the whole answer the client asked for. Other answers (a
/// replica's refusal, an answer not streamed) pass as they are.
pub(super) async fn whole_answer(resp: Response<ProxyBody>, api: Api) -> Response<ProxyBody> {
    if !matches!(resp.body().kind, BodyKind::Resumable(_)) {
        return resp;
    }
    let (mut parts, mut body) = resp.into_parts();
    // Folded as it comes: only the answer's text is kept, not its events.
    let mut whole = Whole::new(api);
    while let Some(frame) = body.frame().await {
        let read = frame.map_err(|e| e.to_string()).and_then(|f| match f.into_data() {
            Ok(data) => whole.push(data),
            Err(_) => Ok(()),
        });
        if let Err(e) = read {
            return openai_error(StatusCode::BAD_GATEWAY, &format!("the answer could not be read whole: {e}"));
        }
    }
    let moves = match &body.kind {
        BodyKind::Resumable(b) => b.moves(),
        _ => 0,
    };
    let (status, json) = match whole.answer() {
        Ok(answer) => (StatusCode::OK, answer),
        Err(error) => (StatusCode::BAD_GATEWAY, error),
    };
    // The engine's stream's framing and type are not the answer's.
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut r = super::answers::json_response(status, json);
    *r.headers_mut() = parts.headers;
    *r.extensions_mut() = parts.extensions;
    r.extensions_mut().insert(Moves(moves));
    r
}

/// One whole answer out of the events of a stream of one choice, as they
/// come: the first event's id, creation time and model, the text in
/// order, the last finish reason and usage; or the stream's error event
/// (it was not continued).
struct Whole {
    api: Api,
    splitter: Splitter,
    head: Map<String, Value>,
    text: String,
    /// Reasoning kept apart (a reasoning model's), its own field whole.
    reasoning: String,
    finish: Value,
    usage: Option<Value>,
    done: bool,
    error: Option<Value>,
}

impl Whole {
    fn new(api: Api) -> Whole {
        Whole {
            api,
            splitter: Splitter::default(),
            head: Map::new(),
            text: String::new(),
            reasoning: String::new(),
            finish: Value::Null,
            usage: None,
            done: false,
            error: None,
        }
    }

    /// The stream's next bytes; `Err` once the text passes [`MOST`].
    fn push(&mut self, data: Bytes) -> Result<(), String> {
        self.splitter.push(data);
        while let Some(event) = self.splitter.next_event() {
            self.event(&event);
        }
        match self.text.len() + self.reasoning.len() > MOST {
            true => Err(format!("its text passed {} MiB", MOST >> 20)),
            false => Ok(()),
        }
    }

    fn event(&mut self, event: &[u8]) {
        let Data::One(data) = data_of(event) else { return };
        // The first error ends the answer: what follows it is not read.
        if self.error.is_some() {
            return;
        }
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Ok(Value::Object(mut e)) = serde_json::from_slice::<Value>(data) else { return };
        if let Some(error) = e.remove("error") {
            self.error = Some(json!({ "error": error }));
            return;
        }
        for key in ["id", "created", "model", "system_fingerprint"] {
            if let (false, Some(v)) = (self.head.contains_key(key), e.get(key)) {
                self.head.insert(key.to_string(), v.clone());
            }
        }
        if let Some(u) = e.remove("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u);
        }
        let Some(choice) = e.get("choices").and_then(|c| c.get(0)) else { return };
        let piece = match self.api {
            Api::Chat => choice.get("delta").and_then(|d| d.get("content")),
            Api::Completion => choice.get("text"),
        };
        self.text.push_str(piece.and_then(Value::as_str).unwrap_or_default());
        let delta = choice.get("delta");
        let thought = delta.and_then(|d| d.get("reasoning_content").or(d.get("reasoning")));
        self.reasoning.push_str(thought.and_then(Value::as_str).unwrap_or_default());
        if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            self.finish = f.clone();
        }
    }

    /// The whole answer, or why there is none.
    fn answer(self) -> Result<Value, Value> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if !self.done && self.finish.is_null() {
            return Err(json!({"error": {
                "message": "the answer ended before its end; retry the request",
                "type": "server_error",
                "code": "answer_not_whole",
            }}));
        }
        let (object, choice) = match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": self.text});
                if !self.reasoning.is_empty() {
                    message["reasoning_content"] = self.reasoning.into();
                }
                ("chat.completion", json!({"index": 0, "message": message, "finish_reason": self.finish}))
            }
            Api::Completion => {
                ("text_completion", json!({"index": 0, "text": self.text, "finish_reason": self.finish}))
            }
        };
        let mut head = self.head;
        head.insert("object".into(), object.into());
        head.insert("choices".into(), json!([choice]));
        if let Some(u) = self.usage {
            head.insert("usage".into(), u);
        }
        Ok(Value::Object(head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole_of(stream: Bytes, api: Api) -> Result<Value, Value> {
        let mut whole = Whole::new(api);
        whole.push(stream).unwrap();
        whole.answer()
    }

    fn events(lines: &[&str]) -> Bytes {
        Bytes::from(lines.iter().map(|l| format!("data: {l}\n\n")).collect::<String>())
    }

    #[test]
    fn a_chat_stream_becomes_one_chat_completion_with_its_usage() {
        let stream = events(&[
            r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Greet"},"finish_reason":null}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":" them."},"finish_reason":null}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"lo é"},"finish_reason":null}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            r#"{"id":"c1","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#,
            "[DONE]",
        ]);
        let v = whole_of(stream, Api::Chat).unwrap();
        assert_eq!(
            v,
            json!({"id": "c1", "created": 7, "model": "m", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello é", "reasoning_content": "Greet them."}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        );
    }

    #[test]
    fn a_completion_stream_becomes_one_text_completion() {
        let stream = events(&[
            r#"{"id":"t","created":1,"model":"m","choices":[{"index":0,"text":"a b","finish_reason":null}]}"#,
            r#"{"id":"t","created":1,"model":"m","choices":[{"index":0,"text":" c","finish_reason":"stop"}]}"#,
            "[DONE]",
        ]);
        let v = whole_of(stream, Api::Completion).unwrap();
        assert_eq!((v["object"].clone(), v["choices"][0]["text"].clone()), ("text_completion".into(), "a b c".into()));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert!(v.get("usage").is_none());
    }

    #[test]
    fn a_stream_not_continued_or_cut_is_an_error() {
        let failed = events(&[
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}"#,
            r#"{"error":{"message":"could not continue","type":"server_error","code":"stream_not_continued"}}"#,
        ]);
        let e = whole_of(failed, Api::Chat).unwrap_err();
        assert_eq!(e["error"]["code"], "stream_not_continued");
        let cut = events(&[r#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}"#]);
        assert_eq!(whole_of(cut, Api::Chat).unwrap_err()["error"]["code"], "answer_not_whole");
    }
}
