//! The router's own calls to replicas (health checks, `/v1/models`
//! listings, onepoold's scrapes of their metrics): a GET on the replica's
//! own connections ([`crate::backend_pool`]), so they take the same
//! transport as proxied requests (TLS pinned to the replica's certificate,
//! issue #36) and never a path of their own around it. Its own module so
//! that the proxy, the health checks and the listings all depend on it and
//! not on one another.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::backend_pool::{self, IdleConns, Outgoing};

/// `GET path` to the replica at `address` with `fields` added, on one of
/// `conns` (a new one within `connect_timeout`); its status and body (at
/// most `max_bytes`), all within `timeout`. The error says why, for the
/// logs.
pub async fn get(
    conns: &Arc<IdleConns>,
    address: SocketAddr,
    path: &str,
    fields: &[(HeaderName, HeaderValue)],
    connect_timeout: Duration,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), String> {
    let call = Call { method: "GET", path, fields, body: &[] };
    request(conns, address, call, connect_timeout, timeout, max_bytes).await
}

/// One request of the router's (or onepoold's preflight's) own.
pub struct Call<'a> {
    pub method: &'static str,
    pub path: &'a str,
    pub fields: &'a [(HeaderName, HeaderValue)],
    /// Sent with its Content-Length (none for an empty GET).
    pub body: &'a [u8],
}

/// The request head of `call` to the replica at `address`.
pub fn head(call: &Call<'_>, address: SocketAddr) -> Result<Vec<u8>, String> {
    let Call { method, path, fields, body } = call;
    // The path goes into the request line as it is: nothing that could
    // end the line or add a field.
    if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{path:?} is not a path to ask a replica for"));
    }
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {address}\r\n").into_bytes();
    if !body.is_empty() || *method != "GET" {
        head.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    for (name, value) in *fields {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Ok(head)
}

/// [`get`] for any method and body.
pub async fn request(
    conns: &Arc<IdleConns>,
    address: SocketAddr,
    call: Call<'_>,
    connect_timeout: Duration,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), String> {
    let head = head(&call, address)?;
    let Call { method, path, body, .. } = call;
    let deadline = Instant::now() + timeout;
    let exchange = async {
        let mut headers = HeaderMap::new();
        let request =
            Outgoing { head: &head, body, head_request: false, headers: &mut headers, body_idle_timeout: timeout };
        let response = backend_pool::send(conns, address, connect_timeout, deadline, request)
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), max_bytes);
        let body = body.collect().await.map_err(|e| format!("{method} {path}: reading the answer: {e}"))?.to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout_at(deadline, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("{method} {path}: no answer in time")))
}
