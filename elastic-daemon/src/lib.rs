//! onepoold's library: the inference router (registry, queue, reverse
//! proxy), its control socket, metrics and configuration. The binary in
//! `main.rs` only reads the config and starts [`daemon::Daemon`]; the
//! replica controllers (`controller.rs`) run endpoints' replicas as Slurm
//! jobs.

pub mod backend_pool;
pub mod config;
pub mod control;
pub mod controller;
pub mod daemon;
pub mod endpoint;
pub mod health;
pub mod metrics;
pub mod policy_check;
pub mod proxy;
pub mod registry;
pub mod replica_metrics;
pub mod routed;
pub mod settings;
pub mod shutdown;
pub mod trace;

/// The async runtime the daemon runs on and the HTTP types of its control
/// client, for callers that start it in-process or talk to its control
/// socket (the CLI, the integration tests).
pub use {http, tokio};
