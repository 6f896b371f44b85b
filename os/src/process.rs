//! What this process sets for itself or for the programs it starts: the
//! umask around a file it creates, a new session for a daemon that must
//! outlive its starter, a listening socket handed to a child as
//! descriptor 3 (socket activation's protocol).

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Runs `f` with the umask `mask`, then restores the previous one: a file
/// or socket `f` creates is never more open than `mask` allows, not even
/// before a chmod.
///
/// The umask is the process's: another thread creating files meanwhile
/// gets `mask` too (only ever stricter in onepool's uses).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: umask only swaps the process's file-creation mask.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let out = f();
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    out
}

/// The program `cmd` starts runs in a session of its own (setsid): it
/// outlives its starter, and no terminal's signal reaches it.
pub fn new_session_on_exec(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and calls only
    // setsid, which is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
}

/// The program `cmd` starts inherits no descriptor but its standard
/// input, output and error: every other one its starter inherited (a
/// lock a test runner holds, a CI runner's pipe) is closed at exec. A
/// daemon that kept them would hold the lock or keep the pipe open for as
/// long as it runs.
pub fn close_inherited_on_exec(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and makes only the
    // close_range and fcntl system calls, which are async-signal-safe and
    // touch no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            // close_range(3, ~0, CLOSE_RANGE_CLOEXEC): Linux 5.11 and later.
            let r = libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if r != 0 {
                for fd in 3..1024 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
}

/// The first descriptor socket activation hands over (`SD_LISTEN_FDS_START`).
pub const FIRST_LISTEN_FD: RawFd = 3;

/// The program `cmd` starts gets `socket` as descriptor 3, open across
/// exec, as systemd hands a socket unit's socket over.
pub fn pass_as_first_listen_fd(cmd: &mut Command, socket: &impl AsRawFd) {
    let fd = socket.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only dup2
    // and fcntl, which are async-signal-safe, on descriptors the child
    // inherited; `socket` outlives the spawn, which the caller's borrow
    // ensures for the call that spawns.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec: clear it then.
            let r =
                if fd == FIRST_LISTEN_FD { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, FIRST_LISTEN_FD) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A descriptor the starter inherited without close-on-exec (as
    /// `flock FILE cargo test` hands its lock on) does not reach the
    /// program; standard output does.
    #[test]
    fn inherited_descriptors_stay_behind() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: clearing close-on-exec on a descriptor this test owns.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        let listed = |close: bool| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &format!("test -e /proc/self/fd/{fd} && echo open || echo closed")]);
            if close {
                close_inherited_on_exec(&mut cmd);
            }
            String::from_utf8(cmd.output().unwrap().stdout).unwrap()
        };
        assert_eq!(listed(false).trim(), "open", "the test's own premise");
        assert_eq!(listed(true).trim(), "closed");
    }

    #[test]
    fn a_file_made_under_a_umask_has_its_mode_and_the_umask_is_back() {
        let dir = std::env::temp_dir().join(format!("onepool-os-umask-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mode = |name: &str| std::fs::metadata(dir.join(name)).unwrap().permissions().mode() & 0o777;
        std::fs::write(dir.join("before"), "x").unwrap();
        with_umask(0o177, || std::fs::write(dir.join("inside"), "x")).unwrap();
        std::fs::write(dir.join("after"), "x").unwrap();
        assert_eq!(mode("inside"), 0o600);
        assert_eq!(mode("after"), mode("before"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_new_session_has_its_own_session_id() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "cut -d' ' -f6 /proc/self/stat"]);
        new_session_on_exec(&mut cmd);
        let out = cmd.output().unwrap();
        let sid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_ne!(
            sid,
            std::fs::read_to_string("/proc/self/stat").unwrap().split(' ').nth(5).unwrap().parse().unwrap()
        );
    }
}
