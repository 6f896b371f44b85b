//! Slurm's commands and the user database, as the demo runs them.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

/// A Slurm client command (SLURM_CONF is in this process's environment).
pub(crate) fn slurm(program: &str, args: &[&str]) -> anyhow::Result<String> {
    onepool_slurm_commands::run(Command::new(program).args(args), Duration::from_secs(30))
        .with_context(|| format!("{program} {}", args.join(" ")))
}

pub(crate) fn uid_of(user: &str) -> Option<u32> {
    id_of(user, "-u")
}

pub(crate) fn gid_of(user: &str) -> Option<u32> {
    id_of(user, "-g")
}

pub(crate) fn id_of(user: &str, which: &str) -> Option<u32> {
    let out = Command::new("id").args([which, user]).stderr(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|_| out.status.success())
}

/// `squeue -h -j JOB -o %T`: the job's state, `None` once it left the queue.
pub(crate) fn job_state(job: u32) -> Option<String> {
    let out = slurm("squeue", &["-h", "-j", &job.to_string(), "-o", "%T"]).ok()?;
    Some(out.trim().to_string()).filter(|s| !s.is_empty())
}
