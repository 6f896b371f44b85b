//! Which Slurm job a process provably belongs to, from what the kernel says
//! about it (`/proc/PID/stat`, `status`, `cgroup`, and its ancestors' `exe`
//! and `cmdline`). The GPU hand-off check kills a process only on such
//! proof, so everything a user controls is ignored: the environment
//! (anyone can set `SLURM_JOB_ID`), the process's own command line and
//! name. What a user cannot forge:
//!
//! - **the job's cgroup**: Slurm's cgroup plugins put every task in
//!   `/slurm/uid_U/job_J/...` (cgroup v1) or
//!   `/system.slice/slurmstepd.scope/job_J/...` (cgroup v2), trees only root
//!   creates and moves processes into; membership survives the step's end,
//!   so a straggler of a departed job still names it;
//! - **ancestry**: a job's tasks are children of root's `slurmstepd`, whose
//!   title is `slurmstepd: [J.S]`; a user cannot make a process a child of a
//!   root process, nor change a root process's title. This is the only
//!   proof under `proctrack/linuxproc` without cgroups, and it lasts only
//!   while the step's slurmstepd runs.
//!
//! The parsers take the texts as read; the caller does the reading.

use std::fmt;

/// A process's identity and parent, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    /// Field 22, clock ticks after boot: with the pid, names one process
    /// for the life of the system (a reused pid gets a later start time).
    pub start_time: u64,
    pub state: char,
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in
/// parentheses and may itself contain spaces and `)`, so fields are counted
/// from the last `)`.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Real, effective, saved and filesystem uid (`/proc/PID/status`, `Uid:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
    pub fs: u32,
}

impl Uids {
    /// The same uid in all four slots.
    pub fn all(uid: u32) -> Uids {
        Uids { real: uid, effective: uid, saved: uid, fs: uid }
    }

    /// A process may regain any of its uids (saved set-user-ID), so it is
    /// as privileged as the lowest one.
    pub fn lowest(&self) -> u32 {
        self.real.min(self.effective).min(self.saved).min(self.fs)
    }

    fn only(&self, allowed: &[u32]) -> bool {
        [self.real, self.effective, self.saved, self.fs].iter().all(|u| allowed.contains(u))
    }
}

pub fn parse_status_uids(status: &str) -> Option<Uids> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let ids: Vec<u32> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    match ids[..] {
        [real, effective, saved, fs] => Some(Uids { real, effective, saved, fs }),
        _ => None,
    }
}

/// What a process's `/proc/PID/cgroup` says about its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupJob {
    /// In no Slurm job cgroup (e.g. `proctrack/linuxproc`, or not a job).
    None,
    /// In job `job`'s cgroup; cgroup v1 also names the job's user.
    Job { job: u32, uid: Option<u32>, path: String },
    /// Hierarchies name different jobs: proves nothing.
    Conflict,
}

/// The job named by a cgroup path, anchored at the root of the hierarchy
/// so that a user's own delegated subtree (cgroup v2 under `user.slice`)
/// cannot imitate it by nesting a `slurmstepd.scope/job_J` of its own.
/// `v1` selects the layout: `/slurm[_NODE]/uid_U/job_J[/...]` for a v1
/// hierarchy, `/system.slice/[NODE_]slurmstepd.scope/job_J[/...]` for the
/// unified one.
fn job_of_path(path: &str, node: &str, v1: bool) -> Option<(u32, Option<u32>)> {
    let mut parts = path.strip_prefix('/')?.split('/');
    let job = |c: Option<&str>| -> Option<u32> { number(c?.strip_prefix("job_")?) };
    if v1 {
        let root = parts.next()?;
        if root != "slurm" && root.strip_prefix("slurm_") != Some(node) {
            return None;
        }
        let uid = number(parts.next()?.strip_prefix("uid_")?)?;
        Some((job(parts.next())?, Some(uid)))
    } else {
        if parts.next()? != "system.slice" {
            return None;
        }
        let scope = parts.next()?;
        if scope != "slurmstepd.scope" && scope.strip_suffix("_slurmstepd.scope") != Some(node) {
            return None;
        }
        Some((job(parts.next())?, None))
    }
}

