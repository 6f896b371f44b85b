//! The GPU hand-off decision: when a job's GPUs change hands, who may still
//! hold them and what to do about it. The SPANK plugin gathers the facts
//! (processes on the job's GPUs, the Slurm job each belongs to) and acts;
//! the rules live here so they are tested once and the same everywhere.
//!
//! - **Epilog** (the departing job): its own processes left on its GPUs
//!   (CUDA contexts linger after SIGKILL; a daemonized child escapes the
//!   step) are killed; anything else holding them is a foreign holder: the
//!   node must be drained with a reason naming the GPU and the holder, and
//!   the epilog fails so Slurm does not hand the GPU on.
//! - **Prolog** (the incoming job): leftovers of jobs no longer running on
//!   this node are killed; a holder that is not a Slurm job, or belongs to a
//!   job still running here, is foreign.

use std::fmt;

/// One process found on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Device minor number (`/dev/nvidiaN`).
    pub minor: u32,
    pub pid: u32,
    /// The Slurm job the process belongs to (from its environment), if any.
    pub job: Option<u32>,
    /// Its command name, for messages.
    pub command: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/dev/nvidia{} held by pid {} ({})", self.minor, self.pid, self.command)?;
        match self.job {
            Some(j) => write!(f, " of job {j}"),
            None => f.write_str(", not a Slurm job"),
        }
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Processes to kill (they belong to the departing job, or to a job
    /// that no longer runs here).
    pub kill: Vec<Holder>,
    /// Holders onepool must not kill: the GPU cannot be handed over.
    pub foreign: Vec<Holder>,
}

impl Plan {
    pub fn is_clean(&self) -> bool {
        self.kill.is_empty() && self.foreign.is_empty()
    }

    /// The node's drain reason: short (Slurm shows it in `sinfo -R`) and
    /// naming the GPU and the holder.
    pub fn drain_reason(&self, job: u32) -> Option<String> {
        let first = self.foreign.first().or(self.kill.first())?;
        let more = self.foreign.len() + self.kill.len() - 1;
        let extra = if more > 0 { format!(" (+{more} more)") } else { String::new() };
        Some(format!("onepool: after job {job}: {first}{extra}"))
    }
}

/// Only holders of the job's own GPUs matter.
fn on_gpus<'a>(holders: &'a [Holder], gpus: &'a [u32]) -> impl Iterator<Item = &'a Holder> {
    holders.iter().filter(move |h| gpus.contains(&h.minor))
}

/// The departing job `job` leaves `gpus`.
pub fn epilog(job: u32, gpus: &[u32], holders: &[Holder]) -> Plan {
    let mut plan = Plan::default();
    for h in on_gpus(holders, gpus) {
        if h.job == Some(job) {
            plan.kill.push(h.clone());
        } else {
            plan.foreign.push(h.clone());
        }
    }
    plan
}

/// The incoming job gets `gpus`; `running_here` are the jobs with steps on
/// this node (the incoming job among them).
pub fn prolog(gpus: &[u32], holders: &[Holder], running_here: &[u32]) -> Plan {
    let mut plan = Plan::default();
    for h in on_gpus(holders, gpus) {
        match h.job {
            Some(j) if !running_here.contains(&j) => plan.kill.push(h.clone()),
            _ => plan.foreign.push(h.clone()),
        }
    }
    plan
}

/// What a dirty GPU at prolog time means for the incoming job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyPrologAction {
    /// Fail the prolog: Slurm requeues the job held and the node is drained;
    /// the job never starts on a GPU someone else holds. (Default.)
    #[default]
    Fail,
    /// Let the job run anyway (the node is still drained for later jobs).
    Run,
}

impl DirtyPrologAction {
    pub fn parse(s: &str) -> Option<DirtyPrologAction> {
        match s {
            "fail" => Some(DirtyPrologAction::Fail),
            "run" => Some(DirtyPrologAction::Run),
            _ => None,
        }
    }
}

/// Slurm's GPU list for a job (`SLURM_JOB_GPUS`, e.g. `0,2-3`): node-local
/// GRES indices, not device minors.
pub fn parse_index_list(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("{s:?} is not a GPU index list (expected e.g. 0,2-3)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a || b - a > 4096 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(minor: u32, pid: u32, job: Option<u32>) -> Holder {
        Holder { minor, pid, job, command: "python".into() }
    }

    #[test]
    fn epilog_kills_its_own_stragglers_and_reports_foreign_holders() {
        let holders = [h(4, 10, Some(7)), h(5, 11, Some(8)), h(6, 12, None), h(9, 13, Some(7))];
        let plan = epilog(7, &[4, 5, 6], &holders);
        assert_eq!(plan.kill, vec![h(4, 10, Some(7))]);
        assert_eq!(plan.foreign, vec![h(5, 11, Some(8)), h(6, 12, None)]);
        assert_eq!(
            plan.drain_reason(7).unwrap(),
            "onepool: after job 7: /dev/nvidia5 held by pid 11 (python) of job 8 (+2 more)"
        );
        assert!(epilog(7, &[4], &[h(9, 13, Some(7))]).is_clean(), "other GPUs do not matter");
    }

    #[test]
    fn prolog_kills_leftovers_of_finished_jobs_only() {
        let holders = [h(0, 10, Some(3)), h(1, 11, Some(4)), h(2, 12, None)];
        let plan = prolog(&[0, 1, 2], &holders, &[4, 5]);
        assert_eq!(plan.kill, vec![h(0, 10, Some(3))]);
        assert_eq!(plan.foreign, vec![h(1, 11, Some(4)), h(2, 12, None)]);
        assert_eq!(h(2, 12, None).to_string(), "/dev/nvidia2 held by pid 12 (python), not a Slurm job");
    }

    #[test]
    fn index_lists() {
        assert_eq!(parse_index_list("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_index_list("").unwrap(), Vec::<u32>::new());
        assert!(parse_index_list("a").unwrap_err().contains("not a GPU index list"));
        assert!(parse_index_list("3-1").is_err());
    }
}
