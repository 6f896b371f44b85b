//! What `onepool replica` runs on a compute node: the replica launcher
//! ([`launcher`]: the model server behind a small front proxy that drains
//! on Slurm's preemption notice, answers only onepoold's router
//! ([`access`]), reports where it listens and why its server ended
//! ([`report`], [`exit_cause`]), on its node's address ([`node_address`])) and, for jobs that host one replica per
//! node, the group that starts one launcher per node as an `srun` step
//! ([`replica_group`]). [`conventions`] holds what onepoold's router and
//! controller agree on with them (the draining header, the replica key,
//! the job's name and the note in its comment), so neither side links the
//! other's code.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

pub mod access;
pub mod config;
pub mod conventions;
mod drain;
pub mod exit_cause;
pub mod front;
pub mod hop_tls;
pub mod launcher;
pub mod node_address;
pub mod outcome;
pub mod replica_group;
pub mod report;
mod server;
