//! A replica's response body, read from its connection as the client
//! takes it, the connection kept for the next request when the body was
//! read to its end.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::backend_pool::conn::{BackendConn, Chunk, Framing};
use crate::backend_pool::idle::IdleConns;
use crate::backend_pool::limits::{MAX_CHUNK_LINE, MAX_HEAD_BYTES};

pub(super) fn body_error(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// A replica's response body, read from its connection as the client
/// takes it. The connection goes back to its replica's idle list once the
/// body has been read to the end (unless the replica asked to close it).
pub struct BackendBody {
    pub(super) conn: Option<BackendConn>,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
    /// The response head has hop-by-hop fields to leave out.
    pub(super) hop_by_hop: bool,
    pub(super) idle: Arc<IdleConns>,
    /// Longest silence of the replica mid-body (see `silent_too_long`).
    pub(super) idle_timeout: Duration,
    /// The connection's timer watches for silence (set at the first wait).
    pub(super) watching: bool,
    /// Bytes came since the timer was set.
    pub(super) progress: bool,
}

impl BackendBody {
    /// The body after a response head on `conn`: framed, kept alive and
    /// with hop-by-hop fields as the head said.
    pub(super) fn new(
        conn: BackendConn,
        (framing, keep_alive, hop_by_hop): (Framing, bool, bool),
        idle: Arc<IdleConns>,
        idle_timeout: Duration,
    ) -> BackendBody {
        BackendBody {
            conn: Some(conn),
            framing,
            keep_alive,
            hop_by_hop,
            idle,
            idle_timeout,
            watching: false,
            progress: false,
        }
    }

    /// Whether the response head has hop-by-hop fields (to leave out).
    pub fn hop_by_hop(&self) -> bool {
        self.hop_by_hop
    }

    pub(super) fn complete(&self) -> bool {
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

    pub(super) fn end(&mut self) -> Poll<Option<io::Result<Frame<Bytes>>>> {
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
    pub(super) fn silent_too_long(&mut self, cx: &mut Context<'_>) -> bool {
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

    pub(super) fn fail(&mut self, e: io::Error) -> Poll<Option<io::Result<Frame<Bytes>>>> {
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
