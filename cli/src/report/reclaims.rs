//! Every reclaim of the period: which job Slurm stopped, for which, how
//! (immediate, graceful, requeue), what a drained replica finished and cut,
//! how long the taker waited and how many GPUs changed hands.
//!
//! From records no ordinary user can write (issue #42): accounting's
//! states, times, nodes and QOS, job_submit/onepool's record, and the
//! drain notes of onepoold's own replica jobs. slurmctld's log is not
//! read: Slurm writes users' text into it raw, and no list of its entries
//! that do is ever complete. A reclaim exists only where a record says
//! so:
//! - a run Slurm ended as `PREEMPTED` (cancelled for another job, at once
//!   or when its grace time ran out);
//! - before Slurm 24.05, a run of a requeue class that was requeued
//!   (`REQUEUED`: the victim requeues itself on Slurm's notice) while a job
//!   that may reclaim it was waiting for its nodes (below); from 24.05
//!   Slurm records such a victim `PREEMPTED` itself, and `REQUEUED` is
//!   only a user's own requeue ([`Requeues`]);
//! - a replica whose launcher noted a drain on Slurm's notice (a graceful
//!   victim that drained in its grace time ends `COMPLETED`).
//!
//! Slurm keeps no record of which job a victim yielded to (it names the
//! preemptor only in its log, and not at all when a grace time ran out),
//! so the taker is derived from what accounting keeps and no ordinary user
//! sets: among the jobs that started on one of the victim's nodes within
//! [`LINK_S`] of its end, in a class the policy lets reclaim the victim's,
//! and eligible to start (`Eligible`) by that end, the one whose class
//! comes first (protected, then flexible by rank), then the one eligible
//! first. A job released by the victim's end (a dependency on it) is
//! eligible only at that end, after the job Slurm preempted for, which
//! waited for the victim's GPUs; a user can time when their job becomes
//! eligible, not the class it runs in (issue #52). Times are accounting's
//! whole seconds.

use std::cmp::Ordering;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::Policy;
use serde::Serialize;

use super::records::{Requeues, Run};

/// A run Slurm stopped to give its GPUs to other work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reclaim {
    pub job: String,
    /// The victim's class (`-` outside the pool's classes).
    pub class: String,
    /// `immediate`, `graceful` or `requeue`: what happened to the victim.
    pub mode: String,
    /// When the victim's run ended (accounting), seconds from the
    /// period's start.
    pub at_s: f64,
    /// GPU-hours of the run that ended: lost work for a cancelled batch
    /// job, at most that for a requeued one (it keeps what it
    /// checkpointed), none for a drained serving replica.
    pub run_gpu_hours: f64,
    pub gpus: u32,
    /// The job that got its GPUs, and its class.
    pub for_job: Option<String>,
    pub for_class: Option<String>,
    /// The victim's GPUs on the taker's nodes (a victim's GPUs are taken to
    /// be spread evenly over its nodes; sacct gives no per-node count).
    pub gpus_changed_hands: Option<u32>,
    /// The taker's time from submission to start, in accounting's whole
    /// seconds (within a second of the truth).
    pub time_to_capacity_s: Option<f64>,
    /// A drained replica's record (its launcher's note): requests in
    /// flight at the notice that finished, those the drain timeout cut,
    /// those the router moved to other replicas (issue #43), new ones sent
    /// elsewhere, and the drain's length.
    pub drained: Option<u64>,
    pub cut: Option<u64>,
    pub moved: Option<u64>,
    pub turned_away: Option<u64>,
    pub drain_s: Option<f64>,
    /// What says it was a reclaim: `accounting` (Slurm's state) or
    /// `replica drain note` (the launcher of onepoold's replica job).
    pub source: String,
}

/// How soon after a reclaimed run ends the job that got its GPUs starts.
pub const LINK_S: f64 = 10.0;

