//! The cluster's jobs and nodes as `squeue --json` and `sinfo --json`
//! report them. Only the fields onepool reads are declared; unknown ones are
//! ignored. Two shapes are read (measured): Slurm 22.05's OpenAPI v0.0.38
//! (plain numbers, a job state string, a lower-case node state and its
//! flags apart) and the data parsers of 24.11 and later (numbers as
//! `{"set", "infinite", "number"}`, states as lists of upper-case flags).
//! 22.05's `squeue --json` ignores `-j`/`-t`: callers filter the returned
//! list themselves.

use serde::{Deserialize, Deserializer};

use onepool_decisions::record::JobRecord;

/// Slurm prints `null` for some unset fields (e.g. a pending job's counts):
/// read those as the field's default.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A number in either shape; unset reads 0, infinite the largest value.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Plain(u64),
    Tagged {
        #[serde(default)]
        set: bool,
        #[serde(default)]
        infinite: bool,
        #[serde(default)]
        number: u64,
    },
}

fn number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(match Option::<Number>::deserialize(d)? {
        None => 0,
        Some(Number::Plain(n)) => n,
        Some(Number::Tagged { infinite: true, .. }) => u64::MAX,
        Some(Number::Tagged { set: false, .. }) => 0,
        Some(Number::Tagged { number, .. }) => number,
    })
}

fn number32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    Ok(u32::try_from(number(d)?).unwrap_or(u32::MAX))
}

/// A state: one string (22.05) or a list whose first item is the base
/// state and the rest its flags (24.11 and later).
#[derive(Deserialize)]
#[serde(untagged)]
enum States {
    One(String),
    Many(Vec<String>),
}

impl States {
    fn split(self) -> (String, Vec<String>) {
        match self {
            States::One(s) => (s, Vec::new()),
            States::Many(mut v) if !v.is_empty() => {
                let base = v.remove(0);
                (base, v)
            }
            States::Many(_) => (String::new(), Vec::new()),
        }
    }
}

/// A job's state (`RUNNING`, `PENDING`, ...) in either shape.
fn job_state<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(States::deserialize(d)?.split().0)
}

/// A list of strings, or one comma-separated string.
fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Option::<States>::deserialize(d)? {
        None => Vec::new(),
        Some(States::One(s)) => s.split(',').filter(|x| !x.is_empty()).map(str::to_string).collect(),
        Some(States::Many(v)) => v,
    })
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct JobInfo {
    pub job_id: u32,
    #[serde(deserialize_with = "job_state")]
    pub job_state: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub user_name: String,
    #[serde(default, deserialize_with = "number32")]
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
    /// The job's own comment (its user's to set; onepool's replicas write
    /// where they listen into it).
    #[serde(default, deserialize_with = "nullable")]
    pub comment: String,
    #[serde(default, deserialize_with = "number")]
    pub submit_time: u64,
    /// When Slurm let it start: its submission, or later when a
    /// dependency, begin time or hold kept it (0 where not given).
    #[serde(default, deserialize_with = "number")]
    pub eligible_time: u64,
    #[serde(default, deserialize_with = "number")]
    pub start_time: u64,
    #[serde(default, deserialize_with = "number")]
    pub end_time: u64,
    /// Non-zero while Slurm is preempting the job (its GraceTime runs).
    #[serde(default, deserialize_with = "number")]
    pub preempt_time: u64,
    /// Minutes.
    #[serde(default, deserialize_with = "number")]
    pub time_limit: u64,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_job: String,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_node: String,
    #[serde(default, deserialize_with = "nullable")]
    pub tres_per_task: String,
    #[serde(default, deserialize_with = "number32")]
    pub node_count: u32,
    #[serde(default, deserialize_with = "number32")]
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
        use onepool_decisions::tres::{gpus_in, GpuRequest, Shape};
        let n = |t: &str| Some(gpus_in(t).0).filter(|n| *n > 0);
        GpuRequest {
            per_job: n(&self.tres_per_job),
            per_node: n(&self.tres_per_node),
            per_socket: None,
            per_task: n(&self.tres_per_task),
        }
        .total(&Shape { min_nodes: self.node_count, tasks: self.tasks, ..Shape::default() })
    }

    /// What job_submit/onepool recorded on the job, if anything.
    pub fn record(&self) -> Option<JobRecord> {
        JobRecord::decode(&self.admin_comment)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "RawNode")]
