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

use std::future::{poll_fn, Future};
use std::io;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use onepool_launcher::hop_tls::PinnedClient;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How soon after our request a replica's close of a reused connection is
/// taken for its keep-alive timeout having fired as the request arrived
/// (the close is then already on its way: on one network, well under a
/// millisecond) rather than for the replica failing on the request.
pub const KEEP_ALIVE_RACE: Duration = Duration::from_millis(100);

/// How long a connection may sit unused before it is closed rather than
/// reused (replicas close idle connections on their own schedule too).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most header fields in a response head (hyper's limit too).
const MAX_HEADERS: usize = 100;
/// Largest response head, and largest trailer section (hyper's read limit).
const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// Longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// Read buffer growth.
const READ_CHUNK: usize = 8192;

/// A connection's bytes: clear, or TLS pinned to the replica's certificate.
enum ReplicaIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ReplicaIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReplicaIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ReplicaIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ReplicaIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ReplicaIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ReplicaIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ReplicaIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ReplicaIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            ReplicaIo::Plain(s) => s.is_write_vectored(),
            ReplicaIo::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReplicaIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ReplicaIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReplicaIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ReplicaIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl ReplicaIo {
    /// The TCP socket under it.
    fn tcp(&self) -> &TcpStream {
        match self {
            ReplicaIo::Plain(s) => s,
            ReplicaIo::Tls(s) => s.get_ref().0,
        }
    }
}

/// One HTTP/1.1 connection to a replica, between exchanges.
pub struct BackendConn {
    io: ReplicaIo,
    /// Bytes read and not yet used (empty between exchanges).
    buf: BytesMut,
    /// The current exchange's deadline for its response head; kept with the
    /// connection so that the next exchange only moves it (no new timer).
    timer: Option<Pin<Box<Sleep>>>,
    idle_since: Instant,
    /// Scratch for parsing response heads.
    spans: Vec<(HeaderName, usize, usize)>,
    /// Whether the current exchange has read any byte of an answer.
    answered: bool,
}

impl BackendConn {
    fn new(io: ReplicaIo) -> BackendConn {
        BackendConn {
            io,
            buf: BytesMut::new(),
            timer: None,
            idle_since: Instant::now(),
            spans: Vec::new(),
            answered: false,
        }
    }

