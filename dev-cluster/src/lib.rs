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

mod policy_conf;
mod services;
pub use services::HaLock;

pub use error::{Error, Result};
pub use layout::Layout;
pub use spec::Spec;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use error::IoContext;

/// Options for `up`.
#[derive(Clone, Debug)]
pub struct UpOptions {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Folder holding `libjob_submit_onepool.so` and `libspank_onepool.so`
    /// (cargo's output folder). `None`: do not install plugins.
    pub plugin_source: Option<PathBuf>,
    /// Install missing Debian packages with apt-get (needs root).
    pub install_packages: bool,
    /// Policy file to run with (default: the shipped sample, etc/onepool.toml).
    pub policy: Option<PathBuf>,
    /// Replaces the JobSubmitPlugins list (`""`: none), e.g. to compare
    /// plugins in a benchmark. `None`: the site's list merged with onepool.
    pub job_submit_plugins: Option<String>,
    /// The site's job_submit.lua (default: etc/dev-cluster/job_submit.lua).
    pub job_submit_lua: Option<PathBuf>,
    /// slurm.conf lines that replace the template's settings of the same
    /// keys (e.g. `MinJobAge=5` for a benchmark that submits many jobs).
    pub site_conf: Option<PathBuf>,
    /// The site before onepool: slurm.conf's onepool Include and
    /// plugstack.conf empty, no QOS from the policy, no plugins copied. The
    /// starting point of the deployment runbook's test (docs/deploy.md):
    /// from there only the runbook's own commands configure onepool.
    pub before_onepool: bool,
    /// Processes tracked and devices constrained by cgroup, as production
    /// nodes run (`ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup`,
    /// `ConstrainDevices=yes`), on the machine's cgroup v1 hierarchies
    /// ([`cgroups`]). Fails with what the machine lacks where it cannot.
    pub cgroup: bool,
    /// Each node, a head host (slurmctld, slurmdbd, MariaDB), a service
    /// host and a client host in network namespaces of their own, on one
    /// bridge ([`hosts`]). The single-namespace mode is faster to start.
    pub hosts: bool,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            nodes: 4,
            gpus_per_node: 4,
            plugin_source: None,
            install_packages: true,
            policy: None,
            job_submit_plugins: None,
            job_submit_lua: None,
            site_conf: None,
            before_onepool: false,
            cgroup: false,
            hosts: false,
        }
    }
}

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

    /// Where onepoold's `[ha]` lock is on this cluster: its MariaDB, over
    /// TLS (docs/ha.md).
    pub fn ha_lock(&self) -> Result<services::HaLock> {
        Ok(services::ha_lock(&self.layout, &self.spec()?))
    }

    pub fn spec(&self) -> Result<Spec> {
        Spec::load(&self.layout.cluster_json())?
            .ok_or_else(|| Error::Setup(format!("no cluster in {} (run `up` first)", self.layout.root.display())))
    }

    /// Brings every service up (idempotent: running ones are kept unless the
    /// plugins changed, which restarts the Slurm daemons that load them) and
    /// waits until every node is idle.
    pub fn up(&self, opts: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<Spec> {
        let _lock = self.lock()?;
        if opts.hosts && opts.cgroup {
            // `ip netns exec` mounts a sysfs of its own, without the cgroup
            // v1 hierarchies the cgroup mode's slurmd needs.
            return Err(Error::Setup("--hosts and --cgroup do not go together".into()));
        }
        services::ensure_packages(opts.install_packages, progress)?;
        for d in self.layout.all_dirs() {
            fs::create_dir_all(&d).ctx(|| format!("creating {}", d.display()))?;
        }
        // munged insists on a 0755 socket folder.
        fs::set_permissions(self.layout.munge_dir(), fs::Permissions::from_mode(0o755))
            .ctx(|| "chmod munge dir".into())?;
        let spec = Spec::load_or_create(&self.layout, opts)?;
        if let Some(net) = &spec.hosts {
            let made = hosts::ensure(net, spec.nodes, progress)?;
            services::stop_rewired(&self.layout, &made, progress);
        }
        let policy = self.install_policy(opts)?;
        let configs_changed = services::write_configs(&self.layout, &spec, &policy, opts)?;
        services::make_gpu_devices(&self.layout, &spec)?;
        let plugins_changed = match &opts.plugin_source {
            Some(src) if !opts.before_onepool => services::install_plugins(&self.layout, src)?,
            _ => false,
        };
        let policy = (!opts.before_onepool).then_some(&policy);
        services::start_all(self, &spec, policy, plugins_changed || configs_changed, progress)?;
        Ok(spec)
    }

    /// Checks the policy and puts it beside slurm.conf, where the plugin
    /// reads it (and re-reads it when it changes).
    fn install_policy(&self, opts: &UpOptions) -> Result<onepool_decisions::policy::Policy> {
        let (name, text) = match &opts.policy {
            Some(p) => (layout::display(p), fs::read_to_string(p).ctx(|| format!("reading {}", p.display()))?),
            None => ("etc/onepool.toml".to_string(), templates::POLICY.to_string()),
        };
        let loaded = onepool_decisions::policy::load(&text);
        let Some(policy) = loaded.policy.clone() else {
            return Err(Error::Setup(format!("the policy has errors:\n{}", loaded.render(&name, &text).join("\n"))));
        };
        let dest = self.layout.policy();
        if fs::read_to_string(&dest).ok().as_deref() != Some(text.as_str()) {
            fs::write(&dest, &text).ctx(|| format!("writing {}", dest.display()))?;
        }
        Ok(policy)
    }

    /// Stops slurmctld and starts it again on the configuration files as they
    /// are (an admin's edits included: nothing is rewritten), as
    /// `systemctl restart slurmctld` would, and waits until it answers.
    pub fn restart_slurmctld(&self, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let _lock = self.lock()?;
        services::restart_slurmctld(self, progress)
    }

    /// Stops every process this cluster started (and the job steps its
    /// slurmd spawned), by recorded PID and start time.
    pub fn down(&self, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let _lock = self.lock()?;
        services::stop_all(self, progress)?;
        if let Some(spec) = Spec::load(&self.layout.cluster_json())? {
            if let Some(net) = &spec.hosts {
                hosts::remove(net, spec.nodes, progress)?;
            }
        }
        Ok(())
    }

    /// The hosts mode's network, `None` in the single-namespace mode (or
    /// before the first `up`).
    pub fn hosts(&self) -> Option<hosts::HostsNet> {
        self.spec().ok()?.hosts
    }

    /// One line per service: name, running or not, PID.
    pub fn status(&self) -> Vec<(String, Option<i32>)> {
        services::service_names(self.spec().ok().as_ref())
            .into_iter()
            .map(|name| {
                let pid = process::Tracked::read(&self.layout.pid_file(&name)).filter(|t| t.alive()).map(|t| t.pid);
                (name, pid)
            })
            .collect()
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
