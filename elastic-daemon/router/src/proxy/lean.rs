//! The lean HTTP/1.1 path: plain HTTP/1.1 requests of an endpoint's own
//! listener, read and answered without hyper's server.
//!
//! Why: at full load the proxy's own CPU time per request is what caps its
//! throughput on a core, and hyper's server spends about a microsecond per
//! request turning each head into a header map and back (issue #28 item 5:
//! onepoold was 0.87-0.94 of nginx's throughput on one core). Here a request
//! head is parsed in place (httparse, fields on the stack), the replica's
//! head is written straight from those fields, and the answer's head
//! straight from the replica's; the forward itself is the same `forward`
//! every request takes (retries, drain, prefix routing, metrics, the
//! access log).
//!
//! Why only the common case: every request this path is unsure of is
//! handed to hyper, which then serves the rest of the connection from the
//! first byte of that request, so each refusal (400, 401, 413, 431, 503 over
//! the body budget) and each rarer feature (chunked, slow or large request
//! bodies, `Expect`, `Connection` and the other hop-by-hop fields,
//! HTTP/1.0, HTTP/2 prior knowledge, the models list) keeps one
//! implementation. The lean path takes a request only when it is HTTP/1.1
//! in origin form with one `Host`, no hop-by-hop, `Expect` or `x-request-class` field, at most
//! one valid `Content-Length` whose body (at most [`MAX_BODY`]) is already
//! in the socket when its head is read and fits the body budget, on an
//! endpoint with keys an accepted key (which, as on hyper's path, does not
//! go on to the replica), and on an endpoint that continues answers no
//! generation that asks for a stream (hyper's path follows those; a whole
//! answer is only sent again whole, marked movable here as there). TLS and
//! shared listeners are hyper's throughout.

use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Response, StatusCode, Version};
use http_body::{Body, Frame};
use onepool_launcher::conventions::MOVABLE_HEADER;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::backend_pool::HOP_BY_HOP;
use crate::classes::CLASS_HEADER;
use crate::proxy::body::ProxyBody;
use crate::proxy::body_budget::BodyShare;
use crate::proxy::client_stream::ClientStream;
use crate::proxy::connections::{ClientConn, RequestHold};
use crate::proxy::graceful::GracefulStop;
use crate::proxy::to_replica::{forward, is_generation_path, is_onepool_field, HeadWriter, Prepared};
use crate::proxy::Target;
use crate::resume::plan::{asks_whole, Api};

/// Most header fields in a request head (hyper's default limit too).
const MAX_FIELDS: usize = 100;
/// Read buffer growth.
pub(super) const READ_CHUNK: usize = 8192;
/// Largest request body the lean path takes. Its bytes are read before
/// the body budget is asked (a larger body goes to hyper's path, which
/// asks it frame by frame), so this bounds what a connection holds outside
/// the budget; a chat prompt of some thousand tokens fits.
const MAX_BODY: usize = 64 * 1024;

/// How a lean connection ended.
pub(super) enum Ended {
    /// The client closed, or the connection closes after its last answer.
    Closed,
    /// A request the lean path does not take: it (unread, at the start of
    /// the bytes) and the rest of the connection go to hyper.
    HandOver(TcpStream, Bytes),
}

/// A request head the lean path takes.
struct Taken {
    head_len: usize,
    body_len: usize,
    head_request: bool,
    retry_any: bool,
    generation: bool,
    /// A generation whose answer is whole on an endpoint that continues
    /// answers: movable, sent again whole (issue #51 item 5).
    whole: bool,
}

enum Parsed {
    Take(Taken),
    /// The head is not whole yet.
    More,
    /// The head is, its body not yet: this many bytes in all.
    Body(usize),
    /// hyper's to serve.
    Decline,
}

