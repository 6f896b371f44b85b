//! Why a call failed, and whether trying again could help: a refused
//! connection or a timeout may pass (a replica starting, a busy server),
//! an answer over its bound or a request that cannot be built will not.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request could not be built (a bad URI or header): a caller's bug
    /// or a bad setting, never worth a retry.
    #[error("{method} {uri}: {reason}")]
    Request { method: String, uri: String, reason: String },
    /// No connection: refused, unreachable, or the socket is missing.
    #[error("{method} {uri}: connecting: {source}")]
    Connect { method: String, uri: String, source: std::io::Error },
    /// Connected, but the exchange failed (the peer closed early, sent
    /// something that is not HTTP, or cut the body).
    #[error("{method} {uri}: {reason}")]
    Exchange { method: String, uri: String, reason: String },
    /// No whole answer within the caller's bound.
    #[error("{method} {uri}: no answer within {}", humantime(*.after))]
    Timeout { method: String, uri: String, after: Duration },
    /// The answer is longer than the caller reads.
    #[error("{method} {uri}: the answer is longer than {limit} bytes")]
    TooLong { method: String, uri: String, limit: usize },
}

impl ClientError {
    /// Whether the same request may succeed later: for the callers that
    /// poll (onepoold's scrape, preflight, the tests' waits) this decides
    /// between waiting and reporting.
    pub fn retryable(&self) -> bool {
        matches!(self, ClientError::Connect { .. } | ClientError::Exchange { .. } | ClientError::Timeout { .. })
    }

    /// The OS error of a failed connection (e.g. `NotFound` for a control
    /// socket that is not there), for callers that explain those.
    pub fn connect_error(&self) -> Option<&std::io::Error> {
        match self {
            ClientError::Connect { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Sorts hyper's error: a connect failure carries the connector's
    /// `io::Error` in its source chain.
    pub(crate) fn from_hyper(method: &http::Method, uri: &http::Uri, e: hyper_util::client::legacy::Error) -> Self {
        let (method, uri) = (method.to_string(), uri.to_string());
        if e.is_connect() {
            let source = io_source(&e)
                .map_or_else(|| std::io::Error::other(chain(&e)), |io| std::io::Error::new(io.kind(), io.to_string()));
            return ClientError::Connect { method, uri, source };
        }
        ClientError::Exchange { method, uri, reason: chain(&e) }
    }
}

fn io_source<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut next = e.source();
    while let Some(s) = next {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        next = s.source();
    }
    None
}

/// The error and its causes on one line: hyper's own message alone is
/// often only "client error (Connect)".
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = s.source();
    }
    text
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}
