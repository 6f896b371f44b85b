//! The GPU hand-off decision: when a job's GPUs change hands, who may still
//! hold them and what to do about it. The SPANK plugin gathers the facts
//! (processes on the job's GPUs, their uids and start times, the job each
//! is *proven* to belong to, see [`crate::ownership`]) and acts; the rules
//! live here so they are tested once and the same everywhere.
//!
//! A process is killed only when it is proven to belong to a job that has
//! left this node, and is neither pid 1 nor a process any of whose uids is
//! root's or a system user's. Everything else holding the GPU is a
//! *refused* holder: the node is drained with a reason naming the GPU, the
//! holder and why it was not killed, and the check fails.
//!
//! - **Epilog** (the departing job): processes proven to be the job's own
//!   (CUDA contexts linger after SIGKILL; a daemonized child escapes the
//!   step but stays in the job's cgroup) are killed.
//! - **Prolog** (the incoming job): processes proven to be of jobs no longer
//!   running on this node are killed.

use std::fmt;

use crate::hostlist::{self, RangeRules};
use crate::ownership::{Proof, Uids};

/// One process found on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Device minor number (`/dev/nvidiaN`).
    pub minor: u32,
    pub pid: u32,
    /// Its uids, if `/proc` could say.
    pub uids: Option<Uids>,
    /// Its start time (`/proc/PID/stat` field 22), if `/proc` could say: the
    /// kill re-checks it so that a pid reused since is never hit.
    pub start_time: Option<u64>,
    /// The Slurm job it is proven to belong to, if any.
    pub proof: Option<Proof>,
    /// Its command name, for messages.
    pub command: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/dev/nvidia{} held by pid {} ({}", self.minor, self.pid, self.command)?;
        if let Some(u) = self.uids {
            write!(f, ", uid {}", u.real)?;
        }
        f.write_str(")")?;
        match &self.proof {
            Some(p) => write!(f, " of job {}", p.job()),
            None => f.write_str(", no Slurm job proven"),
        }
    }
}

/// The rules' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillRules {
    /// Processes with any uid below this are system users' (and root's):
    /// never killed. Default: `/etc/login.defs`, see
    /// [`crate::ownership::login_defs_min_uid`].
    pub min_uid: u32,
}

/// `nobody` (the kernel's overflow uid) runs system daemons too.
const OVERFLOW_UID: u32 = 65534;

/// Why a holder is not killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No proof it belongs to any Slurm job.
    NotProven,
    /// Epilog: proven to be of another job than the departing one.
    OtherJob,
    /// Prolog: its job still runs on this node.
    StillRunning,
    /// Epilog: not run by the departing job's user.
    NotJobUser { job_uid: u32 },
    /// pid 1 is never killed.
    Init,
    /// Its uid or start time could not be read.
    Unidentified,
    /// One of its uids is root's or a system user's.
    SystemUser { uid: u32 },
    /// It could not be killed safely: no pidfd on this kernel.
    NoPidfd,
}

/// A holder onepool will not kill, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub holder: Holder,
    pub why: Refusal,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.holder)?;
        match self.why {
            Refusal::NotProven | Refusal::OtherJob => Ok(()),
            Refusal::StillRunning => f.write_str(", still running here"),
            Refusal::NotJobUser { job_uid } => write!(f, ", not the job's user {job_uid}"),
            Refusal::Init => f.write_str(", pid 1 is never killed"),
            Refusal::Unidentified => f.write_str(", its uid or start time is unreadable"),
            Refusal::SystemUser { uid } => write!(f, ", uid {uid} is a system user's: never killed"),
            Refusal::NoPidfd => f.write_str(", not killed: no pidfd_open on this kernel"),
        }
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Processes to kill: proven to belong to the departing job, or to a job
    /// that no longer runs here, and killable by the rules.
    pub kill: Vec<Holder>,
    /// Holders onepool must not kill: the GPU cannot be handed over.
    pub refused: Vec<Refused>,
}