/// Serves `io`'s requests for `t` while they are the common case.
pub(super) async fn serve(
    mut io: TcpStream,
    client: Arc<ClientConn>,
    t: Arc<Target>,
    max_head: usize,
) -> io::Result<Ended> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut spare = HeaderMap::new();
    let mut out = Vec::with_capacity(512);
    loop {
        let mut head = Vec::new();
        let mut body_tried = false;
        let taken = loop {
            if !buf.is_empty() {
                match parse(&buf, &t, &client, max_head, &mut head) {
                    Parsed::Take(x) => break x,
                    Parsed::More => {}
                    // The rest of a body may be in the socket already (a
                    // read stops where the buffer ends): taken without
                    // waiting; a body still on its way is hyper's, whose
                    // body timeout then applies.
                    Parsed::Body(total) if !body_tried => {
                        body_tried = true;
                        buf.reserve(total - buf.len());
                        while buf.len() < total && matches!(io.try_read_buf(&mut buf), Ok(n) if n > 0) {}
                        continue;
                    }
                    Parsed::Body(_) | Parsed::Decline => return Ok(Ended::HandOver(io, buf.freeze())),
                }
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(READ_CHUNK);
            }
            let read = std::future::poll_fn(|cx| {
                // Between requests, a graceful stop closes the connection.
                if buf.is_empty() && client.stop.load(Ordering::Relaxed) {
                    return Poll::Ready(Ok(0));
                }
                tokio_util::io::poll_read_buf(Pin::new(&mut io), cx, &mut buf)
            });
            if read.await? == 0 {
                return Ok(Ended::Closed);
            }
        };
        // The body's bytes in the daemon-wide budget, as `read_whole` takes
        // them; without room, hyper's path answers 503 as it does.
        let share = match taken.body_len {
            0 => None,
            n if t.budget.take(n) => Some(BodyShare { budget: &t.budget, bytes: n }),
            _ => return Ok(Ended::HandOver(io, buf.freeze())),
        };
        let hold = RequestHold::new(client.clone(), Version::HTTP_11);
        buf.advance(taken.head_len);
        let body = buf.split_to(taken.body_len).freeze();
        let p = Prepared::lean(
            head,
            body,
            std::mem::take(&mut spare),
            taken.head_request,
            (taken.retry_any, taken.generation, taken.whole),
        );
        let Some(mut response) = forward_unless_gone(forward(p, &t), &mut io, &mut buf, max_head).await else {
            // The client left while its request waited (queued, or for
            // its replica's answer): the request is dropped with it, so it
            // leaves the queue or frees its replica, as on hyper's path.
            return Ok(Ended::Closed);
        };
        drop(share);
        let closing = client.stop.load(Ordering::Relaxed);
        // Let go with the body, at the end of its last write, as hyper
        // lets go of it.
        response.body_mut().hold = Some(hold);
        spare = write_response(&mut io, response, taken.head_request, closing, &mut out).await?;
        spare.clear();
        if closing || client.stop.load(Ordering::Relaxed) {
            let _ = io.shutdown().await;
            return Ok(Ended::Closed);
        }
    }
}

/// Awaits `forward` while watching the client's side: `None` if the
/// client closes (or its connection fails) first. Bytes it sends meanwhile
/// (its next pipelined request) are kept in `buf`, up to `max_head`.
/// Costs no system call while the client is quiet: its socket's readiness
/// is known.
async fn forward_unless_gone(
    forward: impl Future<Output = Response<ProxyBody>>,
    io: &mut TcpStream,
    buf: &mut BytesMut,
    max_head: usize,
) -> Option<Response<ProxyBody>> {
    let mut forward = std::pin::pin!(forward);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = forward.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        while buf.len() < max_head {
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(READ_CHUNK);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        Poll::Pending
    })
    .await
}

