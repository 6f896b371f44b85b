//! The other user of the pool (an ordinary cluster user whose job the
//! demo shows onepoold leaving alone) and the demo's own jobs.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::commands::{slurm, uid_of};
use crate::settings::{ABORT, ENDPOINT, OTHER_ACCOUNT, OTHER_JOB, OTHER_USER, TRAINING_JOB};

/// The demo's jobs still in the queue: onepoold's replicas of the demo
/// endpoint (the service user's), the training job (ours), the other
/// user's job.
pub(crate) fn demo_jobs(uid: u32, service_uid: u32) -> anyhow::Result<Vec<u32>> {
    let other = uid_of(OTHER_USER);
    let q = slurm("squeue", &["-h", "-o", "%i|%j|%U"])?;
    Ok(q.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            let (id, name, owner) = (f.first()?.parse::<u32>().ok()?, *f.get(1)?, f.get(2)?.parse::<u32>().ok()?);
            let replica =
                owner == service_uid && onepool_launcher::conventions::port_from_name(ENDPOINT, name).is_some();
            let ours = replica || (owner == uid && name == TRAINING_JOB) || (Some(owner) == other && name == OTHER_JOB);
            ours.then_some(id)
        })
        .collect())
}

/// Cancels the demo's jobs and waits (up to 30 s) until they left the queue.
pub(crate) fn cancel_demo_jobs(uid: u32, service_uid: u32) -> anyhow::Result<usize> {
    let jobs = demo_jobs(uid, service_uid)?;
    if jobs.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = jobs.iter().map(u32::to_string).collect();
    let mut args = vec!["--quiet"];
    args.extend(ids.iter().map(String::as_str));
    // scancel fails for a job that ended meanwhile; what is left is checked below.
    let _ = slurm("scancel", &args);
    let t = Instant::now();
    loop {
        let left = demo_jobs(uid, service_uid)?;
        if left.is_empty() {
            return Ok(jobs.len());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("jobs {left:?} are still in the queue 30 s after scancel");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The other user (created like the integration tests create theirs) and
/// their Slurm association.
pub(crate) fn ensure_other_user() -> anyhow::Result<()> {
    if uid_of(OTHER_USER).is_none() {
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", OTHER_USER])
            .output()
            .context("useradd")?;
        // 9: created meanwhile.
        if !out.status.success() && out.status.code() != Some(9) {
            bail!("useradd {OTHER_USER}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    let accounts = slurm("sacctmgr", &["-n", "-P", "show", "account", "format=account"])?;
    if !accounts.lines().any(|a| a.trim() == OTHER_ACCOUNT) {
        slurm("sacctmgr", &["-i", "add", "account", OTHER_ACCOUNT, "Description=demo", "Organization=demo"])?;
    }
    let assocs = slurm("sacctmgr", &["-n", "-P", "show", "assoc", "format=account,user"])?;
    if !assocs.lines().any(|l| l.trim() == format!("{OTHER_ACCOUNT}|{OTHER_USER}")) {
        slurm("sacctmgr", &["-i", "add", "user", OTHER_USER, &format!("Account={OTHER_ACCOUNT}")])?;
    }
    Ok(())
}

/// sbatch as the other user; slurmctld may need a moment to learn a new
/// association from slurmdbd, so a refusal is retried for 15 s.
pub(crate) fn submit_as_other_user(slurm_conf: &str, args: &[&str]) -> anyhow::Result<u32> {
    let t = Instant::now();
    loop {
        let out = Command::new("runuser")
            .args(["-u", OTHER_USER, "--", "env", &format!("SLURM_CONF={slurm_conf}"), "sbatch", "--parsable"])
            .args(args)
            .current_dir("/tmp")
            .output()
            .context("runuser sbatch")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            return stdout
                .trim()
                .split(';')
                .next()
                .and_then(|s| s.parse().ok())
                .with_context(|| format!("sbatch printed {stdout:?}, not a job id"));
        }
        if t.elapsed() > Duration::from_secs(15) || ABORT.load(Ordering::SeqCst) {
            bail!("sbatch as {OTHER_USER}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
