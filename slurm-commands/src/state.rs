//! The cluster's jobs and nodes as `squeue --json` and `sinfo --json`
//! report them (Slurm 22.05: OpenAPI v0.0.38 shape). Only the fields onepool
//! reads are declared; unknown ones are ignored, so newer releases that add
//! fields still parse. 22.05's `squeue --json` ignores `-j`/`-t`: callers
//! filter the returned list themselves.

use serde::{Deserialize, Deserializer};

use onepool_decisions::record::JobRecord;

/// Slurm prints `null` for some unset fields (e.g. a pending job's counts):
/// read those as the field's default.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobInfo {
    pub job_id: u32,
    pub job_state: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub user_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub user_id: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub qos: String,
    #[serde(default, deserialize_with = "nullable")]
    pub partition: String,
    /// Allocated nodes (a Slurm host list), empty while pending.
    #[serde(default, deserialize_with = "nullable")]
    pub nodes: String,
    #[serde(default, deserialize_with = "nullable")]
    pub batch_host: String,
    #[serde(default, deserialize_with = "nullable")]
    pub admin_comment: String,
    #[serde(default, deserialize_with = "nullable")]
    pub submit_time: u64,
    #[serde(default, deserialize_with = "nullable")]
    pub start_time: u64,
    #[serde(default, deserialize_with = "nullable")]
    pub end_time: u64,
    /// Non-zero while Slurm is preempting the job (its GraceTime runs).
    #[serde(default, deserialize_with = "nullable")]
    pub preempt_time: u64,
    /// Minutes.
    #[serde(default, deserialize_with = "nullable")]
    pub time_limit: u64,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_job: String,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_node: String,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_task: String,
    #[serde(default, deserialize_with = "nullable")]
    pub node_count: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub tasks: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub state_reason: String,
}

impl JobInfo {
    pub fn is_running(&self) -> bool {
        self.job_state == "RUNNING"
    }
    pub fn is_pending(&self) -> bool {
        self.job_state == "PENDING"
    }
    /// Slurm has picked this running job as a preemption victim (its grace
    /// time runs). A job that already ended keeps its preempt_time.
    pub fn is_being_preempted(&self) -> bool {
        self.preempt_time != 0 && self.is_running()
    }
    /// GPUs the job asks for (or holds, once running).
    pub fn gpus(&self) -> u64 {
        use onepool_decisions::tres::{gpus_in, GpuRequest};
        let n = |t: &str| Some(gpus_in(t).0).filter(|n| *n > 0);
        GpuRequest {
            per_job: n(&self.tres_per_job),
            per_node: n(&self.tres_per_node),
            per_task: n(&self.tres_per_task),
        }
        .total(self.node_count, self.tasks)
    }

    /// What job_submit/onepool recorded on the job, if anything.
    pub fn record(&self) -> Option<JobRecord> {
        JobRecord::decode(&self.admin_comment)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// `idle`, `mixed`, `allocated`, `down`, ...
    pub state: String,
    /// e.g. `DRAIN`.
    #[serde(default, deserialize_with = "nullable")]
    pub state_flags: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub reason: String,
    #[serde(default, deserialize_with = "nullable")]
    pub gres: String,
    #[serde(default, deserialize_with = "nullable")]
    pub gres_used: String,
    #[serde(default, deserialize_with = "nullable")]
    pub partitions: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
}

impl NodeInfo {
    pub fn is_drained(&self) -> bool {
        self.state_flags.iter().any(|f| f.starts_with("DRAIN"))
    }
}

/// One running job step, from `squeue --steps` (22.05's `squeue --json`
/// has no steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInfo {
    pub job_id: u32,
    /// `0`, `1`, ... or `batch`, `extern`.
    pub step: String,
    pub name: String,
    /// A Slurm host list.
    pub nodes: String,
}

/// squeue's output format for [`parse_steps`]: `%i` is `JOB.STEP`.
pub const STEP_FORMAT: &str = "%i|%j|%N";

