//! How a launcher ends (the server by itself, a drain, a cut), and why it
//! cannot start.

use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("no server command given (onepool replica [OPTIONS] -- CMD ARGS...)")]
    NoCommand,
    #[error("cannot start `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find a free loopback port for the model server: {0}")]
    BackendPort(#[source] std::io::Error),
    #[error("cannot make the model server's key: {0}")]
    Key(#[source] std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error("{0}")]
    Tls(String),
}

/// How a server that ended by itself ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// "killed by SIGSEGV", "exited with code 1" ([`crate::exit_cause::describe`]).
    pub cause: String,
    /// The launcher's exit code for it (the server's, or 128 + signal).
    pub code: i32,
    /// The last lines the server printed.
    pub tail: Vec<String>,
}

impl Ended {
    /// The cause with the last lines, as reported to onepoold.
    pub fn report(&self) -> String {
        if self.tail.is_empty() {
            return format!("{}; it printed nothing", self.cause);
        }
        format!("{}; last output:\n{}", self.cause, self.tail.join("\n"))
    }
}

/// How the launcher ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server exited by itself.
    ServerExited(Ended),
    /// Drained after a notice: every request in flight finished.
    Drained { waited: Duration },
    /// The drain timeout passed with requests still in flight; they were
    /// cut off with an answer that says so ([`crate::front::Front::cut_off`]).
    TimedOut { in_flight: u64 },
    /// Reclaimed at once (an immediate class's SIGTERM, [`crate::drain`]):
    /// what was in flight was cut off without waiting.
    Cut { in_flight: u64 },
}

impl Outcome {
    /// The process exit code: 0 for a clean drain.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::ServerExited(e) => {
                if e.code == 0 {
                    1
                } else {
                    e.code
                }
            }
            Outcome::Drained { .. } => 0,
            Outcome::TimedOut { .. } | Outcome::Cut { .. } => 1,
        }
    }
}
