//! Slower nodes on demand (issue #35): with `ONEPOOL_NODE_CPU_PERCENT=P`
//! every slurmd of the cluster, and so every job step and model server it
//! starts, shares P percent of one core (a cgroup's CPU quota: cgroup v1
//! `cpu.cfs_quota_us`, or cgroup v2 `cpu.max`). A timing assumption that
//! holds only on a fast machine then fails here, in CI, instead of on a
//! newcomer's slower one. slurmctld, slurmdbd and onepoold keep the whole
//! machine: it is the nodes that are slow.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable that asks for it.
pub const ENV: &str = "ONEPOOL_NODE_CPU_PERCENT";

/// The cgroup quota's period: 100 ms, the kernel's default.
const PERIOD_US: u64 = 100_000;

/// `P` from [`ENV`]: a whole percent of one core, 1 to 10000; `None` when
/// unset or empty.
pub fn percent_from_env() -> Result<Option<u32>> {
    let Ok(v) = std::env::var(ENV) else { return Ok(None) };
    if v.trim().is_empty() {
        return Ok(None);
    }
    match v.trim().parse::<u32>() {
        Ok(p) if (1..=10_000).contains(&p) => Ok(Some(p)),
        _ => Err(Error::Setup(format!("{ENV}={v:?}: a whole percent of one core, 1 to 10000, was expected"))),
    }
}

/// The cgroup the nodes of the cluster rooted at `root` share, made with
/// its quota if it is not there: one per cluster, named after its folder.
pub fn node_cgroup(root: &Path, percent: u32) -> Result<PathBuf> {
    let name = format!("onepool-nodes-{}", cluster_tag(root));
    let quota = u64::from(percent) * PERIOD_US / 100;
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    let (dir, files) = if v1.join("cpu.cfs_quota_us").exists() {
        let dir = v1.join(&name);
        (dir, vec![("cpu.cfs_period_us", PERIOD_US.to_string()), ("cpu.cfs_quota_us", quota.to_string())])
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        // cgroup v2: the cpu controller must be on for the children.
        let _ = fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
        (Path::new("/sys/fs/cgroup").join(&name), vec![("cpu.max", format!("{quota} {PERIOD_US}"))])
    } else {
        return Err(Error::Setup(format!(
            "{ENV} asks for a CPU quota, but this machine has neither cgroup v1's cpu controller at {} nor cgroup v2 \
             at /sys/fs/cgroup",
            v1.display()
        )));
    };
    fs::create_dir_all(&dir).map_err(|e| Error::Setup(format!("creating the cgroup {}: {e}", dir.display())))?;
    for (file, value) in files {
        let path = dir.join(file);
        fs::write(&path, &value).map_err(|e| Error::Setup(format!("writing {value} to {}: {e}", path.display())))?;
    }
    Ok(dir)
}

/// Moves `pid` into `cgroup`; what it starts afterwards is born there.
pub fn join(cgroup: &Path, pid: i32) -> Result<()> {
    let procs = cgroup.join("cgroup.procs");
    fs::write(&procs, pid.to_string()).map_err(|e| Error::Setup(format!("moving {pid} to {}: {e}", procs.display())))
}

/// A short name for the cluster's folder, stable across runs.
fn cluster_tag(root: &Path) -> String {
    // FNV-1a: a name, not a secret.
    let mut h: u32 = 0x811c_9dc5;
    for b in root.as_os_str().as_encoded_bytes() {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percent_is_checked_and_the_name_is_the_folder_s() {
        // One test touches the variable: tests run in threads of one process.
        std::env::set_var(ENV, "50");
        assert_eq!(percent_from_env().unwrap(), Some(50));
        for bad in ["0", "fast", "10001", "-5"] {
            std::env::set_var(ENV, bad);
            let e = percent_from_env().unwrap_err().to_string();
            assert!(e.contains(ENV) && e.contains(bad), "{e}");
        }
        std::env::set_var(ENV, "");
        assert_eq!(percent_from_env().unwrap(), None);
        std::env::remove_var(ENV);
        assert_eq!(percent_from_env().unwrap(), None);
        assert_eq!(cluster_tag(Path::new("/a")), cluster_tag(Path::new("/a")));
        assert_ne!(cluster_tag(Path::new("/a")), cluster_tag(Path::new("/b")));
    }
}
