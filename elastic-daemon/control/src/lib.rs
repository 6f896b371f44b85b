//! onepoold's control API as its clients see it: JSON over HTTP/1.1 on a
//! unix socket, and the client that sends one request ([`request`]), for
//! `onepool status`, the demo and the tests, with the error type both sides
//! share. The server (peer checks, binding the socket, the handlers) is
//! onepoold's own (`onepool_elastic_daemon::control`).
//!
//! - `GET  /v1/state`  endpoints, their replicas and (with `[endpoint.replicas]`) the replica jobs
//! - `POST /v1/endpoints/NAME/replicas`        `{"address": "10.0.0.5:8000", "concurrency": 8, "ready": false}`
//! - `POST /v1/endpoints/NAME/replicas/remove` `{"address": "..."}`
//! - `POST /v1/endpoints/NAME/replicas/drain`  `{"address": "...", "deadline": "30s"}`
//! - `POST /v1/endpoints/NAME/retry`           end the endpoint's start back-off at the next poll

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

use std::path::Path;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::UnixStream;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {action}: {source}")]
    Io { path: String, action: &'static str, source: std::io::Error },
    #[error("control socket {path} exists and is not a socket; remove it or choose another control_socket")]
    NotASocket { path: String },
    #[error("control request: {0}")]
    Http(String),
}

/// One control request from a client (the CLI, tests): returns the status
/// and the JSON answer.
pub async fn request(
    socket: &Path,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Value), ControlError> {
    let p = socket.display().to_string();
    let stream = UnixStream::connect(socket).await.map_err(|source| ControlError::Io {
        path: p.clone(),
        action: "connecting",
        source,
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ControlError::Http(e.to_string()))?;
    tokio::spawn(conn);
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "onepoold")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ControlError::Http(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| ControlError::Http(e.to_string()))?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map_err(|e| ControlError::Http(e.to_string()))?.to_bytes();
    let value = serde_json::from_slice(&bytes).map_err(|e| ControlError::Http(format!("answer is not JSON: {e}")))?;
    Ok((status, value))
}
