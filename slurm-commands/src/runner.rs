//! Running one command with a timeout.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run `{cmd}`: {source} (is it installed and on PATH?)")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` did not finish within {timeout:?} (is the daemon it talks to up and reachable?)")]
    Timeout { cmd: String, timeout: Duration },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed { cmd: String, status: String, stdout: String, stderr: String },
}

impl CommandError {
    /// Whether the same call may succeed later: a timeout or a daemon that
    /// could not be reached, as opposed to a refusal or a missing program.
    pub fn is_retryable(&self) -> bool {
        match self {
            CommandError::Spawn { .. } => false,
            CommandError::Timeout { .. } => true,
            CommandError::Failed { stderr, .. } => {
                let s = stderr.to_ascii_lowercase();
                [
                    "connection refused",
                    "unable to contact",
                    "timed out",
                    "socket timed out",
                    "try again",
                    "problem talking to the database",
                ]
                .iter()
                .any(|m| s.contains(m))
            }
        }
    }
}

/// Runs `cmd` to completion within `timeout`; returns its stdout.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<String, CommandError> {
    let shown = shown(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CommandError::Spawn { cmd: shown.clone(), source })?;
    // Read both pipes while waiting: a command that fills a pipe would
    // otherwise block and never exit.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => return Err(CommandError::Spawn { cmd: shown, source }),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CommandError::Timeout { cmd: shown, timeout });
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        let said = stderr.trim();
        return Err(CommandError::Failed {
            cmd: shown,
            status: status.to_string(),
            stdout,
            stderr: if said.is_empty() { "no message".into() } else { said.to_string() },
        });
    }
    Ok(stdout)
}

fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Something that runs Slurm commands: the real one, or canned answers in tests.
pub trait Runner {
    fn run(&self, argv: &[&str]) -> Result<String, CommandError>;
}

/// Runs real commands, each within `timeout`, with extra environment
/// variables (e.g. SLURM_CONF of a dev cluster).
#[derive(Debug, Clone)]
pub struct SystemRunner {
    pub timeout: Duration,
    pub env: Vec<(String, String)>,
}

impl SystemRunner {
    pub fn new(timeout: Duration) -> SystemRunner {
        SystemRunner { timeout, env: Vec::new() }
    }
}

impl Runner for SystemRunner {
    fn run(&self, argv: &[&str]) -> Result<String, CommandError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(CommandError::Spawn {
                cmd: String::new(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        };
        let mut c = Command::new(program);
        c.args(args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        run(&mut c, self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_stdout_and_reports_failures_and_timeouts() {
        let r = SystemRunner::new(Duration::from_secs(10));
        assert_eq!(r.run(&["sh", "-c", "echo hello"]).unwrap(), "hello\n");
        let e = r.run(&["sh", "-c", "echo busy >&2; exit 3"]).unwrap_err();
        assert!(
            e.to_string().contains("`sh -c echo busy >&2; exit 3` failed") && e.to_string().contains("busy"),
            "{e}"
        );
        assert!(!e.is_retryable());
        let e = r.run(&["/nonexistent/sacctmgr"]).unwrap_err();
        assert!(e.to_string().contains("cannot run `/nonexistent/sacctmgr`"), "{e}");
        // More output than a pipe holds does not block the command.
        let big = r.run(&["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"]).unwrap();
        assert_eq!(big.len(), 1_000_000);
        let quick = SystemRunner::new(Duration::from_millis(200));
        let started = Instant::now();
        let e = quick.run(&["sleep", "5"]).unwrap_err();
        assert!(e.to_string().contains("did not finish within 200ms"), "{e}");
        assert!(e.is_retryable());
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn unreachable_daemons_are_retryable() {
        let r = SystemRunner::new(Duration::from_secs(5));
        let e = r
            .run(&[
                "sh",
                "-c",
                "echo 'sacctmgr: error: Problem talking to the database: Connection refused' >&2; exit 1",
            ])
            .unwrap_err();
        assert!(e.is_retryable());
    }

    #[test]
    fn environment_is_passed() {
        let r = SystemRunner { timeout: Duration::from_secs(5), env: vec![("ONEPOOL_X".into(), "42".into())] };
        assert_eq!(r.run(&["sh", "-c", "echo $ONEPOOL_X"]).unwrap(), "42\n");
    }
}
