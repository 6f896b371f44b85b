//! The validated policy: what every consumer (slurmctld plugin, renderer,
//! daemon, simulator) works from. Built only by [`super::load`], so every
//! value here has passed the checks there.

use std::time::Duration;

use crate::annotation::ReclaimMode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub pool: Pool,
    /// Protected classes first (by name), then flexible ones by rank.
    pub classes: Vec<Class>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub partitions: Vec<String>,
    pub gpu_types: Vec<String>,
    pub total_gpus: u32,
    /// GPUs of the pool's largest node: what Slurm gives an `--exclusive`
    /// job on each of its nodes, whatever it asked for. `None`: such a job
    /// is counted as it asks.
    pub gpus_per_node: Option<u32>,
    pub default_class: String,
    pub min_runtime_before_reclaim: Duration,
    /// Where flexible jobs are routed when some capacity is reserved.
    pub flexible_partition: Option<String>,
    /// Node list of the flexible partition (Slurm syntax; "ALL" by default).
    pub nodes: String,
    pub audit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    pub tier: Tier,
    pub qos: String,
    /// false: the site owns this QOS; render never creates or changes it.
    pub manage_qos: bool,
    /// Jobs submitted to these partitions (without an annotation or class
    /// QOS) belong to this class.
    pub match_partitions: Vec<String>,
    pub description: String,
    /// `None`: everyone may use the class.
    pub entitled: Option<Entitlement>,
    pub max_gpus_per_job: Option<u32>,
    pub time_limit: TimeLimitRule,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tier {
    Protected { capacity: Capacity },
    Flexible { rank: u32, reclaim: ReclaimMode, drain_timeout: Duration, grace_time: Duration },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Flexible work may borrow these and is preempted when the owner needs them.
    pub lendable: u32,
    /// Flexible work never holds these.
    pub reserved: u32,
}

impl Capacity {
    pub fn total(&self) -> u32 {
        self.lendable + self.reserved
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entitlement {
    pub accounts: Vec<String>,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

impl Entitlement {
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, list) in [("accounts", &self.accounts), ("users", &self.users), ("groups", &self.groups)] {
            if !list.is_empty() {
                parts.push(format!("{what} {}", list.join(", ")));
            }
        }
        if parts.is_empty() {
            "nobody".into()
        } else {
            parts.join("; ")
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimeLimitRule {
    pub required: bool,
    pub default: Option<Duration>,
    pub max: Option<Duration>,
}

impl Class {
    pub fn is_protected(&self) -> bool {
        matches!(self.tier, Tier::Protected { .. })
    }
    pub fn rank(&self) -> Option<u32> {
        match self.tier {
            Tier::Flexible { rank, .. } => Some(rank),
            Tier::Protected { .. } => None,
        }
    }
    pub fn reclaim(&self) -> Option<ReclaimMode> {
        match self.tier {
            Tier::Flexible { reclaim, .. } => Some(reclaim),
            Tier::Protected { .. } => None,
        }
    }
}

impl Policy {
    pub fn class(&self, name: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.name == name)
    }
    /// Slurm finds QOS by name without case (`QOS=OP-TRAINING` is
    /// op-training), so this does too.
    pub fn class_by_qos(&self, qos: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.qos.eq_ignore_ascii_case(qos))
    }
    pub fn class_by_partition(&self, partition: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.match_partitions.iter().any(|p| p == partition))
    }
    pub fn class_names(&self) -> Vec<&str> {
        self.classes.iter().map(|c| c.name.as_str()).collect()
    }
    /// The class warm replicas (issue #18) may run in: it must be the
    /// cheapest work in the pool, flexible and outranked by every other
    /// flexible class. A class ranked below it could never preempt a warm
    /// replica and would wait behind it for as long as nobody else needed
    /// the GPUs. The error says what is wrong and how to fix it, without
    /// where (onepoold's config and the simulator's scenario each add
    /// their key).
    pub fn warm_class(&self, name: &str) -> Result<&Class, String> {
        let Some(c) = self.class(name) else {
            return Err(format!(
                "{name:?} is not a class of the policy (classes: {}); add a flexible class ranked below every other, e.g. [classes.inference-warm] tier = \"flexible\", rank = <the highest>, reclaim = \"graceful\"",
                self.class_names().join(", ")
            ));
        };
        let Some(rank) = c.rank() else {
            return Err(format!(
                "{name:?} is a protected class; warm replicas must be the first work Slurm takes back (a flexible class ranked below every other)"
            ));
        };
        let below: Vec<&str> = self
            .classes
            .iter()
            .filter(|o| o.name != c.name && o.rank().is_some_and(|r| r >= rank))
            .map(|o| o.name.as_str())
            .collect();
        if !below.is_empty() {
            return Err(format!(
                "{name:?} (rank {rank}) is not ranked below flexible class(es) {}: their jobs could not take a warm replica's GPUs; give {name} the highest rank number",
                below.join(", ")
            ));
        }
        Ok(c)
    }
    pub fn reserved_gpus(&self) -> u32 {
        self.classes
            .iter()
            .map(|c| match &c.tier {
                Tier::Protected { capacity } => capacity.reserved,
                Tier::Flexible { .. } => 0,
            })
            .sum()
    }
    /// GPUs flexible work may hold at once.
    pub fn flexible_cap(&self) -> u32 {
        self.pool.total_gpus.saturating_sub(self.reserved_gpus())
    }
    /// Whether a job asking for this GPU type draws on the pool (no type, or
    /// a pool that lists none, always does).
    pub fn covers_gpu_type(&self, gpu_type: Option<&str>) -> bool {
        match gpu_type {
            None => true,
            Some(t) => self.pool.gpu_types.is_empty() || self.pool.gpu_types.iter().any(|g| g == t),
        }
    }

    /// Whether the job's partition is in the pool (no partition = Slurm's
    /// default, which the pool is assumed to cover when it lists one).
    pub fn covers_partition(&self, partition: Option<&str>) -> bool {
        match partition {
            None => true,
            Some(p) => p.split(',').any(|p| {
                self.pool.partitions.iter().any(|q| q == p)
                    || self.pool.flexible_partition.as_deref() == Some(p)
                    || self.class_by_partition(p).is_some()
            }),
        }
    }
}
