//! `spank_onepool.so`: lets users say what a job is (`--workload=CLASS`,
//! `--reclaim=MODE`, `--drain-timeout=DURATION`, `--endpoint=NAME`).
//!
//! The syntax is checked here, on the submit host, so a typo fails at once
//! with a message that names the accepted forms. Whether the class exists
//! and whether the user may use it is decided centrally by
//! job_submit/onepool, which receives the values through the job's SPANK
//! environment; login and compute nodes need no policy file.
//!
//! This plugin uses the project's own `slurm-sys` rather than the
//! `slurm-spank` crate: that crate takes its plugin mutex with
//! `try_lock().expect()`, so one panic poisons every later callback, and it
//! brings a second bindgen over the same headers. Everything here runs in
//! short-lived, forking processes (srun, sbatch, slurmstepd): no threads, no
//! async runtime.
//!
//! No unsafe code here: entry points come from `slurm_sys::entry_point!`
//! (which puts each behind the panic barrier) and every C call goes
//! through `slurm_sys`'s safe wrappers.
#![deny(unsafe_code)]

mod args;
mod entry;
mod handoff;
mod kill;
mod options;
mod procinfo;

slurm_sys::export_plugin_identity!(name: "onepool", type: "spank");
