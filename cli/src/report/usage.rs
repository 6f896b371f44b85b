//! What the pool did over a period, from Slurm's accounting: the measured
//! counterpart of `onepool simulate`. Pure: it takes the records `sacct`
//! printed ([`super::records`]) and the policy, and returns the figures.

use std::collections::BTreeMap;

use onepool_decisions::policy::{Policy, Tier};
use onepool_decisions::record::AuditRecord;
use serde::Serialize;

use super::failures::{self, ReplicaFailures};
use super::reclaims::{self, Reclaim};
use super::records::{Records, Run, Unreadable};
use super::replica_jobs::ReplicaJobs;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClassUsage {
    pub class: String,
    pub protected: bool,
    pub gpu_hours: f64,
    /// Flexible classes: GPU-hours held beyond the pool's unprotected GPUs,
    /// i.e. on protected capacity lent to them (shared out by use).
    pub borrowed_gpu_hours: f64,
    pub jobs: usize,
}

/// Audit mode's decisions, as job_submit/onepool recorded them on the
/// jobs (their AdminComment).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Audit {
    /// Jobs it would have placed, per class.
    pub would_place: BTreeMap<String, usize>,
    /// Jobs it would have refused, per rule (`unknown-class`,
    /// `not-entitled`, ...).
    pub would_refuse: BTreeMap<String, usize>,
}

/// sacct records the report could not read: none of its figures counts
/// them, and it says which.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UnreadableRecords {
    pub count: usize,
    pub records: Vec<Unreadable>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub from: f64,
    pub to: f64,
    pub pool_gpus: u32,
    pub classes: Vec<ClassUsage>,
    /// Jobs whose QOS is no class of the policy (outside the pool).
    pub outside_gpu_hours: f64,
    pub idle_gpu_hours: f64,
    pub reclaims: Vec<Reclaim>,
    /// Where the reclaims come from, in words.
    pub reclaim_source: String,
    /// Which jobs count as onepoold's replicas, whose drain and end notes
    /// the reclaims and failures read ([`ReplicaJobs`]).
    pub replica_jobs: String,
    /// Replica jobs that ended as failures, per endpoint.
    pub replica_failures: Vec<ReplicaFailures>,
    pub audit: Option<Audit>,
    /// Records sacct printed that the report could not read.
    pub unreadable: UnreadableRecords,
    /// What the pool saved: the simulator on the period's records.
    pub saved: Option<super::saved::Saved>,
    /// onepoold's replica decisions in the period (acted and advisory),
    /// when its configuration names a decision log.
    pub decisions: Option<super::decisions::Decisions>,
    /// Serving per endpoint and request class, from onepoold's access log
    /// (empty without one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub serving: Vec<super::serving::ServingClass>,
}

/// Seconds of `[start, end]` inside `[from, to]`.
fn inside(start: f64, end: f64, from: f64, to: f64) -> f64 {
    (end.min(to) - start.max(from)).max(0.0)
}

/// `replicas`: which runs' notes count.
pub fn compute(records: &Records, policy: &Policy, from: f64, to: f64, replicas: &ReplicaJobs) -> Report {
    let runs = &records.runs;
    let pool_gpus = policy.pool.total_gpus;
    let protected_gpus: u32 = policy
        .classes
        .iter()
        .map(|c| match &c.tier {
            Tier::Protected { capacity } => capacity.lendable + capacity.reserved,
            Tier::Flexible { .. } => 0,
        })
        .sum();
    let unprotected = f64::from(pool_gpus.saturating_sub(protected_gpus));
    let class_of = |r: &Run| policy.class_by_qos(&r.qos);
    let mut classes: Vec<ClassUsage> = policy
        .classes
        .iter()
        .map(|c| ClassUsage { class: c.name.clone(), protected: c.is_protected(), ..ClassUsage::default() })
        .collect();
    let mut outside = 0.0;
    // Flexible GPUs held over time: +gpus at start, -gpus at end.
    let mut events: Vec<(f64, i64, usize)> = Vec::new();
    for r in runs.iter().filter(|r| r.end > r.start) {
        let secs = inside(r.start, r.end, from, to);
        match class_of(r).and_then(|c| policy.classes.iter().position(|k| k.name == c.name)) {
            Some(i) => {
                classes[i].gpu_hours += f64::from(r.gpus) * secs / 3600.0;
                if secs > 0.0 {
                    classes[i].jobs += 1;
                }
                if !classes[i].protected && secs > 0.0 {
                    events.push((r.start.max(from), i64::from(r.gpus), i));
                    events.push((r.end.min(to), -i64::from(r.gpus), i));
                }
            }
            None => outside += f64::from(r.gpus) * secs / 3600.0,
        }
    }
    // Borrowed: flexible GPUs beyond the unprotected ones, shared out by use.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut held = vec![0i64; classes.len()];
    let mut last = from;
    for (t, delta, i) in events {
        let flex: i64 = held.iter().sum();
        let over = (flex as f64 - unprotected).max(0.0);
        if over > 0.0 && t > last {
            for (k, h) in held.iter().enumerate() {
                classes[k].borrowed_gpu_hours += over * (*h as f64) / (flex as f64) * (t - last) / 3600.0;
            }
        }
        last = t;
        held[i] += delta;
    }
    let used: f64 = classes.iter().map(|c| c.gpu_hours).sum();
    let idle = (f64::from(pool_gpus) * (to - from) / 3600.0 - used).max(0.0);
    let trusted = replicas.notes_trusted(runs);
    Report {
        from,
        to,
        pool_gpus,
        classes,
        outside_gpu_hours: outside,
        idle_gpu_hours: idle,
        reclaims: reclaims::find(&trusted, policy, from, to, records.requeues),
        reclaim_source: RECLAIM_SOURCE.to_string(),
        replica_jobs: replicas.said.clone(),
        replica_failures: failures::find(&trusted, replicas, from, to),
        audit: audit(records, policy),
        unreadable: UnreadableRecords { count: records.unreadable.len(), records: records.unreadable.clone() },
        saved: None,
        decisions: None,
        serving: Vec::new(),
    }
}

/// What every reclaim rests on (docs/report.md, "What each figure trusts").
pub const RECLAIM_SOURCE: &str = "accounting (Slurm's states, times and nodes; whole seconds) and the drain notes of \
     onepoold's replica jobs; the taker is, of the jobs eligible by the victim's end that started on its nodes \
     within 10 s of it in a class that may reclaim the victim's, the one of the class that preempts first, then \
     eligible first";

/// Audit mode's decisions on the period's jobs; `None` outside audit mode
/// when the plugin recorded none.
fn audit(records: &Records, policy: &Policy) -> Option<Audit> {
    let mut a = Audit::default();
    // One decision per job, however many runs a requeued job had.
    let jobs: BTreeMap<&str, &AuditRecord> = records.audit.iter().map(|(id, r)| (id.as_str(), r)).collect();
    for r in jobs.values() {
        match r {
            AuditRecord::Place { class } => *a.would_place.entry(class.clone()).or_default() += 1,
            AuditRecord::Refuse { rule } => *a.would_refuse.entry(rule.clone()).or_default() += 1,
        }
    }
    (policy.pool.audit || !records.audit.is_empty()).then_some(a)
}