/// Parses the head at the start of `buf` and, if the lean path takes the
/// request, writes the replica's head into `head` (as `Forwarded::head`
/// does from a header map).
fn parse(buf: &[u8], t: &Target, client: &ClientConn, max_head: usize, head: &mut Vec<u8>) -> Parsed {
    let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, buf, &mut fields)
    {
        Ok(httparse::Status::Complete(n)) if n <= max_head => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Parsed::More,
        _ => return Parsed::Decline,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else { return Parsed::Decline };
    let models = method == "GET" && target.split('?').next() == Some("/v1/models");
    if !target.starts_with('/') || method == "CONNECT" || models {
        return Parsed::Decline;
    }
    // A request's class is read on the full path too (crate::classes).
    if t.settings.classes.is_some() {
        return Parsed::Decline;
    }
    let (mut hosts, mut length, mut forwarded, mut authorization) = (0, None, None, None);
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
        } else if name.eq_ignore_ascii_case(b"content-length") {
            match (length, content_length(f.value)) {
                (None, Some(n)) => length = Some(n),
                _ => return Parsed::Decline,
            }
        } else if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            forwarded = forwarded.or(Some(f.value));
        } else if name.eq_ignore_ascii_case(b"authorization") {
            authorization = authorization.or(Some(f.value));
        } else if is_declined_field(name) {
            return Parsed::Decline;
        }
    }
    let body_len = length.unwrap_or(0);
    if hosts != 1 || body_len > t.settings.max_request_body.min(MAX_BODY) {
        return Parsed::Decline;
    }
    if buf.len() - head_len < body_len {
        return Parsed::Body(head_len + body_len);
    }
    let Some(whole) = whole_answer(method, target, &buf[head_len..head_len + body_len], t) else {
        return Parsed::Decline;
    };
    if t.settings.auth.as_ref().is_some_and(|a| !a.allows_value(authorization)) {
        return Parsed::Decline;
    }
    let drop_authorization = !t.settings.client_authorization_passes();
    let mut w = HeadWriter::new(head, buf.len().min(head_len + 128));
    w.request_line(method, target);
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        let kept_back = name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"x-forwarded-for")
            || is_onepool_field(name)
            || (drop_authorization && name.eq_ignore_ascii_case(b"authorization"));
        if !kept_back {
            w.field(name, f.value);
        }
    }
    let own = client.forwarded_for.as_bytes();
    match forwarded.filter(|v| v.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))) {
        Some(prev) => w.field_parts(b"x-forwarded-for", &[prev, b", ", own]),
        None => w.field(b"x-forwarded-for", own),
    }
    if let Some(k) = t.endpoint.replica_key() {
        w.field(crate::REPLICA_KEY_HEADER.as_str().as_bytes(), k.as_bytes());
    }
    if whole {
        w.field(MOVABLE_HEADER.as_bytes(), b"1");
    }
    if length.is_some() {
        w.field(b"content-length", body_len.to_string().as_bytes());
    }
    w.end();
    let head_request = method == "HEAD";
    let generation = method == "POST" && is_generation_path(target);
    let retry_any = t.settings.idempotent || generation || matches!(method, "GET" | "HEAD" | "OPTIONS");
    Parsed::Take(Taken { head_len, body_len, head_request, retry_any, generation, whole })
}

/// On an endpoint that continues answers, whether a request is a
/// generation asking for a whole answer: it is only sent again whole, so it
/// stays here, marked movable. `None`: a stream the router may continue
/// elsewhere, read on the full path, which follows it (crate::resume).
fn whole_answer(method: &str, target: &str, body: &[u8], t: &Target) -> Option<bool> {
    if method != "POST" || t.settings.resume.is_none() || Api::of_path(target).is_none() {
        return Some(false);
    }
    asks_whole(target, body).then_some(true)
}

/// A Content-Length value: digits only (no sign, no list), as RFC 9110
/// section 8.6 has it; anything else is hyper's to refuse.
fn content_length(v: &[u8]) -> Option<usize> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A field whose request is hyper's path's: `Expect`, hop-by-hop fields
/// and a request class (refused or read there).
fn is_declined_field(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"expect")
        || name.eq_ignore_ascii_case(CLASS_HEADER.as_bytes())
        || is_hop_by_hop_name(name)
}

fn is_hop_by_hop_name(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// What the response writer does next.
enum Next {
    Frame(Option<Result<Frame<Bytes>, io::Error>>),
    /// The body has nothing yet: the head goes out first (a stream's
    /// client sees its status at once).
    Flush,
}

/// Writes `response` to the client: its head from its fields (a `date`
/// added if it has none, as hyper does), its body as it comes, framed by
/// its length or chunked. Returns its header map, for the next request.
async fn write_response(
    io: &mut TcpStream,
    response: Response<ProxyBody>,
    head_request: bool,
    closing: bool,
    out: &mut Vec<u8>,
) -> io::Result<HeaderMap> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let mut w = HeadWriter::new(out, 256);
    w.status_line(status);
    let (mut has_length, mut has_date) = (false, false);
    for (name, value) in &parts.headers {
        if name == header::TRANSFER_ENCODING || name == header::CONNECTION {
            continue;
        }
        has_length |= name == header::CONTENT_LENGTH;
        has_date |= name == header::DATE;
        w.field(name.as_str().as_bytes(), value.as_bytes());
    }
    if !has_date {
        date::with(|d| w.field(b"date", d));
    }
    let bodyless = head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let mut chunked = false;
    if !bodyless && !has_length {
        match body.size_hint().exact() {
            Some(n) => w.field(b"content-length", n.to_string().as_bytes()),
            None => {
                chunked = true;
                w.field(b"transfer-encoding", b"chunked");
            }
        }
    }
    if closing {
        w.field(b"connection", b"close");
    }
    w.end();
    while !bodyless && !body.is_end_stream() {
        let next = std::future::poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(f) => Poll::Ready(Next::Frame(f)),
            Poll::Pending if !out.is_empty() => Poll::Ready(Next::Flush),
            Poll::Pending => Poll::Pending,
        })
        .await;
        let data = match next {
            Next::Flush => {
                write_all(io, &[out]).await?;
                out.clear();
                continue;
            }
            Next::Frame(None) => break,
            // The answer cannot be finished: the connection closes (as
            // hyper's does), so the client sees it cut short.
            Next::Frame(Some(Err(e))) => return Err(e),
            Next::Frame(Some(Ok(frame))) => match frame.into_data() {
                Ok(d) if !d.is_empty() => d,
                _ => continue,
            },
        };
        if chunked {
            let size = format!("{:x}\r\n", data.len());
            write_all(io, &[out, size.as_bytes(), &data, b"\r\n"]).await?;
        } else {
            write_all(io, &[out, &data]).await?;
        }
        out.clear();
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() {
        write_all(io, &[out]).await?;
        out.clear();
    }
    Ok(parts.headers)
}

