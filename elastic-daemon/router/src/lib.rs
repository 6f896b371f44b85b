//! onepoold's inference router: the replicas of each endpoint and which
//! one takes the next request ([`registry`]), the bounded queue and the
//! waiting ([`endpoint`]), the reverse proxy on per-endpoint and shared
//! listeners ([`proxy`]) with its upstream connections ([`backend_pool`]) and
//! the client of its own calls to replicas ([`replica_client`]),
//! active health checks ([`health`]), the Prometheus metrics ([`metrics`]:
//! one registry, so the replica controllers' `onepool_replica_*` series are
//! defined here too) and the settings all of these read ([`settings`]).
//! [`shutdown`] is the signal every long-running task watches; [`tls`]
//! terminates TLS on listeners that ask for it.
//!
//! The daemon (onepool-elastic-daemon) reads the configuration into
//! [`settings`], starts the listeners and health checkers, and adds the
//! control socket and the replica controllers; nothing here depends on it.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

pub mod access_log;
mod affine_choice;
pub mod backend_pool;
pub mod classes;
pub mod endpoint;
pub mod engine_priority;
mod fair;
pub mod headroom;
pub mod health;
pub mod line_log;
pub mod metrics;
mod models;
pub mod prefix;
mod prompt_scan;
pub mod proxy;
mod rank;
pub mod reach;
pub mod registry;
pub mod replica_client;
pub mod resume;
pub mod settings;
pub mod shutdown;
pub mod tls;

/// The header that carries onepoold's replica key to replicas (the
/// launcher's `onepool_launcher::conventions::REPLICA_KEY_HEADER`: the
/// same name, kept here so the router does not link the launcher).
pub const REPLICA_KEY_HEADER: http::HeaderName = http::HeaderName::from_static("x-onepool-replica-key");
