//! The accept loop of a listener: connection caps, TLS, HTTP/1.1 and
//! HTTP/2, and the graceful stop.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::proxy::client_stream::{ClientStream, REFUSED};
use crate::proxy::connections::{ClientConn, Connections, RequestHold};
use crate::proxy::dispatch::{plan, Plan};
use crate::proxy::graceful::{Guarded, HeadTimeout};
use crate::proxy::lean;
use crate::proxy::routes::Dispatch;
use crate::proxy::to_replica::forward;
use crate::settings::ConnSettings;

/// Serves `dispatch` on `listener` until `shutdown` turns true, then
/// stops accepting and lets open requests finish for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    dispatch: Arc<Dispatch>,
    conn: ConnSettings,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The head timeout is the guard's (see `Guarded`), not hyper's.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None).max_buf_size(conn.max_header_bytes.max(8192));
    builder.http2().timer(TokioTimer::new()).max_header_list_size(conn.max_header_bytes as u32);
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let conns = Arc::new(Connections::new(&conn, &address, metrics));
    let acceptor = conn.tls.as_ref().map(|t| t.acceptor());
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off a moment
                    // instead of spinning on the error.
                    tracing::warn!(listener = %dispatch.name(), "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::shutdown::stopped(&mut shutdown) => break,
        };
        let Some(id) = conns.add(peer.ip()) else {
            // Refused before anything is made for it; the answer is a
            // courtesy (it may not be read), the close is what counts.
            let _ = stream.try_write(REFUSED);
            tracing::debug!(listener = %dispatch.name(), %peer, "connection refused: over the connection cap");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client = ClientConn::new(dispatch.clone(), peer.ip());
        let requests = client.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let hold = RequestHold::new(requests.clone(), req.version());
            // Decided before the future is made, so that it carries only
            // what the request needs (every request's future is moved
            // around whole).
            let plan = plan(req, &hold.client);
            async move {
                let mut r = match plan {
                    Plan::Answer(r) => *r,
                    Plan::Forward(p, t) => forward(p, &t).await,
                    Plan::Later(f) => f.await,
                };
                r.body_mut().hold = Some(hold);
                Ok::<_, Infallible>(r)
            }
        });
        let (builder, conns, conn, acceptor) = (builder.clone(), conns.clone(), conn.clone(), acceptor.clone());
        tokio::spawn(async move {
            let make = move |io: lean::Prefixed| builder.serve_connection(TokioIo::new(io), svc).into_owned();
            let plain = |io| lean::Prefixed { rest: Bytes::new(), io };
            let served = match (acceptor, &*client.dispatch) {
                // An endpoint's own listener in clear: the lean path first.
                (None, Dispatch::Single(t)) => {
                    let lean = lean::serve(stream, client.clone(), t.clone(), conn.max_header_bytes);
                    lean::Switch::Lean { lean: Box::pin(lean), make, client: client.clone() }
                }
                (None, Dispatch::Routed(_)) => {
                    lean::Switch::hyper(make(plain(ClientStream::Plain(stream))), client.clone())
                }
                // The handshake in the connection's own task, so a slow
                // client never holds up the accept loop; it gets the head's
                // time.
                (Some(a), _) => match handshake(&a, stream, conn.header_read_timeout, peer).await {
                    Some(s) => lean::Switch::hyper(make(plain(ClientStream::Tls(Box::new(s)))), client.clone()),
                    None => {
                        conns.remove(id, peer.ip());
                        return;
                    }
                },
            };
            let served = Guarded::new(served, client, (conns, id, peer.ip()), &conn);
            match served.await {
                Ok(()) => {}
                Err(HeadTimeout::Elapsed) => tracing::debug!(%peer, "no request head in time; connection closed"),
                Err(HeadTimeout::Conn(e)) => tracing::debug!(%peer, "client connection ended: {e}"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, conns.stop()).await.is_err() {
        tracing::warn!(listener = %dispatch.name(), "shutdown grace period over; closing open connections");
    }
}

/// A TLS client's handshake, within `timeout`; `None` (logged) if it
/// failed or took longer.
async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    timeout: Duration,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "no TLS handshake in time; connection closed");
            None
        }
    }
}
