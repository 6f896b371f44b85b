//! The Slurm configuration that enforces a policy: slurm.conf settings,
//! one QOS per class, and (when GPUs are reserved) the flexible partition
//! with its capping QOS. Slurm itself then keeps the guarantees, whether or
//! not onepool's daemon runs. [`live`] compares it with a running cluster.

pub mod conf;
pub mod grant;
pub mod live;
pub mod qos;

pub use conf::{slurm_time, ConfLine, Item, Want};
pub use qos::{modify_command, shell_line, QosPreemptMode, QosSetting, QosSpec, SiteQos};

use crate::policy::Policy;

/// Everything `onepool policy render` prints, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub slurm_conf: Vec<ConfLine>,
    /// Class QOS in creation order (see [`qos::QosSpec`]).
    pub qos: Vec<QosSpec>,
    /// Present when the policy reserves GPUs.
    pub flexible_partition: Option<FlexiblePartition>,
    /// QOS of `manage_qos = false` classes: never created or changed, but
    /// they must exist.
    pub site_qos: Vec<SiteQos>,
    /// `pool.partitions`: they must exist.
    pub pool_partitions: Vec<String>,
    /// The pool's partitions other than the flexible one, each with the
    /// QOS allowed to run there; the site's PartitionName lines need them.
    pub partition_access: Vec<PartitionAccess>,
    /// onepoold's service user and its Slurm association.
    pub service: ServiceAccount,
}

/// The Slurm account and association of onepoold's service user, and
/// whether the policy lets it keep baseline replicas (a protected class
/// that entitles it by user or account).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub user: String,
    pub account: String,
    /// Protected classes the service user is entitled to.
    pub protected_classes: Vec<String>,
}

impl ServiceAccount {
    /// `sacctmgr` commands that create the account and the association.
    pub fn commands(&self) -> Vec<Vec<String>> {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        vec![
            w(&[
                "sacctmgr",
                "-i",
                "add",
                "account",
                &self.account,
                "Description=onepoold replicas",
                "Organization=onepool",
            ]),
            w(&["sacctmgr", "-i", "add", "user", &self.user, &format!("Account={}", self.account)]),
        ]
    }

    /// The commands for a person, under a comment saying why.
    pub fn text(&self) -> String {
        let commands: String = self.commands().iter().map(|c| format!("{}\n", shell_line(c))).collect();
        format!("# {}\n{commands}", self.why())
    }

    pub fn why(&self) -> String {
        let classes = if self.protected_classes.is_empty() {
            format!(
                "no protected class entitles it yet: add users = [\"{}\"] to the class of the endpoints' baseline replicas",
                self.user
            )
        } else {
            format!("the policy entitles it to {}", self.protected_classes.join(", "))
        };
        format!(
            "onepoold's service user {} submits and owns the replica jobs (so model servers never run as root); {classes}",
            self.user
        )
    }
}

/// Which QOS may run in one of the pool's partitions (`AllowQos`): only
/// onepool's class QOS, so a job moved there with any other QOS (by
/// `scontrol update`, or one the plugin never saw) stays pending instead of
/// taking the pool's GPUs; Slurm checks it whenever it schedules a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAccess {
    pub name: String,
    pub allow_qos: Vec<String>,
    pub why: String,
}

impl PartitionAccess {
    /// `scontrol update PartitionName=.. AllowQos=..`: in force at once,
    /// until slurmctld restarts and reads slurm.conf again.
    pub fn scontrol_command(&self) -> Vec<String> {
        vec![
            "scontrol".into(),
            "update".into(),
            format!("PartitionName={}", self.name),
            format!("AllowQos={}", self.allow_qos.join(",")),
        ]
    }

    /// The comment that tells an admin what to add to the site's line.
    pub fn instruction(&self) -> String {
        format!(
            "# partition {}: {}
#   add AllowQos={} to its PartitionName line; `{}` applies it until slurmctld restarts
",
            self.name,
            self.why,
            self.allow_qos.join(","),
            self.scontrol_command().join(" ")
        )
    }
}

/// The partition flexible jobs are routed to when GPUs are reserved: the
/// pool's nodes, capped by its partition QOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlexiblePartition {
    pub name: String,
    pub nodes: String,
    pub qos: QosSpec,
    /// The flexible classes' QOS: nothing else runs there.
    pub allow_qos: Vec<String>,
    pub why: String,
}

impl FlexiblePartition {
    pub fn line(&self) -> String {
        let allow =
            if self.allow_qos.is_empty() { String::new() } else { format!(" AllowQos={}", self.allow_qos.join(",")) };
        format!(
            "PartitionName={} Nodes={} QOS={}{allow} MaxTime=INFINITE State=UP",
            self.name, self.nodes, self.qos.name
        )
    }

