//! The model server's process: started in its own process group with a
//! key of its own, its output copied to the job's and its last lines kept,
//! stopped with SIGTERM then SIGKILL, and named when it ends by itself.

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::conventions::{BACKEND_KEY_ALIASES, BACKEND_KEY_ENV, REPLICA_KEY_ENV};
use crate::exit_cause::{self, OutputTail};
use crate::outcome::{Ended, LauncherError};

/// SIGTERM to the server's process group, SIGKILL to it after `grace`.
pub(crate) async fn stop(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    // The server leads its own process group.
    let group = child.id();
    if let Some(g) = group {
        let _ = onepool_os::signal_group(g, onepool_os::SIGTERM);
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    };
    if let Some(g) = group {
        // What the server left behind in its group goes with it (the
        // group may be empty by now: ESRCH).
        let _ = onepool_os::signal_group(g, onepool_os::SIGKILL);
    }
    status
}

/// A loopback port nothing listens on now, for the model server. Another
/// process could take it before the server binds it; the server then
/// fails to start, and says why in its output, which is reported.
pub(crate) fn free_loopback_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

/// Copies a pipe of the server's to this process's standard error (the
/// job's output file) and keeps its last lines.
async fn copy_output(mut from: impl AsyncRead + Unpin, tail: Arc<Mutex<OutputTail>>) {
    let mut err = tokio::io::stderr();
    let mut buf = vec![0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let _ = err.write_all(&buf[..n]).await;
                tail.lock().unwrap_or_else(|e| e.into_inner()).push(&buf[..n]);
            }
        }
    }
}

/// The model server's process and what it printed last.
pub(crate) struct Server {
    pub(crate) child: tokio::process::Child,
    tail: Arc<Mutex<OutputTail>>,
    copies: tokio::task::JoinSet<()>,
}

impl Server {
    pub(crate) fn spawn(
        command_line: &[String],
        program: &str,
        args: &[String],
        backend: SocketAddr,
        backend_key: &str,
    ) -> Result<Server, LauncherError> {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("ONEPOOL_BACKEND_PORT", backend.port().to_string())
            .env(BACKEND_KEY_ENV, backend_key)
            // onepoold's key is for this process only.
            .env_remove(REPLICA_KEY_ENV)
            .env_remove(crate::conventions::REPLICA_KEY_DIGEST_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that stopping it reaches the worker
            // processes servers such as vLLM fork (they hold GPUs too).
            .process_group(0)
            .kill_on_drop(true);
        for alias in BACKEND_KEY_ALIASES {
            command.env(alias, backend_key);
        }
        let mut child =
            command.spawn().map_err(|source| LauncherError::Spawn { cmd: command_line.join(" "), source })?;
        let tail = Arc::new(Mutex::new(OutputTail::default()));
        let mut copies = tokio::task::JoinSet::new();
        if let Some(out) = child.stdout.take() {
            copies.spawn(copy_output(out, tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            copies.spawn(copy_output(err, tail.clone()));
        }
        Ok(Server { child, tail, copies })
    }

    /// Why the server ended by itself, with what it printed last, up to a
    /// moment after it ended (a process it left behind may hold its pipes
    /// open).
    pub(crate) async fn ended(&mut self, status: std::io::Result<ExitStatus>, oom_before: Option<u64>) -> Ended {
        let copies = &mut self.copies;
        let _ =
            tokio::time::timeout(Duration::from_secs(1), async { while copies.join_next().await.is_some() {} }).await;
        match status {
            Ok(status) => Ended {
                cause: exit_cause::describe(status, oom_before, exit_cause::oom_kills()),
                code: exit_cause::exit_code(status),
                tail: self.tail.lock().unwrap_or_else(|e| e.into_inner()).lines(),
            },
            Err(e) => Ended { cause: format!("cannot wait for the server: {e}"), code: 1, tail: Vec::new() },
        }
    }
}
