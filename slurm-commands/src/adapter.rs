//! The one interface through which onepool's daemon acts on Slurm: submit,
//! cancel, update, and read jobs and nodes. The command-line implementation
//! runs sbatch/scancel/scontrol/squeue/sinfo with timeouts; every failure
//! says whether trying again can help.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::runner::{CommandError, Runner};
use crate::state::{
    parse_job_details, parse_jobs, parse_nodes, parse_started_on, parse_steps, parse_user_jobs, parse_waiting,
    JobDetails, JobInfo, NodeInfo, StateError, StepInfo, WaitingJob, STARTED_ON_FIELDS, STEP_FORMAT, USER_JOB_FIELDS,
    WAITING_FIELDS,
};

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("`{cmd}` printed {output:?}, not a job id")]
    NoJobId { cmd: String, output: String },
}

impl SlurmError {
    pub fn is_retryable(&self) -> bool {
        match self {
            SlurmError::Command(e) => e.is_retryable(),
            SlurmError::State(_) | SlurmError::NoJobId { .. } => false,
        }
    }
}

pub trait Slurm {
    /// `sbatch --parsable ARGS`; the new job's id.
    fn submit(&self, args: &[&str]) -> Result<u32, SlurmError>;
    /// `scancel [--signal=SIG] JOB`.
    fn cancel(&self, job: u32, signal: Option<&str>) -> Result<(), SlurmError>;
    /// `scontrol update JobId=JOB K=V...` (e.g. `NodeList=` to shrink).
    fn update_job(&self, job: u32, settings: &[(&str, &str)]) -> Result<(), SlurmError>;
    /// Every job slurmctld knows.
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError>;
    /// At least every pending and running job of `user`, without their
    /// `admin_comment` (see [`Slurm::admin_comment`]): what a poll of one's
    /// own jobs needs, at a cost that does not grow with everyone else's.
    fn user_jobs(&self, user: u32) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(self.jobs()?.into_iter().filter(|j| j.user_id == user).collect())
    }
    /// One job's `AdminComment` (job_submit/onepool's record); `None` when
    /// it has none or is gone.
    fn admin_comment(&self, job: u32) -> Result<Option<String>, SlurmError> {
        Ok(self.job_details(job)?.map(|d| d.admin_comment).filter(|c| !c.is_empty()))
    }
    /// One job's comments and how it ended, while slurmctld still holds it
    /// (`MinJobAge` after its end); `None` once it is gone.
    fn job_details(&self, job: u32) -> Result<Option<JobDetails>, SlurmError> {
        Ok(self.jobs()?.into_iter().find(|j| j.job_id == job).map(|j| JobDetails {
            admin_comment: j.admin_comment,
            comment: j.comment,
            state: j.job_state,
            exit_code: String::new(),
            reason: j.state_reason,
            start_time: j.start_time,
            end_time: j.end_time,
            preempt_time: j.preempt_time,
            nodes: j.nodes,
        }))
    }
    fn nodes(&self) -> Result<Vec<NodeInfo>, SlurmError>;
    /// The running steps of `user`'s jobs.
    fn steps(&self, user: u32) -> Result<Vec<StepInfo>, SlurmError>;
    /// The pending jobs of every user in any of `partitions`, and why each
    /// waits.
    fn waiting(&self, partitions: &[String]) -> Result<Vec<WaitingJob>, SlurmError> {
        let jobs = self.jobs()?.into_iter();
        let inside = |j: &JobInfo| j.partition.split(',').any(|p| partitions.iter().any(|q| q == p));
        Ok(jobs
            .filter(|j| j.job_state == "PENDING" && inside(j))
            .map(|j| WaitingJob { job_id: j.job_id, user_id: j.user_id, qos: j.qos, reason: j.state_reason })
            .collect())
    }
    /// The jobs of every user that started on any node of `nodes` (a host
    /// list) and that slurmctld still holds: running, or ended within
    /// `MinJobAge`, with their submission and start times (Unix seconds):
    /// who took a reclaimed replica's GPUs (issue #26). Ended ones count
    /// too: a taker that ran for less than a poll is still the taker
    /// (issue #35: records, not moments).
    fn started_on(&self, nodes: &str) -> Result<Vec<JobInfo>, SlurmError> {
        let wanted = onepool_decisions::hostlist::expand(nodes).unwrap_or_default();
        let on = |j: &JobInfo| {
            onepool_decisions::hostlist::expand(&j.nodes).unwrap_or_default().iter().any(|n| wanted.contains(n))
        };
        Ok(self.jobs()?.into_iter().filter(|j| j.job_state != "PENDING" && j.start_time > 0 && on(j)).collect())
    }
}

