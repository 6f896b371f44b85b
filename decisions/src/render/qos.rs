//! The QOS that enforce the policy inside Slurm (priority, who preempts
//! whom, how a reclaimed job goes, GPU limits) and the sacctmgr commands
//! that create or correct them.

use std::time::Duration;

use super::conf::slurm_time;
use super::live::LiveQos;
use crate::annotation::ReclaimMode;
use crate::duration;
use crate::policy::{Class, Policy, Tier, FLEXIBLE_CAP_QOS};

/// Priority of protected QOS (raised when there are many flexible classes,
/// so that it always stays above every flexible QOS).
pub const PROTECTED_PRIORITY: u32 = 10_000;
/// Priority distance between neighbouring flexible ranks.
pub const RANK_STEP: u32 = 1_000;

/// How Slurm stops a job of this QOS when a preemptor needs its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosPreemptMode {
    Cancel,
    Requeue,
}

impl QosPreemptMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QosPreemptMode::Cancel => "cancel",
            QosPreemptMode::Requeue => "requeue",
        }
    }
}

/// A QOS as onepool wants it: every field here is owned by onepool and set
/// exactly, except `preempt_mode: None`, which leaves the QOS's mode alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosSpec {
    pub name: String,
    /// The class whose jobs carry this QOS; `None` for a partition QOS.
    pub class: Option<String>,
    pub why: String,
    pub priority: u32,
    /// QOS whose jobs this QOS's jobs may preempt.
    pub preempt: Vec<String>,
    pub preempt_mode: Option<QosPreemptMode>,
    pub grace_time: Duration,
    /// `GrpTRES=gres/gpu=N`: GPUs all jobs of the QOS may hold together.
    pub grp_gpus: Option<u32>,
    /// `MaxTRESPerJob=gres/gpu=N`.
    pub max_gpus_per_job: Option<u32>,
    /// `MaxWall`: the class's longest time limit, so that a job whose limit
    /// is raised past it by `scontrol update` never starts.
    pub max_wall: Option<Duration>,
    /// `Flags=DenyOnLimit`: refuse at submit what could never run.
    pub deny_on_limit: bool,
}

/// A QOS the policy names but the site manages (`manage_qos = false`): it
/// must exist, and onepool never changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteQos {
    pub class: String,
    pub qos: String,
}

/// How Slurm yields a flexible class's jobs (PreemptMode, GraceTime) and
/// the words that say so.
fn preemption(reclaim: ReclaimMode, grace_time: Duration) -> (QosPreemptMode, Duration, String) {
    match reclaim {
        ReclaimMode::Immediate => {
            (QosPreemptMode::Cancel, Duration::ZERO, "cancelled at once when reclaimed".to_string())
        }
        ReclaimMode::Graceful => (
            QosPreemptMode::Cancel,
            grace_time,
            format!(
                "when reclaimed, gets a drain notice and {} (GraceTime), then is cancelled",
                duration::format(grace_time)
            ),
        ),
        ReclaimMode::Requeue => (
            QosPreemptMode::Requeue,
            grace_time,
            format!(
                "when reclaimed, gets a checkpoint notice and {} (GraceTime), then is requeued",
                duration::format(grace_time)
            ),
        ),
    }
}

