//! HTTP/1.1 to replicas: keep-alive connections, one idle list per
//! replica, and a small client for the one exchange the proxy makes on
//! them (write a request head and its whole body, read a response head,
//! stream the response body). The request that uses a connection does its
//! reads and writes itself, in the client connection's task, with no
//! channel or task between it and the socket. Response heads are parsed by
//! `httparse`; bodies are framed by Content-Length, chunked encoding, or
//! the end of the connection (RFC 9112, section 6). A connection is kept
//! for the next request when its response was read to the end and the
//! replica did not ask to close it; a response left half-way (client gone,
//! timeout, a replica silent mid-body) closes it.
//!
//! A replica whose launcher serves TLS (issue #36) is reached over TLS
//! pinned to the certificate its launcher reported
//! ([`onepool_launcher::hop_tls`]): one handshake per new connection, none
//! per request, and a request never leaves on a connection whose
//! certificate did not match.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderMap;
use http::Response;
use tokio::net::TcpStream;
use tokio::time::Instant;

mod body;
mod conn;
mod idle;
mod limits;

use crate::backend_pool::conn::{BackendConn, Exchange, ReplicaIo};

pub use body::BackendBody;
pub use conn::HOP_BY_HOP;
pub use idle::{IdleConns, Transport};
pub use limits::{IDLE_TIMEOUT, KEEP_ALIVE_RACE};

/// Why a request got no response head from the replica.
#[derive(Debug)]
pub enum SendError {
    /// It never left: no connection could be made, or none would take it.
    NotSent(String),
    /// It may have reached the replica (written, then the exchange failed).
    Failed(String),
    /// No response head by the deadline.
    TimedOut,
    /// No response head yet, and the replica was lost meanwhile
    /// ([`crate::reach`]): none will come.
    Lost,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::NotSent(reason) => write!(f, "not sent: {reason}"),
            SendError::Failed(reason) => write!(f, "{reason}"),
            SendError::TimedOut => write!(f, "no response in time"),
            SendError::Lost => write!(f, "no response head, and its health checks no longer reach it"),
        }
    }
}

/// One request as it goes to a replica.
pub struct Outgoing<'a> {
    /// The request head, serialized (request line, fields, blank line).
    pub head: &'a [u8],
    pub body: &'a [u8],
    /// A HEAD request: the response has no body, whatever it says.
    pub head_request: bool,
    /// A map for the response's header fields (emptied first), so that
    /// the caller's spare one serves instead of a new one.
    pub headers: &'a mut HeaderMap,
    /// Longest silence of the replica in the middle of the response body.
    pub body_idle_timeout: Duration,
}