pub struct NodeInfo {
    pub name: String,
    /// `idle`, `mixed`, `allocated`, `down`, ...
    pub state: String,
    /// e.g. `DRAIN`.
    pub state_flags: Vec<String>,
    pub reason: String,
    pub gres: String,
    pub gres_used: String,
    pub partitions: Vec<String>,
    pub address: String,
}

/// A node in either shape: 22.05 prints `"state": "idle"` and the flags in
/// `state_flags`, 24.11 and later `"state": ["IDLE", "DRAIN"]`.
#[derive(Deserialize)]
struct RawNode {
    name: String,
    state: States,
    #[serde(default, deserialize_with = "list")]
    state_flags: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    reason: String,
    #[serde(default, deserialize_with = "nullable")]
    gres: String,
    #[serde(default, deserialize_with = "nullable")]
    gres_used: String,
    #[serde(default, deserialize_with = "list")]
    partitions: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    address: String,
}

impl From<RawNode> for NodeInfo {
    fn from(r: RawNode) -> NodeInfo {
        let (base, mut flags) = r.state.split();
        flags.extend(r.state_flags);
        NodeInfo {
            name: r.name,
            state: base.to_ascii_lowercase(),
            state_flags: flags,
            reason: r.reason,
            gres: r.gres,
            gres_used: r.gres_used,
            partitions: r.partitions,
            address: r.address,
        }
    }
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

/// A pending job and why it waits, from [`parse_waiting`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingJob {
    pub job_id: u32,
    pub user_id: u32,
    pub qos: String,
    /// Slurm's pending reason (`Resources`, `Priority`, `Dependency`, ...).
    pub reason: String,
}

impl WaitingJob {
    /// It waits for nodes or GPUs to come free (or for jobs ahead of it
    /// that do), not for a dependency, a hold, a begin time or a limit:
    /// GPUs given back now would let it, or the jobs ahead of it, start.
    pub fn wants_resources(&self) -> bool {
        matches!(self.reason.as_str(), "Resources" | "Priority")
    }
}

/// squeue's `-O` fields for [`parse_waiting`].
pub const WAITING_FIELDS: &str = "JobID:|,UserID:|,QOS:|,Reason:|";

/// Reads `squeue -h -t PD -p PARTITIONS -O WAITING_FIELDS`.
pub fn parse_waiting(out: &str) -> Result<Vec<WaitingJob>, StateError> {
    let bad = |line: usize, why: String| StateError { what: "squeue -t PD -O", detail: format!("line {line}: {why}") };
    let mut jobs = Vec::new();
    for (i, l) in out.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split('|').map(str::trim).collect();
        if f.len() < 4 {
            return Err(bad(i + 1, format!("{} fields, expected 4: {l:?}", f.len())));
        }
        // A pending array prints JOB_[TASKS]: the job id before the '_'.
        let id = f[0].split(['_', '+']).next().unwrap_or_default();
        let job_id = id.parse().map_err(|_| bad(i + 1, format!("job id {:?} is not a number", f[0])))?;
        let user_id = f[1].parse().map_err(|_| bad(i + 1, format!("user id {:?} is not a number", f[1])))?;
        jobs.push(WaitingJob { job_id, user_id, qos: f[2].to_string(), reason: f[3].to_string() });
    }
    Ok(jobs)
}

/// squeue's `-O` fields for [`parse_user_jobs`], read with
/// `SLURM_TIME_FORMAT=%s` (times in Unix seconds). The name goes last: it
/// is the one field that may hold the separator.
pub const USER_JOB_FIELDS: &str = "JobID:|,UserID:|,State:|,NumNodes:|,StartTime:|,EndTime:|,PreemptTime:|,\
                                   TimeLimit:|,BatchHost:|,NodeList:|,Name:|";

