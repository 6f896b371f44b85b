//! A real Slurm cluster in one folder: munged, MariaDB, slurmdbd, slurmctld
//! and N slurmd (each with fake GPU device nodes), all on loopback, with
//! onepool's plugins copied in from the build output.
//!
//! Used by the `onepool-devcluster` binary and by the integration tests,
//! which bring one cluster up per test run (or reuse one that is up).

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

pub mod capture;
pub mod cgroups;
pub mod error;
pub mod hosts;
pub mod layout;
pub mod model_server;
pub mod onepoold;
pub mod process;
pub mod spec;
pub mod templates;
pub mod throttle;

mod lifecycle;
mod options;
mod policy_conf;
mod services;
pub use services::HaLock;

pub use error::{Error, Result};
pub use layout::Layout;
pub use options::UpOptions;
pub use spec::Spec;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use error::IoContext;

/// One cluster, identified by its state folder.
pub struct Cluster {
    pub layout: Layout,
}

/// The plugins the project builds, as (cargo's file name, Slurm's file name).
pub const PLUGINS: &[(&str, &str)] =
    &[("libjob_submit_onepool.so", "job_submit_onepool.so"), ("libspank_onepool.so", "spank_onepool.so")];

impl Cluster {
    pub fn at(dir: impl AsRef<Path>) -> Result<Cluster> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        let root = dir.canonicalize().ctx(|| format!("resolving {}", dir.display()))?;
        Ok(Cluster { layout: Layout::new(root) })
    }

    /// The variables a shell needs to talk to this cluster.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".into(), layout::display(&self.layout.slurm_conf()))]
    }

    /// A command for a Slurm client tool pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        for (k, v) in self.env() {
            c.env(k, v);
        }
        c
    }

    /// Runs a Slurm client tool against this cluster and returns its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        process::run(self.command(program).args(args), Duration::from_secs(60))
    }

    /// An exclusive lock on the folder: concurrent `up`s (e.g. from test
    /// processes) run one after the other instead of racing.
    fn lock(&self) -> Result<FolderLock> {
        FolderLock::take(&self.layout.lock_file())
    }
}

/// The folder's lock, held while the value lives (the kernel lets go if the
/// process dies).
struct FolderLock(#[allow(dead_code, reason = "held for its Drop")] onepool_os::Locked);

impl FolderLock {
    fn take(path: &Path) -> Result<FolderLock> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ctx(|| format!("opening {}", path.display()))?;
        let locked = onepool_os::Locked::exclusive(f)
            .map_err(|source| Error::Io { what: format!("locking {}", path.display()), source })?;
        Ok(FolderLock(locked))
    }
}
