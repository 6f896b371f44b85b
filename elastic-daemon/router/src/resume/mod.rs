//! Answers that outlive their replica (issue #43). When the replica
//! serving a generation cannot finish it (reclaimed, its model server
//! dead, its node lost, silent past `response_idle_timeout`), the router
//! continues the answer on another replica from where its client has it:
//! by the token ids already generated where the engine takes and gives
//! them (llama-server), by the text otherwise. The client sees one answer.
//!
//! The pure parts live here (which requests, their events, the junction);
//! the body that follows a stream is the proxy's
//! (`crate::proxy::resumable`), the requests that continue it are in
//! [`moving`].

pub mod chunk;
pub mod events;
pub mod moving;
pub mod plan;
pub mod progress;
pub mod replay;
pub mod splice;
pub mod transcript;

/// How an answer continues on another replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// From the token ids the client's text came from, on llama.cpp's
    /// native API: at temperature 0 the answer is the uninterrupted one.
    Tokens,
    /// From the text, as the assistant's message to continue (OpenAI API):
    /// the engine tokenizes the text again, so the junction may differ
    /// from the uninterrupted answer.
    Text,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Tokens => "tokens",
            Method::Text => "text",
        }
    }
}

/// An endpoint's `[endpoint.resume]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeSettings {
    pub method: Method,
    /// Moves of one answer at most; past them its client gets the error
    /// event as before resumption.
    pub max_moves: u32,
    /// A followed stream without the client's `seed` gets one of the
    /// router's, so that what a prefill cannot continue is generated again
    /// the same ([`replay`]). Off: such an answer is the same again only at
    /// temperature 0, and the error event ends it otherwise.
    pub seed: bool,
}

/// Why a stream left its replica (`onepool_router_streams_moved_total`'s
/// `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The replica's launcher ended it: the replica is reclaimed.
    Reclaimed,
    /// Its health checks no longer reach the replica ([`crate::reach`]).
    Lost,
    /// The connection failed or the body was malformed.
    Failed,
    /// The body ended before the answer did (a model server that died).
    Ended,
    /// Nothing came for `response_idle_timeout`.
    Silent,
    /// It gave its slot to a request of a higher class (issue #44).
    Yielded,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Reclaimed => "reclaimed",
            Why::Lost => "replica_lost",
            Why::Failed => "failed",
            Why::Ended => "ended_early",
            Why::Silent => "silent",
            Why::Yielded => "yielded",
        }
    }
}
