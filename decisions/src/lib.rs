//! onepool's decisions, in one pure crate that the slurmctld plugin, the
//! SPANK plugin, the daemon, the CLI and the simulator all call: nothing
//! here does I/O or knows about Slurm's C types, so every rule is tested
//! once, fast, and behaves the same everywhere.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

pub mod annotation;
pub mod autoscale;
pub mod backoff;
pub mod classify;
pub mod decision_log;
pub mod duration;
pub mod gres_conf;
pub mod handoff;
pub mod hostlist;
pub mod latency;
pub mod manpage;
pub mod names;
pub mod ownership;
pub mod policy;
pub mod record;
pub mod render;
pub mod replicas;
pub mod trace;
pub mod tres;
