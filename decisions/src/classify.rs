//! The submission-time decision: which class a job belongs to, where Slurm
//! should put it (QOS, partition, time limit), and whether the policy
//! forbids it, with one sentence the user can act on.
//!
//! Precedence for the class: explicit annotation (`--workload`) > requested
//! QOS > partition > the policy's default class.

use std::time::Duration;

use crate::annotation::{Annotation, ReclaimMode};
use crate::duration;
use crate::policy::{Class, Entitlement, Policy, Tier};
use crate::record::JobRecord;

/// Who is asking, as slurmctld knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitter {
    pub uid: u32,
    /// The job's primary group.
    pub gid: u32,
}

/// Users and groups, resolved off slurmctld's submit path (name lookups can
/// block on LDAP); the decision only reads this snapshot.
pub trait Directory {
    fn user_name(&self, uid: u32) -> Option<&str>;
    /// Whether the user (by uid, or by the job's primary gid) is in `group`.
    fn in_group(&self, uid: u32, gid: u32, group: &str) -> bool;
    /// Administrators (root, SlurmUser) are entitled to every class.
    fn is_admin(&self, uid: u32) -> bool {
        uid == 0
    }
}

/// The parts of a job description the decision reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobRequest {
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub annotation: Annotation,
    pub gpus: u64,
    /// The GPU type the job names (`--gpus=a100:2`), if any.
    pub gpu_type: Option<String>,
    /// `--exclusive` (not `=user` or `=mcs`): Slurm gives the job every GPU
    /// of its nodes, whatever it asked for (issue #25: an `--exclusive`
    /// agents job asking for 1 GPU got `gres/gpu=4`).
    pub exclusive: bool,
    /// Nodes the job asks for at least (1 when not given).
    pub nodes: u32,
    pub time_limit: Option<Duration>,
}

/// Where the job goes. Fields that are `Some` are written into the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub class: String,
    pub qos: String,
    pub partition: Option<String>,
    /// Set when the class's default time limit applies.
    pub time_limit: Option<Duration>,
    pub record: JobRecord,
}

/// Which rule refused a job; each maps to the closest Slurm error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    UnknownClass,
    Conflict,
    NotEntitled,
    GpuCap,
    TimeLimitRequired,
    TimeLimitTooLong,
    ReclaimNotAllowed,
    BadAnnotation,
    /// An update moving a job to another class's QOS.
    ClassChange,
    /// An update moving a job into one of the pool's partitions.
    PartitionChange,
}

