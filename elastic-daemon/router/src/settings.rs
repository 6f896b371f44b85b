//! The router's settings: what onepoold's configuration fills in (its
//! `config` module checks the file) and the proxy and the health checker
//! read. They live with the router so that the configuration depends on the
//! router and never the other way round.

use std::sync::Arc;
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::HeaderMap;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Longest wait for a replica's response head; past it the client gets 504.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Largest request body; larger gets 413. Bodies are read whole before
    /// forwarding so a failed attempt can be retried on another replica.
    pub max_request_body: usize,
    /// Longest time a client may take to send a whole request body, from
    /// the end of its head; past it the client gets 408 and the connection
    /// closes (far shorter than `request_timeout`: a body trickled in holds
    /// its connection and its bytes while it lasts).
    pub body_read_timeout: Duration,
    /// Longest silence of a replica in the middle of a response body; past
    /// it the response is cut off and the replica's connection closed.
    pub response_idle_timeout: Duration,
    /// Attempts after the first, each on a replica not yet tried.
    pub retries: u32,
    /// Every request may be retried, not only safe methods.
    pub idempotent: bool,
    /// The endpoint's own listener's connection limits.
    pub conn: ConnSettings,
    /// Bearer tokens a request must carry (`[endpoint.auth]`); `None`:
    /// none needed.
    pub auth: Option<BearerTokens>,
    /// Route by prompt prefix ([`crate::prefix`]); `None`: least
    /// outstanding alone.
    pub prefix: Option<crate::prefix::PrefixSettings>,
    /// Requests served by class ([`crate::classes`]); `None`: one queue,
    /// first come first served.
    pub classes: Option<Arc<crate::classes::RequestClasses>>,
    /// Continue answers on another replica when theirs cannot finish them
    /// ([`crate::resume`]); `None`: off.
    pub resume: Option<crate::resume::ResumeSettings>,
}

/// The tokens an endpoint accepts in `Authorization: Bearer TOKEN`, each
/// with the request class it names (issue #44), if any.
#[derive(Clone)]
pub struct BearerTokens(Arc<Vec<Token>>);

/// A token's bytes and the class its line names.
type Token = (Vec<u8>, Option<Arc<str>>);

impl BearerTokens {
    pub fn new(tokens: impl IntoIterator<Item = String>) -> BearerTokens {
        BearerTokens::with_classes(tokens.into_iter().map(|t| (t, None)))
    }

    /// Tokens, each with the class its line names.
    pub fn with_classes(tokens: impl IntoIterator<Item = (String, Option<String>)>) -> BearerTokens {
        BearerTokens(Arc::new(tokens.into_iter().map(|(t, c)| (t.into_bytes(), c.map(Arc::from))).collect()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The classes the tokens name.
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|(_, c)| c.as_deref())
    }

    /// Whether the request's Authorization field names one of the tokens.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        self.allows_value(headers.get(AUTHORIZATION).map(|v| v.as_bytes()))
    }

    /// [`allows`](Self::allows), given the first `Authorization` field's
    /// value as it came (the lean HTTP/1.1 path has no header map).
    pub fn allows_value(&self, given: Option<&[u8]>) -> bool {
        self.find(given).is_some()
    }

    /// The request's token (its place in the file, from 1) and the class
    /// it names; `None` when no token matches.
    pub fn key_of(&self, headers: &HeaderMap) -> Option<(u32, Option<&Arc<str>>)> {
        let i = self.find(headers.get(AUTHORIZATION).map(|v| v.as_bytes()))?;
        Some((u32::try_from(i + 1).unwrap_or(u32::MAX), self.0[i].1.as_ref()))
    }

