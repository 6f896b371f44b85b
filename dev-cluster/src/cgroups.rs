//! The dev cluster's cgroup mode (issue #24): processes tracked and GPU
//! devices constrained by cgroup, as production nodes run, so that the
//! GPU hand-off check's proof by cgroup path and Slurm's device isolation
//! are tested for real.
//!
//! What was measured on the machines this project runs on (a VM kernel,
//! 6.x): cgroup v1 hierarchies for cpu, cpuacct, cpuset, memory, devices,
//! freezer, blkio and pids under /sys/fs/cgroup, and a cgroup2 hierarchy at
//! /sys/fs/cgroup/unified with no controller but hugetlb. Slurm's cgroup/v2
//! plugin needs the controllers in the unified hierarchy, so it cannot run
//! here; cgroup/v1 (22.05, and still shipped by 24.11 and 26.05) can, with
//! several slurmd on one host (paths `/slurm_<node>/uid_U/job_J/step_S`).

use crate::error::{Error, Result};

/// What `cgroup.conf` says in this mode.
pub const CGROUP_CONF: &str = "\
# Written by `onepool-devcluster up --cgroup`: cgroup v1 (the unified
# hierarchy of this machine holds no controller Slurm needs).
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainDevices=yes
";

/// slurm.conf settings in this mode (replacing the template's).
pub const SLURM_SETTINGS: &str = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n";

/// The controllers proctrack/cgroup (freezer) and task/cgroup's
/// ConstrainDevices (devices) need.
const NEEDED: [&str; 2] = ["freezer", "devices"];

/// Whether this machine can host the mode, from `/proc/mounts`: each
/// needed controller on a cgroup v1 hierarchy. The error names what is
/// missing and what is mounted.
pub fn check_host(mounts: &str) -> Result<()> {
    let v1: Vec<Vec<&str>> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup").then(|| f[3].split(',').collect())
        })
        .collect();
    let missing: Vec<&str> = NEEDED.iter().copied().filter(|c| !v1.iter().any(|opts| opts.contains(c))).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mounted: Vec<String> = mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(2).is_some_and(|t| t.starts_with("cgroup")))
        .map(|l| l.split_whitespace().take(4).skip(1).collect::<Vec<_>>().join(" "))
        .collect();
    Err(Error::Setup(format!(
        "the cgroup mode needs cgroup v1 hierarchies with the {} controller(s) (Slurm's cgroup/v1; cgroup/v2 needs them in \
         the unified hierarchy); this machine mounts: {}",
        missing.join(" and "),
        if mounted.is_empty() { "no cgroup file system".to_string() } else { mounted.join("; ") }
    )))
}

/// [`check_host`] on this machine.
pub fn check_this_host() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/mounts").map_err(|e| Error::Setup(format!("reading /proc/mounts: {e}")))?;
    check_host(&mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_freezer_and_devices_are_needed_and_what_is_mounted_is_named() {
        let here = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0\n\
                    cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert!(check_host(here).is_ok());
        let unified_only = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        let e = check_host(unified_only).unwrap_err().to_string();
        assert!(
            e.contains("freezer and devices controller(s)") && e.contains("/sys/fs/cgroup cgroup2 rw,nsdelegate"),
            "{e}"
        );
        let no_devices = "cgroup /sys/fs/cgroup/freezer cgroup rw,freezer 0 0\n";
        assert!(check_host(no_devices).unwrap_err().to_string().contains("the devices controller(s)"));
    }
}
