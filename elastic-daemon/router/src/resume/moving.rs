//! Continuing an answer on another replica: a slot there, ahead of new
//! requests, then the engine's requests that pick the answer up where
//! its client has it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use onepool_launcher::conventions::{DRAINING_HEADER, MOVABLE_HEADER};

use super::plan::{Api, Plan};
use super::splice::{
    native_request, prompt_of, template_request, text_request, tokenize_request, tokens_of, NATIVE_PATH, TEMPLATE_PATH,
    TOKENIZE_PATH,
};
use super::Method;
use crate::backend_pool::{self, BackendBody};
use crate::endpoint::{AcquireError, Endpoint, Lease};
use crate::registry::ReplicaId;
use crate::replica_client;

/// Largest answer of `/apply-template` or `/tokenize` read (a prompt's
/// template or its ids: a few times the request body at most).
const MAX_HELPER_ANSWER: usize = 64 << 20;

/// The form of the events a replica sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The answer's first replica: the client's API, passed on.
    First,
    /// llama.cpp's native `/completion` stream (a continuation by tokens).
    Native,
    /// The client's API from another replica (a continuation by text).
    OpenAi,
    /// The answer generated again from its start on another replica
    /// ([`super::replay`]).
    Replay,
}

/// What a continuation needs, taken from the stream it continues.
pub struct Ask {
    pub endpoint: Arc<Endpoint>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    /// The client's `Authorization`, where the endpoint passes it on.
    pub authorization: Option<HeaderValue>,
    /// Replicas not to try: those the answer left.
    pub exclude: Vec<ReplicaId>,
    pub plan: Plan,
    /// The client's request body, as it came.
    pub client: Bytes,
    /// Continuing by tokens: the answer's ids so far.
    pub ids: Vec<u32>,
    /// Continuing by text: the answer's text so far.
    pub text: String,
    /// Generating it again: the body of its first attempt (its seed set).
    pub replay: Option<Bytes>,
    /// Tokens left of the client's budget.
    pub left: Option<u64>,
    /// Replicas to try at most.
    pub attempts: u32,
    /// Its place in the queue (issue #44), and its longest wait for a slot.
    pub rank: crate::endpoint::Rank,
    /// Of a class below the endpoint's own: lent replicas first.
    pub lower: bool,
    pub wait: Option<Duration>,
}

/// A replica that goes on with the answer.
pub struct Continuation {
    pub lease: Lease,
    pub body: BackendBody,
    pub source: Source,
    /// The prompt's tokens, as the continuation counted them (by tokens).
    pub prompt_tokens: Option<u64>,
}

/// Why no replica took the answer over.
#[derive(Debug)]
pub enum Failed {
    NoReplica(AcquireError),
    Replica(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::NoReplica(e) => write!(f, "no replica to continue on: {e}"),
            Failed::Replica(e) => write!(f, "the replicas tried could not continue it: {e}"),
        }
    }
}

impl Failed {
    /// `onepool_router_stream_moves_failed_total`'s `why`.
    pub fn label(&self) -> &'static str {
        match self {
            Failed::NoReplica(AcquireError::QueueFull) => "queue_full",
            Failed::NoReplica(AcquireError::TimedOut) => "queue_timeout",
            Failed::NoReplica(AcquireError::ClassFull) => "class_full",
            Failed::NoReplica(AcquireError::KeyFull) => "key_full",
            Failed::Replica(_) => "replica_failed",
        }
    }
}

/// The answer taken over by another replica, tried on `attempts` at most.
pub async fn continue_elsewhere(mut ask: Ask) -> Result<Continuation, Failed> {
    let mut last = String::new();
    for _ in 0..ask.attempts.max(1) {
        let want = crate::endpoint::Want {
            exclude: &ask.exclude,
            rank: ask.rank,
            lower: ask.lower,
            ahead: true,
            wait: ask.wait,
            ..Default::default()
        };
        let lease = ask.endpoint.acquire_want(want).await.map_err(Failed::NoReplica)?;
        match on(&ask, &lease).await {
            Ok((body, source, prompt_tokens)) => return Ok(Continuation { lease, body, source, prompt_tokens }),
            Err(Refusal { why, draining }) => {
                let replica = lease.address();
                tracing::info!(endpoint = %ask.endpoint.name(), %replica, "a replica could not continue a stream: {why}");
                match draining {
                    true => ask.endpoint.backend_draining(lease.id()),
                    false => ask.endpoint.exchange_failed(lease.id()),
                }
                ask.exclude.push(lease.id());
                last = why;
            }
        }
    }
    Err(Failed::Replica(last))
}

