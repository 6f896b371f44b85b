//! `onepool simulate`: what one shared pool would save on an
//! administrator's own workload, compared with separate islands, using
//! onepool's own decision code (`onepool-decisions`: classification,
//! autoscaling, the rendered QOS) and a documented model of what Slurm
//! does with it ([`slurm`]).

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

pub mod compare;
pub mod engine;
pub mod fleet;
pub mod generate;
pub mod input;
pub mod job_log;
pub mod report;
pub mod scenario;
pub mod slurm;
pub mod svg;
pub mod validate;
