//! The daemon-wide bound on request body bytes held for retries, and
//! reading a request body whole within it and within its deadline.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::Metrics;

/// The request body bytes all requests in flight may hold, daemon-wide:
/// bodies are kept whole until their last attempt (for retries), so
/// without a bound many large ones at once grow memory without end. A
/// body takes its bytes as they arrive and gives them back when its
/// request is done; one that finds the budget spent gets 503.
pub struct BodyBudget {
    /// Bytes held now (the `onepool_router_buffered_body_bytes` gauge).
    pub(super) held: Gauge,
    pub(super) limit: i64,
    pub(super) refused: Counter,
}

impl BodyBudget {
    pub fn new(limit: usize, metrics: &Metrics) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            held: metrics.buffered_body_bytes.clone(),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            refused: metrics.body_budget_refused.clone(),
        })
    }

    /// Bytes held by requests in flight now.
    pub fn held(&self) -> i64 {
        self.held.get()
    }

    /// Takes `n` bytes if the budget has them (one atomic update).
    pub(super) fn take(&self, n: usize) -> bool {
        let n = n as i64;
        self.held
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |h| (h + n <= self.limit).then_some(h + n))
            .is_ok()
    }
}

/// A request body's bytes in the budget, given back when dropped.
pub(super) struct BodyShare<'a> {
    pub(super) budget: &'a BodyBudget,
    pub(super) bytes: usize,
}

impl Drop for BodyShare<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.dec_by(self.bytes as i64);
        }
    }
}

/// Why a request body was not read whole.
pub(super) enum BodyError {
    TooLarge,
    TimedOut,
    /// The budget had no room for it.
    OverBudget,
    Unreadable,
}

/// Reads a request body whole: at most `max` bytes, within `timeout` (for
/// the whole body, so a client cannot hold its connection and bytes by
/// trickling), each frame's bytes taken from `budget` as it arrives.
pub(super) async fn read_whole(
    mut body: Incoming,
    max: usize,
    timeout: Duration,
    budget: &BodyBudget,
) -> Result<(Bytes, BodyShare<'_>), BodyError> {
    let hint = body.size_hint();
    if hint.lower() > max as u64 {
        return Err(BodyError::TooLarge);
    }
    let read = async move {
        let mut share = BodyShare { budget, bytes: 0 };
        // The first frame is kept as it is (most bodies come in one); a
        // second starts a buffer, of the Content-Length when there is one,
        // whose pages fill as the bytes come.
        let (mut first, mut rest) = (Bytes::new(), BytesMut::new());
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| BodyError::Unreadable)?.into_data() else { continue };
            if share.bytes + data.len() > max {
                return Err(BodyError::TooLarge);
            }
            if !budget.take(data.len()) {
                return Err(BodyError::OverBudget);
            }
            share.bytes += data.len();
            if share.bytes == data.len() {
                first = data;
                continue;
            }
            if rest.is_empty() {
                let whole = hint.exact().map_or(share.bytes, |n| n as usize);
                rest.reserve(whole.max(share.bytes));
                rest.extend_from_slice(&std::mem::take(&mut first));
            }
            rest.extend_from_slice(&data);
        }
        Ok((if rest.is_empty() { first } else { rest.freeze() }, share))
    };
    tokio::time::timeout(timeout, read).await.unwrap_or(Err(BodyError::TimedOut))
}

impl BodyError {
    /// The answer to the client, made by `make`; `what` names the limit
    /// passed.
    pub(super) fn answer<B>(
        self,
        budget: &BodyBudget,
        max: usize,
        what: &str,
        make: fn(StatusCode, &str) -> Response<B>,
    ) -> Response<B> {
        match self {
            BodyError::TooLarge => {
                make(StatusCode::PAYLOAD_TOO_LARGE, &format!("request body larger than {max} bytes{what}"))
            }
            BodyError::TimedOut => make(StatusCode::REQUEST_TIMEOUT, "request body not received in time"),
            BodyError::OverBudget => {
                budget.refused.inc();
                let mut r = make(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the router holds as many request bodies as it may; retry later",
                );
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            BodyError::Unreadable => make(StatusCode::BAD_REQUEST, "request body could not be read"),
        }
    }
}
