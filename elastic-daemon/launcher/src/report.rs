//! How a launcher tells onepoold where its replica listens and why its
//! server ended (and, for `onepool report`, what its drain did) (issue #25: the replica's port is chosen by the kernel on
//! the node, so nobody can take it first). A one-replica job writes its
//! job's `Comment` itself; a launcher step of a per-node job prints a line
//! for the job's main process, which writes the comment for all of them
//! ([`crate::replica_group`]).

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::conventions::{DrainNote, ReplicaNote, STEP_LINE};
use crate::hop_tls::Fingerprint;

#[derive(Debug, Clone)]
pub enum Report {
    /// `scontrol update JobId=JOB Comment=NOTE`.
    Comment { scontrol: String, job: u32, slot: u16 },
    /// A line on standard output (per-node steps).
    Stdout { slot: u16 },
    /// Nowhere (a launcher started by hand, or in-process tests).
    Off,
}

/// Attempts at the comment before giving up: slurmctld may be busy. A
/// replica whose address never arrives is replaced by onepoold after its
/// startup timeout, like one that never became healthy.
const ATTEMPTS: u32 = 4;
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(15);

/// How hard to try writing the job's comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// Retry a busy slurmctld (the port, a server's end, a drain).
    Retry,
    /// Once, briefly: an immediate class's job is being killed and its
    /// GPUs are waited for; the launcher must not outlive the server for a
    /// record slurmctld may refuse for a job it has already ended.
    AtKill,
}

impl Patience {
    fn attempts(self) -> (u32, Duration) {
        match self {
            Patience::Retry => (ATTEMPTS, SCONTROL_TIMEOUT),
            Patience::AtKill => (1, Duration::from_secs(2)),
        }
    }
}

impl Report {
    /// The port, with the fingerprint of the certificate it serves (TLS).
    pub async fn listening(&self, note: &mut ReplicaNote, port: u16, pin: Option<Fingerprint>) {
        match self {
            Report::Comment { slot, .. } => {
                note.set_port(*slot, port);
                if let Some(pin) = pin {
                    note.set_pin(*slot, pin);
                }
                self.write_comment(note, Patience::Retry).await;
            }
            // One line, so the group writes the port and its pin together.
            Report::Stdout { slot } => match pin {
                Some(pin) => print_line(&format!("L{slot}={port};F{slot}={pin}")).await,
                None => print_line(&format!("L{slot}={port}")).await,
            },
            Report::Off => {}
        }
    }

    pub async fn ended(&self, note: &mut ReplicaNote, cause: &str) {
        match self {
            Report::Comment { slot, .. } => {
                note.set_ended(*slot, cause);
                self.write_comment(note, Patience::Retry).await;
            }
            Report::Stdout { slot } => {
                let mut one = ReplicaNote::default();
                one.set_ended(*slot, cause);
                // Only the entry: the group adds it to the job's note.
                let enc = one.encode();
                print_line(enc.strip_prefix("op1;").unwrap_or(&enc)).await
            }
            Report::Off => {}
        }
    }

    /// The drain's record (issue #26): where Slurm's accounting keeps it.
    pub async fn drained(&self, note: &mut ReplicaNote, drain: DrainNote, patience: Patience) {
        match self {
            Report::Comment { slot, .. } => {
                note.set_drained(*slot, drain);
                self.write_comment(note, patience).await;
            }
            Report::Stdout { slot } => print_line(&format!("D{slot}={}", drain.encode())).await,
            Report::Off => {}
        }
    }

    async fn write_comment(&self, note: &ReplicaNote, patience: Patience) {
        let Report::Comment { scontrol, job, .. } = self else { return };
        write_comment(scontrol, *job, note, patience).await;
    }
}

/// Writes `note` as job `job`'s comment, retrying a busy slurmctld.
pub async fn write_comment(scontrol: &str, job: u32, note: &ReplicaNote, patience: Patience) {
    let (id, comment) = (format!("JobId={job}"), format!("Comment={}", note.encode()));
    let (attempts, timeout) = patience.attempts();
    let mut wait = Duration::from_millis(500);
    for attempt in 1..=attempts {
        let out = Command::new(scontrol).args(["update", &id, &comment]).kill_on_drop(true).output();
        let why = match tokio::time::timeout(timeout, out).await {
            Ok(Ok(o)) if o.status.success() => return,
            Ok(Ok(o)) if job_is_over(&o.stderr) => {
                // No retry can write it: slurmctld ended the job (an
                // immediate reclaim's kill), and the launcher must not hold
                // the node retrying (3.5 s of retries held a protected job's
                // GPUs before this).
                tracing::warn!("job {job} has already ended: its comment cannot take the replica's note");
                return;
            }
            Ok(Ok(o)) => format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
            Ok(Err(e)) => format!("cannot run {scontrol}: {e}"),
            Err(_) => format!("no answer in {} s", timeout.as_secs()),
        };
        tracing::warn!(attempt, "writing the replica's note into job {job}'s comment failed: {why}");
        if attempt < attempts {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    tracing::error!("job {job}'s comment could not be written: onepoold will not find this replica's address");
}

/// Whether scontrol's error says the job is over (Slurm's
/// ESLURM_ALREADY_DONE, "Job has already finished", or a job slurmctld no
/// longer knows).
fn job_is_over(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr);
    text.contains("already finished") || text.contains("Invalid job id")
}

async fn print_line(entry: &str) {
    let mut out = tokio::io::stdout();
    let _ = out.write_all(format!("{STEP_LINE}{entry}\n").as_bytes()).await;
    let _ = out.flush().await;
}

/// The entry of a step's line, if `line` is one.
pub fn step_entry(line: &str) -> Option<&str> {
    line.strip_prefix(STEP_LINE).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in scontrol that counts its calls and fails as `stderr`.
    fn scontrol(dir: &std::path::Path, stderr: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("scontrol");
        let calls = dir.join("calls");
        std::fs::write(&path, format!("#!/bin/sh\necho x >> {}\necho '{stderr}' >&2\nexit 1\n", calls.display()))
            .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn calls(dir: &std::path::Path) -> usize {
        std::fs::read_to_string(dir.join("calls")).unwrap_or_default().lines().count()
    }

    #[tokio::test]
    async fn a_job_slurmctld_ended_is_not_retried_a_busy_slurmctld_is() {
        let dir = std::env::temp_dir().join(format!("onepool-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let note = ReplicaNote::default();
        let over = scontrol(&dir, "slurm_update error: Job has already finished");
        write_comment(&over, 7, &note, Patience::Retry).await;
        assert_eq!(calls(&dir), 1, "an ended job's comment is tried once");
        std::fs::remove_file(dir.join("calls")).unwrap();
        let busy = scontrol(&dir, "slurm_update error: Socket timed out on send/recv operation");
        write_comment(&busy, 7, &note, Patience::Retry).await;
        assert_eq!(calls(&dir), ATTEMPTS as usize, "a busy slurmctld is tried again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
