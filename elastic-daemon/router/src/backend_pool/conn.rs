//! One keep-alive connection to a replica (clear or TLS) and the
//! exchange on it: the request written whole, the response head read
//! and parsed, the body's framing taken from it.

use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::backend_pool::limits::{MAX_HEADERS, MAX_HEAD_BYTES, READ_CHUNK};

/// A connection's bytes: clear, or TLS pinned to the replica's certificate.
pub(super) enum ReplicaIo {
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
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            ReplicaIo::Plain(s) => s,
            ReplicaIo::Tls(s) => s.get_ref().0,
        }
    }
}

/// One HTTP/1.1 connection to a replica, between exchanges.
pub struct BackendConn {
    pub(super) io: ReplicaIo,
    /// Bytes read and not yet used (empty between exchanges).
    pub(super) buf: BytesMut,
    /// The current exchange's deadline for its response head; kept with the
    /// connection so that the next exchange only moves it (no new timer).
    pub(super) timer: Option<Pin<Box<Sleep>>>,
    pub(super) idle_since: Instant,
    /// Scratch for parsing response heads.
    pub(super) spans: Vec<(HeaderName, usize, usize)>,
    /// Whether the current exchange has read any byte of an answer.
    pub(super) answered: bool,
}

impl BackendConn {
    pub(super) fn new(io: ReplicaIo) -> BackendConn {
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
    pub(super) fn arm(&mut self, deadline: Instant) {
        self.answered = false;
        match self.timer.as_mut() {
            Some(t) => t.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    pub(super) fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.timer.as_mut() {
            Some(t) => t.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// Reads what the socket has into `buf`; Ok(0) at the end of the stream.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
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
    pub(super) fn still_idle(&mut self) -> bool {
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
    pub(super) fn poll_write_all(
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
    pub(super) fn poll_head(
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
    pub(super) fn parse_head(&mut self, head_request: bool, headers: &mut HeaderMap) -> Result<Option<Head>, String> {
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
pub(super) fn parse_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
    pub(super) hop_by_hop: bool,
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
pub(super) enum Exchange {
    TimedOut,
    /// The replica closed the connection before a response head.
    Closed,
    Io(io::Error),
    Invalid(String),
}

pub(super) enum Framing {
    /// This many bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the replica closes the connection.
    Close,
    Done,
}

pub(super) enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
}
