//! Which endpoint takes a request: an endpoint's own listener, or a
//! shared one that picks by `Host`, path prefix or the OpenAI `model`
//! field, and the answers routing gives itself (`/v1/models` lists).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use hyper::body::Incoming;

use crate::access_log::RequestFacts;
use crate::proxy::answers::{
    error_response, is_models_list, json_response, list_models, logged, openai_error, unauthorized,
};
use crate::proxy::body::ProxyBody;
use crate::proxy::body_budget::{read_whole, BodyBudget};
use crate::proxy::connections::ClientConn;
use crate::proxy::routes::{By, Dispatch, Routed};
use crate::proxy::to_replica::{forward, Prepared};
use crate::proxy::Target;
use crate::settings::MODEL_PATHS;

/// The host a request names, lower case, without a port.
pub(super) fn request_host(parts: &http::request::Parts) -> Option<String> {
    let raw = match parts.headers.get(header::HOST).and_then(|v| v.to_str().ok()) {
        Some(h) => h,
        None => parts.uri.authority()?.as_str(),
    };
    let host = match raw.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(']') || raw.starts_with('[') => {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                raw
            }
        }
        _ => raw,
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// Whether `prefix` matches `path` on whole segments.
pub(super) fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/" || (path.starts_with(prefix) && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/')))
}

pub(super) fn strip_prefix(uri: &Uri, prefix: &str) -> Result<Uri, String> {
    let rest = &uri.path()[if prefix == "/" { 0 } else { prefix.len() }..];
    let path = if rest.is_empty() { "/" } else { rest };
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().map_err(|e| format!("request target {pq:?}: {e}"))?);
    Uri::from_parts(parts).map_err(|e| format!("request target {pq:?}: {e}"))
}

#[derive(serde::Deserialize)]
pub(super) struct ModelField {
    pub(super) model: Option<serde_json::Value>,
}

/// What to do with a request, decided as it arrives.
pub(super) enum Plan {
    /// Answered by the listener already (boxed: rare, and large).
    Answer(Box<Response<ProxyBody>>),
    /// A request without a body, for the endpoint's replicas.
    Forward(Prepared, Arc<Target>),
    /// A body to read first (or a model to find in it).
    Later(Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>),
}

pub(super) fn plan(req: Request<Incoming>, client: &Arc<ClientConn>) -> Plan {
    let later = |req| Plan::Later(Box::pin(route(req, client.clone())));
    if !req.body().is_end_stream() {
        return later(req);
    }
    let (req, t) = match &*client.dispatch {
        Dispatch::Single(t) => (req, t),
        Dispatch::Routed(routed) => match routed.by {
            By::Model { .. } => return later(req),
            _ => match pick(req, routed) {
                Picked::Endpoint(req, t) => (req, t),
                Picked::Answered(r) => return Plan::Answer(Box::new(r)),
                Picked::ByModel { req, .. } => return later(req),
            },
        },
    };
    if let Some(r) = unauthorized(t, req.headers()) {
        return Plan::Answer(Box::new(r));
    }
    if is_models_list(&req) {
        return Plan::Later(Box::pin(list_models(t.clone(), req.headers().get(header::AUTHORIZATION).cloned())));
    }
    let start = Instant::now();
    let (parts, _) = req.into_parts();
    let mut p = Prepared::new(parts, Bytes::new(), t, client, start);
    // Nothing read since `start`: the first attempt's clock starts there.
    p.start_is_now = true;
    Plan::Forward(p, t.clone())
}

/// Picks the endpoint for one request, reads its body, then proxies it
/// there.
pub(super) async fn route(req: Request<Incoming>, client: Arc<ClientConn>) -> Response<ProxyBody> {
    let client = &*client;
    // One `forward` await for every way to an endpoint: each await of it
    // would add its state to this future.
    let (req, t) = match &*client.dispatch {
        Dispatch::Single(t) => (req, t),
        Dispatch::Routed(routed) => match pick(req, routed) {
            Picked::Endpoint(req, t) => (req, t),
            Picked::Answered(r) => return r,
            Picked::ByModel { req, max_body, body_timeout, models, budget } => {
                // Boxed: its body reading and JSON parsing would otherwise
                // make every request's future as large.
                let routing = route_by_model(req, max_body, body_timeout, models, budget, client);
                return match Box::pin(routing).await {
                    Routing::Endpoint(r) => r,
                    Routing::Listener(r) => routed.listener_answer(r),
                };
            }
        },
    };
    // Before its body is read: a client without a token costs nothing more.
    if let Some(r) = unauthorized(t, req.headers()) {
        return r;
    }
    if is_models_list(&req) {
        return Box::pin(list_models(t.clone(), req.headers().get(header::AUTHORIZATION).cloned())).await;
    }
    // The body, read whole (bounded) so that a failed attempt can be
    // retried; then the request goes to one of the endpoint's replicas.
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    // Held until the last attempt is over.
    let (body, _share) = if body.is_end_stream() {
        (Bytes::new(), None)
    } else {
        let s = &t.settings;
        // Boxed, as only requests with a body need its state.
        match Box::pin(read_whole(body, s.max_request_body, s.body_read_timeout, &t.budget)).await {
            Ok((b, share)) => (b, Some(share)),
            Err(e) => {
                let r = e.answer(&t.budget, s.max_request_body, "", error_response);
                t.endpoint.count_answer(r.status().as_u16());
                let why = match r.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
                    StatusCode::REQUEST_TIMEOUT => "body_timeout",
                    StatusCode::SERVICE_UNAVAILABLE => "body_budget",
                    _ => "body_unread",
                };
                return logged(t, start, RequestFacts::default(), why, r);
            }
        }
    };
    forward(Prepared::new(parts, body, t, client, start), t).await
}