impl Plan {
    pub fn is_clean(&self) -> bool {
        self.kill.is_empty() && self.refused.is_empty()
    }

    /// The node's drain reason: short (Slurm shows it in `sinfo -R`) and
    /// naming the GPU, the holder and why it was not killed.
    pub fn drain_reason(&self, job: u32) -> Option<String> {
        let first = match (self.refused.first(), self.kill.first()) {
            (Some(r), _) => r.to_string(),
            (None, Some(h)) => h.to_string(),
            (None, None) => return None,
        };
        let more = self.refused.len() + self.kill.len() - 1;
        let extra = if more > 0 { format!(" (+{more} more)") } else { String::new() };
        Some(format!("onepool: after job {job}: {first}{extra}"))
    }

    fn sort(&mut self, h: &Holder, verdict: Result<(), Refusal>) {
        match verdict {
            Ok(()) => self.kill.push(h.clone()),
            Err(why) => self.refused.push(Refused { holder: h.clone(), why }),
        }
    }
}

/// What is left to check once the holder's job is proven to be one that may
/// be cleaned up: the process itself must be killable.
pub fn killable(h: &Holder, rules: &KillRules) -> Result<(), Refusal> {
    if h.pid <= 1 {
        return Err(Refusal::Init);
    }
    let (Some(uids), Some(_)) = (h.uids, h.start_time) else { return Err(Refusal::Unidentified) };
    let lowest = uids.lowest();
    // Root is never killed, whatever bound the site configured.
    if lowest < rules.min_uid.max(1) || [uids.real, uids.effective, uids.saved, uids.fs].contains(&OVERFLOW_UID) {
        let uid = if lowest < rules.min_uid.max(1) { lowest } else { OVERFLOW_UID };
        return Err(Refusal::SystemUser { uid });
    }
    Ok(())
}

/// Only holders of the job's own GPUs matter.
fn on_gpus<'a>(holders: &'a [Holder], gpus: &'a [u32]) -> impl Iterator<Item = &'a Holder> {
    holders.iter().filter(move |h| gpus.contains(&h.minor))
}

/// The departing job `job`, run by `job_uid` (if known), leaves `gpus`.
pub fn epilog(job: u32, job_uid: Option<u32>, gpus: &[u32], holders: &[Holder], rules: &KillRules) -> Plan {
    let mut plan = Plan::default();
    for h in on_gpus(holders, gpus) {
        let verdict = if h.pid <= 1 {
            Err(Refusal::Init)
        } else {
            match &h.proof {
                None => Err(Refusal::NotProven),
                Some(p) if p.job() != job => Err(Refusal::OtherJob),
                Some(_) => killable(h, rules).and(match (job_uid, h.uids) {
                    (Some(want), Some(u)) if u.real != want => Err(Refusal::NotJobUser { job_uid: want }),
                    _ => Ok(()),
                }),
            }
        };
        plan.sort(h, verdict);
    }
    plan
}

