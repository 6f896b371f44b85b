//! Streams the router passes as they come without following them (tools,
//! several choices, log-probabilities the client asked for, ...), watched
//! for their end (issue #50): an OpenAI stream ends with `[DONE]`, so one
//! whose replica ended it before that (its server died, its connection
//! failed, it went silent, its node was lost) gets the error event the
//! router writes, never a clean close a client would read as a whole
//! answer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};

use crate::endpoint::Endpoint;
use crate::proxy::leased::{lost_of, LeasedBody, Lost};
use crate::resume::splice::coded_error_event;

/// Bytes of the last line's start that tell how a stream ended.
const HEAD: usize = 16;

/// How far an event stream got: the start of its last non-empty line, and
/// whether an event is still open (a line since the last blank one).
pub(super) struct EventTail {
    line: [u8; HEAD],
    line_len: usize,
    /// The last byte seen ended a line (or none came yet).
    at_line_start: bool,
    /// A non-empty line came since the last blank line.
    open_event: bool,
}

impl Default for EventTail {
    fn default() -> EventTail {
        EventTail { line: [0; HEAD], line_len: 0, at_line_start: true, open_event: false }
    }
}

impl EventTail {
    pub(super) fn push(&mut self, data: &[u8]) {
        let mut rest = data;
        loop {
            let (segment, next) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            let segment = segment.strip_suffix(b"\r").unwrap_or(segment);
            let blank = segment.is_empty() && self.at_line_start;
            if !segment.is_empty() {
                if self.at_line_start {
                    self.line_len = 0;
                }
                let n = (HEAD - self.line_len).min(segment.len());
                self.line[self.line_len..self.line_len + n].copy_from_slice(&segment[..n]);
                self.line_len += n;
                (self.open_event, self.at_line_start) = (true, false);
            }
            let Some(next) = next else { return };
            if blank {
                self.open_event = false;
            }
            self.at_line_start = true;
            rest = &rest[next..];
        }
    }

    /// The stream's last event ended it: `[DONE]`, or an error event (the
    /// launcher's reclaim event, the server's own error).
    pub(super) fn ended(&self) -> bool {
        let line = &self.line[..self.line_len];
        let data = match line.strip_prefix(b"data:") {
            Some(d) => d.strip_prefix(b" ").unwrap_or(d),
            None => return false,
        };
        data.starts_with(b"[DONE]") || data.starts_with(b"{\"error\"")
    }

    /// What goes before an event the router adds: a blank line if the last
    /// event is still open (its line cut, or its blank line missing).
    pub(super) fn closing(&self) -> &'static [u8] {
        match self.open_event {
            true => b"\n\n",
            false => b"",
        }
    }
}

/// An unfollowed event stream of a generation request.
pub(super) struct WatchedStream {
    current: LeasedBody,
    tail: EventTail,
    /// Resolves when the replica is lost (its health checks get no answer).
    lost: Option<Lost>,
    endpoint: std::sync::Arc<Endpoint>,
    /// Its end has passed (its own, or the router's error event).
    done: bool,
    /// Ended by the router's error event (not whole).
    pub(super) cut: bool,
}

impl WatchedStream {
    pub(super) fn new(current: LeasedBody, endpoint: std::sync::Arc<Endpoint>) -> WatchedStream {
        let lost = current.lease.as_ref().map(lost_of);
        WatchedStream { current, tail: EventTail::default(), lost, endpoint, done: false, cut: false }
    }

    pub(super) fn finish(&mut self) -> Option<std::time::Instant> {
        self.current.finish()
    }

    fn cut_short(&mut self, code: &str, why: &str) -> Bytes {
        (self.done, self.cut) = (true, true);
        self.lost = None;
        let event = cut_event(&self.tail, &self.endpoint, &self.current, code, why);
        let _ = self.current.finish();
        event
    }
}

