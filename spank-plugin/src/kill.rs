//! Killing a GPU holder through a pidfd. `kill(pid)` signals whatever has
//! the pid when the call lands; if the holder exited after the decision
//! and the pid was reused, that is someone else. A pidfd pins one process:
//! once it is open, `/proc/PID` is read again, and only if the start time
//! is the one decided on (so the pidfd names that very process) and the
//! process is still killable by the rules is the signal sent, through the
//! pidfd, which cannot reach another process.

use std::io;
use std::os::fd::OwnedFd;

use onepool_decisions::handoff::{killable, Holder, KillRules, Refusal};
use onepool_decisions::ownership::{Stat, Uids};
use slurm_sys::os::{pidfd_open, pidfd_send_signal};

use crate::procinfo;

/// What became of one kill.
#[derive(Debug)]
pub enum Outcome {
    /// SIGKILL was sent to the process decided on.
    Signalled,
    /// The process has exited.
    Gone,
    /// The pid now names another process (its start time differs): not
    /// signalled.
    Reused {
        now: u64,
    },
    /// The process is no longer killable (e.g. it exec'd a set-user-ID
    /// program): not signalled.
    Refused(Refusal),
    /// The kernel has no pidfd_open (before Linux 5.3): not signalled, as
    /// plain kill(2) could hit a reused pid.
    NoPidfd,
    Failed(io::Error),
}

/// Kills `h` with SIGKILL if it is still the process decided on.
pub fn kill(h: &Holder, rules: &KillRules) -> Outcome {
    kill_checked(h, rules, pidfd_open, |pid| Some((procinfo::stat(pid)?, procinfo::uids(pid)?)))
}