/// Writes every byte of `parts`, in as few system calls as the socket
/// allows (one, almost always).
async fn write_all(io: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0;
    while done < total {
        let mut skip = done;
        let mut slices = [IoSlice::new(&[]); 4];
        let mut n = 0;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            slices[n] = IoSlice::new(&p[skip..]);
            skip = 0;
            n += 1;
        }
        match io.write_vectored(&slices[..n]).await? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            k => done += k,
        }
    }
    Ok(())
}

/// The `date` field, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    pub(super) fn with(f: impl FnOnce(&[u8])) {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        CACHED.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != secs {
                *c = (secs, httpdate::fmt_http_date(now));
            }
            f(c.1.as_bytes());
        });
    }
}

/// A client connection that hyper serves after the lean path: the bytes
/// the lean path read and did not use come first.
pub(super) struct Prefixed {
    pub(super) rest: Bytes,
    pub(super) io: ClientStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.rest.is_empty() {
            let n = me.rest.len().min(buf.remaining());
            buf.put_slice(&me.rest[..n]);
            me.rest.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut me.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A client connection's future: the lean path until it hands the
/// connection over, hyper's connection (made by `make`) from then on.
pub(super) enum Switch<L, M, H> {
    Lean {
        lean: Pin<Box<L>>,
        make: M,
        client: Arc<ClientConn>,
    },
    /// `stop_after`: a stop came while lean; hyper is told to stop once it
    /// has a request of its own past this count (an unread request would
    /// otherwise be dropped: see `Guarded`).
    Hyper {
        conn: Pin<Box<H>>,
        client: Arc<ClientConn>,
        stop_after: Option<u64>,
    },
    Over,
}

pub(super) type ConnError = Box<dyn std::error::Error + Send + Sync>;

impl<L, M, H> Switch<L, M, H> {
    pub(super) fn hyper(conn: H, client: Arc<ClientConn>) -> Switch<L, M, H> {
        Switch::Hyper { conn: Box::pin(conn), client, stop_after: None }
    }
}

impl<L, M, H> Future for Switch<L, M, H>
where
    L: Future<Output = io::Result<Ended>>,
    M: FnOnce(Prefixed) -> H + Unpin,
    H: Future<Output = Result<(), ConnError>> + GracefulStop,
{
    type Output = Result<(), ConnError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.get_mut();
        if let Switch::Lean { lean, .. } = me {
            let ended = ready!(lean.as_mut().poll(cx));
            let Switch::Lean { make, client, .. } = std::mem::replace(me, Switch::Over) else {
                return Poll::Ready(Ok(()));
            };
            let (io, rest) = match ended {
                Ok(Ended::HandOver(io, rest)) => (io, rest),
                Ok(Ended::Closed) => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(e.into())),
            };
            let stop_after = client.stop.load(Ordering::Relaxed).then(|| client.received.load(Ordering::Relaxed));
            let conn = Box::pin(make(Prefixed { rest, io: ClientStream::Plain(io) }));
            *me = Switch::Hyper { conn, client, stop_after };
        }
        match me {
            Switch::Hyper { conn, client, stop_after } => {
                if stop_after.is_some_and(|n| client.received.load(Ordering::Relaxed) > n) {
                    *stop_after = None;
                    conn.as_mut().graceful_stop();
                }
                conn.as_mut().poll(cx)
            }
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl<L, M: Unpin, H: GracefulStop> GracefulStop for Switch<L, M, H> {
    fn graceful_stop(self: Pin<&mut Self>) {
        match self.get_mut() {
            Switch::Lean { client, .. } => client.stop.store(true, Ordering::Relaxed),
            Switch::Hyper { conn, .. } => conn.as_mut().graceful_stop(),
            Switch::Over => {}
        }
    }
}
