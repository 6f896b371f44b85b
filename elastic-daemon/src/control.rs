//! The control API: JSON over HTTP/1.1 on a unix socket. Replicas enter an
//! endpoint only through here (or the daemon itself), so the socket is the
//! trust boundary: file mode 0600 by default, and every connection's peer
//! uid (SO_PEERCRED) must be root or the daemon's own.
//!
//! This is the server side; the requests it answers are listed in
//! [`onepool_control`], which holds the client and the error type both
//! sides share.

use std::convert::Infallible;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use onepool_control::api;
use onepool_control::ControlError;
use onepool_router::backend_pool::Transport;
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::routed::{RoutedEndpoint as Routed, Router};

/// Only root and the daemon's own user may change the router.
pub fn peer_allowed(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_uid
}

/// Binds the socket (replacing a stale one from an earlier run) and sets
/// its mode before anyone can connect through the listener.
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, ControlError> {
    let p = path.display().to_string();
    let io = |action, source| ControlError::Io { path: p.clone(), action, source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ControlError::NotASocket { path: p });
        }
        std::fs::remove_file(path).map_err(|e| io("removing the stale socket", e))?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("creating its folder", e))?;
    }
    // The umask makes the socket private from the moment it exists; the
    // chmod then sets the configured mode.
    let bound = onepool_os::with_umask(0o177, || UnixListener::bind(path));
    let listener = bound.map_err(|e| io("binding", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| io("setting its mode", e))?;
    Ok(listener)
}

/// Serves the control API until `shutdown` turns true.
pub async fn serve(listener: UnixListener, router: Arc<Router>, mut shutdown: watch::Receiver<bool>) {
    let own_uid = onepool_os::geteuid();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = onepool_router::shutdown::stopped(&mut shutdown) => return,
        };
        let uid = match stream.peer_cred() {
            Ok(c) => c.uid(),
            Err(e) => {
                tracing::warn!("control socket: cannot read the peer's credentials: {e}");
                continue;
            }
        };
        if !peer_allowed(uid, own_uid) {
            tracing::warn!(
                uid,
                "control socket: refused a connection from a uid that is neither root nor the daemon's"
            );
            continue;
        }
        let router = router.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let router = router.clone();
                async move { Ok::<_, Infallible>(handle(req, &router).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    // The API's types have no map with non-string keys and no failing
    // Serialize: this cannot fail, and if it ever did the client still
    // gets an answer that says so.
    let text = serde_json::to_string(body)
        .unwrap_or_else(|e| format!(r#"{{"error":"onepoold could not write its answer: {e}"}}"#));
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Full<Bytes>> {
    reply(status, &api::ErrorAnswer { error: message.to_string() })
}

async fn handle(req: Request<Incoming>, router: &Router) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, 64 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("request body: {e}")),
    };
    let segments: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
    match (&parts.method, segments.as_slice()) {
        (&Method::GET, ["v1", "state"]) => reply(StatusCode::OK, &state(router)),
        (&Method::POST, ["v1", "endpoints", name, "retry"]) => retry(router, name),
        (&Method::POST, ["v1", "endpoints", name, "replicas", rest @ ..]) => {
            let Some(ep) = router.endpoints.get(*name) else {
                return unknown_endpoint(router, name);
            };
            match rest {
                [] => add(ep, name, &body),
                ["remove"] => remove(ep, name, &body),
                ["drain"] => drain(ep, name, &body).await,
                _ => error(StatusCode::NOT_FOUND, format!("no such path {}", parts.uri.path())),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            format!("no such request {} {}; see `GET /v1/state`", parts.method, parts.uri.path()),
        ),
    }
}

fn state(router: &Router) -> api::State {
    let endpoints = router
        .endpoints
        .values()
        .map(|e| {
            let mut state = e.endpoint.snapshot();
            state.replica_jobs = e.replica_jobs.as_ref().map(|v| v.lock().unwrap_or_else(|p| p.into_inner()).clone());
            state
        })
        .collect();
    api::State { endpoints, leadership: Some(router.leadership.view()) }
}

fn unknown_endpoint(router: &Router, name: &str) -> Response<Full<Bytes>> {
    let known: Vec<_> = router.endpoints.keys().collect();
    error(StatusCode::NOT_FOUND, format!("no endpoint {name:?}; configured: {known:?}"))
}

fn retry(router: &Router, name: &str) -> Response<Full<Bytes>> {
    let Some(ep) = router.endpoints.get(name) else {
        return unknown_endpoint(router, name);
    };
    let Some(view) = &ep.replica_jobs else {
        return error(
            StatusCode::CONFLICT,
            format!("endpoint {name:?} has no [endpoint.replicas]: onepoold submits no replica job for it"),
        );
    };
    let mut v = view.lock().unwrap_or_else(|p| p.into_inner());
    let was = v.start_failures.clone();
    v.retry_requested = true;
    tracing::info!(endpoint = %name, in_a_row = was.in_a_row, "start back-off: retry requested");
    reply(
        StatusCode::ACCEPTED,
        &api::RetryAccepted { endpoint: name.to_string(), was, retry: "at the next poll".into() },
    )
}

/// The request's body as `T`, or the 400 answer that says what is wrong
/// with it and what was expected.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8], expected: &str) -> Result<T, Box<Response<Full<Bytes>>>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("body: {e}; expected {expected}"))))
}

fn add(ep: &Routed, name: &str, body: &[u8]) -> Response<Full<Bytes>> {
    let b: api::AddReplica =
        match parse(body, r#"{"address": "IP:PORT", "concurrency": N, "ready": BOOL, "pin": "SHA-256 HEX"}"#) {
            Ok(b) => b,
            Err(answer) => return *answer,
        };
    let ready = b.ready.unwrap_or(!ep.health_checked);
    let transport = match b.pin.as_deref().map(|p| p.parse().and_then(onepool_launcher::hop_tls::pinned_client)) {
        None => Transport::Plain,
        Some(Ok(client)) => Transport::Pinned(client),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("pin: {e}")),
    };
    match ep.endpoint.add_with(b.address, transport, b.concurrency, ready) {
        Ok(id) => {
            tracing::info!(endpoint = %name, address = %b.address, ready, "replica added");
            reply(StatusCode::CREATED, &api::Added { id })
        }
        Err(e) => error(StatusCode::CONFLICT, e),
    }
}