/// Reads `squeue -h --steps -o '%i|%j|%N'`.
pub fn parse_steps(out: &str) -> Result<Vec<StepInfo>, StateError> {
    let bad = |line: usize, l: &str, why: &str| StateError {
        what: "squeue --steps",
        detail: format!("line {line}: {why}: {l:?} (expected JOB.STEP|NAME|NODES)"),
    };
    let mut steps = Vec::new();
    for (i, l) in out.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = l.trim().splitn(3, '|').collect();
        let [id, name, nodes] = f[..] else { return Err(bad(i + 1, l, "not three '|'-separated fields")) };
        let (job, step) = id.split_once('.').ok_or_else(|| bad(i + 1, l, "no step id"))?;
        // A heterogeneous job's component prints as JOB+N.
        let job = job.split('+').next().unwrap_or(job);
        // An array task prints as ARRAYJOB_TASK, which is not its job id:
        // never one of onepool's jobs (it submits no arrays), so it is
        // left out rather than failing the whole answer.
        if job.contains('_') {
            continue;
        }
        let job_id = job.parse().map_err(|_| bad(i + 1, l, "the job id is not a number"))?;
        steps.push(StepInfo { job_id, step: step.to_string(), name: name.to_string(), nodes: nodes.to_string() });
    }
    Ok(steps)
}

#[derive(Deserialize)]
struct Jobs {
    jobs: Vec<JobInfo>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Nodes {
    nodes: Vec<NodeInfo>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct StateError {
    pub what: &'static str,
    pub detail: String,
}

fn reported(what: &'static str, errors: &[serde_json::Value]) -> Result<(), StateError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(StateError { what, detail: format!("Slurm reported errors: {}", serde_json::Value::from(errors.to_vec())) })
    }
}

pub fn parse_jobs(json: &str) -> Result<Vec<JobInfo>, StateError> {
    let j: Jobs =
        serde_json::from_str(json).map_err(|e| StateError { what: "squeue --json", detail: e.to_string() })?;
    reported("squeue --json", &j.errors)?;
    Ok(j.jobs)
}

pub fn parse_nodes(json: &str) -> Result<Vec<NodeInfo>, StateError> {
    let n: Nodes =
        serde_json::from_str(json).map_err(|e| StateError { what: "sinfo --json", detail: e.to_string() })?;
    reported("sinfo --json", &n.errors)?;
    Ok(n.nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_replica_as_22_05_reports_it() {
        let jobs = parse_jobs(include_str!("../tests/fixtures/squeue-22.05-running.json")).unwrap();
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert!(j.is_running() && !j.is_being_preempted());
        assert_eq!(
            (j.nodes.as_str(), j.batch_host.as_str(), j.tres_per_job.as_str()),
            ("node1", "node1", "gres:gpu:2")
        );
        assert_eq!(j.qos, "op-inference");
        assert_eq!(j.gpus(), 2);
        let r = j.record().expect("onepool's record");
        assert_eq!((r.class.as_str(), r.endpoint.as_deref()), ("inference", Some("llm")));
    }

    #[test]
    fn nodes_as_22_05_reports_them() {
        let nodes = parse_nodes(include_str!("../tests/fixtures/sinfo-22.05.json")).unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].gres, "gpu:4");
        assert!(nodes[0].partitions.contains(&"gpu-flex".to_string()));
        assert!(!nodes[0].is_drained());
    }

    #[test]
    fn null_fields_read_as_defaults() {
        let jobs =
            parse_jobs(r#"{"jobs": [{"job_id": 1, "job_state": "PENDING", "node_count": null, "nodes": null}]}"#)
                .unwrap();
        assert_eq!((jobs[0].node_count, jobs[0].nodes.as_str()), (0, ""));
    }

    #[test]
    fn steps_as_22_05_prints_them() {
        // Captured from the dev cluster: a three-node job, one step per node.
        let out = "1.0|replica-18604|node3\n1.2|replica-18600|node1\n1.batch|batch|node1\n\n";
        let s = parse_steps(out).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], StepInfo { job_id: 1, step: "0".into(), name: "replica-18604".into(), nodes: "node3".into() });
        assert_eq!(s[2].step, "batch");
        // Another job of the same user: an array task's step.
        let s = parse_steps("123_4.0|train|node2\n1.0|replica-18604|node3\n").unwrap();
        assert_eq!(s.iter().map(|s| s.job_id).collect::<Vec<_>>(), [1]);
        let e = parse_steps("1|x|node1\n").unwrap_err().to_string();
        assert!(e.contains("line 1: no step id"), "{e}");
        assert!(parse_steps("x.0|a|n\n").unwrap_err().to_string().contains("not a number"));
        assert!(parse_steps("1.0 node1\n").unwrap_err().to_string().contains("three"));
    }

    #[test]
    fn garbage_and_reported_errors_are_errors() {
        assert!(parse_jobs("not json").unwrap_err().to_string().starts_with("squeue --json:"));
        let e = parse_jobs(r#"{"jobs": [], "errors": [{"error": "boom"}]}"#).unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
