//! The policy file (`/etc/slurm/onepool.toml`): model, loading and checks.

pub mod diag;
pub mod load;
pub mod model;

pub use diag::{Diagnostic, Severity};
pub use load::{load, Loaded};
pub use model::{Capacity, Class, Entitlement, Policy, Pool, Tier, TimeLimitRule};

/// Where slurmctld's plugin and the tools look for the policy by default.
pub const DEFAULT_PATH: &str = "/etc/slurm/onepool.toml";
/// Environment variable that overrides [`DEFAULT_PATH`].
pub const PATH_ENV: &str = "ONEPOOL_POLICY";
/// Where the plugin and onepoold find the policy: `env` (the value of
/// [`PATH_ENV`]), else `onepool.toml` beside slurm.conf, else
/// [`DEFAULT_PATH`].
pub fn locate(env: Option<std::ffi::OsString>, slurm_conf: Option<&std::path::Path>) -> std::path::PathBuf {
    if let Some(p) = env {
        return p.into();
    }
    match slurm_conf.and_then(std::path::Path::parent) {
        Some(dir) => dir.join("onepool.toml"),
        None => DEFAULT_PATH.into(),
    }
}

/// Partition QOS of the flexible partition (see `render`); no class may use it.
pub const FLEXIBLE_CAP_QOS: &str = "onepool-flexible-cap";

/// The unprivileged user onepoold runs as (etc/systemd/onepoold.service):
/// it submits, owns and cancels the replica jobs, so model servers run as
/// it too, never as root. Its Slurm account has the same name.
pub const SERVICE_USER: &str = "onepool";
pub const SERVICE_ACCOUNT: &str = "onepool";

#[cfg(test)]
mod locate_tests {
    use super::*;
    use std::path::{Path, PathBuf};

    #[test]
    fn the_environment_wins_then_beside_slurm_conf_then_the_default() {
        let conf = Some(Path::new("/etc/slurm-x/slurm.conf"));
        assert_eq!(locate(Some("/p.toml".into()), conf), PathBuf::from("/p.toml"));
        assert_eq!(locate(None, conf), PathBuf::from("/etc/slurm-x/onepool.toml"));
        assert_eq!(locate(None, None), PathBuf::from(DEFAULT_PATH));
    }
}
