//! The router's own answers: OpenAI-style errors, 503 with retry-after,
//! 401 for a missing or wrong bearer token.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;

use crate::access_log::{RequestFacts, Tap};
use crate::proxy::body::{BodyKind, ProxyBody};
use crate::proxy::Target;

pub(super) fn full(body: impl Into<Bytes>) -> ProxyBody {
    ProxyBody { kind: BodyKind::Own(Full::new(body.into())), hold: None, tap: None }
}

pub(super) fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut r = Response::new(full(format!("{message}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

pub(super) fn unavailable(ctx: &Target, message: &str) -> Response<ProxyBody> {
    let mut r = openai_error(StatusCode::SERVICE_UNAVAILABLE, message);
    let secs = ctx.endpoint.queue_settings().timeout.as_secs().max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// 401 unless the request carries one of the endpoint's bearer tokens
/// (endpoints with `[endpoint.auth]`).
pub(super) fn unauthorized(t: &Target, headers: &HeaderMap) -> Option<Response<ProxyBody>> {
    let auth = t.settings.auth.as_ref()?;
    if auth.allows(headers) {
        return None;
    }
    t.endpoint.count_answer(401);
    let mut r = openai_error(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs an API key: send Authorization: Bearer <key> with one of its keys",
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(logged(t, Instant::now(), RequestFacts::default(), "unauthorized", r))
}

/// `GET /v1/models`, which the endpoint answers itself from all its
/// replicas' lists.
pub(super) fn is_models_list<B>(req: &Request<B>) -> bool {
    req.method() == Method::GET && req.uri().path() == "/v1/models"
}

/// `authorization`: the client's, which goes to the replicas as with any
/// other request ([`ProxySettings::client_authorization_passes`]).
pub(super) async fn list_models(t: Arc<Target>, authorization: Option<HeaderValue>) -> Response<ProxyBody> {
    let authorization = authorization.filter(|_| t.settings.client_authorization_passes());
    let r = match crate::models::list(&t.endpoint, t.settings.connect_timeout, authorization).await {
        Ok(list) => json_response(StatusCode::OK, list),
        Err((status, why)) => openai_error(status, &why),
    };
    t.endpoint.count_answer(r.status().as_u16());
    r
}

pub(super) fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

pub(super) fn json_response(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An OpenAI-style error answer, which OpenAI clients show as it is: the
/// endpoint's own answers (no replica, the replica failed) are read by the
/// same clients that read the model server's.
pub(super) fn openai_error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    json_response(status, serde_json::json!({ "error": { "message": message, "type": kind, "code": status.as_u16() } }))
}

/// The router's own answer `r` to a request that never reached the
/// forward (refused as it came), with its access-log line (issue #50:
/// every refusal leaves a trace, with `why`).
pub(super) fn logged(
    t: &Target,
    start: Instant,
    facts: RequestFacts,
    why: &'static str,
    mut r: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let Some(log) = &t.access else { return r };
    let mut tap = Tap::new(log.clone(), t.endpoint.name(), facts, start, r.status().as_u16(), None);
    tap.reason = Some(why);
    r.body_mut().tap = Some(Box::new(tap));
    r
}