struct Refusal {
    why: String,
    /// The replica said it drains.
    draining: bool,
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, draining: false }
    }
}

/// The continuation's stream from the replica of `lease`.
async fn on(ask: &Ask, lease: &Lease) -> Result<(BackendBody, Source, Option<u64>), Refusal> {
    let bad = |what: &str| Refusal::from(format!("{what} could not be read"));
    let api_path = match ask.plan.api {
        Api::Chat => "/v1/chat/completions",
        Api::Completion => "/v1/completions",
    };
    if let Some(first) = &ask.replay {
        let resp = send(ask, lease, api_path, first.to_vec()).await?;
        return Ok((resp.into_body(), Source::Replay, None));
    }
    match ask.plan.method {
        Method::Tokens => {
            let prompt = match ask.plan.api {
                Api::Chat => {
                    let req = template_request(&ask.client).ok_or_else(|| bad("the chat's messages"))?;
                    let templated = read_whole(send(ask, lease, TEMPLATE_PATH, req).await?).await?;
                    prompt_of(&templated).ok_or_else(|| bad("/apply-template's answer"))?
                }
                Api::Completion => prompt_of(&ask.client).ok_or_else(|| bad("the prompt"))?,
            };
            let ids = read_whole(send(ask, lease, TOKENIZE_PATH, tokenize_request(&prompt)).await?).await?;
            let prompt_ids = tokens_of(&ids).ok_or_else(|| bad("/tokenize's answer"))?;
            let req = native_request(&ask.client, &prompt_ids, &ask.ids, ask.left).ok_or_else(|| bad("the request"))?;
            let resp = send(ask, lease, NATIVE_PATH, req).await?;
            Ok((resp.into_body(), Source::Native, Some(prompt_ids.len() as u64)))
        }
        Method::Text => {
            let req = text_request(&ask.plan, &ask.client, &ask.text, ask.left).ok_or_else(|| bad("the request"))?;
            let resp = send(ask, lease, api_path, req).await?;
            Ok((resp.into_body(), Source::OpenAi, None))
        }
    }
}

/// One request of the router's own to the replica; a 200 or a refusal.
async fn send(ask: &Ask, lease: &Lease, path: &str, body: Vec<u8>) -> Result<Response<BackendBody>, Refusal> {
    let replica = lease.replica();
    let value = |v: &'static str| HeaderValue::from_static(v);
    let mut fields = vec![
        (http::header::CONTENT_TYPE, value("application/json")),
        (http::header::ACCEPT, value("text/event-stream, application/json")),
        (HeaderName::from_static(MOVABLE_HEADER), value("1")),
    ];
    if let Some(key) = ask.endpoint.replica_key() {
        fields.push((crate::REPLICA_KEY_HEADER, key.clone()));
    }
    if let Some(auth) = &ask.authorization {
        fields.push((http::header::AUTHORIZATION, auth.clone()));
    }
    let call = replica_client::Call { method: "POST", path, fields: &fields, body: &body };
    let head = replica_client::head(&call, replica.address).map_err(Refusal::from)?;
    let mut headers = HeaderMap::new();
    let request = backend_pool::Outgoing {
        head: &head,
        body: &body,
        head_request: false,
        headers: &mut headers,
        body_idle_timeout: ask.idle_timeout,
    };
    let deadline = tokio::time::Instant::now() + ask.request_timeout;
    let send = backend_pool::send(&replica.conns, replica.address, ask.connect_timeout, deadline, request);
    let resp = tokio::select! {
        biased;
        sent = send => sent.map_err(|e| Refusal::from(format!("{path}: {e}")))?,
        () = replica.reach.lost() => return Err(Refusal::from("its health checks no longer reach it".to_string())),
    };
    replica.metrics.requests.count(resp.status().as_u16());
    if resp.status() == StatusCode::OK {
        return Ok(resp);
    }
    let draining = resp.headers().get(DRAINING_HEADER).is_some_and(|v| v.as_bytes() == b"1");
    Err(Refusal { why: format!("{path} answered {}", resp.status()), draining })
}

/// A helper's whole answer (a template, token ids), bounded.
async fn read_whole(resp: Response<BackendBody>) -> Result<Bytes, Refusal> {
    let body = http_body_util::Limited::new(resp.into_body(), MAX_HELPER_ANSWER);
    let whole = body.collect().await.map_err(|e| Refusal::from(format!("its answer could not be read whole: {e}")))?;
    Ok(whole.to_bytes())
}