    /// Starts an exchange: its response head is due by `deadline`.
    fn arm(&mut self, deadline: Instant) {
        self.answered = false;
        match self.timer.as_mut() {
            Some(t) => t.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.timer.as_mut() {
            Some(t) => t.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// Reads what the socket has into `buf`; Ok(0) at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        let read = ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf));
        if matches!(read, Ok(n) if n > 0) {
            self.answered = true;
        }
        Poll::Ready(read)
    }

    /// Whether an idle connection can take a request: the replica neither
    /// closed it nor sent anything unasked. Costs a system call only when
    /// the socket has become readable.
    fn still_idle(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        // Without readiness known, tokio answers WouldBlock with no system
        // call (and no waker to register); with it, a read tells an end of
        // stream or unasked bytes (either way the connection goes). Under
        // TLS the same holds of the socket: the launcher sends no session
        // tickets, so a byte on an idle connection is an alert or a close.
        let mut byte = [0u8; 1];
        matches!(self.io.tcp().try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes the request; Err carries how many bytes had gone out.
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        head: &[u8],
        body: &[u8],
        written: &mut usize,
    ) -> Poll<Result<(), Exchange>> {
        while *written < head.len() + body.len() {
            let (h, b) = if *written < head.len() {
                (&head[*written..], body)
            } else {
                (&head[..0], &body[*written - head.len()..])
            };
            let bufs = [IoSlice::new(h), IoSlice::new(b)];
            match Pin::new(&mut self.io).poll_write_vectored(cx, &bufs) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(Exchange::Io(io::ErrorKind::WriteZero.into()))),
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Exchange::Io(e))),
                Poll::Pending => {
                    ready!(self.poll_timer(cx));
                    return Poll::Ready(Err(Exchange::TimedOut));
                }
            }
        }
        // TLS may hold the last record; a TCP socket flushes at once.
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(Exchange::Io(e))),
            Poll::Pending => {
                ready!(self.poll_timer(cx));
                Poll::Ready(Err(Exchange::TimedOut))
            }
        }
    }

    /// Reads the response head (skipping 1xx interim answers), its fields
    /// into `headers`.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        head_request: bool,
        headers: &mut HeaderMap,
    ) -> Poll<Result<Head, Exchange>> {
        loop {
            if !self.buf.is_empty() {
                match self.parse_head(head_request, headers) {
                    Err(e) => return Poll::Ready(Err(Exchange::Invalid(e))),
                    Ok(Some(h)) if h.status.is_informational() => {
                        if h.status == StatusCode::SWITCHING_PROTOCOLS {
                            return Poll::Ready(Err(Exchange::Invalid(
                                "101 Switching Protocols, never asked for".into(),
                            )));
                        }
                        continue;
                    }
                    Ok(Some(h)) => return Poll::Ready(Ok(h)),
                    Ok(None) if self.buf.len() > MAX_HEAD_BYTES => {
                        return Poll::Ready(Err(Exchange::Invalid(format!(
                            "response head larger than {MAX_HEAD_BYTES} bytes"
                        ))));
                    }
                    Ok(None) => {}
                }
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(Exchange::Closed)),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Exchange::Io(e))),
                Poll::Pending => {
                    ready!(self.poll_timer(cx));
                    return Poll::Ready(Err(Exchange::TimedOut));
                }
            }
        }
    }

    /// A complete response head at the start of `buf`, taken out of it,
    /// with how its body is delimited (RFC 9112, section 6.3) and whether
    /// the connection may serve another request after it.
    fn parse_head(&mut self, head_request: bool, headers: &mut HeaderMap) -> Result<Option<Head>, String> {
        let mut fields = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut r = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut r,
            &self.buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("invalid response head: {e}")),
        };
        let code = r.code.unwrap_or_default();
        let status = StatusCode::from_u16(code).map_err(|_| format!("invalid response status {code}"))?;
        let http10 = r.version == Some(0);
        // Framing, from the raw fields: no look-ups in the map.
        let (mut close, mut keep_alive_token, mut chunked, mut encoded) = (false, false, false, false);
        let mut hop_by_hop = false;
        let mut length: Option<u64> = None;
        // Where each value lies in the head, so that the values can share
        // the head's bytes instead of each being copied.
        let base = self.buf.as_ptr() as usize;
        self.spans.clear();
        for f in r.headers.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes())
                .map_err(|_| format!("invalid response header name {:?}", f.name))?;
            if name == header::CONTENT_LENGTH {
                for part in f.value.split(|&b| b == b',') {
                    let n = parse_length(part).ok_or_else(|| "invalid Content-Length".to_string())?;
                    if length.is_some_and(|l| l != n) {
                        return Err("conflicting Content-Length values".into());
                    }
                    length = Some(n);
                }
            } else if name == header::TRANSFER_ENCODING {
                encoded = true;
                // Only the last coding counts.
                let last = f.value.rsplit(|&b| b == b',').next().unwrap_or_default();
                chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
            } else if name == header::CONNECTION {
                for token in f.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            hop_by_hop |= HOP_BY_HOP.contains(&name);
            let start = f.value.as_ptr() as usize - base;
            self.spans.push((name, start, start + f.value.len()));
        }
        let head = self.buf.split_to(len).freeze();
        let mut map = std::mem::take(headers);
        map.clear();
        map.reserve(self.spans.len());
        for (name, start, end) in self.spans.drain(..) {
            let value = HeaderValue::from_maybe_shared(head.slice(start..end))
                .map_err(|_| format!("invalid value of response header {name}"))?;
            map.append(name, value);
        }
        let keep_alive = if http10 { keep_alive_token } else { !close };
        let (framing, keep_alive) = if head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            (Framing::Length(0), keep_alive)
        } else if encoded {
            if chunked {
                (Framing::Chunked(Chunk::Size), keep_alive)
            } else {
                (Framing::Close, false)
            }
        } else {
            match length {
                Some(n) => (Framing::Length(n), keep_alive),
                None => (Framing::Close, false),
            }
        };
        let version = if http10 { Version::HTTP_10 } else { Version::HTTP_11 };
        Ok(Some(Head { status, version, headers: map, framing, keep_alive, hop_by_hop }))
    }
}