/// A decimal number as the kernel and Slurm write them: digits only, so
/// `+1`, ` 1` and the empty string are not numbers here.
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Reads `/proc/PID/cgroup` (`ID:CONTROLLERS:PATH` lines; `0::PATH` is the
/// unified hierarchy). `node` is this node's name, for the layouts of
/// slurmd built with multiple-slurmd support.
pub fn cgroup_job(cgroup: &str, node: &str) -> CgroupJob {
    let mut found: Option<(u32, Option<u32>, String)> = None;
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let v1 = !(id == "0" && controllers.is_empty());
        let Some((job, uid)) = job_of_path(path, node, v1) else { continue };
        match &found {
            None => found = Some((job, uid, path.to_string())),
            Some((j, u, _)) if *j == job && (u.is_none() || uid.is_none() || *u == uid) => {}
            Some(_) => return CgroupJob::Conflict,
        }
    }
    match found {
        Some((job, uid, path)) => CgroupJob::Job { job, uid, path },
        None => CgroupJob::None,
    }
}

/// The job of a `slurmstepd` title, `slurmstepd: [J.S]` (S a step number,
/// `batch`, `extern`, `interactive`, possibly `+C` for a heterogeneous
/// component). Other titles (`slurmstepd: spank prolog`) name no job.
pub fn stepd_title_job(cmdline: &[u8]) -> Option<u32> {
    let first = cmdline.split(|b| *b == 0).next()?;
    let title = std::str::from_utf8(first).ok()?.trim_end();
    let inner = title.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
    let (job, step) = inner.split_once('.')?;
    let step_ok = !step.is_empty() && step.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'+');
    step_ok.then(|| number(job)).flatten()
}

/// What is read about one process on the way up its ancestry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFacts {
    pub pid: u32,
    pub stat: Stat,
    pub uids: Uids,
    /// `readlink /proc/PID/exe`.
    pub exe: Option<String>,
    /// `/proc/PID/cmdline`; callers may leave it empty for processes that
    /// are not [`is_slurmstepd`], whose titles prove nothing.
    pub cmdline: Vec<u8>,
}

/// Whether `p` is a genuine slurmstepd: run by root or by slurmd's own user
/// (`stepd_uid`) in every uid slot, from a binary named `slurmstepd` (still
/// so when an upgrade replaced it on disk), or `slurmstepd-wlm`: Debian's
/// packages install it so, behind the `/usr/sbin/slurmstepd` alternative,
/// and `/proc/PID/exe` names the file itself. (Measured on 22.05, 24.11
/// and 26.05 when the cgroup mode first exercised the hand-off check's
/// proofs: without that name no slurmstepd was recognised, and a prolog
/// took a running job's process for a departed job's.) A user's process
/// may call itself slurmstepd, but cannot run as root.
pub fn is_slurmstepd(p: &ProcFacts, stepd_uid: u32) -> bool {
    let Some(exe) = p.exe.as_deref() else { return false };
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(exe);
    p.uids.only(&[0, stepd_uid]) && matches!(exe.rsplit('/').next(), Some("slurmstepd" | "slurmstepd-wlm"))
}

/// The job of a genuine slurmstepd running a job step (`slurmstepd: [J.S]`).
/// The title is trusted only because the process is root's.
pub fn stepd_job(p: &ProcFacts, stepd_uid: u32) -> Option<u32> {
    is_slurmstepd(p, stepd_uid).then(|| stepd_title_job(&p.cmdline)).flatten()
}

/// Ancestors further up than this are not walked: job tasks are children or
/// near descendants of their slurmstepd, and a longer chain is not followed
/// without bound.
pub const MAX_ANCESTRY: usize = 64;