/// Slurm through its command-line tools.
pub struct Commands<R: Runner> {
    pub runner: R,
}

impl<R: Runner> Slurm for Commands<R> {
    fn submit(&self, args: &[&str]) -> Result<u32, SlurmError> {
        let mut argv = vec!["sbatch", "--parsable"];
        argv.extend_from_slice(args);
        let out = self.runner.run(&argv)?;
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        out.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| SlurmError::NoJobId { cmd: argv.join(" "), output: out.trim().to_string() })
    }

    fn cancel(&self, job: u32, signal: Option<&str>) -> Result<(), SlurmError> {
        let sig = signal.map(|s| format!("--signal={s}"));
        let id = job.to_string();
        let mut argv = vec!["scancel"];
        argv.extend(sig.as_deref());
        argv.push(&id);
        self.runner.run(&argv)?;
        Ok(())
    }

    fn update_job(&self, job: u32, settings: &[(&str, &str)]) -> Result<(), SlurmError> {
        let pairs: Vec<String> =
            std::iter::once(format!("JobId={job}")).chain(settings.iter().map(|(k, v)| format!("{k}={v}"))).collect();
        let mut argv = vec!["scontrol", "update"];
        argv.extend(pairs.iter().map(String::as_str));
        self.runner.run(&argv)?;
        Ok(())
    }

    /// Every job slurmctld holds, ended ones too (until MinJobAge): what
    /// 22.05's `squeue --json` prints whatever the filters; 24.11's keeps
    /// to pending and running jobs unless asked for all states (measured).
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(parse_jobs(&self.runner.run(&["squeue", "--json", "--states=all"])?)?)
    }

    fn user_jobs(&self, user: u32) -> Result<Vec<JobInfo>, SlurmError> {
        let user = user.to_string();
        let argv = ["env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-u", &user, "-O", USER_JOB_FIELDS];
        Ok(parse_user_jobs(&self.runner.run(&argv)?)?)
    }

    fn job_details(&self, job: u32) -> Result<Option<JobDetails>, SlurmError> {
        let id = job.to_string();
        // Times as Unix seconds: PreemptTime, StartTime and EndTime are
        // what onepoold learns a replica's end from.
        match self.runner.run(&["env", "SLURM_TIME_FORMAT=%s", "scontrol", "-o", "show", "job", &id]) {
            Ok(out) => Ok(parse_job_details(&out)),
            // It ended and left slurmctld's table since it was listed.
            Err(CommandError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `scontrol --json show nodes` (23.02 and later: one entry per node,
    /// where their `sinfo --json` groups nodes), else 22.05's `sinfo
    /// --json`, which has the per-node shape.
    fn nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        match self.runner.run(&["scontrol", "--json", "show", "nodes"]) {
            Ok(out) => Ok(parse_nodes(&out)?),
            Err(CommandError::Failed { stderr, .. }) if stderr.contains("unrecognized option") => {
                Ok(parse_nodes(&self.runner.run(&["sinfo", "--json"])?)?)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn steps(&self, user: u32) -> Result<Vec<StepInfo>, SlurmError> {
        let user = user.to_string();
        Ok(parse_steps(&self.runner.run(&["squeue", "-h", "--steps", "-u", &user, "-o", STEP_FORMAT])?)?)
    }

    fn started_on(&self, nodes: &str) -> Result<Vec<JobInfo>, SlurmError> {
        let argv = ["env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-t", "all", "-w", nodes, "-O", STARTED_ON_FIELDS];
        Ok(parse_started_on(&self.runner.run(&argv)?)?)
    }
    fn waiting(&self, partitions: &[String]) -> Result<Vec<WaitingJob>, SlurmError> {
        let parts = partitions.join(",");
        Ok(parse_waiting(&self.runner.run(&["squeue", "-h", "-t", "PD", "-p", &parts, "-O", WAITING_FIELDS])?)?)
    }
}

/// One user's jobs and steps read once for every caller that asks within
/// `max_age` of the last read: onepoold's replica controllers, one per
/// endpoint, poll on the same beat, and each read costs slurmctld its
/// whole job table (`bench/poll.sh`). A caller waits while another reads
/// and then shares its answer. Every write (submit, cancel, update) makes
/// the next read a fresh one, so a caller always sees its own changes.
pub struct Coalesced<S> {
    pub inner: S,
    pub max_age: Duration,
    jobs: Mutex<Option<Read<JobInfo>>>,
    steps: Mutex<Option<Read<StepInfo>>>,
    waiting: Mutex<Option<Read<WaitingJob>>>,
}

struct Read<T> {
    at: Instant,
    user: u32,
    items: Vec<T>,
}

impl<S: Slurm> Coalesced<S> {
    pub fn new(inner: S, max_age: Duration) -> Coalesced<S> {
        Coalesced { inner, max_age, jobs: Mutex::new(None), steps: Mutex::new(None), waiting: Mutex::new(None) }
    }

    fn forget(&self) {
        *lock(&self.jobs) = None;
        *lock(&self.steps) = None;
        *lock(&self.waiting) = None;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A reader that panicked left at worst no answer or a whole one.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared<T: Clone>(
    slot: &Mutex<Option<Read<T>>>,
    max_age: Duration,
    user: u32,
    read: impl FnOnce() -> Result<Vec<T>, SlurmError>,
) -> Result<Vec<T>, SlurmError> {
    // Held while reading: whoever comes meanwhile gets this answer.
    let mut last = lock(slot);
    if let Some(r) = last.as_ref().filter(|r| r.user == user && r.at.elapsed() <= max_age) {
        return Ok(r.items.clone());
    }
    let items = read()?;
    *last = Some(Read { at: Instant::now(), user, items: items.clone() });
    Ok(items)
}

impl<S: Slurm> Slurm for Coalesced<S> {
    fn submit(&self, args: &[&str]) -> Result<u32, SlurmError> {
        let r = self.inner.submit(args);
        self.forget();
        r
    }
    fn cancel(&self, job: u32, signal: Option<&str>) -> Result<(), SlurmError> {
        let r = self.inner.cancel(job, signal);
        self.forget();
        r
    }
    fn update_job(&self, job: u32, settings: &[(&str, &str)]) -> Result<(), SlurmError> {
        let r = self.inner.update_job(job, settings);
        self.forget();
        r
    }
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
        self.inner.jobs()
    }
    fn user_jobs(&self, user: u32) -> Result<Vec<JobInfo>, SlurmError> {
        shared(&self.jobs, self.max_age, user, || self.inner.user_jobs(user))
    }
    fn admin_comment(&self, job: u32) -> Result<Option<String>, SlurmError> {
        self.inner.admin_comment(job)
    }
    fn job_details(&self, job: u32) -> Result<Option<JobDetails>, SlurmError> {
        self.inner.job_details(job)
    }
    fn nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        self.inner.nodes()
    }
    fn steps(&self, user: u32) -> Result<Vec<StepInfo>, SlurmError> {
        shared(&self.steps, self.max_age, user, || self.inner.steps(user))
    }
    fn started_on(&self, nodes: &str) -> Result<Vec<JobInfo>, SlurmError> {
        self.inner.started_on(nodes)
    }
    /// Every endpoint asks about the same pool's partitions.
    fn waiting(&self, partitions: &[String]) -> Result<Vec<WaitingJob>, SlurmError> {
        shared(&self.waiting, self.max_age, 0, || self.inner.waiting(partitions))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    type Answer = Box<dyn Fn(&str) -> Result<String, CommandError>>;

    /// Records the commands and answers from a script.
    struct Script {
        seen: RefCell<Vec<String>>,
        answer: Answer,
    }

    impl Runner for Script {
        fn run(&self, argv: &[&str]) -> Result<String, CommandError> {
            let cmd = argv.join(" ");
            self.seen.borrow_mut().push(cmd.clone());
            (self.answer)(&cmd)
        }
    }

    fn slurm(answer: impl Fn(&str) -> Result<String, CommandError> + 'static) -> Commands<Script> {
        Commands { runner: Script { seen: RefCell::new(Vec::new()), answer: Box::new(answer) } }
    }

    #[test]
    fn commands_and_their_parsing() {
        let s = slurm(|cmd| {
            Ok(match cmd {
                c if c.starts_with("sbatch") => "4242;cluster\n".into(),
                _ => String::new(),
            })
        });
        assert_eq!(s.submit(&["--qos=op-inference", "replica.sh"]).unwrap(), 4242);
        s.cancel(4242, Some("USR1")).unwrap();
        s.update_job(4242, &[("NodeList", "node[1-2]")]).unwrap();
        assert!(s.steps(0).unwrap().is_empty());
        assert!(s.waiting(&["gpu".into(), "gpu-flex".into()]).unwrap().is_empty());
        assert_eq!(
            *s.runner.seen.borrow(),
            [
                "sbatch --parsable --qos=op-inference replica.sh",
                "scancel --signal=USR1 4242",
                "scontrol update JobId=4242 NodeList=node[1-2]",
                "squeue -h --steps -u 0 -o %i|%j|%N",
                "squeue -h -t PD -p gpu,gpu-flex -O JobID:|,UserID:|,QOS:|,Reason:|"
            ]
        );
    }

    #[test]
    fn reads_within_max_age_are_shared_and_writes_make_the_next_one_fresh() {
        let squeue = |cmd: &str| cmd.contains("squeue");
        let s = Coalesced::new(slurm(|_| Ok(String::new())), Duration::from_secs(3600));
        let reads = |s: &Coalesced<Commands<Script>>| s.inner.runner.seen.borrow().iter().filter(|c| squeue(c)).count();
        s.user_jobs(0).unwrap();
        s.user_jobs(0).unwrap();
        s.steps(0).unwrap();
        s.steps(0).unwrap();
        assert_eq!(reads(&s), 2, "one jobs read and one steps read for two callers each");
        s.user_jobs(1).unwrap();
        assert_eq!(reads(&s), 3, "another user's jobs are read anew");
        s.cancel(7, None).unwrap();
        s.user_jobs(1).unwrap();
        s.steps(0).unwrap();
        assert_eq!(reads(&s), 5, "a write makes the next reads fresh");
        let s = Coalesced::new(slurm(|_| Ok(String::new())), Duration::ZERO);
        s.user_jobs(0).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        s.user_jobs(0).unwrap();
        assert_eq!(reads(&s), 2, "older than max_age: read again");
        // A failed read is not kept: the next caller tries again.
        let s = Coalesced::new(
            slurm(|_| Err(CommandError::Timeout { cmd: "squeue".into(), timeout: Duration::ZERO })),
            Duration::from_secs(3600),
        );
        assert!(s.user_jobs(0).is_err() && s.user_jobs(0).is_err());
        assert_eq!(reads(&s), 2);
    }

    /// 22.05's scontrol has no --json: its sinfo --json lists nodes.
    #[test]
    fn nodes_come_from_scontrol_json_else_from_sinfo_json() {
        let fixture_22 = include_str!("../tests/fixtures/sinfo-22.05.json");
        let s = slurm(move |cmd| match cmd {
            c if c.starts_with("scontrol --json") => Err(CommandError::Failed {
                cmd: c.into(),
                status: "exit status: 1".into(),
                stdout: String::new(),
                stderr: "scontrol: unrecognized option '--json'".into(),
            }),
            _ => Ok(fixture_22.to_string()),
        });
        assert_eq!(s.nodes().unwrap().len(), 4);
        assert_eq!(*s.runner.seen.borrow(), ["scontrol --json show nodes", "sinfo --json"]);
        let s = slurm(|_| Ok(include_str!("../tests/fixtures/nodes-24.11.json").to_string()));
        assert_eq!(s.nodes().unwrap().len(), 4);
        assert_eq!(*s.runner.seen.borrow(), ["scontrol --json show nodes"]);
    }

    #[test]
    fn failures_say_whether_to_retry() {
        let s = slurm(|cmd| {
            Err(CommandError::Failed {
                cmd: cmd.into(),
                status: "exit status: 1".into(),
                stdout: String::new(),
                stderr: if cmd.starts_with("squeue") {
                    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)".into()
                } else {
                    "Invalid job id specified".into()
                },
            })
        });
        assert!(s.jobs().unwrap_err().is_retryable());
        assert!(!s.cancel(1, None).unwrap_err().is_retryable());
        let s = slurm(|_| Ok("Submitted batch job 7\n".into()));
        let e = s.submit(&["x.sh"]).unwrap_err();
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("not a job id"), "{e}");
    }
}
