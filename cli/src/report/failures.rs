//! Replica jobs that ended as failures, per endpoint: a crash loop's jobs
//! are not service, and GPU-hours alone made them look like it (issue
//! #26). A replica job is one of onepoold's ([`ReplicaJobs`]: its service
//! user's, recorded by job_submit/onepool for the endpoint; a job that is
//! only named like one, `onepool-ENDPOINT-SLOT`, is not, issue #35); it
//! failed when Slurm says so (FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY,
//! BOOT_FAIL, DEADLINE) or its launcher noted that the server ended by
//! itself.

use std::collections::BTreeMap;

use serde::Serialize;

use super::records::Run;
use super::replica_jobs::ReplicaJobs;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplicaFailures {
    pub endpoint: String,
    pub user: String,
    /// Replica jobs of the endpoint that ended in the period, and those
    /// that failed.
    pub jobs: usize,
    pub failed: usize,
    /// GPU-hours the failed jobs held.
    pub gpu_hours: f64,
    /// Failed jobs by how they ended (Slurm's state, or `server ended`).
    pub by_end: BTreeMap<String, usize>,
    /// The last failure: when (seconds from the period's start), the job,
    /// and its cause as the launcher noted it (signal or exit code and the
    /// server's last output line), else Slurm's state.
    pub last_at_s: f64,
    pub last_job: String,
    pub last_cause: String,
}

const FAILED_STATES: [&str; 6] = ["FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"];

pub fn find(runs: &[Run], replicas: &ReplicaJobs, from: f64, to: f64) -> Vec<ReplicaFailures> {
    let mut by: BTreeMap<(String, String), ReplicaFailures> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.end >= from && r.end <= to) {
        let Some(endpoint) = replicas.endpoint_of(r) else { continue };
        let f = by.entry((endpoint.to_string(), r.user.clone())).or_insert_with(|| ReplicaFailures {
            endpoint: endpoint.to_string(),
            user: r.user.clone(),
            ..ReplicaFailures::default()
        });
        f.jobs += 1;
        let server_ended = r.note.as_ref().and_then(|n| n.ended.first()).map(|(_, c)| c.clone());
        let end = match (&server_ended, FAILED_STATES.contains(&r.state.as_str())) {
            (_, true) => r.state.clone(),
            (Some(_), false) => "server ended".to_string(),
            (None, false) => continue,
        };
        f.failed += 1;
        f.gpu_hours += f64::from(r.gpus) * (r.end.min(to) - r.start.max(from)).max(0.0) / 3600.0;
        *f.by_end.entry(end.clone()).or_default() += 1;
        if r.end - from >= f.last_at_s {
            f.last_at_s = r.end - from;
            f.last_job = r.id.clone();
            f.last_cause = server_ended.map(|c| first_line_and_last(&c)).unwrap_or(end);
        }
    }
    by.into_values().filter(|f| f.failed > 0).collect()
}

/// A launcher's cause is "killed by SIGSEGV; last output:\n...": its first
/// line and the output's last line.
fn first_line_and_last(cause: &str) -> String {
    let mut lines = cause.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default();
    match lines.next_back() {
        Some(last) => format!("{first} {last}"),
        None => first.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_keeps_its_first_and_last_line() {
        assert_eq!(
            first_line_and_last("killed by SIGSEGV; last output:\na\n\nggml: abort\n"),
            "killed by SIGSEGV; last output: ggml: abort"
        );
        assert_eq!(first_line_and_last("exit code 3"), "exit code 3");
    }
}
