//! What `/proc` says about a process: whether it still runs, and its name.

use std::io::ErrorKind;
use std::path::PathBuf;

use crate::GpuError;

/// Whether `pid` is a process that still runs: `/proc/PID` exists and the
/// process is not a zombie (a zombie holds no GPU: the driver releases its
/// contexts at exit, before the parent reaps it).
///
/// Under a `/proc` mounted with `hidepid=`, other users' processes look
/// dead to unprivileged callers; slurmstepd runs as root.
pub fn is_running(pid: u32) -> Result<bool, GpuError> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let stat = match std::fs::read_to_string(&path) {
        Ok(stat) => stat,
        // ESRCH: the process exited between opening and reading.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(error) => return Err(GpuError::ProcStatus { pid, path, error }),
    };
    match state(&stat) {
        Some(state) => Ok(!matches!(state, 'Z' | 'X' | 'x')),
        None => Err(GpuError::ProcStatus {
            pid,
            path,
            error: std::io::Error::new(ErrorKind::InvalidData, format!("no process state in `{}`", stat.trim_end())),
        }),
    }
}

/// The state letter of a `/proc/PID/stat` line: the field after the command
/// name, which is in parentheses and may itself contain spaces and `)`.
fn state(stat: &str) -> Option<char> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().next()?.chars().next()
}

/// The process's command name (`/proc/PID/comm`), if it can be read.
pub fn command_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert_eq!(state("42 (sleep) S 1 42 42 0"), Some('S'));
        assert_eq!(state("42 (a) b) Z 1 42"), Some('Z'));
        assert_eq!(state("42 (sleep)"), None);
        assert_eq!(state("garbage"), None);
    }

    #[test]
    fn a_child_runs_until_killed_and_is_not_running_as_a_zombie() {
        let mut child = Command::new("sleep").arg("60").stdin(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        assert!(is_running(pid).unwrap());
        assert_eq!(command_name(pid).as_deref(), Some("sleep"));
        child.kill().unwrap();
        // Not reaped yet: a zombie until wait().
        let zombie = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !is_running(pid).unwrap()
        });
        assert!(zombie, "pid {pid} still runs after kill");
        child.wait().unwrap();
        assert!(!is_running(pid).unwrap());
        assert_eq!(command_name(pid), None);
    }
}