/// Sends `request` to the replica at `address`, on an idle connection of
/// `idle` or a new one, and returns the response head with its body still
/// to read. Idle connections found closed are skipped. The response head
/// must arrive by `deadline`.
///
/// A reused connection that the replica closes right after the request
/// went out (within [`KEEP_ALIVE_RACE`]) and before any byte of an answer
/// is the race of its keep-alive timeout with our request: the replica
/// dropped the connection unread, so the request goes out once more, on a
/// new connection, whatever its method (as HTTP clients do for a closed
/// idle connection). A close that comes later may follow work done (a
/// replica that died on the request), so it is a failure, as is anything
/// that goes wrong on the new connection: the request was sent once, and
/// the caller must not take it for one that never reached a replica.
pub async fn send(
    idle: &Arc<IdleConns>,
    address: SocketAddr,
    connect_timeout: Duration,
    deadline: Instant,
    request: Outgoing<'_>,
) -> Result<Response<BackendBody>, SendError> {
    // The first attempt's failure, once the request went out on a reused
    // connection closed unanswered: the second attempt is on a new one.
    let mut sent_once: Option<String> = None;
    loop {
        let (mut c, reused) = match sent_once.is_none().then(|| idle.pop()).flatten() {
            Some(c) => (c, true),
            // Boxed: rare, and large.
            None => match (Box::pin(connect(address, &idle.transport, connect_timeout, deadline)).await, &sent_once) {
                (Ok(c), _) => (c, false),
                // The first attempt was taken as unread (the keep-alive
                // race below) and this one never left: another replica may
                // have it. A launcher whose drain ended closes its port
                // right after its connections.
                (Err(SendError::NotSent(e)), Some(first)) => {
                    return Err(SendError::NotSent(format!("{first}; then {e}")))
                }
                (Err(e), _) => return Err(e),
            },
        };
        c.arm(deadline);
        let mut written = 0;
        let sent = poll_fn(|cx| c.poll_write_all(cx, request.head, request.body, &mut written)).await;
        match sent {
            Ok(()) => {}
            Err(Exchange::TimedOut) => return Err(SendError::TimedOut),
            // Nothing went out: the connection was closed under us.
            Err(_) if written == 0 && reused => continue,
            Err(e) if written == 0 && sent_once.is_none() => return Err(SendError::NotSent(describe(address, e))),
            Err(e) => return Err(SendError::Failed(describe(address, e))),
        }
        let written_at = Instant::now();
        let head = match poll_fn(|cx| c.poll_head(cx, request.head_request, request.headers)).await {
            Ok(h) => h,
            Err(Exchange::TimedOut) => return Err(SendError::TimedOut),
            Err(e) if reused && !c.answered && closed_unread(&e) && written_at.elapsed() < KEEP_ALIVE_RACE => {
                sent_once = Some(describe(address, e));
                continue;
            }
            Err(e) => return Err(SendError::Failed(describe(address, e))),
        };
        let body = BackendBody::new(
            c,
            (head.framing, head.keep_alive, head.hop_by_hop),
            idle.clone(),
            request.body_idle_timeout,
        );
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        return Ok(response);
    }
}

/// The replica closed the connection without reading it to the end (an
/// orderly close, or a reset because our request sat unread in its socket).
fn closed_unread(e: &Exchange) -> bool {
    match e {
        Exchange::Closed => true,
        // Under TLS a close without close_notify reads as an unexpected end.
        Exchange::Io(e) => matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof),
        Exchange::TimedOut | Exchange::Invalid(_) => false,
    }
}

fn describe(address: SocketAddr, e: Exchange) -> String {
    match e {
        Exchange::TimedOut => format!("{address}: timed out"),
        Exchange::Closed => format!("{address} closed the connection before answering"),
        Exchange::Io(e) => format!("{address}: {e}"),
        Exchange::Invalid(e) => format!("{address}: {e}"),
    }
}

/// A new connection, its TLS handshake included (within the connect
/// bound: a replica that accepts and then stalls is as good as down).
async fn connect(
    address: SocketAddr,
    transport: &Transport,
    connect_timeout: Duration,
    deadline: Instant,
) -> Result<BackendConn, SendError> {
    let connect_by = Instant::now() + connect_timeout;
    let open = async {
        if matches!(transport, Transport::Refused) {
            return Err(format!("{address}: no transport is known for this replica; nothing is sent to it"));
        }
        let s = TcpStream::connect(address).await.map_err(|e| format!("connecting to {address}: {e}"))?;
        let _ = s.set_nodelay(true);
        match transport {
            Transport::Pinned(tls) => tokio_rustls::TlsConnector::from(tls.config.clone())
                .connect(tls.name.clone(), s)
                .await
                .map(|t| ReplicaIo::Tls(Box::new(t)))
                // A certificate other than the pinned one ends here, before
                // a byte of the request (and the replica key) is written.
                .map_err(|e| format!("TLS with {address} (pinned certificate {}): {e}", tls.pin)),
            _ => Ok(ReplicaIo::Plain(s)),
        }
    };
    match tokio::time::timeout_at(connect_by.min(deadline), open).await {
        Err(_) if deadline < connect_by => Err(SendError::TimedOut),
        Err(_) => Err(SendError::NotSent(format!("connecting to {address} timed out"))),
        Ok(Err(e)) => Err(SendError::NotSent(e)),
        Ok(Ok(io)) => Ok(BackendConn::new(io)),
    }
}
