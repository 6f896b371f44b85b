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
//! launcher left in the job's comment (`AccountingStoreFlags=job_comment`,
//! read only on onepoold's replica jobs: [`super::replica_jobs`]), and its
//! taker is the first job that started on its nodes right after it ended
//! (by node and time; the report says so).
//!
//! A user's text can reach slurmctld's log (issue #35), so nothing in it
//! counts that accounting does not bear out: a preemption only where its
//! victim and taker ran as it says (`checked`), a time only where it
//! agrees with sacct's whole second.

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::{Policy, Tier};
use serde::Serialize;

use super::slurmctld_log::{LogFacts, Preemption};
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

/// How long after Slurm's line a victim may still be ending, beyond its
/// grace time: KillWait (30 s by default) between SIGTERM and SIGKILL, and
/// slurmctld's check that ends a grace time, which runs every 30 s.
pub const END_SLACK_S: f64 = 60.0;

/// How far the log's time of an event may lie from accounting's: sacct
/// keeps the whole second slurmctld took before it logged the line.
const AGREE_S: (f64, f64) = (-1.0, 2.0);

pub fn find(runs: &[Run], policy: &Policy, log: Option<&LogFacts>, from: f64, to: f64) -> Vec<Reclaim> {
    let mut out = Vec::new();
    // The log's span: where it is read; before it, accounting alone.
    let log_from = log.and_then(|l| l.first).map(|f| f.max(from));
    let mut seen: Vec<(&str, f64)> = Vec::new();
    // Victims Slurm named, with their takers, where accounting agrees.
    if let (Some(log), Some(log_from)) = (log, log_from) {
        for p in log.preemptions.iter().filter(|p| p.at >= log_from && p.at <= to) {
            let Some((victim, taker)) = checked(runs, policy, p) else { continue };
            // One reclaim per victim run, whatever slurmctld repeats (a
            // graceful victim killed at the end of its grace time is named
            // again then).
            if seen.contains(&(victim.id.as_str(), victim.start)) {
                continue;
            }
            seen.push((victim.id.as_str(), victim.start));
            let class_mode = policy.class_by_qos(&victim.qos).and_then(|c| c.reclaim());
            let mode = match p.verb.as_str() {
                "requeued" => ReclaimMode::Requeue,
                "grace" => ReclaimMode::Graceful,
                // Killed with no grace time left: a graceful victim whose
                // grace time ran out, or one that never had any.
                _ if victim.drain().is_some() || class_mode == Some(ReclaimMode::Graceful) => ReclaimMode::Graceful,
                _ => ReclaimMode::Immediate,
            };
            let ttc = taker.map(|t| ttc(Some(log), t));
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
                // the millisecond, where accounting agrees.
                let end = logged(&log.times(&v.id).ends, v.end).unwrap_or(v.end);
                let taker = log
                    .starts
                    .iter()
                    .filter(|(t, id, _)| *id != v.id && *t >= end - 1.0 && *t <= end + LINK_S)
                    // The run that started then, on the victim's nodes (as
                    // accounting has them), waiting when the victim ended
                    // (sacct's submission may be the whole second before the log's).
                    .filter_map(|(t, id, _)| {
                        let run = runs.iter().find(|r| r.id == *id && agrees(*t, r.start))?;
                        let submit = logged(&log.times(id).submits, run.submit).unwrap_or(run.submit);
                        (shares_a_node(run, v) && submit <= end + 1.0).then_some((*t, run))
                    })
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, run)| run);
                let ttc = taker.map(|t| ttc(Some(log), t));
                reclaim(policy, v, taker, mode, end - from, ttc, "slurmctld log (taker by node and time)")
            }
            None => {
                let taker = runs
                    .iter()
                    .filter(|p| p.id != v.id && p.start >= v.end && p.start <= v.end + LINK_S)
                    .filter(|p| p.submit <= v.end && shares_a_node(p, v))
                    .min_by(|a, b| a.start.total_cmp(&b.start));
                let ttc = taker.map(|t| ttc(None, t));
                reclaim(policy, v, taker, mode, v.end - from, ttc, "accounting")
            }
        };
        out.push(r);
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// The log's preemption lines in `from..=to` that accounting does not bear
/// out ([`checked`]): not used, only told, so that an admin sees why a
/// reclaim's source is not slurmctld's line.
pub fn unconfirmed<'a>(runs: &[Run], policy: &Policy, log: &'a LogFacts, from: f64, to: f64) -> Vec<&'a Preemption> {
    log.preemptions.iter().filter(|p| p.at >= from && p.at <= to && checked(runs, policy, p).is_none()).collect()
}