/// Reads `squeue -h -u UID -O USER_JOB_FIELDS`: one user's pending and
/// running jobs with the fields onepoold polls, unlike `squeue --json`
/// (which in 22.05 prints every job slurmctld holds, whatever `-u` says).
/// `admin_comment` is not among squeue's fields: it stays empty.
pub fn parse_user_jobs(out: &str) -> Result<Vec<JobInfo>, StateError> {
    const FIELDS: usize = 11;
    let bad = |line: usize, why: String| StateError { what: "squeue -O", detail: format!("line {line}: {why}") };
    let mut jobs = Vec::new();
    for (i, l) in out.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let f: Vec<&str> = l.splitn(FIELDS, '|').collect();
        if f.len() < FIELDS {
            return Err(bad(line, format!("{} fields, expected {FIELDS}: {l:?}", f.len())));
        }
        // Array tasks (JOB_TASK) and heterogeneous components (JOB+N) print
        // ids that are not job ids; onepoold submits neither.
        if f[0].contains(['_', '+']) {
            continue;
        }
        let number = |k: usize, what: &str| -> Result<u64, StateError> {
            match f[k].trim() {
                "" | "N/A" | "Unknown" | "None" => Ok(0),
                v => v.parse().map_err(|_| bad(line, format!("{what} {v:?} is not a number"))),
            }
        };
        let text = |k: usize| match f[k].trim() {
            "n/a" | "N/A" | "(null)" | "None" => String::new(),
            v => v.to_string(),
        };
        let small = |k: usize, what: &str| -> Result<u32, StateError> {
            u32::try_from(number(k, what)?).map_err(|_| bad(line, format!("{what} {:?} is too large", f[k])))
        };
        // D-HH:MM:SS, or words (UNLIMITED, Partition_Limit, ...): none.
        let time_limit = onepool_decisions::duration::parse(f[7]).map_or(0, |d| d.as_secs() / 60);
        jobs.push(JobInfo {
            job_id: small(0, "the job id")?,
            user_id: small(1, "the user id")?,
            job_state: f[2].trim().to_string(),
            node_count: small(3, "the node count")?,
            start_time: number(4, "the start time")?,
            end_time: number(5, "the end time")?,
            preempt_time: number(6, "the preemption time")?,
            time_limit,
            batch_host: text(8),
            nodes: text(9),
            // The separator after the last field is squeue's own.
            name: f[10].strip_suffix('|').unwrap_or(f[10]).to_string(),
            ..JobInfo::default()
        });
    }
    Ok(jobs)
}

/// `squeue -O` fields of [`parse_started_on`], under
/// `SLURM_TIME_FORMAT=%s` (times as Unix seconds).
pub const STARTED_ON_FIELDS: &str = "JobID:|,UserID:|,State:|,SubmitTime:|,EligibleTime:|,StartTime:|,NodeList:|";

/// Reads `squeue -h -t all -w NODES -O STARTED_ON_FIELDS`: the jobs that
/// started on some nodes (running, or ended and still held by slurmctld)
/// with when each was submitted, became eligible (its submission where
/// Slurm prints none) and started. A job that has not started
/// (squeue prints an expected start, or none) is left out.
pub fn parse_started_on(out: &str) -> Result<Vec<JobInfo>, StateError> {
    const FIELDS: usize = 7;
    let bad = |line: usize, why: String| StateError { what: "squeue -w -O", detail: format!("line {line}: {why}") };
    let mut jobs = Vec::new();
    for (i, l) in out.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let f: Vec<&str> = l.trim_end().trim_end_matches('|').split('|').map(str::trim).collect();
        if f.len() != FIELDS {
            return Err(bad(line, format!("{} fields, expected {FIELDS}: {l:?}", f.len())));
        }
        if f[2] == "PENDING" {
            continue;
        }
        // An array task or hetjob component prints JOB_TASK or JOB+N; the
        // raw id is what the report and the log use, and squeue -O has it
        // only as ArrayJobID: such a taker is named by its first id.
        let id = f[0].split(['_', '+']).next().unwrap_or(f[0]);
        let number = |v: &str, what: &str| -> Result<u64, StateError> {
            v.parse().map_err(|_| bad(line, format!("{what} {v:?} is not a number")))
        };
        // Slurm prints N/A or Unknown for a start it has not made.
        let Ok(start_time) = f[5].parse::<u64>() else { continue };
        jobs.push(JobInfo {
            job_id: u32::try_from(number(id, "the job id")?)
                .map_err(|_| bad(line, format!("job id {id:?} is too large")))?,
            user_id: u32::try_from(number(f[1], "the user id")?)
                .map_err(|_| bad(line, format!("user id {:?} is too large", f[1])))?,
            job_state: f[2].to_string(),
            submit_time: number(f[3], "the submission time")?,
            eligible_time: f[4].parse().or_else(|_| number(f[3], "the submission time"))?,
            start_time,
            nodes: f[6].to_string(),
            ..JobInfo::default()
        });
    }
    Ok(jobs)
}

