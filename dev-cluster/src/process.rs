//! Daemons started by the launcher, tracked by PID *and* start time so that
//! `down` can never signal a process it did not start, even after PID reuse.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub pid: i32,
    pub start_ticks: u64,
}

/// Field 22 of /proc/PID/stat (start time in clock ticks since boot), and
/// whether the process is a zombie.
fn proc_stat(pid: i32) -> Option<(u64, bool)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces: parse after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, *state == "Z" || *state == "X"))
}

impl Tracked {
    pub fn of(pid: i32) -> Option<Tracked> {
        proc_stat(pid).map(|(start_ticks, _)| Tracked { pid, start_ticks })
    }

    /// The same process is still there and not a zombie.
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Some((start, false)) if start == self.start_ticks)
    }

    pub fn read(pid_file: &Path) -> Option<Tracked> {
        let text = fs::read_to_string(pid_file).ok()?;
        let mut it = text.split_whitespace();
        Some(Tracked { pid: it.next()?.parse().ok()?, start_ticks: it.next()?.parse().ok()? })
    }

    pub fn write(&self, pid_file: &Path) -> Result<()> {
        fs::write(pid_file, format!("{} {}\n", self.pid, self.start_ticks))
            .ctx(|| format!("writing {}", pid_file.display()))
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns once the process is gone.
    pub fn stop(&self, grace: Duration) {
        if !self.alive() {
            return;
        }
        // A pid verified (with its start time) to be ours.
        let _ = onepool_os::signal(self.pid as u32, onepool_os::SIGTERM);
        let deadline = Instant::now() + grace;
        while self.alive() && Instant::now() < deadline {
            sleep(Duration::from_millis(50));
        }
        if self.alive() {
            // The tracked process, checked alive (same start time) just above.
            let _ = onepool_os::signal(self.pid as u32, onepool_os::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.alive() && Instant::now() < deadline {
                sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Starts `cmd` in its own session (so it outlives the launcher and no
/// terminal signal reaches it), output appended to `log`, and records it.
pub fn spawn(mut cmd: Command, log: &Path, pid_file: &Path) -> Result<Tracked> {
    let out =
        fs::OpenOptions::new().create(true).append(true).open(log).ctx(|| format!("opening {}", log.display()))?;
    let err = out.try_clone().ctx(|| "dup log fd".into())?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    onepool_os::new_session_on_exec(&mut cmd);
    onepool_os::close_inherited_on_exec(&mut cmd);
    let program = format!("{:?}", cmd.get_program());
    let child = cmd.spawn().ctx(|| format!("starting {program}"))?;
    let pid = child.id() as i32;
    // The Child handle is dropped without wait(): the daemon is meant to
    // outlive us and is reaped by init once we exit.
    drop(child);
    let tracked =
        Tracked::of(pid).ok_or_else(|| Error::Setup(format!("{program} exited at once; see {}", log.display())))?;
    tracked.write(pid_file)?;
    Ok(tracked)
}

/// Runs a command to completion with a timeout, returning stdout.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<String> {
    onepool_slurm_commands::run(cmd, timeout).map_err(Error::from)
}

/// Polls `ready` until it returns true or `timeout` passes.
pub fn wait_for(what: &str, log: &Path, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(20);
    loop {
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout { what: what.to_string(), secs: timeout.as_secs(), log: log.to_path_buf() });
        }
        sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_tracked_and_alive() {
        let me = Tracked::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let other = Tracked { start_ticks: me.start_ticks + 1, ..me };
        assert!(!other.alive(), "a reused PID with another start time is not ours");
    }

    #[test]
    fn pid_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("op-pid-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.pid");
        let t = Tracked { pid: 42, start_ticks: 4242 };
        t.write(&f).unwrap();
        assert_eq!(Tracked::read(&f), Some(t));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spawn_and_stop() {
        let dir = std::env::temp_dir().join(format!("op-spawn-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut c = Command::new("sleep");
        c.arg("30");
        let t = spawn(c, &dir.join("s.log"), &dir.join("s.pid")).unwrap();
        assert!(t.alive());
        t.stop(Duration::from_secs(2));
        // Our own child stays a zombie until reaped; alive() must say gone.
        assert!(!t.alive());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_reports_failure_with_output() {
        let e = run(Command::new("sh").args(["-c", "echo nope >&2; exit 3"]), Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
