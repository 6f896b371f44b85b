//! What a running cluster reports (`sacctmgr`, `scontrol`), read into
//! values the renderer compares with, and the difference between the two:
//! only the changes that bring the cluster to the policy. The commands are
//! listed here so the caller that runs them and the parsers agree on the
//! output format; running them is the caller's business.

mod diff;
mod parse;

use std::collections::BTreeMap;
use std::time::Duration;

pub use diff::{diff, AccessChange, Changes, ConfChange, PartitionChange, QosChange};
pub use parse::{
    allow_list, parse_sacctmgr_assoc, parse_sacctmgr_qos, parse_scontrol_config, parse_scontrol_partitions,
    sacctmgr_line, ParseError,
};

/// The QOS with exactly the fields [`parse_sacctmgr_qos`] reads, in its order.
pub const SHOW_QOS: &[&str] = &[
    "sacctmgr",
    "-n",
    "-P",
    "show",
    "qos",
    "format=Name,Priority,Preempt,PreemptMode,GraceTime,GrpTRES,MaxTRESPerJob,Flags,MaxWall",
];
/// Every association and its QOS list (inherited ones included), for
/// [`parse_sacctmgr_assoc`].
pub const SHOW_ASSOC: &[&str] = &["sacctmgr", "-n", "-P", "show", "assoc", "format=Account,User,QOS"];
/// slurmctld's running configuration, for [`parse_scontrol_config`].
pub const SHOW_CONFIG: &[&str] = &["scontrol", "show", "config"];
/// One partition per line, for [`parse_scontrol_partitions`].
pub const SHOW_PARTITIONS: &[&str] = &["scontrol", "-o", "show", "partition"];

/// A QOS as `sacctmgr show qos` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveQos {
    pub name: String,
    pub priority: u32,
    pub preempt: Vec<String>,
    /// As sacctmgr prints it: `cluster` (the cluster-wide mode), `cancel`,
    /// `requeue`, `suspend`, `off`.
    pub preempt_mode: String,
    pub grace_time: Duration,
    /// `(TRES, limit)` pairs, e.g. `("gres/gpu", "8")`.
    pub grp_tres: Vec<(String, String)>,
    pub max_tres_per_job: Vec<(String, String)>,
    pub flags: Vec<String>,
    /// `None`: no limit.
    pub max_wall: Option<Duration>,
}

const GPU_TRES: &str = "gres/gpu";

impl LiveQos {
    /// What `sacctmgr add qos NAME` creates when given no settings.
    pub fn fresh(name: &str) -> LiveQos {
        LiveQos {
            name: name.to_string(),
            priority: 0,
            preempt: Vec::new(),
            preempt_mode: "cluster".to_string(),
            grace_time: Duration::ZERO,
            grp_tres: Vec::new(),
            max_tres_per_job: Vec::new(),
            flags: Vec::new(),
            max_wall: None,
        }
    }
    pub fn grp_gpus(&self) -> Option<&str> {
        tres(&self.grp_tres, GPU_TRES)
    }
    pub fn max_gpus_per_job(&self) -> Option<&str> {
        tres(&self.max_tres_per_job, GPU_TRES)
    }
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f.eq_ignore_ascii_case(flag))
    }
}

fn tres<'a>(list: &'a [(String, String)], name: &str) -> Option<&'a str> {
    list.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// `scontrol show config`: key → value, as printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveConfig {
    pub values: BTreeMap<String, String>,
}

impl LiveConfig {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }
}

/// A partition as `scontrol -o show partition` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePartition {
    pub name: String,
    pub nodes: Option<String>,
    /// The partition QOS; `None` when it has none (`QoS=N/A`).
    pub qos: Option<String>,
    /// `AllowQos`; `None` when every QOS may run there (`AllowQos=ALL`).
    pub allow_qos: Option<Vec<String>>,
}

#[cfg(test)]
mod tests;