/// Walks `/proc` parents from `process` to the nearest genuine slurmstepd
/// and returns its job and pid. Stops, proving nothing, at pid 1 (an
/// orphan was reparented away from its step), at a process that cannot be
/// read, at a parent that started after its child (the parent's pid was
/// reused while the walk ran), at a slurmstepd that runs no job step, or
/// after [`MAX_ANCESTRY`] parents.
pub fn prove_by_ancestry(
    process: &ProcFacts,
    stepd_uid: u32,
    mut lookup: impl FnMut(u32) -> Option<ProcFacts>,
) -> Option<(u32, u32)> {
    let mut child = process.stat;
    for _ in 0..MAX_ANCESTRY {
        if child.ppid <= 1 {
            return None;
        }
        let parent = lookup(child.ppid)?;
        if parent.stat.start_time > child.start_time {
            return None;
        }
        if is_slurmstepd(&parent, stepd_uid) {
            // The nearest slurmstepd decides: one that runs no step (the
            // job-script context) proves no job.
            return stepd_title_job(&parent.cmdline).map(|job| (job, parent.pid));
        }
        child = parent.stat;
    }
    None
}

/// How a process was proven to belong to a job; shown as what proved it
/// (`its cgroup PATH`), the job being the holder's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    Cgroup { job: u32, path: String },
    Slurmstepd { job: u32, pid: u32 },
}

impl Proof {
    pub fn job(&self) -> u32 {
        match self {
            Proof::Cgroup { job, .. } | Proof::Slurmstepd { job, .. } => *job,
        }
    }
}

impl fmt::Display for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proof::Cgroup { path, .. } => write!(f, "its cgroup {path}"),
            Proof::Slurmstepd { pid, .. } => write!(f, "its ancestor slurmstepd, pid {pid}"),
        }
    }
}

/// Puts the two kinds of evidence together. Either proves the job alone;
/// if both name a job they must agree, and a cgroup v1 path's `uid_U` must
/// be the process's real uid, or nothing is proven.
pub fn prove(cgroup: &CgroupJob, ancestry: Option<(u32, u32)>, uids: Uids) -> Option<Proof> {
    let by_cgroup = match cgroup {
        CgroupJob::Conflict => return None,
        CgroupJob::None => None,
        CgroupJob::Job { uid: Some(u), .. } if *u != uids.real => return None,
        CgroupJob::Job { job, path, .. } => Some(Proof::Cgroup { job: *job, path: path.clone() }),
    };
    let by_stepd = ancestry.map(|(job, pid)| Proof::Slurmstepd { job, pid });
    match (by_cgroup, by_stepd) {
        (Some(c), Some(s)) if c.job() != s.job() => None,
        (Some(c), _) => Some(c),
        (None, s) => s,
    }
}