/// A preemption line's victim and taker runs when accounting bears it
/// out; `None`: the line is ignored (a user's text may have written it,
/// [`super::log_trust`]), and the victim is found as one Slurm did not
/// name. The victim held its GPUs at the line and ended (or was requeued)
/// within its grace time and [`END_SLACK_S`] after it; the taker (none for
/// `JobId=Invalid`) was waiting at the line and started after it, on one of
/// the victim's nodes, within as long; and the policy lets the taker's
/// class reclaim the victim's.
fn checked<'a>(runs: &'a [Run], policy: &Policy, p: &Preemption) -> Option<(&'a Run, Option<&'a Run>)> {
    let reach = |r: &Run| grace_s(policy, &r.qos) + END_SLACK_S;
    // Accounting's times lie up to AGREE_S before the line's: 26.05 kept
    // a victim's end (and its taker's start) a whole second before the
    // line it logged at 15:38:29.001 (end 15:38:28).
    let (before, after) = (-AGREE_S.0, AGREE_S.1);
    let victim = runs
        .iter()
        .filter(|r| r.id == p.victim)
        .find(|r| r.start <= p.at + before && r.end >= p.at - after && r.end <= p.at + reach(r))?;
    let Some(taker) = &p.taker else { return Some((victim, None)) };
    let taker = runs
        .iter()
        .filter(|r| r.id == *taker && r.submit <= p.at + before && r.start >= p.at - after)
        .filter(|r| r.start <= p.at + reach(victim) + LINK_S && shares_a_node(r, victim))
        .min_by(|a, b| a.start.total_cmp(&b.start))?;
    may_reclaim(policy, &taker.qos, &victim.qos).then_some((victim, Some(taker)))
}

/// The grace time of the class a job ran in; the longest of the policy's
/// for a job outside its classes.
fn grace_s(policy: &Policy, qos: &str) -> f64 {
    let grace = |c: &onepool_decisions::policy::Class| match c.tier {
        Tier::Flexible { grace_time, .. } => grace_time.as_secs_f64(),
        Tier::Protected { .. } => 0.0,
    };
    match policy.class_by_qos(qos) {
        Some(c) => grace(c),
        None => policy.classes.iter().map(grace).fold(0.0, f64::max),
    }
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

/// Whether the log's time `log` is the event accounting has at `sacct`.
fn agrees(log: f64, sacct: f64) -> bool {
    let d = log - sacct;
    d >= AGREE_S.0 && d <= AGREE_S.1
}

/// The first of the log's times that agrees with accounting's.
fn logged(times: &[f64], sacct: f64) -> Option<f64> {
    times.iter().copied().find(|t| agrees(*t, sacct))
}

/// The taker's submission to start: the log's, to the millisecond, where
/// both agree with accounting; else accounting's whole seconds.
fn ttc(log: Option<&LogFacts>, t: &Run) -> f64 {
    let times = log.map(|l| l.times(&t.id));
    let submit = times.and_then(|x| logged(&x.submits, t.submit));
    let start = times.and_then(|x| logged(&x.starts, t.start));
    match (submit, start) {
        (Some(a), Some(b)) if b >= a => b - a,
        _ => t.start - t.submit,
    }
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