/// The incoming job gets `gpus`; `running_here` are the jobs with steps on
/// this node (the incoming job among them).
pub fn prolog(gpus: &[u32], holders: &[Holder], running_here: &[u32], rules: &KillRules) -> Plan {
    let mut plan = Plan::default();
    for h in on_gpus(holders, gpus) {
        let verdict = if h.pid <= 1 {
            Err(Refusal::Init)
        } else {
            match &h.proof {
                None => Err(Refusal::NotProven),
                Some(p) if running_here.contains(&p.job()) => Err(Refusal::StillRunning),
                Some(_) => killable(h, rules),
            }
        };
        plan.sort(h, verdict);
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
/// GRES indices, not device minors. Spaces around items and empty items
/// are ignored; a range holds at most 4097 indices.
pub fn parse_index_list(s: &str) -> Result<Vec<u32>, String> {
    const RULES: RangeRules = RangeRules { max: u32::MAX as u64, max_len: 4097, lenient: true };
    let ranges =
        hostlist::ranges(s, RULES).map_err(|e| format!("{s:?} is not a GPU index list (expected e.g. 0,2-3): {e}"))?;
    // Every number is at most u32::MAX (RULES.max).
    Ok(ranges.iter().flat_map(|r| r.numbers()).map(|n| n as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: KillRules = KillRules { min_uid: 1000 };
    const USER: u32 = 1000;

    fn cgroup(job: u32) -> Option<Proof> {
        Some(Proof::Cgroup { job, path: format!("/system.slice/slurmstepd.scope/job_{job}/step_0") })
    }

    fn h(minor: u32, pid: u32, proof: Option<Proof>) -> Holder {
        Holder { minor, pid, uids: Some(Uids::all(USER)), start_time: Some(500), proof, command: "python".into() }
    }

    fn refused(holder: Holder, why: Refusal) -> Refused {
        Refused { holder, why }
    }

    #[test]
    fn epilog_kills_its_own_proven_stragglers_and_refuses_the_rest() {
        let holders = [h(4, 10, cgroup(7)), h(5, 11, cgroup(8)), h(6, 12, None), h(9, 13, cgroup(7))];
        let plan = epilog(7, Some(USER), &[4, 5, 6], &holders, &RULES);
        assert_eq!(plan.kill, vec![h(4, 10, cgroup(7))]);
        assert_eq!(
            plan.refused,
            vec![refused(h(5, 11, cgroup(8)), Refusal::OtherJob), refused(h(6, 12, None), Refusal::NotProven)]
        );
        assert_eq!(
            plan.drain_reason(7).unwrap(),
            "onepool: after job 7: /dev/nvidia5 held by pid 11 (python, uid 1000) of job 8 (+2 more)"
        );
        assert!(epilog(7, None, &[4], &[h(9, 13, cgroup(7))], &RULES).is_clean(), "other GPUs do not matter");
    }

    #[test]
    fn prolog_kills_proven_leftovers_of_finished_jobs_only() {
        let holders = [h(0, 10, cgroup(3)), h(1, 11, cgroup(4)), h(2, 12, None)];
        let plan = prolog(&[0, 1, 2], &holders, &[4, 5], &RULES);
        assert_eq!(plan.kill, vec![h(0, 10, cgroup(3))]);
        assert_eq!(
            plan.refused,
            vec![refused(h(1, 11, cgroup(4)), Refusal::StillRunning), refused(h(2, 12, None), Refusal::NotProven)]
        );
        assert_eq!(
            plan.refused[0].to_string(),
            "/dev/nvidia1 held by pid 11 (python, uid 1000) of job 4, still running here"
        );
        assert_eq!(plan.refused[1].to_string(), "/dev/nvidia2 held by pid 12 (python, uid 1000), no Slurm job proven");
    }

    #[test]
    fn pid_1_is_never_killed_even_when_proven() {
        let init = h(0, 1, cgroup(3));
        assert_eq!(
            prolog(&[0], std::slice::from_ref(&init), &[], &RULES).refused,
            vec![refused(init.clone(), Refusal::Init)]
        );
        assert_eq!(
            epilog(3, None, &[0], std::slice::from_ref(&init), &RULES).refused,
            vec![refused(init, Refusal::Init)]
        );
        let zero = h(0, 0, cgroup(3));
        assert_eq!(killable(&zero, &RULES), Err(Refusal::Init));
    }

    #[test]
    fn root_and_system_users_are_never_killed() {
        let with = |uids: Uids| Holder { uids: Some(uids), ..h(0, 10, cgroup(3)) };
        let check = |uids: Uids, rules: &KillRules| killable(&with(uids), rules);
        assert_eq!(check(Uids::all(0), &RULES), Err(Refusal::SystemUser { uid: 0 }));
        assert_eq!(check(Uids::all(999), &RULES), Err(Refusal::SystemUser { uid: 999 }));
        assert_eq!(check(Uids::all(65534), &RULES), Err(Refusal::SystemUser { uid: 65534 }));
        // A setuid-root program run by a user is root's.
        assert_eq!(check(Uids { effective: 0, ..Uids::all(USER) }, &RULES), Err(Refusal::SystemUser { uid: 0 }));
        assert_eq!(check(Uids { saved: 0, ..Uids::all(USER) }, &RULES), Err(Refusal::SystemUser { uid: 0 }));
        assert_eq!(check(Uids::all(USER), &RULES), Ok(()));
        // A site bound; root stays protected even with a bound of 0.
        assert_eq!(check(Uids::all(1500), &KillRules { min_uid: 2000 }), Err(Refusal::SystemUser { uid: 1500 }));
        assert_eq!(check(Uids::all(0), &KillRules { min_uid: 0 }), Err(Refusal::SystemUser { uid: 0 }));
        assert_eq!(check(Uids::all(5), &KillRules { min_uid: 0 }), Ok(()));
        let plan = prolog(&[0], &[with(Uids::all(0))], &[], &RULES);
        assert_eq!(
            plan.drain_reason(9).unwrap(),
            "onepool: after job 9: /dev/nvidia0 held by pid 10 (python, uid 0) of job 3, uid 0 is a system user's: \
             never killed"
        );
    }

    #[test]
    fn an_unidentified_process_is_not_killed() {
        let no_uid = Holder { uids: None, ..h(0, 10, cgroup(3)) };
        let no_start = Holder { start_time: None, ..h(0, 10, cgroup(3)) };
        assert_eq!(killable(&no_uid, &RULES), Err(Refusal::Unidentified));
        assert_eq!(killable(&no_start, &RULES), Err(Refusal::Unidentified));
        assert_eq!(no_uid.to_string(), "/dev/nvidia0 held by pid 10 (python) of job 3");
    }

    #[test]
    fn epilog_kills_only_the_job_users_processes() {
        let other = Holder { uids: Some(Uids::all(1001)), ..h(0, 10, cgroup(3)) };
        let plan = epilog(3, Some(USER), &[0], std::slice::from_ref(&other), &RULES);
        assert_eq!(plan.refused, vec![refused(other.clone(), Refusal::NotJobUser { job_uid: USER })]);
        assert_eq!(epilog(3, None, &[0], std::slice::from_ref(&other), &RULES).kill, vec![other]);
    }

    #[test]
    fn a_stepd_proof_names_the_job_like_a_cgroup_proof() {
        let by_stepd = h(0, 10, Some(Proof::Slurmstepd { job: 3, pid: 9 }));
        assert_eq!(epilog(3, Some(USER), &[0], std::slice::from_ref(&by_stepd), &RULES).kill, vec![by_stepd.clone()]);
        assert_eq!(by_stepd.to_string(), "/dev/nvidia0 held by pid 10 (python, uid 1000) of job 3");
        let r = refused(by_stepd, Refusal::NoPidfd);
        assert!(r.to_string().ends_with(", not killed: no pidfd_open on this kernel"), "{r}");
    }

    #[test]
    fn index_lists() {
        assert_eq!(parse_index_list("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_index_list("").unwrap(), Vec::<u32>::new());
        assert!(parse_index_list("a").unwrap_err().contains("not a GPU index list"));
        assert!(parse_index_list("3-1").is_err());
        assert_eq!(parse_index_list(" 1 , 4-5,").unwrap(), vec![1, 4, 5]);
        assert_eq!(
            parse_index_list("0,3-1").unwrap_err(),
            "\"0,3-1\" is not a GPU index list (expected e.g. 0,2-3): range `3-1` runs backwards: write the lower \
             number first"
        );
        assert_eq!(parse_index_list("0-4096").unwrap().len(), 4097);
        assert!(parse_index_list("0-4097").unwrap_err().contains("holds 4098 numbers, more than the 4097 allowed"));
        assert!(parse_index_list("4294967296").unwrap_err().contains("is above 4294967295"));
    }
}