pub fn find(runs: &[Run], policy: &Policy, from: f64, to: f64, requeues: Requeues) -> Vec<Reclaim> {
    let mut out = Vec::new();
    for v in runs.iter().filter(|r| r.end >= from && r.end <= to) {
        let class = policy.class_by_qos(&v.qos).and_then(|c| c.reclaim());
        let (mode, source) = match v.state.as_str() {
            "REQUEUED" if class == Some(ReclaimMode::Requeue) && requeues == Requeues::ByTheVictim => {
                (ReclaimMode::Requeue, "accounting")
            }
            "PREEMPTED" if v.drain().is_some() => (ReclaimMode::Graceful, "accounting"),
            "PREEMPTED" => (class.unwrap_or(ReclaimMode::Immediate), "accounting"),
            "TIMEOUT" => continue,
            _ if v.drain().is_some_and(|d| d.on_slurm_notice()) => (ReclaimMode::Graceful, "replica drain note"),
            _ => continue,
        };
        // Looked for only for a candidate: every run of a long period
        // ends in it, and the look goes over all of them.
        let taker = taker(runs, policy, v);
        // A run requeued by its user (`scontrol requeue`) is no reclaim:
        // only one a reclaiming job was waiting for.
        if v.state == "REQUEUED" && taker.is_none() {
            continue;
        }
        out.push(reclaim(policy, v, taker, mode, v.end - from, source));
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s).then_with(|| a.job.cmp(&b.job)));
    out
}

/// The job that got `v`'s GPUs, from accounting: of those that started on
/// one of its nodes within [`LINK_S`] of its end, eligible by that end, in
/// a class that may reclaim `v`'s, the first by [`first_to_take`].
fn taker<'a>(runs: &'a [Run], policy: &Policy, v: &Run) -> Option<&'a Run> {
    runs.iter()
        .filter(|p| p.id != v.id && p.start >= v.end && p.start <= v.end + LINK_S)
        .filter(|p| p.eligible <= v.end && shares_a_node(p, v) && may_reclaim(policy, &p.qos, &v.qos))
        .min_by(|a, b| first_to_take(policy, a).partial_cmp(&first_to_take(policy, b)).unwrap_or(Ordering::Equal))
}

/// The order in which candidates are the taker: the class that preempts
/// first (protected, then flexible by rank, then any other), then the job
/// eligible first, then the one that started first, then submitted first.
fn first_to_take(policy: &Policy, p: &Run) -> (u64, f64, f64, f64) {
    let class = match policy.class_by_qos(&p.qos) {
        Some(c) => c.rank().map_or(0, |r| u64::from(r) + 1),
        None => u64::MAX,
    };
    (class, p.eligible, p.start, p.submit)
}

/// Whether the QOS `onepool policy render` gives the taker's class may
/// preempt the victim's: a protected class every flexible one, a flexible
/// class those ranked after it. A class outside the policy, or whose QOS
/// the site manages, is not checked.
fn may_reclaim(policy: &Policy, taker: &str, victim: &str) -> bool {
    let (Some(t), Some(v)) = (policy.class_by_qos(taker), policy.class_by_qos(victim)) else { return true };
    if !t.manage_qos || !v.manage_qos {
        return true;
    }
    match (t.rank(), v.rank()) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(t), Some(v)) => t < v,
    }
}

fn shares_a_node(a: &Run, b: &Run) -> bool {
    a.nodes.iter().any(|n| b.nodes.contains(n))
}

fn reclaim(policy: &Policy, v: &Run, taker: Option<&Run>, mode: ReclaimMode, at_s: f64, source: &str) -> Reclaim {
    let class = policy.class_by_qos(&v.qos);
    let drain = v.drain();
    let gpus_changed_hands = taker.map(|t| {
        let shared = v.nodes.iter().filter(|n| t.nodes.contains(n)).count();
        let spread = u64::from(v.gpus) * shared as u64 / v.nodes.len().max(1) as u64;
        (spread as u32).min(t.gpus)
    });
    Reclaim {
        job: v.id.clone(),
        class: class.map_or("-".to_string(), |c| c.name.clone()),
        mode: mode_name(mode).into(),
        at_s,
        run_gpu_hours: f64::from(v.gpus) * (v.end - v.start).max(0.0) / 3600.0,
        gpus: v.gpus,
        for_job: taker.map(|p| p.id.clone()),
        for_class: taker.and_then(|p| policy.class_by_qos(&p.qos)).map(|c| c.name.clone()),
        gpus_changed_hands,
        time_to_capacity_s: taker.map(|t| (t.start - t.submit).max(0.0)),
        drained: drain.map(|d| d.finished()),
        cut: drain.map(|d| d.cut),
        moved: drain.map(|d| d.moved),
        turned_away: drain.map(|d| d.turned_away),
        drain_s: drain.map(|d| d.took_ms as f64 / 1000.0),
        source: source.into(),
    }
}

pub fn mode_name(m: ReclaimMode) -> &'static str {
    match m {
        ReclaimMode::Immediate => "immediate",
        ReclaimMode::Graceful => "graceful",
        ReclaimMode::Requeue => "requeue",
    }
}
