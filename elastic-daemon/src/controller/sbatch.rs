//! Which Slurm jobs are this endpoint's replicas, and the sbatch line that
//! submits one.

use std::time::Duration;

use onepool_decisions::replicas::Kind;
use onepool_launcher::conventions::{job_name, port_from_name, ReplicaNote};
use onepool_slurm_commands::state::JobInfo;

use crate::config::{ReplicaSettings, ReplicaTransport};

/// The job's port and kind when the job is one of this endpoint's replicas
/// submitted by `uid`; `None` for every job onepoold must leave alone.
pub fn owned(job: &JobInfo, endpoint: &str, uid: u32, s: &ReplicaSettings) -> Option<(u16, Kind)> {
    if job.user_id != uid {
        return None;
    }
    let port = port_from_name(endpoint, &job.name)?;
    if port < s.port_range.0 || port >= s.port_range.1 {
        return None;
    }
    let record = job.record()?;
    if record.endpoint.as_deref() != Some(endpoint) {
        return None;
    }
    if record.class == s.baseline_workload {
        Some((port, Kind::Baseline))
    } else if record.class == s.supplemental_workload {
        Some((port, Kind::Supplemental))
    } else if s.warm.as_ref().is_some_and(|w| record.class == w.workload) {
        Some((port, Kind::Warm))
    } else if s.lower_workload.as_ref().is_some_and(|w| record.class == *w) {
        Some((port, Kind::Lower))
    } else {
        None
    }
}

pub(super) fn quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// sbatch's arguments (after `--parsable`) for a job of `replicas`
/// replicas from `port` on: one replica on one node, or with
/// `replicas_per_job` above 1 one per node, each an srun step
/// ([`onepool_launcher::replica_group`]) on `port + 2i`.
pub fn sbatch_args(endpoint: &str, s: &ReplicaSettings, kind: Kind, port: u16, replicas: u32) -> Vec<String> {
    let class = match kind {
        Kind::Baseline => &s.baseline_workload,
        Kind::Supplemental => &s.supplemental_workload,
        Kind::Warm => s.warm.as_ref().map_or(&s.supplemental_workload, |w| &w.workload),
        Kind::Lower => s.lower_workload.as_ref().unwrap_or(&s.supplemental_workload),
    };
    let drain_secs = s.drain_timeout.as_secs_f64().ceil().max(1.0) as u64;
    let drain = onepool_decisions::duration::format(Duration::from_secs(drain_secs));
    let launcher = quote(&s.launcher);
    // The slot names the job; the port is the kernel's choice on the node
    // (issue #25: a port from a known range could be taken first), on the
    // node's address as Slurm knows it, where onepoold routes (issue #36:
    // not every address of the node).
    let mut common = format!("--listen node:0 --slot {port} --drain-timeout {drain}");
    // The router pins the certificate the launcher reports (issue #36).
    if s.transport == ReplicaTransport::Tls {
        common.push_str(" --tls");
    }
    if s.immediate_classes.iter().any(|c| c == class) {
        common.push_str(" --reclaim immediate");
    }
    if !s.serve_paths.is_empty() && s.serve_paths.iter().map(String::as_str).ne(onepool_launcher::access::DEFAULT_PATHS)
    {
        for p in &s.serve_paths {
            common.push_str(&format!(" --allow-path {}", quote(p)));
        }
    }
    let mut args = vec![
        "-J".to_string(),
        job_name(endpoint, port),
        format!("--workload={class}"),
        format!("--endpoint={endpoint}"),
    ];
    let script = if s.replicas_per_job > 1 {
        args.extend([
            format!("-N{}", replicas.max(1)),
            "--ntasks-per-node=1".to_string(),
            format!("--gpus-per-node={}", s.gpus),
            // A failed node leaves the job; the replicas on the others serve on.
            "--no-kill".to_string(),
        ]);
        format!("exec {launcher} replica --per-node {common} -- {}", s.command)
    } else {
        args.extend([format!("--gpus={}", s.gpus), "-N1".to_string()]);
        format!("exec {launcher} replica {common} -- {}", s.command)
    };
    // Slurm's preemption notice reaches a per-node job's steps too, and
    // with them the model servers: SIGURG, which they ignore by default
    // (SIGUSR1 killed them with their requests in flight, measured).
    let notice = if s.replicas_per_job > 1 { "URG" } else { "USR1" };
    args.extend([
        // A replica lost with its node is replaced at once by a new job; a
        // requeued one would wait Slurm's BeginTime (~2 minutes) first.
        "--no-requeue".to_string(),
        // Issue #37: one replica per slot, whoever submits. The name is the
        // slot, and Slurm starts a singleton job only while no other job of
        // this name and user runs or is suspended and none with a lower id
        // is pending (slurmctld's _find_singleton_job, the same in 22.05,
        // 24.11 and 26.05). Two onepoold instances acting at once, or one
        // that lost its state, may still submit twice for one slot: the
        // later job then waits (Reason=Dependency) instead of running
        // beside the first, and the controller cancels it
        // (`Controller::surplus_in_slots`).
        "--dependency=singleton".to_string(),
        format!("--signal=B:{notice}@{drain_secs}"),
    ]);
    if let Some(t) = s.time_limit {
        args.push(format!("--time={}", t.as_secs().div_ceil(60).max(1)));
    }
    args.extend(["-o".to_string(), s.output.clone(), "--wrap".to_string(), script]);
    args
}

/// What the launcher's note says of a replica job that ended: its server's
/// end (`server`, from the note), or that the launcher never started;
/// empty when it listened and its server did not end by itself. Shared by
/// the controller's failed starts and the preflight.
pub fn launcher_end(note: &ReplicaNote, server: Option<&str>) -> String {
    match server {
        Some(server) => format!("; the model server {server}"),
        None if note.listening.is_empty() => {
            "; its launcher never reported a port (it did not start: see the job's output file)".to_string()
        }
        None => String::new(),
    }
}
