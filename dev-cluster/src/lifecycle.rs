//! A dev cluster's life: brought up (its hosts, configuration, plugins,
//! policy and daemons), restarted, asked its state, taken down.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::error::{Error, IoContext, Result};
use crate::options::UpOptions;
use crate::spec::Spec;
use crate::{hosts, layout, process, services, templates, Cluster};

impl Cluster {
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
}