    /// Its `AllowQos`, as for the site's partitions; `None` in audit mode.
    pub fn access(&self) -> Option<PartitionAccess> {
        (!self.allow_qos.is_empty()).then(|| PartitionAccess {
            name: self.name.clone(),
            allow_qos: self.allow_qos.clone(),
            why: self.why.clone(),
        })
    }
}

pub fn render(policy: &Policy) -> Rendered {
    let (qos, site_qos) = qos::class_qos(policy);
    let class_qos = |protected: bool| -> Vec<String> {
        policy.classes.iter().filter(|c| c.is_protected() == protected).map(|c| c.qos.clone()).collect()
    };
    let flexible_partition = match &policy.pool.flexible_partition {
        Some(name) if policy.reserved_gpus() > 0 => Some(FlexiblePartition {
            name: name.clone(),
            nodes: policy.pool.nodes.clone(),
            qos: qos::flexible_cap(policy, name),
            // In audit mode the plugin sets no class QOS: jobs keep the
            // site's, and AllowQos would hold every one of them back.
            allow_qos: if policy.pool.audit { Vec::new() } else { class_qos(false) },
            why: format!(
                "onepool's slurmctld plugin routes flexible jobs here; its partition QOS keeps them off the {} reserved GPUs, and only flexible classes' QOS run here",
                policy.reserved_gpus()
            ),
        }),
        _ => None,
    };
    // With a flexible partition, flexible jobs run only there (its QOS caps
    // them); a flexible job moved to another of the pool's partitions would
    // escape that cap, so those allow the protected classes alone.
    let (allow_qos, why) = match &flexible_partition {
        Some(fp) => (
            class_qos(true),
            format!("only protected classes run here (flexible ones run in {}, under its cap)", fp.name),
        ),
        None => {
            (policy.classes.iter().map(|c| c.qos.clone()).collect(), "only onepool's class QOS run here".to_string())
        }
    };
    let mut names: Vec<&String> = policy.pool.partitions.iter().collect();
    for p in policy.classes.iter().flat_map(|c| &c.match_partitions) {
        if !names.contains(&p) {
            names.push(p);
        }
    }
    let partition_access = names
        .into_iter()
        .filter(|_| !policy.pool.audit)
        .filter(|n| flexible_partition.as_ref().is_none_or(|fp| &fp.name != *n))
        .map(|n| PartitionAccess { name: n.clone(), allow_qos: allow_qos.clone(), why: why.clone() })
        .collect();
    let service = ServiceAccount {
        user: crate::policy::SERVICE_USER.to_string(),
        account: crate::policy::SERVICE_ACCOUNT.to_string(),
        protected_classes: policy
            .classes
            .iter()
            .filter(|c| c.is_protected())
            .filter(|c| {
                c.entitled.as_ref().is_some_and(|e| {
                    e.users.iter().any(|u| u == crate::policy::SERVICE_USER)
                        || e.accounts.iter().any(|a| a == crate::policy::SERVICE_ACCOUNT)
                })
            })
            .map(|c| c.name.clone())
            .collect(),
    };
    Rendered {
        slurm_conf: conf::lines(policy),
        qos,
        flexible_partition,
        site_qos,
        pool_partitions: policy.pool.partitions.clone(),
        partition_access,
        service,
    }
}

impl Rendered {
    /// Class QOS, then the flexible partition's QOS.
    pub fn all_qos(&self) -> impl Iterator<Item = &QosSpec> {
        self.qos.iter().chain(self.flexible_partition.as_ref().map(|p| &p.qos))
    }

    /// The slurm.conf fragment (meant to be `Include`d), each setting under
    /// a comment saying why it is needed.
    pub fn slurm_conf_text(&self) -> String {
        let mut out = String::new();
        for line in &self.slurm_conf {
            out.push_str(&format!("# {}\n{}={}\n", line.why, line.key, line.value));
        }
        if let Some(p) = &self.flexible_partition {
            out.push_str(&format!("# {}\n{}\n", p.why, p.line()));
        }
        for a in &self.partition_access {
            out.push_str(&a.instruction());
        }
        out
    }

    /// `sacctmgr -i add qos ...` argument lists, in an order that works.
    pub fn sacctmgr_commands(&self) -> Vec<Vec<String>> {
        self.all_qos().map(QosSpec::add_command).collect()
    }

    /// The class QOS added to the root account's list, so that the jobs
    /// given them are not refused (see [`grant`]).
    pub fn root_grant(&self) -> grant::Grant {
        grant::Grant { to: grant::Association::root(), qos: grant::job_qos(self.all_qos()) }
    }

    /// The same commands for a person: one a line, each under a comment;
    /// then the grant of the class QOS and onepoold's service account.
    pub fn sacctmgr_text(&self) -> String {
        let mut out = String::new();
        for q in self.all_qos() {
            out.push_str(&format!("# {}\n{}\n", q.why, shell_line(&q.add_command())));
        }
        out.push_str(&self.root_grant().text());
        out.push_str(&self.service.text());
        out
    }
}

#[cfg(test)]
mod tests;
