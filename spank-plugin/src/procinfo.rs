//! Reads what `/proc` says about GPU holders and slurmstepds; the meaning
//! of it is `onepool_decisions::ownership`'s. `stat`, `status`, `comm`,
//! `cgroup` and the `exe` link are read for any process: the kernel answers
//! them without the process's memory lock. `cmdline` needs that lock, which
//! a user's process can keep held (a thread stuck in a page fault on a hung
//! file system), so it is read only from genuine slurmstepds, which are
//! root's.

use onepool_decisions::handoff::Holder;
use onepool_decisions::ownership::{self, CgroupJob, ProcFacts, Stat, Uids};

fn read(pid: u32, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()
}

pub fn stat(pid: u32) -> Option<Stat> {
    ownership::parse_stat(&read(pid, "stat")?)
}

pub fn uids(pid: u32) -> Option<Uids> {
    ownership::parse_status_uids(&read(pid, "status")?)
}

fn command(pid: u32) -> String {
    read(pid, "comm").map(|c| c.trim_end_matches('\n').to_string()).unwrap_or_else(|| "?".into())
}

/// What the ancestry walk needs of `pid`; its title only if it is a
/// genuine slurmstepd (see the module's note on `cmdline`).
pub fn facts(pid: u32, stepd_uid: u32) -> Option<ProcFacts> {
    let stat = stat(pid)?;
    let uids = uids(pid)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok().map(|p| p.to_string_lossy().into_owned());
    let mut f = ProcFacts { pid, stat, uids, exe, cmdline: Vec::new() };
    if ownership::is_slurmstepd(&f, stepd_uid) {
        f.cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    }
    // The same process throughout, or the facts are a mix of two.
    (self::stat(pid)?.start_time == stat.start_time).then_some(f)
}

/// The uid slurmstepd may run as besides root: this process runs as
/// slurmd's user (`SlurmdUser`), and slurmd starts slurmstepd as itself.
pub fn stepd_uid() -> u32 {
    slurm_sys::os::geteuid()
}

/// Everything the hand-off rules need about `pid`, seen on GPU `minor` of
/// node `node`. A holder whose start time changed while it was being read
/// (it exited and the pid was reused) gets no start time, so it is never
/// killed.
pub fn holder(minor: u32, pid: u32, node: &str, stepd_uid: u32) -> Holder {
    let before = stat(pid);
    let uids = uids(pid);
    let cgroup = read(pid, "cgroup").map_or(CgroupJob::None, |t| ownership::cgroup_job(&t, node));
    let me = match (before, uids) {
        (Some(stat), Some(uids)) => Some(ProcFacts { pid, stat, uids, exe: None, cmdline: Vec::new() }),
        _ => None,
    };
    let ancestry = me.as_ref().and_then(|me| ownership::prove_by_ancestry(me, stepd_uid, |p| facts(p, stepd_uid)));
    let proof = uids.and_then(|u| ownership::prove(&cgroup, ancestry, u));
    let command = command(pid);
    let after = stat(pid);
    let start_time = match (before, after) {
        (Some(b), Some(a)) if a.start_time == b.start_time => Some(b.start_time),
        _ => None,
    };
    Holder { minor, pid, uids, start_time, proof, command }
}

/// Jobs with a genuine job-step slurmstepd on this host. A process that
/// only calls itself `slurmstepd: [J.S]` does not count.
pub fn running_jobs(stepd_uid: u32) -> Vec<u32> {
    let mut jobs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A cheap first look: comm is the binary's name, whatever the title.
        if read(pid, "comm").as_deref().map(str::trim_end) != Some("slurmstepd") {
            continue;
        }
        if let Some(job) = facts(pid, stepd_uid).and_then(|f| ownership::stepd_job(&f, stepd_uid)) {
            if !jobs.contains(&job) {
                jobs.push(job);
            }
        }
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_child_is_described_from_proc_and_its_spoofed_environment_is_ignored() {
        let mut child = Command::new("sleep")
            .arg("60")
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOBID", "4242")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let h = holder(3, pid, "node1", stepd_uid());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(h.minor, 3);
        assert_eq!(h.command, "sleep");
        assert_eq!(h.uids.map(|u| u.real), Some(slurm_sys::os::getuid()));
        assert!(h.start_time.is_some());
        assert_eq!(h.proof, None, "the environment's SLURM_JOB_ID proves nothing");
        assert!(!running_jobs(stepd_uid()).contains(&4242));
    }

    #[test]
    fn a_process_titled_like_slurmstepd_is_not_a_running_job() {
        // exec -a sets argv[0]: the forged title, as `ps` would show it.
        let mut child = Command::new("bash")
            .args(["-c", "exec -a 'slurmstepd: [4243.0]' sleep 60"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let forged = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"slurmstepd: [4243.0]"))
        });
        let running = running_jobs(stepd_uid());
        let facts = facts(pid, stepd_uid());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(forged, "the child never took the forged title");
        assert!(!running.contains(&4243));
        assert_eq!(facts.and_then(|f| ownership::stepd_job(&f, stepd_uid())), None);
    }

    #[test]
    fn a_pid_that_does_not_exist_is_unidentified() {
        // Above the kernel's pid_max limit (2^22), so never a process.
        let h = holder(0, 5_000_000, "node1", stepd_uid());
        assert_eq!((h.uids, h.start_time, h.proof), (None, None, None));
        assert_eq!(h.command, "?");
    }
}
