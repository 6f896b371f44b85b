//! onepool's one HTTP client stack, for every call onepool makes of its
//! own: the router's health checks and model listings, the launcher's
//! forwarding to its model server, onepoold's scrape of replica metrics
//! and its preflight, `onepool status` and the demo on the control
//! socket, the demo's load generator and the tests.
//!
//! It is hyper's pooled client (`hyper_util::client::legacy`, the client
//! reqwest is built on) with onepool's settings made in one place
//! ([`Settings`]): why a call may wait only so long, why no proxy from the
//! environment may sit between onepoold and a replica, why answers are
//! read only up to a bound. One stack means one set of connection-pool,
//! timeout and error behaviours to reason about when a replica misbehaves.
//!
//! The proxy's forward path is the one exception: it keeps its own
//! per-replica connections (`onepool_router::backend_pool`) because the
//! router benchmark shows they pay (bench/RESULTS.md, "Router").

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

mod answer;
pub mod blocking;
mod caller;
mod error;
mod settings;
pub mod tls;
mod unix;

pub use answer::{read_bounded, Answer};
pub use caller::Caller;
pub use error::ClientError;
/// What a connector must be for a [`Caller`] over it.
pub use hyper_util::client::legacy::connect::Connect;
pub use settings::{pooled, pooled_tls, Pooled, PooledTls, Settings};
pub use unix::{unix_client, UnixConnector};

/// The body every simple request sends: whole, in memory.
pub type FullBody = http_body_util::Full<bytes::Bytes>;
