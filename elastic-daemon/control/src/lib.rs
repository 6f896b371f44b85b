//! onepoold's control API as its clients see it: JSON over HTTP/1.1 on a
//! unix socket, its requests and answers as types ([`api`]), and the
//! client ([`Control`]) for `onepool status`, the demo and the tests, with
//! the error type both sides share. The server (peer checks, binding the
//! socket, the handlers) is onepoold's own (`onepool_elastic_daemon::control`).
//!
//! - `GET  /v1/state`                          → [`api::State`]
//! - `POST /v1/endpoints/NAME/replicas`        [`api::AddReplica`] → [`api::Added`]
//! - `POST /v1/endpoints/NAME/replicas/remove` [`api::ReplicaRef`] → [`api::Removed`]
//! - `POST /v1/endpoints/NAME/replicas/drain`  [`api::ReplicaRef`] → [`api::DrainOutcome`]
//! - `POST /v1/endpoints/NAME/retry`           end the endpoint's start back-off at the next poll → [`api::RetryAccepted`]
//!
//! Every other answer is [`api::ErrorAnswer`] with a 4xx status.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

pub mod api;
pub mod blocking;

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode};
use onepool_client::{unix_client, Caller, ClientError, UnixConnector};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// The largest answer a client reads: a state with hundreds of replicas is
/// well under a megabyte.
const ANSWER_LIMIT: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {action}: {source}")]
    Io { path: String, action: &'static str, source: std::io::Error },
    #[error("control socket {path} exists and is not a socket; remove it or choose another control_socket")]
    NotASocket { path: String },
    /// onepoold answered, and said no.
    #[error("onepoold answered {status}: {message}")]
    Refused { status: StatusCode, message: String },
    #[error("control request: {0}")]
    Http(String),
}

/// A client of one onepoold's control socket.
#[derive(Debug, Clone)]
pub struct Control {
    socket: PathBuf,
    caller: Caller<UnixConnector>,
}

impl Control {
    /// Each request answered whole within `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        let socket = socket.into();
        Control { caller: Caller::new(unix_client(&socket), timeout), socket }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub async fn state(&self) -> Result<api::State, ControlError> {
        self.typed(Method::GET, "/v1/state", None::<&()>).await
    }

    pub async fn add_replica(&self, endpoint: &str, add: &api::AddReplica) -> Result<api::Added, ControlError> {
        self.typed(Method::POST, &format!("/v1/endpoints/{endpoint}/replicas"), Some(add)).await
    }

    pub async fn remove_replica(&self, endpoint: &str, r: &api::ReplicaRef) -> Result<api::Removed, ControlError> {
        self.typed(Method::POST, &format!("/v1/endpoints/{endpoint}/replicas/remove"), Some(r)).await
    }

    pub async fn drain_replica(&self, endpoint: &str, r: &api::ReplicaRef) -> Result<api::DrainOutcome, ControlError> {
        self.typed(Method::POST, &format!("/v1/endpoints/{endpoint}/replicas/drain"), Some(r)).await
    }

    pub async fn retry(&self, endpoint: &str) -> Result<api::RetryAccepted, ControlError> {
        self.typed(Method::POST, &format!("/v1/endpoints/{endpoint}/retry"), None::<&()>).await
    }

    /// Any request, its status and JSON answer as they came: for the tests
    /// that send what no typed client would.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ControlError> {
        let body = body.map(Value::to_string);
        let answer = self.send(method, path, body.as_deref()).await?;
        let value = answer.json().map_err(ControlError::Http)?;
        Ok((answer.status, value))
    }

    async fn typed<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ControlError> {
        let body = body.map(|b| serde_json::to_string(b).map_err(|e| ControlError::Http(e.to_string()))).transpose()?;
        let answer = self.send(method, path, body.as_deref()).await?;
        if !answer.status.is_success() {
            let message = answer.json::<api::ErrorAnswer>().map_or_else(|_| answer.text(), |e| e.error);
            return Err(ControlError::Refused { status: answer.status, message });
        }
        answer.json().map_err(ControlError::Http)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&str>,
    ) -> Result<onepool_client::Answer, ControlError> {
        let uri = format!("http://onepoold{path}");
        let req = self.caller.build(method, &uri, body, &[]).map_err(|e| ControlError::Http(e.to_string()))?;
        self.caller.send(req, ANSWER_LIMIT).await.map_err(|e| self.error(e))
    }

    fn error(&self, e: ClientError) -> ControlError {
        match e {
            ClientError::Connect { source, .. } => {
                ControlError::Io { path: self.socket.display().to_string(), action: "connecting", source }
            }
            other => ControlError::Http(other.to_string()),
        }
    }
}