/// The end of a stream its replica ended before its answer did: the error
/// event (after a blank line, if an event was left open), logged and
/// counted (`onepool_router_streams_cut_total`).
pub(super) fn cut_event(tail: &EventTail, endpoint: &Endpoint, current: &LeasedBody, code: &str, why: &str) -> Bytes {
    let replica = current.lease.as_ref().map(|l| l.address());
    let name = endpoint.name();
    tracing::info!(endpoint = %name, ?replica, code, "a stream the router does not follow ended early: {why}");
    endpoint.metrics().count_stream_cut(name, code);
    let message = format!(
        "the replica serving this answer ended it before it was complete ({why}); onepool cannot continue this kind of answer elsewhere, retry the request"
    );
    let mut out = tail.closing().to_vec();
    out.extend_from_slice(&coded_error_event(code, &message));
    Bytes::from(out)
}

/// Why a stream ended early, from its body's error: (code, words).
pub(super) fn cut_reason(e: &std::io::Error) -> (&'static str, String) {
    match e.kind() {
        std::io::ErrorKind::TimedOut => {
            ("replica_silent", format!("it sent nothing for the endpoint's response_idle_timeout: {e}"))
        }
        _ => ("replica_failed", format!("its connection failed: {e}")),
    }
}

/// Why a stream's replica is gone: lost, or its body ended early.
pub(super) const LOST: (&str, &str) = ("replica_lost", "its health checks no longer reach it");
pub(super) const ENDED: (&str, &str) = ("replica_failed", "its answer ended before the stream did");

impl Body for WatchedStream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut this.current).poll_frame(cx);
        if let (Poll::Pending, Some(lost)) = (&polled, &mut this.lost) {
            if lost.as_mut().poll(cx).is_ready() {
                let event = this.cut_short(LOST.0, LOST.1);
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
        }
        let event = match std::task::ready!(polled) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.tail.push(data);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            None | Some(Err(_)) if this.tail.ended() => {
                this.done = true;
                let _ = this.current.finish();
                return Poll::Ready(None);
            }
            None => this.cut_short(ENDED.0, ENDED.1),
            Some(Err(e)) => {
                let (code, why) = cut_reason(&e);
                this.cut_short(code, &why)
            }
        };
        Poll::Ready(Some(Ok(Frame::data(event))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(chunks: &[&str]) -> EventTail {
        let mut t = EventTail::default();
        for c in chunks {
            t.push(c.as_bytes());
        }
        t
    }

    #[test]
    fn a_stream_ended_by_done_or_an_error_event_is_told_from_one_cut_anywhere() {
        let whole = ["data: {\"a\":1}\n\n", "data: {\"b\":2}\n\n", "data: [DONE]\n\n"];
        assert!(tail(&whole).ended());
        assert_eq!(tail(&whole).closing(), b"");
        // However the reads cut it, even inside `[DONE]` and across "\r\n".
        let joined = whole.concat().replace('\n', "\r\n");
        for at in 0..joined.len() {
            let t = tail(&[&joined[..at], &joined[at..]]);
            assert!(t.ended(), "cut at {at}");
        }
        assert!(tail(&["data:[DONE]\n\n"]).ended());
        assert!(tail(&["data: {\"x\":1}\n\ndata: {\"error\":{\"code\":\"replica_reclaimed\"}}\n\n"]).ended());
        // Cut before its end: not ended, and the open event is closed first.
        let cut = tail(&["data: {\"a\":1}\n\n", "data: {\"b\""]);
        assert!(!cut.ended());
        assert_eq!(cut.closing(), b"\n\n");
        let between = tail(&["data: {\"a\":1}\n\n"]);
        assert!(!between.ended());
        assert_eq!(between.closing(), b"");
        // A model that writes "[DONE]" or an error's text in its answer
        // does not end the stream: it is inside a JSON string.
        let said = tail(&["data: {\"content\":\"data: [DONE]\"}\n\n"]);
        assert!(!said.ended());
        let line_open = tail(&["data: {\"a\":1}\n"]);
        assert_eq!(line_open.closing(), b"\n\n");
        assert!(!tail(&[]).ended());
        assert_eq!(tail(&[]).closing(), b"");
    }
}
