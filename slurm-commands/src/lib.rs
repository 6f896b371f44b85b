//! Slurm's client commands, run the way every onepool tool needs them: with
//! a timeout (a slurmctld or slurmdbd that does not answer must not hang an
//! admin's shell, a daemon or a test), both pipes drained while waiting, and
//! failures that say which command failed, what it printed, and whether
//! trying again can help.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

pub mod adapter;
pub mod fake;
pub mod live;
pub mod runner;
pub mod state;

pub use runner::{run, CommandError, Runner, SystemRunner};
