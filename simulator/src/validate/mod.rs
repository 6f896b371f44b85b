//! The simulator against the real dev cluster (bench/validate-simulator.sh,
//! issue 7): the script runs a scenario on the cluster and through
//! `onepool simulate`, leaves what each said in one folder, and
//! `onepool-validate` sets the two side by side.
//!
//! - [`batch`]: every run of every job (sacct, job.sh's logs, `--job-log`).
//! - [`inference`]: onepoold's replica jobs (its log, sacct) and the
//!   requests' queueing delays (load.py) beside the simulated endpoint.
//!
//! Everything the folder holds is read by the reader of its format here or
//! where the format is defined: the scenario and policy by
//! [`crate::scenario`], jobs.csv by [`crate::input::jobs`], the job log by
//! [`crate::job_log`], times by the traces' [`crate::input::parse_time`].

pub mod batch;
mod format;
pub mod inference;
pub mod sacct;

use std::path::Path;

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A file the run may not have written (a job that never started writes
/// no job.sh log).
fn read_if_there(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}
