//! What bringing a dev cluster up is asked: its size and hosts, the policy,
//! the plugins, the packages.

use std::path::PathBuf;

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