/// [`kill`], opening the pidfd with `open` and reading the identity after
/// it is open with `identity`.
fn kill_checked(
    h: &Holder,
    rules: &KillRules,
    open: impl FnOnce(u32) -> io::Result<OwnedFd>,
    identity: impl FnOnce(u32) -> Option<(Stat, Uids)>,
) -> Outcome {
    let Some(decided) = h.start_time else { return Outcome::Refused(Refusal::Unidentified) };
    if let Err(why) = killable(h, rules) {
        return Outcome::Refused(why);
    }
    let fd = match open(h.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Outcome::NoPidfd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Outcome::Gone,
        Err(e) => return Outcome::Failed(e),
    };
    // The pidfd was opened on whatever had the pid; the process seen now had
    // it then too if it is the one decided on (a pid is not reused while
    // its process lives), so a matching start time proves the pidfd names
    // the holder.
    let Some((stat, uids)) = identity(h.pid) else { return Outcome::Gone };
    if stat.start_time != decided {
        return Outcome::Reused { now: stat.start_time };
    }
    let now = Holder { uids: Some(uids), start_time: Some(stat.start_time), ..h.clone() };
    if let Err(why) = killable(&now, rules) {
        return Outcome::Refused(why);
    }
    match pidfd_send_signal(&fd, libc::SIGKILL) {
        Ok(()) => Outcome::Signalled,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Outcome::Gone,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Outcome::NoPidfd,
        Err(e) => Outcome::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use onepool_decisions::ownership::Proof;

    /// A bound every test child passes: the children run as a regular user
    /// (uid 4242 when the tests run as root, else the caller's own).
    const RULES: KillRules = KillRules { min_uid: 1 };

    fn child() -> Child {
        let mut c = Command::new("sleep");
        c.arg("60").stdin(Stdio::null());
        if slurm_sys::os::geteuid() == 0 {
            c.uid(4242).gid(4242);
        }
        c.spawn().unwrap()
    }

    fn holder_of(child: &Child) -> Holder {
        let pid = child.id();
        let h = procinfo::holder(0, pid, "node1", procinfo::stepd_uid());
        // The proof is the decision's business; here it is given.
        Holder { proof: Some(Proof::Cgroup { job: 7, path: "/slurm/uid_4242/job_7".into() }), ..h }
    }

    /// Waits (bounded) for the child to end, and says how it ended.
    fn ended_by(child: &mut Child) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        for _ in 0..500 {
            if let Some(status) = child.try_wait().unwrap() {
                return status.signal();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    #[test]
    fn a_child_is_killed_through_its_pidfd() {
        let mut c = child();
        let h = holder_of(&c);
        assert!(h.start_time.is_some());
        match kill(&h, &RULES) {
            Outcome::Signalled => {}
            Outcome::NoPidfd => {
                let _ = c.kill();
                let _ = c.wait();
                eprintln!("no pidfd_open on this kernel: nothing to test");
                return;
            }
            other => panic!("not signalled: {other:?}"),
        }
        assert_eq!(ended_by(&mut c), Some(libc::SIGKILL));
        // Reaped now: the pid names nothing, or someone else.
        assert!(matches!(kill(&h, &RULES), Outcome::Gone | Outcome::Reused { .. }));
    }

    #[test]
    fn a_reused_pid_is_not_signalled() {
        let mut c = child();
        let h = holder_of(&c);
        // As if the holder had exited after the decision and the pid been
        // given to this child: the start time read after the open differs.
        let decided = Holder { start_time: h.start_time.map(|t| t.saturating_sub(1)), ..h.clone() };
        let outcome = kill(&decided, &RULES);
        let alive = c.try_wait().unwrap().is_none();
        let _ = c.kill();
        let _ = c.wait();
        if matches!(outcome, Outcome::NoPidfd) {
            return;
        }
        assert!(matches!(outcome, Outcome::Reused { now } if Some(now) == h.start_time), "{outcome:?}");
        assert!(alive, "the process now holding the pid was hit");
    }

    #[test]
    fn a_process_that_became_root_after_the_decision_is_not_signalled() {
        let mut c = child();
        let h = holder_of(&c);
        let became_root = |pid| Some((procinfo::stat(pid)?, Uids { effective: 0, ..procinfo::uids(pid)? }));
        let outcome = kill_checked(&h, &RULES, pidfd_open, became_root);
        let alive = c.try_wait().unwrap().is_none();
        let _ = c.kill();
        let _ = c.wait();
        if matches!(outcome, Outcome::NoPidfd) {
            return;
        }
        assert!(matches!(outcome, Outcome::Refused(Refusal::SystemUser { uid: 0 })), "{outcome:?}");
        assert!(alive);
    }

    #[test]
    fn without_pidfd_open_nothing_is_signalled() {
        let mut c = child();
        let h = holder_of(&c);
        let enosys = |_| Err(io::Error::from_raw_os_error(libc::ENOSYS));
        let outcome = kill_checked(&h, &RULES, enosys, |_| panic!("no identity is read without a pidfd"));
        let alive = c.try_wait().unwrap().is_none();
        let _ = c.kill();
        let _ = c.wait();
        assert!(matches!(outcome, Outcome::NoPidfd), "{outcome:?}");
        assert!(alive, "no plain kill(2) in place of the pidfd");
    }

    #[test]
    fn unkillable_holders_are_refused_before_any_syscall() {
        let base = Holder {
            minor: 0,
            pid: 1,
            uids: Some(Uids::all(4242)),
            start_time: Some(1),
            proof: Some(Proof::Slurmstepd { job: 7, pid: 9 }),
            command: "init".into(),
        };
        assert!(matches!(kill(&base, &RULES), Outcome::Refused(Refusal::Init)));
        let root = Holder { pid: 2, uids: Some(Uids::all(0)), ..base.clone() };
        assert!(matches!(kill(&root, &RULES), Outcome::Refused(Refusal::SystemUser { uid: 0 })));
        let unknown = Holder { pid: 2, start_time: None, ..base };
        assert!(matches!(kill(&unknown, &RULES), Outcome::Refused(Refusal::Unidentified)));
    }
}