pub(super) enum Picked<'a> {
    Endpoint(Request<Incoming>, &'a Arc<Target>),
    /// Refused by the listener (counted).
    Answered(Response<ProxyBody>),
    /// To be read for its `model`.
    ByModel {
        req: Request<Incoming>,
        max_body: usize,
        body_timeout: Duration,
        models: &'a BTreeMap<String, Arc<Target>>,
        budget: &'a BodyBudget,
    },
}

/// The endpoint for a request on a shared listener, by host or path.
pub(super) fn pick(req: Request<Incoming>, routed: &Routed) -> Picked<'_> {
    match &routed.by {
        By::Host(hosts) => {
            let (parts, body) = req.into_parts();
            let Some(host) = request_host(&parts) else {
                return Picked::Answered(routed.listener_answer(error_response(
                    StatusCode::BAD_REQUEST,
                    "the request names no host; this listener routes by Host",
                )));
            };
            match hosts.get(&host) {
                Some(t) => Picked::Endpoint(Request::from_parts(parts, body), t),
                None => Picked::Answered(routed.listener_answer(error_response(
                    StatusCode::NOT_FOUND,
                    &format!("no endpoint is served for host {host:?} here"),
                ))),
            }
        }
        By::Path(routes) => {
            let (mut parts, body) = req.into_parts();
            let Some((prefix, strip, t)) = routes.iter().find(|(p, _, _)| prefix_matches(p, parts.uri.path())) else {
                let known: Vec<&str> = routes.iter().map(|(p, _, _)| p.as_str()).collect();
                let msg =
                    format!("no endpoint is served under {:?}; the path prefixes here are {known:?}", parts.uri.path());
                return Picked::Answered(routed.listener_answer(error_response(StatusCode::NOT_FOUND, &msg)));
            };
            if *strip {
                match strip_prefix(&parts.uri, prefix) {
                    Ok(u) => parts.uri = u,
                    Err(msg) => {
                        t.endpoint.count_answer(400);
                        return Picked::Answered(error_response(StatusCode::BAD_REQUEST, &msg));
                    }
                }
            }
            Picked::Endpoint(Request::from_parts(parts, body), t)
        }
        By::Model { max_body, body_timeout, models, budget } => {
            Picked::ByModel { req, max_body: *max_body, body_timeout: *body_timeout, models, budget }
        }
    }
}

/// Who answered a request routed by model: an endpoint (which counted
/// it), or the listener itself (its model list, or a refusal).
pub(super) enum Routing {
    Endpoint(Response<ProxyBody>),
    Listener(Response<ProxyBody>),
}

pub(super) async fn route_by_model(
    req: Request<Incoming>,
    max_body: usize,
    body_timeout: Duration,
    models: &BTreeMap<String, Arc<Target>>,
    budget: &BodyBudget,
    client: &ClientConn,
) -> Routing {
    let known = || models.keys().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ");
    let refuse = |status, msg: &str| Routing::Listener(openai_error(status, msg));
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/v1/models" {
        let data: Vec<_> =
            models.keys().map(|m| serde_json::json!({ "id": m, "object": "model", "owned_by": "onepool" })).collect();
        return Routing::Listener(json_response(StatusCode::OK, serde_json::json!({ "object": "list", "data": data })));
    }
    if !MODEL_PATHS.contains(&path) {
        let msg = format!(
            "this listener routes by the \"model\" of POST {}; {path:?} is not one of them",
            MODEL_PATHS.join(", ")
        );
        return refuse(StatusCode::NOT_FOUND, &msg);
    }
    if req.method() != Method::POST {
        let mut r = openai_error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes POST"));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Routing::Listener(r);
    }
    let (parts, body) = req.into_parts();
    let (body, _share) = match read_whole(body, max_body, body_timeout, budget).await {
        Ok(b) => b,
        Err(e) => {
            let what = ", the most this listener reads to find \"model\" (max_model_body)";
            return Routing::Listener(e.answer(budget, max_body, what, openai_error));
        }
    };
    let model = match serde_json::from_slice::<ModelField>(&body) {
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("request body is not a JSON object: {e}")),
        Ok(ModelField { model: None }) => {
            let msg = format!("the request names no \"model\"; the models served here are {}", known());
            return refuse(StatusCode::NOT_FOUND, &msg);
        }
        Ok(ModelField { model: Some(serde_json::Value::String(m)) }) => m,
        Ok(ModelField { model: Some(other) }) => {
            let msg = format!("\"model\" must be a string, not {other}; the models served here are {}", known());
            return refuse(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let Some(t) = models.get(&model) else {
        let msg = format!("model {model:?} is not served here; the models served here are {}", known());
        return refuse(StatusCode::NOT_FOUND, &msg);
    };
    if let Some(r) = unauthorized(t, &parts.headers) {
        return Routing::Endpoint(r);
    }
    if body.len() > t.settings.max_request_body {
        let msg = format!("request body larger than {} bytes", t.settings.max_request_body);
        t.endpoint.count_answer(413);
        let r = error_response(StatusCode::PAYLOAD_TOO_LARGE, &msg);
        return Routing::Endpoint(logged(t, Instant::now(), RequestFacts::of(&body), "body_too_large", r));
    }
    Routing::Endpoint(forward(Prepared::new(parts, body, t, client, Instant::now()), t).await)
}