impl Rule {
    /// A stable name for records and reports (never the message, which
    /// quotes what the user asked for).
    pub fn name(self) -> &'static str {
        match self {
            Rule::UnknownClass => "unknown-class",
            Rule::Conflict => "conflict",
            Rule::NotEntitled => "not-entitled",
            Rule::GpuCap => "gpu-cap",
            Rule::TimeLimitRequired => "time-limit-required",
            Rule::TimeLimitTooLong => "time-limit-too-long",
            Rule::ReclaimNotAllowed => "reclaim-not-allowed",
            Rule::BadAnnotation => "bad-annotation",
            Rule::ClassChange => "class-change",
            Rule::PartitionChange => "partition-change",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: Rule,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The job is not in the pool's partitions: left alone.
    Outside,
    Accept(Placement),
    Refuse(Refusal),
}

fn refusal(rule: Rule, message: String) -> Refusal {
    Refusal { rule, message: format!("onepool: {message}") }
}

fn refuse(rule: Rule, message: String) -> Verdict {
    Verdict::Refuse(refusal(rule, message))
}

/// Decides a new job.
pub fn classify(policy: &Policy, dir: &dyn Directory, who: Submitter, job: &JobRequest) -> Verdict {
    if !policy.covers_partition(job.partition.as_deref()) || !policy.covers_gpu_type(job.gpu_type.as_deref()) {
        return Verdict::Outside;
    }
    let class = match pick_class(policy, job) {
        Ok(c) => c,
        Err(r) => return Verdict::Refuse(r),
    };
    if let Some(v) = check_entitlement(class, dir, who, job.account.as_deref()) {
        return v;
    }
    if let Some(cap) = class.max_gpus_per_job {
        let held = held_gpus(policy, job);
        if held > u64::from(cap) {
            let hint = larger_class_hint(policy, dir, who, &JobRequest { gpus: held, ..job.clone() }, class);
            let asks = if held > job.gpus {
                format!(
                    "this --exclusive job gets every GPU of its {} node(s), {held} (it asks for {}); drop --exclusive or ask for fewer nodes",
                    job.nodes.max(1),
                    job.gpus
                )
            } else {
                format!("this job asks for {held}; ask for {cap} or fewer")
            };
            return refuse(
                Rule::GpuCap,
                format!("class {} allows at most {cap} GPUs per job and {asks}{hint}", class.name),
            );
        }
    }
    let mut time_limit = None;
    match job.time_limit {
        None if class.time_limit.required => {
            return refuse(
                Rule::TimeLimitRequired,
                format!(
                    "class {} requires a time limit; add --time (e.g. --time=4:00:00){}",
                    class.name,
                    max_hint(class)
                ),
            )
        }
        None => time_limit = class.time_limit.default,
        Some(t) => {
            if let Some(max) = class.time_limit.max {
                if t > max {
                    return refuse(
                        Rule::TimeLimitTooLong,
                        format!(
                            "class {} allows a time limit of at most {} and this job asks for {}; lower --time",
                            class.name,
                            duration::format(max),
                            duration::format(t)
                        ),
                    );
                }
            }
        }
    }
    let (reclaim, drain_timeout) = match reclaim_for(class, &job.annotation) {
        Ok(r) => r,
        Err(r) => return Verdict::Refuse(r),
    };
    let partition = partition_for(policy, class, job.partition.as_deref());
    Verdict::Accept(Placement {
        class: class.name.clone(),
        qos: class.qos.clone(),
        partition,
        time_limit,
        record: JobRecord {
            class: class.name.clone(),
            protected: class.is_protected(),
            reclaim,
            drain_timeout,
            endpoint: job.annotation.endpoint.clone(),
        },
    })
}

fn pick_class<'p>(policy: &'p Policy, job: &JobRequest) -> Result<&'p Class, Refusal> {
    let by_qos = job.qos.as_deref().and_then(|q| policy.class_by_qos(q));
    if let Some(name) = &job.annotation.workload {
        let Some(class) = policy.class(name) else {
            return Err(refusal(
                Rule::UnknownClass,
                format!(
                    "--workload={name} is not a workload class here; use one of: {}",
                    policy.class_names().join(", ")
                ),
            ));
        };
        if let Some(other) = by_qos.filter(|c| c.name != class.name) {
            return Err(refusal(
                Rule::Conflict,
                format!(
                    "--workload={name} conflicts with --qos={} (the QOS of class {}); drop --qos, onepool sets it from the class",
                    other.qos, other.name
                ),
            ));
        }
        return Ok(class);
    }
    if let Some(c) = by_qos {
        return Ok(c);
    }
    if let Some(c) = job.partition.as_deref().and_then(|p| p.split(',').find_map(|p| policy.class_by_partition(p))) {
        return Ok(c);
    }
    policy
        .class(&policy.pool.default_class)
        .ok_or_else(|| refusal(Rule::UnknownClass, "the policy's default class is missing (policy error)".into()))
}

/// Whether `who` (with the job's `account`) is entitled by `e`: an
/// administrator, a user named, the account named, or a member of a group
/// named. onepoold asks it of its own user too (issue #44).
pub fn entitled(e: &Entitlement, dir: &dyn Directory, who: Submitter, account: Option<&str>) -> bool {
    dir.is_admin(who.uid)
        || dir.user_name(who.uid).is_some_and(|u| e.users.iter().any(|x| x == u))
        || account.is_some_and(|a| e.accounts.iter().any(|x| x == a))
        || e.groups.iter().any(|g| dir.in_group(who.uid, who.gid, g))
}

fn check_entitlement(class: &Class, dir: &dyn Directory, who: Submitter, account: Option<&str>) -> Option<Verdict> {
    let e = class.entitled.as_ref()?;
    if entitled(e, dir, who, account) {
        return None;
    }
    let user = dir.user_name(who.uid).map(str::to_string).unwrap_or_else(|| format!("uid {}", who.uid));
    let how = if account.is_none() && !e.accounts.is_empty() {
        format!("if you belong to one of its accounts, submit with --account={}", e.accounts[0])
    } else {
        "use a flexible class (--workload) or ask an administrator to entitle you".to_string()
    };
    let kind = if class.is_protected() { "protected" } else { "restricted" };
    Some(refuse(
        Rule::NotEntitled,
        format!(
            "class {} is {kind} and {user}{} is not entitled to it (entitled: {}); {how}",
            class.name,
            account.map(|a| format!(" with account {a}")).unwrap_or_default(),
            e.describe()
        ),
    ))
}

fn larger_class_hint(
    policy: &Policy,
    dir: &dyn Directory,
    who: Submitter,
    job: &JobRequest,
    current: &Class,
) -> String {
    policy
        .classes
        .iter()
        .filter(|c| c.name != current.name && c.max_gpus_per_job.is_none_or(|m| u64::from(m) >= job.gpus))
        .find(|c| c.entitled.as_ref().is_none_or(|e| entitled(e, dir, who, job.account.as_deref())))
        .map(|c| format!(", or use --workload={}", c.name))
        .unwrap_or_default()
}

fn max_hint(class: &Class) -> String {
    class.time_limit.max.map(|m| format!(", at most {}", duration::format(m))).unwrap_or_default()
}