    /// The index of the token `given` names. Every token is compared in
    /// full, without stopping at the first difference, so the time taken
    /// does not tell how much of a guess was right.
    fn find(&self, given: Option<&[u8]>) -> Option<usize> {
        let given = given?;
        let given = given.get(..7).filter(|s| s.eq_ignore_ascii_case(b"bearer ")).map(|_| &given[7..])?;
        let given = given.trim_ascii();
        let mut found = usize::MAX;
        for (i, (t, _)) in self.0.iter().enumerate() {
            let mut diff = u8::from(t.len() != given.len());
            for (k, b) in t.iter().enumerate() {
                diff |= b ^ given.get(k).copied().unwrap_or(0);
            }
            // No branch on the comparison: the index is kept by a mask.
            let same = usize::from(diff == 0).wrapping_neg();
            found = (found & !same) | (i & same);
        }
        (found != usize::MAX).then_some(found)
    }
}

/// Never prints the tokens.
impl std::fmt::Debug for BearerTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BearerTokens({} tokens)", self.0.len())
    }
}

/// What a listener applies to each connection, before any routing.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnSettings {
    /// Longest time a client may take to send its request head (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head in bytes; larger gets 431. At least 8192.
    pub max_header_bytes: usize,
    /// Open connections the listener keeps at most; one more is refused.
    pub max_connections: usize,
    /// Open connections from one client IP address at most.
    pub max_connections_per_ip: usize,
    /// Longest time an HTTP/2 connection may have no stream open, after its
    /// first request (before it, `header_read_timeout` applies).
    pub http2_idle_timeout: Duration,
    /// TLS termination (`[endpoint.tls]`, `[listener.tls]`); clear HTTP
    /// without it.
    pub tls: Option<Arc<crate::tls::Tls>>,
}

impl ProxySettings {
    /// An endpoint's own listener takes its connection limits from the
    /// endpoint.
    pub fn conn(&self) -> ConnSettings {
        self.conn.clone()
    }

    /// Whether the client's `Authorization` fields go on to a replica.
    /// Where the endpoint has keys, the client's key is the router's to
    /// check and stops there: replicas trust onepoold's replica key, and
    /// the client's would otherwise cross the cluster network in clear to
    /// every replica. Where it has none, the router checks nothing and the
    /// field passes as sent: a replica behind an open endpoint may check
    /// keys of its own (onepool's launcher sends its model server that
    /// server's own key instead, or none).
    pub fn client_authorization_passes(&self) -> bool {
        self.auth.is_none()
    }
}

#[derive(Clone, Debug)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Routes {
    /// Host (lower case, no port) to endpoint name.
    Host(Vec<(String, String)>),
    Path(Vec<PathRoute>),
    Model {
        /// The most body bytes read to find `model`; a larger body gets 413.
        max_body: usize,
        /// How long the client may take to send that body.
        body_timeout: Duration,
        /// Model name to endpoint name.
        routes: Vec<(String, String)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct PathRoute {
    /// Starts with '/', no trailing '/' except for "/" itself; matches on
    /// whole segments ("/chat" matches "/chat/x", not "/chatty").
    pub prefix: String,
    /// Forward without the prefix ("/chat/v1/x" goes out as "/v1/x").
    pub strip: bool,
    pub endpoint: String,
}

/// The paths whose JSON body names the `model` when routing by model.
pub const MODEL_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

impl Routes {
    /// The endpoint names the routes lead to, in configuration order.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        let v: Vec<&str> = match self {
            Routes::Host(r) | Routes::Model { routes: r, .. } => r.iter().map(|(_, e)| e.as_str()).collect(),
            Routes::Path(r) => r.iter().map(|p| p.endpoint.as_str()).collect(),
        };
        v.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_bearer_token_passes() {
        let t = BearerTokens::new(["s3cret-token".to_string(), "other".to_string()]);
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, v.parse().unwrap());
            t.allows(&h)
        };
        assert!(with("Bearer s3cret-token") && with("bearer other") && with("Bearer  other "));
        for bad in
            ["Bearer s3cret-toke", "Bearer s3cret-token2", "Basic s3cret-token", "s3cret-token", "Bearer ", "Bearer"]
        {
            assert!(!with(bad), "{bad}");
        }
        assert!(!t.allows(&HeaderMap::new()));
        assert_eq!(format!("{t:?}"), "BearerTokens(2 tokens)");
    }
}
