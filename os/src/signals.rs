//! Signals: to one process through a pidfd (which cannot name another
//! process even if the pid is reused), or by pid to a child or a process
//! group this process leads, and to itself.

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub use libc::{SIGKILL, SIGTERM, SIGUSR1};

/// `pidfd_open(pid, 0)`: a descriptor that names this one process for as
/// long as it is open. ENOSYS before Linux 5.3; ESRCH for no such process
/// (or a pid out of `pid_t`'s range).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open(pid, flags) takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(fd, signal, NULL, 0)`: signals the process `fd`
/// names, which cannot be another one even if its pid was reused.
pub fn pidfd_send_signal(fd: &OwnedFd, signal: c_int) -> io::Result<()> {
    // SAFETY: a valid pidfd, no siginfo (NULL), no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `kill(pid, signal)`: for a child of this process (not yet reaped, so its
/// pid is not reused) or a pid checked to be the expected process.
pub fn signal(pid: u32, signal: c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    kill(pid, signal)
}

/// `kill(-leader, signal)`: every process of the group `leader` leads (a
/// server started in its own group, and what it left behind).
pub fn signal_group(leader: u32, signal: c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(leader).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid <= 0 {
        // kill(0, …) and kill(-1, …) would signal this process's own group
        // or every process it may signal.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    kill(-pid, signal)
}

/// `raise(signal)`: this process signals itself (its own handlers run).
pub fn raise(signal: c_int) -> io::Result<()> {
    // SAFETY: raise takes no pointers.
    if unsafe { libc::raise(signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn kill(pid: libc::pid_t, signal: c_int) -> io::Result<()> {
    // SAFETY: kill takes no pointers; the callers above exclude 0 and -1.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_such_process_has_no_pidfd() {
        let e = pidfd_open(u32::MAX).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn a_group_signal_never_reaches_this_group_or_everyone() {
        for leader in [0, u32::MAX] {
            let e = signal_group(leader, 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{leader}");
        }
    }

    #[test]
    fn a_child_is_signalled_by_pid_and_by_group() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        signal(child.id(), 0).unwrap();
        signal_group(child.id(), SIGTERM).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(SIGTERM));
    }
}
