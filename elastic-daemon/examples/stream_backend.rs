//! A streaming stand-in for llama-server, for `bench/resume.sh` (issue
//! #43): every POST is answered as llama-server streams a chat completion
//! (an id, a role chunk, one chunk per token every `INTERVAL_MS`, the
//! finish, `[DONE]`), with each token's id and bytes in its
//! log-probabilities when the request asks for them, as onepoold's router
//! does to continue answers by token ids. Light enough that 10,000 streams
//! at once cost the router, not it.
//!
//!     cargo run --release -p onepool-elastic-daemon --example stream_backend -- 127.0.0.1:18090 [INTERVAL_MS]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The answer's events, one per interval.
struct Stream {
    tick: tokio::time::Interval,
    next: u64,
    tokens: u64,
    logprobs: bool,
}

const HEAD: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1796600000,"model":"bench","system_fingerprint":"b1","choices":[{"index":0,"#;

impl Body for Stream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.next > self.tokens + 1 {
            return Poll::Ready(None);
        }
        if self.next > 0 && self.next <= self.tokens {
            std::task::ready!(self.tick.poll_tick(cx));
        }
        let i = self.next;
        self.next += 1;
        let event = if i == 0 {
            format!("data: {HEAD}\"delta\":{{\"role\":\"assistant\",\"content\":null}},\"finish_reason\":null}}]}}\n\n")
        } else if i <= self.tokens {
            // Tokens of 4 to 6 bytes, as English text is on average.
            let text = format!("w{} ", i % 1000);
            let logprobs = match self.logprobs {
                true => format!(
                    ",\"logprobs\":{{\"content\":[{{\"id\":{},\"token\":\"{text}\",\"bytes\":{:?},\"logprob\":-0.5,\"top_logprobs\":[{{\"id\":{},\"token\":\"{text}\",\"bytes\":{:?},\"logprob\":-0.5}}]}}]}}",
                    1000 + i,
                    text.as_bytes(),
                    1000 + i,
                    text.as_bytes()
                ),
                false => String::new(),
            };
            format!("data: {HEAD}\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null{logprobs}}}]}}\n\n")
        } else {
            format!("data: {HEAD}\"delta\":{{}},\"finish_reason\":\"length\"}}]}}\n\ndata: [DONE]\n\n")
        };
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

fn main() {
    let addr: SocketAddr =
        std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:18090".into()).parse().expect("IP:PORT");
    let interval = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(50u64);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        eprintln!("stream_backend: listening on {addr}, a token every {interval} ms");
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    let tokens = v["max_tokens"].as_u64().unwrap_or(100);
                    let logprobs = v["logprobs"].as_bool().unwrap_or(false);
                    let mut tick = tokio::time::interval(Duration::from_millis(interval));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut r = Response::new(Stream { tick, next: 0, tokens, logprobs });
                    r.headers_mut().insert("content-type", http::HeaderValue::from_static("text/event-stream"));
                    Ok::<_, Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
}
