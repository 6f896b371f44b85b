//! onepoold's library: the daemon around the inference router
//! ([`onepool_router`]). It reads and checks the configuration
//! ([`config`]; [`policy_check`] holds the replica settings against the
//! policy), serves the control socket ([`control`]; its clients use
//! [`onepool_control`]) and runs the replica controllers ([`controller`],
//! reading replicas' own load with [`replica_metrics`]) that keep
//! endpoints' replicas as Slurm jobs. The binary in `main.rs` only reads
//! the config and starts [`daemon::Daemon`], which wires all of it together
//! ([`routed`]: the endpoints it serves), on listening sockets handed over
//! at start where there are ([`inherited`]: systemd's socket activation).
//! [`trace`] reads the Azure trace the router is replayed with; [`leader`]
//! decides which of several instances acts on Slurm (`[ha]`).

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

pub mod config;
pub mod control;
pub mod controller;
pub mod daemon;
pub mod engine_priority;
pub mod inherited;
pub mod leader;
pub mod policy_check;
pub mod preflight;
pub mod private_file;
pub mod replica_key;
pub mod replica_metrics;
pub mod round_error;
pub mod routed;
pub mod start_files;
pub mod trace;

/// The async runtime the daemon runs on and the HTTP types of its control
/// client, for callers that start it in-process or talk to its control
/// socket (the integration tests).
pub use {http, tokio};