/// A Content-Length value: digits only.
fn parse_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    framing: Framing,
    keep_alive: bool,
    hop_by_hop: bool,
}

/// Hop-by-hop header fields (RFC 9110, section 7.6.1): they belong to one
/// connection, and are not passed on (with those `Connection` names).
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// How one exchange went wrong.
enum Exchange {
    TimedOut,
    /// The replica closed the connection before a response head.
    Closed,
    Io(io::Error),
    Invalid(String),
}

/// A replica's idle connections, the most recently used first out, and
/// how new ones are made.
#[derive(Default)]
pub struct IdleConns {
    idle: Mutex<Vec<BackendConn>>,
    transport: Transport,
}

/// How the router reaches one replica.
#[derive(Default, Clone, Debug)]
pub enum Transport {
    /// Clear HTTP (`[endpoint.replicas] transport = "plain"`, or a replica
    /// added by hand).
    #[default]
    Plain,
    /// TLS, accepting only the certificate its launcher reported.
    Pinned(PinnedClient),
    /// No connection at all: a replica whose transport is not known.
    Refused,
}

impl IdleConns {
    pub fn new(transport: Transport) -> IdleConns {
        IdleConns { idle: Mutex::default(), transport }
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    fn lock(&self) -> MutexGuard<'_, Vec<BackendConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection used last (connections unused for long are closed
    /// by `prune` and by `put`).
    fn pop(&self) -> Option<BackendConn> {
        loop {
            let mut c = self.lock().pop()?;
            if c.still_idle() {
                return Some(c);
            }
        }
    }

    /// Keeps a connection whose last exchange ended cleanly at `now`.
    fn put(&self, mut c: BackendConn, now: Instant) {
        if !c.buf.is_empty() {
            return;
        }
        c.idle_since = now;
        let mut idle = self.lock();
        // The oldest are at the bottom; drop the ones past their time.
        let stale = idle.iter().take_while(|c| now.duration_since(c.idle_since) >= IDLE_TIMEOUT).count();
        idle.drain(..stale);
        idle.push(c);
    }

    /// Closes the connections unused for `max_idle` or more.
    pub fn prune(&self, max_idle: Duration) {
        let now = Instant::now();
        self.lock().retain(|c| now.duration_since(c.idle_since) < max_idle);
    }

    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

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
        let body = BackendBody {
            conn: Some(c),
            framing: head.framing,
            keep_alive: head.keep_alive,
            hop_by_hop: head.hop_by_hop,
            idle: idle.clone(),
            idle_timeout: request.body_idle_timeout,
            watching: false,
            progress: false,
        };
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

enum Framing {
    /// This many bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the replica closes the connection.
    Close,
    Done,
}

enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
}

fn body_error(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// A replica's response body, read from its connection as the client
/// takes it. The connection goes back to its replica's idle list once the
/// body has been read to the end (unless the replica asked to close it).
pub struct BackendBody {
    conn: Option<BackendConn>,
    framing: Framing,
    keep_alive: bool,
    /// The response head has hop-by-hop fields to leave out.
    hop_by_hop: bool,
    idle: Arc<IdleConns>,
    /// Longest silence of the replica mid-body (see `silent_too_long`).
    idle_timeout: Duration,
    /// The connection's timer watches for silence (set at the first wait).
    watching: bool,
    /// Bytes came since the timer was set.
    progress: bool,
}

impl BackendBody {
    /// Whether the response head has hop-by-hop fields (to leave out).
    pub fn hop_by_hop(&self) -> bool {
        self.hop_by_hop
    }

    fn complete(&self) -> bool {
        matches!(self.framing, Framing::Done | Framing::Length(0))
    }

    /// Done with the body at `now`: read to the end, the connection serves
    /// the next request; left half-way (client gone), it closes.
    pub fn finish(&mut self, now: Instant) {
        if let Some(c) = self.conn.take() {
            if self.complete() && self.keep_alive {
                self.idle.put(c, now);
            }
        }
    }

    fn end(&mut self) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.framing = Framing::Done;
        self.finish(Instant::now());
        Poll::Ready(None)
    }

    /// Whether the replica has sent nothing for a whole idle timeout; asked
    /// only when a read would wait. One timer (the connection's), set at
    /// the first wait and again whenever it fires after bytes came: a
    /// silence is caught between one and two idle timeouts after it began,
    /// and a body that flows costs no timer work per frame (responses read
    /// whole with their head, most of them, cost none at all).
    fn silent_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(c) = self.conn.as_mut() else { return false };
        if !self.watching {
            self.watching = true;
            self.progress = false;
            c.arm(Instant::now() + self.idle_timeout);
        }
        while c.poll_timer(cx).is_ready() {
            if !std::mem::take(&mut self.progress) {
                return true;
            }
            c.arm(Instant::now() + self.idle_timeout);
        }
        false
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.framing = Framing::Done;
        self.keep_alive = false;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Drop for BackendBody {
    fn drop(&mut self) {
        if self.conn.is_some() {
            self.finish(Instant::now());
        }
    }
}

impl Body for BackendBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = &mut *self;
        loop {
            let Some(c) = this.conn.as_mut() else { return Poll::Ready(None) };
            // Take what the buffer holds, or say what is missing.
            match &mut this.framing {
                Framing::Done | Framing::Length(0) => return this.end(),
                Framing::Length(rest) | Framing::Chunked(Chunk::Data(rest)) if !c.buf.is_empty() => {
                    let n = c.buf.len().min(usize::try_from(*rest).unwrap_or(usize::MAX));
                    let data = c.buf.split_to(n).freeze();
                    *rest -= n as u64;
                    if let Framing::Chunked(chunk @ Chunk::Data(0)) = &mut this.framing {
                        *chunk = Chunk::DataEnd;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Close if !c.buf.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(c.buf.split().freeze()))));
                }
                Framing::Chunked(chunk @ Chunk::Size) => match httparse::parse_chunk_size(&c.buf) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        c.buf.advance(n);
                        *chunk = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                        continue;
                    }
                    Ok(httparse::Status::Partial) if c.buf.len() > MAX_CHUNK_LINE => {
                        return this.fail(body_error("chunk-size line too long"));
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(_) => return this.fail(body_error("invalid chunk size")),
                },
                Framing::Chunked(chunk @ Chunk::DataEnd) if c.buf.len() >= 2 => {
                    if &c.buf[..2] != b"\r\n" {
                        return this.fail(body_error("chunk data not followed by CRLF"));
                    }
                    c.buf.advance(2);
                    *chunk = Chunk::Size;
                    continue;
                }
                Framing::Chunked(Chunk::Trailers) => {
                    let mut fields = [httparse::EMPTY_HEADER; 32];
                    match httparse::parse_headers(&c.buf, &mut fields) {
                        Ok(httparse::Status::Complete((n, fields))) => {
                            let mut trailers = HeaderMap::new();
                            for f in fields.iter() {
                                if let (Ok(name), Ok(value)) =
                                    (HeaderName::from_bytes(f.name.as_bytes()), HeaderValue::from_bytes(f.value))
                                {
                                    trailers.append(name, value);
                                }
                            }
                            c.buf.advance(n);
                            if trailers.is_empty() {
                                return this.end();
                            }
                            this.framing = Framing::Done;
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        Ok(httparse::Status::Partial) if c.buf.len() > MAX_HEAD_BYTES => {
                            return this.fail(body_error("trailer section too large"));
                        }
                        Ok(httparse::Status::Partial) => {}
                        Err(_) => return this.fail(body_error("invalid trailer section")),
                    }
                }
                _ => {}
            }
            // More bytes needed.
            match c.poll_fill(cx) {
                Poll::Pending if this.silent_too_long(cx) => {
                    let msg = format!("the replica sent no body bytes for {:?}", this.idle_timeout);
                    return this.fail(io::Error::new(io::ErrorKind::TimedOut, msg));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if matches!(this.framing, Framing::Close) => return this.end(),
                Poll::Ready(Ok(0)) => {
                    return this.fail(body_error("the replica closed the connection before the end of the body"))
                }
                Poll::Ready(Ok(_)) => this.progress = true,
                Poll::Ready(Err(e)) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.complete()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
