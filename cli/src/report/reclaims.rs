//! Every reclaim of the period: which job Slurm stopped, for which, how
//! (immediate, graceful, requeue), what a drained replica finished and cut,
//! how long the taker waited and how many GPUs changed hands.
//!
//! Where slurmctld's log covers the period it is the source: it names the
//! preemptor and the victim of a reclaim without grace time at the moment
//! Slurm decided (a graceful one only at debug level, see
//! [`super::slurmctld_log`]), and times submissions, starts and ends to
//! the millisecond. A graceful victim that drained and exited in its grace
//! time ends COMPLETED in sacct: it is found by the drain note its
//! launcher left in the job's comment (`AccountingStoreFlags=job_comment`),
//! and its taker is the first job that started on its nodes right after
//! it ended (by node and time; the report says so).

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::Policy;
use serde::Serialize;

use super::slurmctld_log::LogFacts;
use super::usage::Run;

/// A run Slurm stopped to give its GPUs to other work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reclaim {
    pub job: String,
    /// The victim's class (`-` outside the pool's classes).
    pub class: String,
    /// `immediate`, `graceful` or `requeue`: what happened to the victim.
    pub mode: String,
    /// When Slurm picked it (the log), or when it ended (accounting only),
    /// seconds from the period's start.
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
    /// The taker's time from submission to start.
    pub time_to_capacity_s: Option<f64>,
    /// A drained replica's record (its launcher's note): requests in
    /// flight at the notice that finished, those the drain timeout cut, new
    /// ones sent elsewhere, and the drain's length.
    pub drained: Option<u64>,
    pub cut: Option<u64>,
    pub turned_away: Option<u64>,
    pub drain_s: Option<f64>,
    /// "slurmctld log", or "accounting" (times in whole seconds, the taker
    /// guessed by node and time).
    pub source: String,
}

/// How soon after a reclaimed run ends the job that got its GPUs starts
/// (accounting only).
pub const LINK_S: f64 = 10.0;

pub fn find(runs: &[Run], policy: &Policy, log: Option<&LogFacts>, from: f64, to: f64) -> Vec<Reclaim> {
    let mut out = Vec::new();
    // The log's span: where it is read; before it, accounting alone.
    let log_from = log.and_then(|l| l.first).map(|f| f.max(from));
    let mut seen: Vec<(&str, f64)> = Vec::new();
    // Victims Slurm named, with their takers.
    if let (Some(log), Some(log_from)) = (log, log_from) {
        for p in log.preemptions.iter().filter(|p| p.at >= log_from && p.at <= to) {
            let Some(victim) = run_at(runs, &p.victim, p.at) else { continue };
            // One reclaim per victim run, whatever slurmctld repeats (a
            // graceful victim killed at the end of its grace time is named
            // again then).
            if seen.contains(&(victim.id.as_str(), victim.start)) {
                continue;
            }
            seen.push((victim.id.as_str(), victim.start));
            let taker = runs
                .iter()
                .filter(|r| r.id == p.taker && r.start >= p.at - 1.0)
                .min_by(|a, b| a.start.total_cmp(&b.start));
            let class_mode = policy.class_by_qos(&victim.qos).and_then(|c| c.reclaim());
            let mode = match p.verb.as_str() {
                "requeued" => ReclaimMode::Requeue,
                "grace" => ReclaimMode::Graceful,
                // Killed with no grace time left: a graceful victim whose
                // grace time ran out, or one that never had any.
                _ if victim.drain().is_some() || class_mode == Some(ReclaimMode::Graceful) => ReclaimMode::Graceful,
                _ => ReclaimMode::Immediate,
            };
            let ttc = log_ttc(log, &p.taker).or_else(|| taker.map(|t| t.start - t.submit));
            out.push(reclaim(policy, victim, taker, mode, p.at - from, ttc, "slurmctld log"));
        }
    }
    // Victims Slurm did not name: accounting's PREEMPTED and REQUEUED, and
    // graceful victims, which end COMPLETED after a drain and are named in
    // the log only at debug level: found by their replica's drain note.
    for v in runs.iter().filter(|r| r.end >= from && r.end <= to) {
        if seen.contains(&(v.id.as_str(), v.start)) {
            continue;
        }
        let class = policy.class_by_qos(&v.qos).and_then(|c| c.reclaim());
        let mode = match v.state.as_str() {
            // A requeued run that was not preempted (scontrol requeue) is not a reclaim.
            "REQUEUED" if class == Some(ReclaimMode::Requeue) => ReclaimMode::Requeue,
            "PREEMPTED" => class.unwrap_or(ReclaimMode::Immediate),
            "TIMEOUT" => continue,
            _ if v.drain().is_some_and(|d| d.on_slurm_notice()) => ReclaimMode::Graceful,
            _ => continue,
        };
        let in_log = log.filter(|_| log_from.is_some_and(|f| v.end >= f));
        let r = match in_log {
            Some(log) => {
                // The log's end of the victim and starts of the others, to
                // the millisecond.
                // (A requeued job's log end is its last run's: only one
                // that agrees with this run's whole-second end is used.)
                let end = log.times(&v.id).end.filter(|e| (e - v.end).abs() < 1.5).unwrap_or(v.end);
                let taker = log
                    .starts
                    .iter()
                    .filter(|(t, id, nodes)| {
                        *id != v.id
                            && *t >= end - 1.0
                            && *t <= end + LINK_S
                            && nodes.iter().any(|n| v.nodes.contains(n))
                    })
                    // Waiting when the victim ended (sacct's end may be
                    // the whole second before the log's submission).
                    .filter(|(_, id, _)| log.times(id).submit.is_none_or(|s| s <= end + 1.0))
                    .min_by(|a, b| a.0.total_cmp(&b.0));
                let run = taker.and_then(|(t, id, _)| run_at(runs, id, *t));
                let ttc = taker.and_then(|(_, id, _)| log_ttc(log, id)).or_else(|| run.map(|t| t.start - t.submit));
                reclaim(policy, v, run, mode, end - from, ttc, "slurmctld log (taker by node and time)")
            }
            None => {
                let taker = runs
                    .iter()
                    .filter(|p| p.id != v.id && p.start >= v.end && p.start <= v.end + LINK_S)
                    .filter(|p| p.submit <= v.end && p.nodes.iter().any(|n| v.nodes.contains(n)))
                    .min_by(|a, b| a.start.total_cmp(&b.start));
                let ttc = taker.map(|p| p.start - p.submit);
                reclaim(policy, v, taker, mode, v.end - from, ttc, "accounting")
            }
        };
        out.push(r);
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// A job's submission to start in the log, when it has both.
fn log_ttc(log: &LogFacts, job: &str) -> Option<f64> {
    let t = log.times(job);
    Some(t.start? - t.submit?).filter(|d| *d >= 0.0)
}

/// The run of job `id` that held its GPUs at `at` (a requeued job has one
/// run per start; sacct's whole seconds round either way).
fn run_at<'a>(runs: &'a [Run], id: &str, at: f64) -> Option<&'a Run> {
    let of = || runs.iter().filter(move |r| r.id == id);
    of().find(|r| r.start <= at + 1.0 && r.end >= at - 1.0).or_else(|| of().next())
}

fn reclaim(
    policy: &Policy,
    v: &Run,
    taker: Option<&Run>,
    mode: ReclaimMode,
    at_s: f64,
    ttc: Option<f64>,
    source: &str,
) -> Reclaim {
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
        time_to_capacity_s: ttc,
        drained: drain.map(|d| d.finished()),
        cut: drain.map(|d| d.cut),
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