/// The `AdminComment` in `scontrol -o show job`'s line, if set. Its value
/// ends at the first space: job_submit/onepool's records have none, and a
/// comment of someone else's that has one is then not mistaken for one.
pub fn parse_admin_comment(out: &str) -> Option<String> {
    field(out, "AdminComment")
}

/// One word-valued `Key=Value` of `scontrol -o show job`'s line.
fn field(out: &str, key: &str) -> Option<String> {
    let rest = out.split([' ', '\n']).find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?;
    Some(rest.to_string()).filter(|c| !c.is_empty() && c != "(null)")
}

/// What `scontrol -o show job` says of one job that a poll of the queue
/// does not: both comments, and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobDetails {
    pub admin_comment: String,
    pub comment: String,
    pub state: String,
    /// `ExitCode=CODE:SIGNAL` as Slurm prints it.
    pub exit_code: String,
    pub reason: String,
    /// Unix seconds; 0 where Slurm has none. `preempt_time` is set when
    /// Slurm picks the job as a preemption victim and stays in its record
    /// after it ended: the record of a reclaim, however short the grace
    /// time and whenever onepoold polled (issue #35).
    pub start_time: u64,
    pub end_time: u64,
    pub preempt_time: u64,
    /// The nodes it ran on (a host list), empty if it never ran.
    pub nodes: String,
}

impl JobDetails {
    /// "FAILED, exit code 1", "TIMEOUT", "NODE_FAIL", "CANCELLED (signal 9)".
    pub fn ending(&self) -> String {
        let mut s = self.state.clone();
        match self.exit_code.split_once(':') {
            Some(("0", "0")) | None => {}
            Some((code, "0")) => s.push_str(&format!(", exit code {code}")),
            Some((_, sig)) => s.push_str(&format!(", signal {sig}")),
        }
        if !self.reason.is_empty() && self.reason != "None" {
            s.push_str(&format!(" ({})", self.reason));
        }
        s
    }
}

