//! The policy in force, swapped atomically by the watcher thread and read
//! (one `Arc` clone under a read lock) on the submit path.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use onepool_decisions::policy::{self, Policy};

use crate::nss::Snapshot;

pub struct Active {
    pub policy: Policy,
    pub directory: Snapshot,
}

static ACTIVE: RwLock<Option<Arc<Active>>> = RwLock::new(None);

pub fn get() -> Option<Arc<Active>> {
    ACTIVE.read().unwrap_or_else(|p| p.into_inner()).clone()
}

pub fn set(a: Option<Active>) {
    *ACTIVE.write().unwrap_or_else(|p| p.into_inner()) = a.map(Arc::new);
}

/// `$ONEPOOL_POLICY`, else `onepool.toml` beside `$SLURM_CONF`, else
/// /etc/slurm/onepool.toml.
pub fn policy_path() -> PathBuf {
    let conf = std::env::var_os("SLURM_CONF").map(PathBuf::from);
    policy::locate(std::env::var_os(policy::PATH_ENV), conf.as_deref())
}

/// Reads and checks the policy file; `Err` carries every diagnostic line.
pub fn load_file(path: &Path) -> Result<(Policy, Vec<String>), Vec<String>> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{shown}: cannot read the policy: {e}")])?;
    let loaded = policy::load(&text);
    let lines = loaded.render(&shown, &text);
    match loaded.policy {
        Some(p) => Ok((p, lines)),
        None => Err(lines),
    }
}

/// Loads the policy at `path` and puts it in force with a fresh user/group
/// snapshot, logging warnings and unresolved names; returns a one-line
/// summary. On errors every diagnostic is logged and nothing changes.
pub fn load_and_install(path: &Path) -> Result<String, ()> {
    use slurm_sys::log;

    use crate::PLUGIN;
    match load_file(path) {
        Ok((policy, warnings)) => {
            for w in warnings {
                log::info(&format!("{PLUGIN}: {w}"));
            }
            let directory = Snapshot::resolve(&policy);
            for u in &directory.unresolved {
                log::error(&format!("{PLUGIN}: policy names {u}, which does not resolve on this host"));
            }
            let summary = format!(
                "{} classes, {} GPUs, {} reserved{}",
                policy.classes.len(),
                policy.pool.total_gpus,
                policy.reserved_gpus(),
                if policy.pool.audit { ", audit mode: nothing is changed or refused" } else { "" }
            );
            set(Some(Active { policy, directory }));
            Ok(summary)
        }
        Err(lines) => {
            for l in &lines {
                log::error(&format!("{PLUGIN}: {l}"));
            }
            Err(())
        }
    }
}
