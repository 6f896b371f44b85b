//! Which Slurm jobs the replicas come in and go in: the replicas to
//! submit packed into jobs of `replicas_per_job`, and the replicas to
//! release turned into what Slurm is told (scancel or shrink).

use crate::replicas::{Action, Kind};

/// How many replicas each new job hosts: the submissions `reconcile`
/// asked for, `per_job` at most to a job, in order of kind.
pub fn pack_submissions(actions: &[Action], per_job: u32) -> Vec<(Kind, u32)> {
    let per_job = per_job.max(1);
    let mut jobs: Vec<(Kind, u32)> = Vec::new();
    for a in actions {
        let Action::Submit(kind) = a else { continue };
        match jobs.last_mut() {
            Some((k, n)) if k == kind && *n < per_job => *n += 1,
            _ => jobs.push((*kind, 1)),
        }
    }
    jobs
}

/// One of the daemon's jobs as far as releasing its replicas goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLayout {
    pub job: u32,
    /// Not running yet: its node count is still a request.
    pub pending: bool,
    /// Where it runs (none while pending).
    pub batch_host: Option<String>,
    /// Its replicas: slot and node (none while pending). Every node of a
    /// running job has one.
    pub replicas: Vec<(u16, Option<String>)>,
}

/// What Slurm is told to give replicas' GPUs back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// None of the job's replicas is left: `scancel`.
    Cancel { job: u32 },
    /// `scontrol update JobId=.. NodeList=<keep>`: the released nodes'
    /// GPUs are free at once (Slurm SIGKILLs what still runs there, so the
    /// replicas on them have drained first).
    Shrink { job: u32, keep: Vec<String>, released: Vec<u16> },
    /// A pending job asks for fewer nodes: `scontrol update NumNodes=`.
    Resize { job: u32, nodes: u32, released: Vec<u16> },
    /// The replica on the batch host cannot leave while its job keeps
    /// others; it stays out of the router until they go.
    Held { job: u32, slot: u16 },
}

/// Groups the replicas to release by job: a job with none left is
/// cancelled; a running one keeps the nodes of the rest, and always its
/// batch host; a pending one asks for fewer nodes.
pub fn plan_releases(jobs: &[JobLayout], release: &[(u32, u16)]) -> Vec<Release> {
    let mut out = Vec::new();
    for j in jobs {
        let mine: Vec<u16> = j.replicas.iter().map(|(s, _)| *s).filter(|s| release.contains(&(j.job, *s))).collect();
        if mine.is_empty() {
            continue;
        }
        if mine.len() == j.replicas.len() {
            out.push(Release::Cancel { job: j.job });
            continue;
        }
        if j.pending {
            out.push(Release::Resize { job: j.job, nodes: (j.replicas.len() - mine.len()) as u32, released: mine });
            continue;
        }
        let mut keep = Vec::new();
        let mut released = Vec::new();
        for (slot, node) in &j.replicas {
            let Some(node) = node else { continue };
            let on_batch_host = j.batch_host.as_deref() == Some(node.as_str());
            if !mine.contains(slot) {
                keep.push(node.clone());
            } else if on_batch_host {
                keep.push(node.clone());
                out.push(Release::Held { job: j.job, slot: *slot });
            } else {
                released.push(*slot);
            }
        }
        if !released.is_empty() {
            out.push(Release::Shrink { job: j.job, keep, released });
        }
    }
    out
}