/// Reads `SLURM_TIME_FORMAT=%s scontrol -o show job JOB`. Comments are
/// single words here: job_submit/onepool's record and the replicas' notes
/// have no spaces. Times that are not Unix seconds (`None`, `Unknown`, or
/// another time format) read 0.
pub fn parse_job_details(out: &str) -> Option<JobDetails> {
    let state = field(out, "JobState")?;
    let time = |key: &str| field(out, key).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(JobDetails {
        admin_comment: parse_admin_comment(out).unwrap_or_default(),
        comment: field(out, "Comment").unwrap_or_default(),
        state,
        exit_code: field(out, "ExitCode").unwrap_or_default(),
        reason: field(out, "Reason").unwrap_or_default(),
        start_time: time("StartTime"),
        end_time: time("EndTime"),
        preempt_time: time("PreemptTime"),
        nodes: field(out, "NodeList").unwrap_or_default(),
    })
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
mod started_on_tests {
    use super::*;

    #[test]
    fn jobs_that_started_on_nodes_with_their_times_ended_ones_too() {
        let out =
            "41|1001|RUNNING|1796464800|1796464801|1796464803|node[1-2]|\n42_3|1002|COMPLETED|1796464801|Unknown|1796464802|node3|\n\
                   43|1003|PENDING|1796464801|1796464801|1796464900|node3|\n44|1004|CANCELLED|1796464801|1796464801|N/A|node3|\n";
        let j = parse_started_on(out).unwrap();
        assert_eq!(j.len(), 2, "not started: left out: {j:?}");
        assert_eq!(
            (j[0].job_id, j[0].user_id, j[0].submit_time, j[0].eligible_time, j[0].start_time),
            (41, 1001, 1_796_464_800, 1_796_464_801, 1_796_464_803)
        );
        assert_eq!(j[1].eligible_time, 1_796_464_801, "Unknown: its submission");
        assert_eq!((j[0].nodes.as_str(), j[1].job_id, j[1].job_state.as_str()), ("node[1-2]", 42, "COMPLETED"));
        let e = parse_started_on("41|1001|RUNNING|soon|1796464801|1796464803|node1|\n").unwrap_err();
        assert!(e.to_string().contains("line 1: the submission time \"soon\" is not a number"), "{e}");
        assert!(parse_started_on("41|1001|\n").is_err());
    }
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

    /// 24.11's data parser: numbers as {set, infinite, number}, states as
    /// lists (captured from the dev cluster running Debian 13's Slurm).
    #[test]
    fn a_running_replica_as_24_11_reports_it() {
        let jobs = parse_jobs(include_str!("../tests/fixtures/squeue-24.11-running.json")).unwrap();
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert!(j.is_running() && !j.is_being_preempted());
        assert_eq!((j.nodes.as_str(), j.batch_host.as_str()), ("node1", "node1"));
        assert_eq!((j.time_limit, j.node_count, j.tasks), (10, 1, 1));
        assert!(j.start_time > 1_700_000_000, "{}", j.start_time);
        assert_eq!((j.qos.as_str(), j.gpus()), ("op-inference", 1));
        assert_eq!(j.record().expect("onepool's record").class, "inference");
        let nodes = parse_nodes(include_str!("../tests/fixtures/nodes-24.11.json")).unwrap();
        let states: Vec<(&str, &str, bool)> =
            nodes.iter().map(|n| (n.name.as_str(), n.state.as_str(), n.is_drained())).collect();
        assert_eq!(
            states,
            [("node1", "mixed", false), ("node2", "idle", false), ("node3", "idle", false), ("node4", "idle", true)]
        );
        assert_eq!((nodes[3].reason.as_str(), nodes[0].address.as_str()), ("test", "127.0.0.1"));
    }

    #[test]
    fn numbers_in_either_shape() {
        let jobs = parse_jobs(
            r#"{"jobs": [{"job_id": 1, "job_state": ["PENDING"], "time_limit": {"set": false, "infinite": true, "number": 0},
                "start_time": {"set": false, "infinite": false, "number": 5}, "node_count": 3}]}"#,
        )
        .unwrap();
        assert_eq!((jobs[0].time_limit, jobs[0].start_time, jobs[0].node_count), (u64::MAX, 0, 3));
        assert!(jobs[0].is_pending());
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
    fn one_user_s_jobs_as_squeue_prints_them() {
        // Captured from the dev cluster (SLURM_TIME_FORMAT=%s), plus an
        // array task of the same user and a name holding the separator.
        let out = "90|0|RUNNING|1|1796281910|1798873910|N/A|30-00:00:00|node2|node2|onepool-chat-18500|\n\
                   93|0|RUNNING|3|1796281927|1796368327|1796282000|1-00:00:00|node2|node[2-4]|onepool-chat-18508|\n\
                   94|0|PENDING|1|0|N/A|N/A|UNLIMITED|n/a||a|b|\n\
                   7_2|0|RUNNING|1|1796281910|1796368327|N/A|2:00|node1|node1|wrap|\n";
        let jobs = parse_user_jobs(out).unwrap();
        assert_eq!(jobs.len(), 3);
        let j = &jobs[0];
        assert_eq!((j.job_id, j.user_id, j.job_state.as_str(), j.node_count), (90, 0, "RUNNING", 1));
        assert_eq!((j.start_time, j.end_time, j.preempt_time, j.time_limit), (1796281910, 1798873910, 0, 30 * 24 * 60));
        assert_eq!(
            (j.batch_host.as_str(), j.nodes.as_str(), j.name.as_str()),
            ("node2", "node2", "onepool-chat-18500")
        );
        assert!(jobs[1].is_being_preempted());
        assert_eq!((jobs[1].nodes.as_str(), jobs[1].time_limit), ("node[2-4]", 24 * 60));
        let p = &jobs[2];
        assert!(p.is_pending());
        assert_eq!((p.batch_host.as_str(), p.nodes.as_str(), p.time_limit, p.name.as_str()), ("", "", 0, "a|b"));
        let e = parse_user_jobs("90|0|RUNNING\n").unwrap_err().to_string();
        assert!(e.contains("line 1: 3 fields, expected 11"), "{e}");
        let e = parse_user_jobs("90|0|RUNNING|one|0|0|0|1:00|n|n|x|\n").unwrap_err().to_string();
        assert!(e.contains("the node count \"one\" is not a number"), "{e}");
    }

    #[test]
    fn the_admin_comment_from_scontrol_show_job() {
        let line = "JobId=90 JobName=onepool-chat-18500 UserId=root(0) GroupId=root(0) MCS_label=N/A \
                    Priority=1 Nice=0 Account=(null) QOS=op-inference AdminComment=onepool:class=inference;tier=flexible;endpoint=chat \
                    Comment=my job\n";
        assert_eq!(parse_admin_comment(line).as_deref(), Some("onepool:class=inference;tier=flexible;endpoint=chat"));
        assert_eq!(parse_admin_comment("JobId=1 JobName=x Comment=a\n"), None);
        assert_eq!(parse_admin_comment("JobId=1 AdminComment=\n"), None);
    }

    #[test]
    fn how_a_job_ended_from_scontrol_show_job() {
        let line = "JobId=91 JobName=onepool-chat-19400 JobState=FAILED Reason=NonZeroExitCode Dependency=(null) \
                    ExitCode=139:0 AdminComment=onepool:class=inference-baseline Comment=op1;L19400=41234;E19400=killed%20by%20SIGSEGV\n";
        let d = parse_job_details(line).unwrap();
        assert_eq!(d.comment, "op1;L19400=41234;E19400=killed%20by%20SIGSEGV");
        assert_eq!(d.admin_comment, "onepool:class=inference-baseline");
        assert_eq!(d.ending(), "FAILED, exit code 139 (NonZeroExitCode)");
        let killed =
            JobDetails { state: "CANCELLED".into(), exit_code: "0:9".into(), reason: "None".into(), ..d.clone() };
        assert_eq!(killed.ending(), "CANCELLED, signal 9");
        assert_eq!(parse_job_details("slurm_load_jobs error: Invalid job id specified\n"), None);
        // A comment with no note, and none at all.
        assert_eq!(parse_job_details("JobId=1 JobState=RUNNING Comment=(null)\n").unwrap().comment, "");
        // A reclaimed replica as 22.05 prints it under SLURM_TIME_FORMAT=%s:
        // COMPLETED after its drain, its pick kept in PreemptTime.
        let line = "JobId=92 JobName=onepool-chat-18000 JobState=COMPLETED Reason=None ExitCode=0:0 \
                    SubmitTime=1796464700 StartTime=1796464701 EndTime=1796464805 Deadline=N/A \
                    PreemptEligibleTime=1796464711 PreemptTime=1796464803 SuspendTime=None \
                    ReqNodeList=(null) ExcNodeList=node9 NodeList=node[2-3] BatchHost=node2\n";
        let d = parse_job_details(line).unwrap();
        assert_eq!((d.start_time, d.end_time, d.preempt_time), (1_796_464_701, 1_796_464_805, 1_796_464_803));
        assert_eq!(d.nodes, "node[2-3]");
        let d = parse_job_details("JobId=1 JobState=RUNNING PreemptTime=None StartTime=Unknown\n").unwrap();
        assert_eq!((d.start_time, d.preempt_time, d.nodes.as_str()), (0, 0, ""));
    }

    #[test]
    fn garbage_and_reported_errors_are_errors() {
        assert!(parse_jobs("not json").unwrap_err().to_string().starts_with("squeue --json:"));
        let e = parse_jobs(r#"{"jobs": [], "errors": [{"error": "boom"}]}"#).unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
    }

    #[test]
    fn waiting_jobs_and_whether_gpus_would_help_them() {
        let out =
            "101|1000|op-training|Resources\n102_[3-9]|1001|op-agents|Priority\n103|1002|op-agents|Dependency\n\n";
        let w = parse_waiting(out).unwrap();
        assert_eq!(
            w.iter().map(|j| (j.job_id, j.user_id)).collect::<Vec<_>>(),
            [(101, 1000), (102, 1001), (103, 1002)]
        );
        assert_eq!(w.iter().map(WaitingJob::wants_resources).collect::<Vec<_>>(), [true, true, false]);
        let e = parse_waiting("101|x|q|Resources\n").unwrap_err();
        assert!(e.to_string().contains("line 1: user id \"x\" is not a number"), "{e}");
        assert!(parse_waiting("101|1000\n").unwrap_err().to_string().contains("2 fields, expected 4"));
    }
}