/// The reclaim behaviour: the class's, or a quicker one the user asked for.
fn reclaim_for(class: &Class, a: &Annotation) -> Result<(Option<ReclaimMode>, Option<Duration>), Refusal> {
    match class.tier {
        Tier::Protected { .. } => {
            if a.reclaim.is_some() || a.drain_timeout.is_some() {
                return Err(refusal(
                    Rule::ReclaimNotAllowed,
                    format!(
                        "class {} is protected and never reclaimed; drop --reclaim and --drain-timeout",
                        class.name
                    ),
                ));
            }
            Ok((None, None))
        }
        Tier::Flexible { reclaim, drain_timeout, .. } => {
            let mode = a.reclaim.unwrap_or(reclaim);
            if mode != ReclaimMode::Immediate && reclaim == ReclaimMode::Immediate {
                return Err(refusal(
                    Rule::ReclaimNotAllowed,
                    format!(
                        "class {} is reclaimed immediately, so --reclaim={mode} cannot be honoured (its QOS gives no grace time); use a class with graceful reclaim",
                        class.name
                    ),
                ));
            }
            let drain = match (mode, a.drain_timeout) {
                (ReclaimMode::Immediate, _) => None,
                (_, Some(d)) if d > drain_timeout => {
                    return Err(refusal(
                        Rule::ReclaimNotAllowed,
                        format!(
                            "--drain-timeout={} is longer than class {}'s {}, which is all the grace Slurm gives; ask for {} or less",
                            duration::format(d),
                            class.name,
                            duration::format(drain_timeout),
                            duration::format(drain_timeout)
                        ),
                    ))
                }
                (_, Some(d)) => Some(d),
                (_, None) => Some(drain_timeout),
            };
            Ok((Some(mode), drain))
        }
    }
}

/// The GPUs Slurm will give the job: what it asks for, or for an
/// `--exclusive` job every GPU of its nodes when the policy says how many
/// a node has.
pub fn held_gpus(policy: &Policy, job: &JobRequest) -> u64 {
    match (job.exclusive, policy.pool.gpus_per_node) {
        (true, Some(per_node)) => job.gpus.max(u64::from(job.nodes.max(1)) * u64::from(per_node)),
        _ => job.gpus,
    }
}

/// Flexible jobs go to the flexible partition when capacity is reserved
/// (its partition QOS caps them); protected jobs never run there.
fn partition_for(policy: &Policy, class: &Class, requested: Option<&str>) -> Option<String> {
    let flex = policy.pool.flexible_partition.as_deref();
    let routes_flexible = policy.reserved_gpus() > 0 && flex.is_some();
    if class.is_protected() {
        (requested.is_some() && requested == flex).then(|| policy.pool.partitions[0].clone())
    } else if routes_flexible && requested != flex {
        flex.map(str::to_string)
    } else {
        None
    }
}

/// A change through `scontrol update` (job_modify): only the fields it sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModifyRequest {
    pub account: Option<String>,
    pub qos: Option<String>,
    pub partition: Option<String>,
}

/// Refuses, for everyone but administrators, the updates that would move a
/// job into the pool or between its classes: a job's class, and with it
/// its QOS and partition, is decided once, at submission, where every rule
/// of the policy is checked. job_modify sees only the fields an update
/// sets, not the job (its record is opaque to plugins), so what depends on
/// the job's current class — a longer time limit, more GPUs or nodes — is
/// left to Slurm's own enforcement: the class QOS's `MaxWall` and
/// `MaxTRESPerJob` and the partitions' `AllowQos` keep such a job pending,
/// and a QOS outside the pool cannot run in the pool's partitions.
pub fn check_modify(policy: &Policy, dir: &dyn Directory, who: Submitter, m: &ModifyRequest) -> Result<(), Refusal> {
    if dir.is_admin(who.uid) {
        return Ok(());
    }
    if let Some(qos) = m.qos.as_deref() {
        if let Some(class) = policy.class_by_qos(qos) {
            if let Some(Verdict::Refuse(r)) = check_entitlement(class, dir, who, m.account.as_deref()) {
                return Err(r);
            }
            return Err(refusal(
                Rule::ClassChange,
                format!(
                    "QOS {qos} is class {}'s, and a job's class is fixed when it is submitted; to run as class {}, submit a new job with --workload={}",
                    class.name, class.name, class.name
                ),
            ));
        }
        if qos.eq_ignore_ascii_case(crate::policy::FLEXIBLE_CAP_QOS) {
            return Err(refusal(
                Rule::ClassChange,
                format!("QOS {qos} is the partition QOS of the pool's flexible partition, not a job QOS; submit a new job with --workload=CLASS"),
            ));
        }
    }
    if let Some(list) = m.partition.as_deref() {
        if let Some(p) = list.split(',').find(|p| policy.covers_partition(Some(p))) {
            return Err(refusal(
                Rule::PartitionChange,
                format!(
                    "partition {p} is in the GPU pool, where onepool places a job when it is submitted; submit a new job (sbatch -p {p} --workload=CLASS) instead of moving this one"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