const REPLICA_REF: &str = r#"{"address": "IP:PORT", "deadline": "30s"}"#;

fn remove(ep: &Routed, name: &str, body: &[u8]) -> Response<Full<Bytes>> {
    let b: api::ReplicaRef = match parse(body, REPLICA_REF) {
        Ok(b) => b,
        Err(answer) => return *answer,
    };
    match ep.endpoint.remove(b.address) {
        Ok(r) => {
            tracing::info!(endpoint = %name, address = %b.address, in_flight = r.in_flight, "replica removed");
            reply(StatusCode::OK, &api::Removed { removed: r.view() })
        }
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

async fn drain(ep: &Routed, name: &str, body: &[u8]) -> Response<Full<Bytes>> {
    let b: api::ReplicaRef = match parse(body, REPLICA_REF) {
        Ok(b) => b,
        Err(answer) => return *answer,
    };
    let deadline = match b.deadline.as_deref().map(onepool_decisions::duration::parse_millis) {
        None => Duration::from_secs(30),
        Some(Ok(d)) => d,
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("deadline: {e}")),
    };
    tracing::info!(endpoint = %name, address = %b.address, ?deadline, "drain started");
    match ep.endpoint.drain(b.address, deadline).await {
        Ok(outcome) => {
            tracing::info!(endpoint = %name, address = %b.address, ?outcome, "drain ended");
            reply(StatusCode::OK, &outcome)
        }
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_own_uid_are_allowed() {
        assert!(peer_allowed(0, 1000));
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(65534, 0));
    }
}