/// The class QOS in the order they can be created (a QOS can only list
/// existing QOS in `Preempt`, so the lowest flexible rank comes first and
/// protected classes last), and the site-managed QOS the policy relies on.
pub(super) fn class_qos(policy: &Policy) -> (Vec<QosSpec>, Vec<SiteQos>) {
    let mut flexible: Vec<&Class> = policy.classes.iter().filter(|c| !c.is_protected()).collect();
    flexible.sort_by_key(|c| c.rank());
    let count = u32::try_from(flexible.len()).unwrap_or(u32::MAX);
    // Priorities follow the rank order, not the rank numbers: a rank of 20
    // would otherwise lift a flexible QOS above the protected ones (and a
    // huge rank overflow), and more than nine flexible classes raise the
    // protected priority instead.
    let protected_priority = PROTECTED_PRIORITY.max(RANK_STEP.saturating_mul(count.saturating_add(1)));
    let flexible_qos: Vec<String> = flexible.iter().map(|c| c.qos.clone()).collect();

    let mut specs = Vec::new();
    for (i, class) in flexible.iter().enumerate().rev() {
        if !class.manage_qos {
            continue;
        }
        let Tier::Flexible { rank, reclaim, grace_time, .. } = class.tier else {
            continue;
        };
        let position = u32::try_from(i).unwrap_or(u32::MAX);
        let (mode, grace, how) = preemption(reclaim, grace_time);
        specs.push(QosSpec {
            name: class.qos.clone(),
            class: Some(class.name.clone()),
            why: format!("class {}: flexible, rank {rank}; {how}", class.name),
            priority: RANK_STEP.saturating_mul(count - position),
            preempt: flexible_qos[i + 1..].to_vec(),
            preempt_mode: Some(mode),
            grace_time: grace,
            grp_gpus: None,
            max_gpus_per_job: class.max_gpus_per_job,
            max_wall: class.time_limit.max,
            deny_on_limit: class.max_gpus_per_job.is_some() || class.time_limit.max.is_some(),
        });
    }
    for class in &policy.classes {
        let Tier::Protected { capacity } = class.tier else {
            continue;
        };
        if !class.manage_qos {
            continue;
        }
        specs.push(QosSpec {
            name: class.qos.clone(),
            class: Some(class.name.clone()),
            why: format!(
                "class {}: protected, {} GPUs ({} lendable, {} reserved); preempts every flexible class",
                class.name,
                capacity.total(),
                capacity.lendable,
                capacity.reserved
            ),
            priority: protected_priority,
            preempt: flexible_qos.clone(),
            preempt_mode: Some(QosPreemptMode::Cancel),
            grace_time: Duration::ZERO,
            grp_gpus: Some(capacity.total()),
            max_gpus_per_job: class.max_gpus_per_job,
            max_wall: class.time_limit.max,
            deny_on_limit: class.max_gpus_per_job.is_some() || class.time_limit.max.is_some(),
        });
    }
    let site = policy
        .classes
        .iter()
        .filter(|c| !c.manage_qos)
        .map(|c| SiteQos { class: c.name.clone(), qos: c.qos.clone() })
        .collect();
    (specs, site)
}

/// The partition QOS of the flexible partition: flexible jobs together never
/// hold more than the unreserved GPUs.
pub(super) fn flexible_cap(policy: &Policy, partition: &str) -> QosSpec {
    let cap = policy.flexible_cap();
    QosSpec {
        name: FLEXIBLE_CAP_QOS.to_string(),
        class: None,
        why: format!(
            "partition QOS of {partition}: flexible jobs together hold at most {cap} GPUs, so the {} reserved GPUs stay free for their owners",
            policy.reserved_gpus()
        ),
        priority: 0,
        preempt: Vec::new(),
        preempt_mode: None,
        grace_time: Duration::ZERO,
        grp_gpus: Some(cap),
        max_gpus_per_job: None,
        max_wall: None,
        // A flexible job asking for more than the cap is refused at submit
        // instead of pending forever.
        deny_on_limit: true,
    }
}

/// One `Key=Value` argument of `sacctmgr ... set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QosSetting {
    Priority(u32),
    Preempt(Vec<String>),
    PreemptMode(QosPreemptMode),
    GraceTime(Duration),
    /// `None` clears the limit.
    GrpGpus(Option<u32>),
    MaxGpusPerJob(Option<u32>),
    /// `None` clears the limit.
    MaxWall(Option<Duration>),
    DenyOnLimit(bool),
}

const DENY_ON_LIMIT: &str = "DenyOnLimit";

