//! `job_submit_onepool.so`, loaded by slurmctld (`JobSubmitPlugins=onepool`).
//!
//! slurmctld calls `job_submit`/`job_modify` while it holds its job and
//! node locks, so everything on those paths is in-memory work: no file,
//! network or blocking call, no allocation handed to Slurm except through
//! Slurm's own `xstrdup`, and no panic crosses back into C.
//!
//! No unsafe code here: entry points come from `slurm_sys::entry_point!`
//! (which puts each behind the panic barrier) and every C call goes
//! through `slurm_sys`'s safe wrappers.
#![deny(unsafe_code)]

mod active;
mod entry;
mod job_desc;
mod nss;
mod watcher;

slurm_sys::export_plugin_identity!(name: "onepool job submit plugin", type: "job_submit/onepool");

pub(crate) const PLUGIN: &str = "job_submit/onepool";