/// The lowest uid of a regular user, from `/etc/login.defs`: one above
/// `SYS_UID_MAX`, else `UID_MIN`, else 1000 (the common default of both).
pub fn login_defs_min_uid(login_defs: &str) -> u32 {
    let value = |key: &str| {
        login_defs.lines().find_map(|l| {
            let mut w = l.split('#').next()?.split_whitespace();
            (w.next()? == key).then(|| w.next()?.parse::<u32>().ok()).flatten()
        })
    };
    value("SYS_UID_MAX").and_then(|m| m.checked_add(1)).or_else(|| value("UID_MIN")).unwrap_or(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A stat line as the kernel writes it: `ppid` in field 4, start time in
    /// field 22.
    fn stat_line(pid: u32, comm: &str, ppid: u32, start: u64) -> String {
        format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0")
    }

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let s = parse_stat(&stat_line(42, "sleep", 7, 123456)).unwrap();
        assert_eq!(s, Stat { ppid: 7, start_time: 123456, state: 'S' });
        let odd = parse_stat(&stat_line(42, "a) S 1 (b", 9, 55)).unwrap();
        assert_eq!((odd.ppid, odd.start_time), (9, 55), "a command name cannot shift the fields");
        assert_eq!(parse_stat("42 (sleep) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn uids_from_status() {
        let status =
            "Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t0\t1000\t1000\nGid:\t100\t100\t100\t100\n";
        let u = parse_status_uids(status).unwrap();
        assert_eq!(u, Uids { real: 1000, effective: 0, saved: 1000, fs: 1000 });
        assert_eq!(u.lowest(), 0);
        assert_eq!(parse_status_uids("Name:\tx\n"), None);
        assert_eq!(parse_status_uids("Uid:\t1\t2\n"), None);
    }

    #[test]
    fn cgroup_v1_layout() {
        let text = "12:freezer:/slurm/uid_1000/job_42/step_0/task_1\n11:memory:/slurm/uid_1000/job_42/step_0\n1:name=systemd:/system.slice/slurmd.service\n";
        assert_eq!(
            cgroup_job(text, "node1"),
            CgroupJob::Job { job: 42, uid: Some(1000), path: "/slurm/uid_1000/job_42/step_0/task_1".into() }
        );
        let multi = "4:freezer:/slurm_node2/uid_1000/job_7/step_batch\n";
        assert!(matches!(cgroup_job(multi, "node2"), CgroupJob::Job { job: 7, .. }));
        assert_eq!(cgroup_job(multi, "node1"), CgroupJob::None, "another slurmd's tree is not this node's");
        assert!(matches!(cgroup_job("4:freezer:/slurm/uid_5/job_9\n", "n"), CgroupJob::Job { job: 9, .. }));
    }

    #[test]
    fn cgroup_v2_layout() {
        let text = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n";
        assert_eq!(
            cgroup_job(text, "node1"),
            CgroupJob::Job {
                job: 42,
                uid: None,
                path: "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0".into()
            }
        );
        assert!(matches!(
            cgroup_job("0::/system.slice/node3_slurmstepd.scope/job_8/step_extern\n", "node3"),
            CgroupJob::Job { job: 8, .. }
        ));
        // slurmstepd's own cgroup, and processes of no job.
        assert_eq!(cgroup_job("0::/system.slice/slurmstepd.scope/system\n", "n"), CgroupJob::None);
        assert_eq!(cgroup_job("0::/\n", "n"), CgroupJob::None);
        assert_eq!(cgroup_job("0::/user.slice/user-1000.slice/session-3.scope\n", "n"), CgroupJob::None);
    }

    #[test]
    fn a_user_cannot_imitate_a_job_cgroup_in_a_delegated_subtree() {
        // systemd delegates user@UID.service to the user, who may create any
        // cgroup names below it.
        let forged = "0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_42/step_0\n";
        assert_eq!(cgroup_job(forged, "n"), CgroupJob::None);
        let nested_v1 = "4:freezer:/user/slurm/uid_1000/job_42\n";
        assert_eq!(cgroup_job(nested_v1, "n"), CgroupJob::None);
        // v1 layout in the unified hierarchy and the reverse are not Slurm's.
        assert_eq!(cgroup_job("0::/slurm/uid_1000/job_42\n", "n"), CgroupJob::None);
        assert_eq!(cgroup_job("4:freezer:/system.slice/slurmstepd.scope/job_42\n", "n"), CgroupJob::None);
        for bad in ["job_", "job_+4", "job_4x", "job_ 4", "jobs_4"] {
            assert_eq!(cgroup_job(&format!("0::/system.slice/slurmstepd.scope/{bad}\n"), "n"), CgroupJob::None);
        }
    }

    #[test]
    fn hierarchies_naming_different_jobs_prove_nothing() {
        let text = "12:freezer:/slurm/uid_1000/job_42/step_0\n0::/system.slice/slurmstepd.scope/job_43/step_0\n";
        assert_eq!(cgroup_job(text, "n"), CgroupJob::Conflict);
        let uids = "12:freezer:/slurm/uid_1000/job_42\n11:memory:/slurm/uid_1001/job_42\n";
        assert_eq!(cgroup_job(uids, "n"), CgroupJob::Conflict);
    }

    #[test]
    fn stepd_titles() {
        assert_eq!(stepd_title_job(b"slurmstepd: [42.batch]\0\0\0"), Some(42));
        assert_eq!(stepd_title_job(b"slurmstepd: [42.0]"), Some(42));
        assert_eq!(stepd_title_job(b"slurmstepd: [7.extern]   "), Some(7));
        assert_eq!(stepd_title_job(b"slurmstepd: [7.0+1]"), Some(7));
        assert_eq!(stepd_title_job(b"slurmstepd: spank prolog"), None);
        assert_eq!(stepd_title_job(b"/usr/sbin/slurmstepd\0spank\0epilog"), None);
        assert_eq!(stepd_title_job(b"slurmstepd: [42]"), None);
        assert_eq!(stepd_title_job(b"slurmstepd: [x.0]"), None);
        assert_eq!(stepd_title_job(b"slurmstepd: [42.0] extra"), None);
    }

    const USER: u32 = 1000;

    fn facts(pid: u32, ppid: u32, start: u64, uid: u32, exe: &str, cmdline: &str) -> ProcFacts {
        ProcFacts {
            pid,
            stat: Stat { ppid, start_time: start, state: 'S' },
            uids: Uids::all(uid),
            exe: Some(exe.into()),
            cmdline: cmdline.as_bytes().to_vec(),
        }
    }

    fn walk(tree: &[ProcFacts], from: u32) -> Option<(u32, u32)> {
        let by_pid: HashMap<u32, ProcFacts> = tree.iter().map(|f| (f.pid, f.clone())).collect();
        prove_by_ancestry(&by_pid[&from], 0, |p| by_pid.get(&p).cloned())
    }

    fn stepd(pid: u32, job: &str) -> ProcFacts {
        facts(pid, 1, 100, 0, "/usr/sbin/slurmstepd", &format!("slurmstepd: [{job}]"))
    }

    #[test]
    fn ancestry_to_a_root_slurmstepd_proves_the_job() {
        let tree = [
            stepd(50, "42.batch"),
            facts(60, 50, 110, USER, "/usr/bin/bash", "/bin/bash\0/var/spool/slurmd/job00042/slurm_script"),
            facts(70, 60, 120, USER, "/usr/bin/python3", "python\0train.py"),
        ];
        assert_eq!(walk(&tree, 70), Some((42, 50)));
        assert_eq!(walk(&tree, 60), Some((42, 50)));
    }

    #[test]
    fn a_forged_cmdline_or_a_users_slurmstepd_proves_nothing() {
        // The holder and its parent both claim to be job 42's slurmstepd.
        let tree = [
            facts(60, 1, 110, USER, "/home/u/slurmstepd", "slurmstepd: [42.0]"),
            facts(70, 60, 120, USER, "/usr/bin/python3", "slurmstepd: [42.0]"),
        ];
        assert_eq!(walk(&tree, 70), None);
        // A user's own "slurmstepd" between a task and the real one is
        // walked past: the real one above decides.
        let tree = [
            stepd(50, "42.0"),
            facts(60, 50, 110, USER, "/home/u/slurmstepd", "slurmstepd: [43.0]"),
            facts(70, 60, 120, USER, "/usr/bin/python3", "python"),
        ];
        assert_eq!(walk(&tree, 70), Some((42, 50)));
        // Root's process titled like a step but not running slurmstepd.
        let tree = [
            facts(60, 1, 110, 0, "/usr/bin/perl", "slurmstepd: [42.0]"),
            facts(70, 60, 120, USER, "/usr/bin/python3", "python"),
        ];
        assert_eq!(walk(&tree, 70), None);
        // A root slurmstepd running no step (the job-script context).
        let tree = [
            facts(60, 1, 110, 0, "/usr/sbin/slurmstepd", "slurmstepd: spank epilog"),
            facts(70, 60, 120, USER, "/usr/bin/python3", "python"),
        ];
        assert_eq!(walk(&tree, 70), None);
    }

    #[test]
    fn debian_s_slurmstepd_wlm_is_a_slurmstepd_and_other_names_are_not() {
        let mut s = stepd(50, "9.batch");
        s.exe = Some("/usr/sbin/slurmstepd-wlm".into());
        assert_eq!(stepd_job(&s, 0), Some(9));
        for other in ["/usr/sbin/slurmstepd-wlm2", "/tmp/xslurmstepd", "/usr/sbin/slurmstepd.bak"] {
            s.exe = Some(other.into());
            assert_eq!(stepd_job(&s, 0), None, "{other}");
        }
    }

    #[test]
    fn a_slurmstepd_of_slurmds_own_user_counts_and_a_replaced_binary_too() {
        let mut s = stepd(50, "9.0");
        s.uids = Uids::all(64030);
        s.exe = Some("/usr/sbin/slurmstepd (deleted)".into());
        let child = facts(60, 50, 110, USER, "/usr/bin/python3", "python");
        let by_pid: HashMap<u32, ProcFacts> = [(50, s.clone()), (60, child.clone())].into();
        assert_eq!(prove_by_ancestry(&child, 64030, |p| by_pid.get(&p).cloned()), Some((9, 50)));
        assert_eq!(prove_by_ancestry(&child, 0, |p| by_pid.get(&p).cloned()), None, "not slurmd's user");
        s.uids = Uids { real: 0, effective: 0, saved: USER, fs: 0 };
        let by_pid: HashMap<u32, ProcFacts> = [(50, s), (60, child.clone())].into();
        assert_eq!(prove_by_ancestry(&child, 0, |p| by_pid.get(&p).cloned()), None, "a user could regain it");
    }

    #[test]
    fn orphans_reused_parents_and_unreadable_parents_prove_nothing() {
        // Reparented to init when its step ended.
        let tree = [stepd(50, "42.0"), facts(70, 1, 120, USER, "/usr/bin/python3", "python")];
        assert_eq!(walk(&tree, 70), None);
        // The parent pid now belongs to a slurmstepd started after the child.
        let tree = [
            facts(50, 1, 500, 0, "/usr/sbin/slurmstepd", "slurmstepd: [43.0]"),
            facts(70, 50, 120, USER, "/usr/bin/python3", "python"),
        ];
        assert_eq!(walk(&tree, 70), None);
        // The parent is gone.
        let tree = [facts(70, 50, 120, USER, "/usr/bin/python3", "python")];
        assert_eq!(walk(&tree, 70), None);
    }

    #[test]
    fn the_walk_is_bounded() {
        // A parent chain longer than MAX_ANCESTRY, all user processes.
        let n = MAX_ANCESTRY as u32 + 10;
        let mut tree: Vec<ProcFacts> = (0..n).map(|i| facts(1000 + i, 1001 + i, 10, USER, "/bin/sh", "sh")).collect();
        tree.push(stepd(1000 + n, "1.0"));
        tree.last_mut().unwrap().stat.start_time = 1;
        assert_eq!(walk(&tree, 1000), None);
        let looped = [facts(5, 6, 10, USER, "/bin/sh", "sh"), facts(6, 5, 10, USER, "/bin/sh", "sh")];
        assert_eq!(walk(&looped, 5), None, "a cycle (impossible in /proc, possible in a race) ends");
    }

    #[test]
    fn cgroup_and_ancestry_together() {
        let cg = |job| CgroupJob::Job { job, uid: Some(USER), path: format!("/slurm/uid_{USER}/job_{job}") };
        let me = Uids::all(USER);
        assert_eq!(prove(&cg(42), None, me).map(|p| p.job()), Some(42));
        assert_eq!(prove(&CgroupJob::None, Some((42, 50)), me), Some(Proof::Slurmstepd { job: 42, pid: 50 }));
        assert_eq!(prove(&cg(42), Some((42, 50)), me), prove(&cg(42), None, me), "agreeing evidence");
        assert_eq!(prove(&cg(42), Some((43, 50)), me), None, "disagreeing evidence proves nothing");
        assert_eq!(prove(&CgroupJob::Conflict, Some((42, 50)), me), None);
        assert_eq!(prove(&cg(42), None, Uids::all(1001)), None, "v1 path of another user");
        assert_eq!(prove(&CgroupJob::None, None, me), None);
        assert_eq!(prove(&cg(42), None, me).unwrap().to_string(), "its cgroup /slurm/uid_1000/job_42");
        assert_eq!(Proof::Slurmstepd { job: 42, pid: 50 }.to_string(), "its ancestor slurmstepd, pid 50");
    }

    #[test]
    fn login_defs() {
        assert_eq!(login_defs_min_uid("UID_MIN\t\t\t 1000\n#SYS_UID_MAX\t\t  999\n"), 1000);
        assert_eq!(login_defs_min_uid("SYS_UID_MAX 499\nUID_MIN 1000\n"), 500);
        assert_eq!(login_defs_min_uid("UID_MIN 500 # old\n"), 500);
        assert_eq!(login_defs_min_uid(""), 1000);
        assert_eq!(login_defs_min_uid("SYS_UID_MAX many\n"), 1000);
    }
}
