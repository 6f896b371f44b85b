//! The Slurm configuration that enforces a policy: slurm.conf settings,
//! one QOS per class, and (when GPUs are reserved) the flexible partition
//! with its capping QOS. Slurm itself then keeps the guarantees, whether or
//! not onepool's daemon runs. [`live`] compares it with a running cluster.

pub mod conf;
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
}

/// The partition flexible jobs are routed to when GPUs are reserved: the
/// pool's nodes, capped by its partition QOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlexiblePartition {
    pub name: String,
    pub nodes: String,
    pub qos: QosSpec,
    pub why: String,
}

impl FlexiblePartition {
    pub fn line(&self) -> String {
        format!("PartitionName={} Nodes={} QOS={} MaxTime=INFINITE State=UP", self.name, self.nodes, self.qos.name)
    }
}

pub fn render(policy: &Policy) -> Rendered {
    let (qos, site_qos) = qos::class_qos(policy);
    let flexible_partition = match &policy.pool.flexible_partition {
        Some(name) if policy.reserved_gpus() > 0 => Some(FlexiblePartition {
            name: name.clone(),
            nodes: policy.pool.nodes.clone(),
            qos: qos::flexible_cap(policy, name),
            why: format!(
                "onepool's slurmctld plugin routes flexible jobs here; its partition QOS keeps them off the {} reserved GPUs",
                policy.reserved_gpus()
            ),
        }),
        _ => None,
    };
    Rendered {
        slurm_conf: conf::lines(policy),
        qos,
        flexible_partition,
        site_qos,
        pool_partitions: policy.pool.partitions.clone(),
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
        out
    }

    /// `sacctmgr -i add qos ...` argument lists, in an order that works.
    pub fn sacctmgr_commands(&self) -> Vec<Vec<String>> {
        self.all_qos().map(QosSpec::add_command).collect()
    }

    /// The same commands for a person: one a line, each under a comment.
    pub fn sacctmgr_text(&self) -> String {
        let mut out = String::new();
        for q in self.all_qos() {
            out.push_str(&format!("# {}\n{}\n", q.why, shell_line(&q.add_command())));
        }
        out
    }
}

#[cfg(test)]
mod tests;