impl QosSetting {
    /// The sacctmgr argument. `adding`: for `add qos` (flags are set whole
    /// there; `modify` adds or removes the one flag and keeps the others).
    pub fn arg(&self, adding: bool) -> String {
        let gpus = |n: &Option<u32>| match n {
            Some(n) => format!("gres/gpu={n}"),
            // sacctmgr clears one TRES limit with -1 and keeps the others.
            None => "gres/gpu=-1".to_string(),
        };
        match self {
            QosSetting::Priority(p) => format!("Priority={p}"),
            // An empty value clears the list.
            QosSetting::Preempt(list) => format!("Preempt={}", list.join(",")),
            QosSetting::PreemptMode(m) => format!("PreemptMode={}", m.as_str()),
            QosSetting::GraceTime(d) => format!("GraceTime={}", d.as_secs()),
            QosSetting::GrpGpus(n) => format!("GrpTRES={}", gpus(n)),
            QosSetting::MaxGpusPerJob(n) => format!("MaxTRESPerJob={}", gpus(n)),
            QosSetting::MaxWall(Some(d)) => format!("MaxWall={}", slurm_time(*d)),
            QosSetting::MaxWall(None) => "MaxWall=-1".to_string(),
            QosSetting::DenyOnLimit(true) if adding => format!("Flags={DENY_ON_LIMIT}"),
            QosSetting::DenyOnLimit(true) => format!("Flags+={DENY_ON_LIMIT}"),
            QosSetting::DenyOnLimit(false) => format!("Flags-={DENY_ON_LIMIT}"),
        }
    }
}

impl QosSpec {
    /// The settings that turn `live` into this QOS (empty: nothing to do).
    pub fn settings_from(&self, live: &LiveQos) -> Vec<QosSetting> {
        let mut out = Vec::new();
        if self.priority != live.priority {
            out.push(QosSetting::Priority(self.priority));
        }
        if !same_names(&self.preempt, &live.preempt) {
            out.push(QosSetting::Preempt(self.preempt.clone()));
        }
        if let Some(mode) = self.preempt_mode {
            if !live.preempt_mode.eq_ignore_ascii_case(mode.as_str()) {
                out.push(QosSetting::PreemptMode(mode));
            }
        }
        if self.grace_time != live.grace_time {
            out.push(QosSetting::GraceTime(self.grace_time));
        }
        if !same_limit(self.grp_gpus, live.grp_gpus()) {
            out.push(QosSetting::GrpGpus(self.grp_gpus));
        }
        if !same_limit(self.max_gpus_per_job, live.max_gpus_per_job()) {
            out.push(QosSetting::MaxGpusPerJob(self.max_gpus_per_job));
        }
        if self.max_wall != live.max_wall {
            out.push(QosSetting::MaxWall(self.max_wall));
        }
        if self.deny_on_limit != live.has_flag(DENY_ON_LIMIT) {
            out.push(QosSetting::DenyOnLimit(self.deny_on_limit));
        }
        out
    }

    /// `sacctmgr -i add qos NAME set ...`.
    pub fn add_command(&self) -> Vec<String> {
        let settings = self.settings_from(&LiveQos::fresh(&self.name));
        let mut argv = words(&["sacctmgr", "-i", "add", "qos", &self.name]);
        if !settings.is_empty() {
            argv.push("set".into());
            argv.extend(settings.iter().map(|s| s.arg(true)));
        }
        argv
    }
}

/// `sacctmgr -i modify qos where name=NAME set ...`.
pub fn modify_command(name: &str, settings: &[QosSetting]) -> Vec<String> {
    let mut argv = words(&["sacctmgr", "-i", "modify", "qos", "where", &format!("name={name}"), "set"]);
    argv.extend(settings.iter().map(|s| s.arg(false)));
    argv
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// Slurm keeps QOS names in lower case, so names compare without case.
pub(crate) fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

pub(crate) fn same_names(want: &[String], live: &[String]) -> bool {
    want.len() == live.len() && want.iter().all(|w| live.iter().any(|l| same_name(w, l)))
}

fn same_limit(want: Option<u32>, live: Option<&str>) -> bool {
    match (want, live) {
        (None, None) => true,
        (Some(n), Some(l)) => l.trim() == n.to_string(),
        _ => false,
    }
}

/// A command line a person can paste into a shell. Every word onepool
/// produces is shell-safe except an empty list value (`Preempt=`), written
/// the way sacctmgr's manual does (`Preempt=''`).
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            if w.ends_with('=') && !w.ends_with("+=") && !w.ends_with("-=") {
                format!("{w}''")
            } else if w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_=+/.,:@%".contains(&b)) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
