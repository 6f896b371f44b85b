//! Why a model server ended, in words an admin can act on (issue #24: a
//! server that died of SIGSEGV was reported as "the server exited (None)").
//! A status is named by its signal (`SIGSEGV`, `SIGKILL`, with the kernel's
//! OOM killer when the job's memory cgroup counted a kill) or exit code,
//! and carries the last lines the server printed.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The last lines a process printed, bounded in count and length (a
/// server that prints one huge line keeps its end).
#[derive(Debug, Default)]
pub struct OutputTail {
    lines: VecDeque<String>,
    partial: Vec<u8>,
}

/// Lines kept; a crash's cause is in the last few.
pub const TAIL_LINES: usize = 12;
/// Bytes kept of one line.
const LINE_MAX: usize = 400;

impl OutputTail {
    /// Takes output as it comes, in any pieces.
    pub fn push(&mut self, mut bytes: &[u8]) {
        while let Some(nl) = bytes.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&bytes[..nl]);
            self.end_line();
            bytes = &bytes[nl + 1..];
        }
        self.partial.extend_from_slice(bytes);
        if self.partial.len() > 4 * LINE_MAX {
            self.partial.drain(..self.partial.len() - LINE_MAX);
        }
    }

    fn end_line(&mut self) {
        let raw = std::mem::take(&mut self.partial);
        let start = raw.len().saturating_sub(LINE_MAX);
        let line = String::from_utf8_lossy(&raw[start..]).trim_end_matches('\r').to_string();
        if line.trim().is_empty() {
            return;
        }
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The kept lines, the one still unfinished included.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.lines.iter().cloned().collect();
        let rest = String::from_utf8_lossy(&self.partial).trim().to_string();
        if !rest.is_empty() {
            out.push(rest);
        }
        out.drain(..out.len().saturating_sub(TAIL_LINES));
        out
    }
}

/// `SIGSEGV` for 11, and so on; the number for a signal without a name here.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// "killed by SIGSEGV (core dumped)", "exited with code 1", "killed by
/// SIGKILL: the kernel's OOM killer (memory cgroup oom_kill 0 -> 1)".
pub fn describe(status: ExitStatus, oom_before: Option<u64>, oom_after: Option<u64>) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    let Some(sig) = status.signal() else { return format!("ended ({status})") };
    let mut s = format!("killed by {}", signal_name(sig));
    if status.core_dumped() {
        s.push_str(" (core dumped)");
    }
    if let (libc::SIGKILL, Some(before), Some(after)) = (sig, oom_before, oom_after) {
        if after > before {
            s.push_str(&format!(": the kernel's OOM killer (memory cgroup oom_kill {before} -> {after})"));
        }
    }
    s
}

/// The exit code the launcher ends with for a server that ended so: the
/// server's own code, or 128 + the signal as a shell reports it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// OOM kills counted in this process's memory cgroup so far: cgroup v2's
/// `memory.events` (`oom_kill N`), else v1's `memory.oom_control`; `None`
/// where neither is readable (no memory controller for the job, e.g.
/// under proctrack/linuxproc without task/cgroup).
pub fn oom_kills() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.events")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.oom_control")
        } else {
            continue;
        };
        if let Some(n) = std::fs::read_to_string(&file).ok().and_then(|t| oom_kill_count(&t)) {
            return Some(n);
        }
    }
    None
}

fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named_by_signal_or_code() {
        // Raw wait statuses: signal in the low 7 bits, 0x80 for a core
        // dump, the exit code in the next byte.
        assert_eq!(describe(ExitStatus::from_raw(11 | 0x80), None, None), "killed by SIGSEGV (core dumped)");
        assert_eq!(describe(ExitStatus::from_raw(4), None, None), "killed by SIGILL");
        assert_eq!(describe(ExitStatus::from_raw(1 << 8), None, None), "exited with code 1");
        assert_eq!(describe(ExitStatus::from_raw(9), Some(0), Some(0)), "killed by SIGKILL");
        assert_eq!(
            describe(ExitStatus::from_raw(9), Some(2), Some(3)),
            "killed by SIGKILL: the kernel's OOM killer (memory cgroup oom_kill 2 -> 3)"
        );
        assert_eq!(exit_code(ExitStatus::from_raw(11)), 139);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn the_tail_keeps_the_last_lines_in_any_pieces() {
        let mut t = OutputTail::default();
        for i in 0..30 {
            t.push(format!("line {i}\r\n").as_bytes());
        }
        t.push(b"\n\nhalf a ");
        t.push(b"line");
        let lines = t.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines.last().unwrap(), "half a line");
        assert_eq!(lines[lines.len() - 2], "line 29");
        let mut long = OutputTail::default();
        long.push(&vec![b'x'; 10_000]);
        long.push(b"END\n");
        assert!(long.lines()[0].ends_with("xEND") && long.lines()[0].len() <= LINE_MAX);
    }

    #[test]
    fn oom_counts_are_read_from_both_cgroup_versions() {
        assert_eq!(oom_kill_count("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"), Some(2));
        assert_eq!(oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"), Some(5));
        assert_eq!(oom_kill_count("oom_kill_disable 0\n"), None);
    }
}
