//! What the pool did over a period, from Slurm's accounting: the measured
//! counterpart of `onepool simulate`. Pure: it takes the allocations
//! `sacct` reports and the policy, and returns the figures.

use std::collections::BTreeMap;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::{Policy, Tier};
use serde::Serialize;

/// One run of a job as `sacct -X -D` lists it (a requeued job has one
/// per run).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: String,
    pub name: String,
    pub qos: String,
    /// Slurm's state word (`COMPLETED`, `PREEMPTED`, `REQUEUED`, ...).
    pub state: String,
    pub submit: f64,
    pub start: f64,
    pub end: f64,
    pub gpus: u32,
    pub nodes: Vec<String>,
}

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

/// A run Slurm stopped to give its GPUs to other work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reclaim {
    pub job: String,
    pub class: String,
    /// The class's reclaim mode in the policy (`immediate`, `graceful`,
    /// `requeue`).
    pub mode: String,
    /// When it ended, seconds from the period's start.
    pub at_s: f64,
    /// GPU-hours of the run that ended: lost work for a cancelled batch
    /// job, at most that for a requeued one (it keeps what it
    /// checkpointed), none for a drained serving replica.
    pub run_gpu_hours: f64,
    /// The job that got its GPUs: the first to start on one of its nodes
    /// within `LINK_S` after it ended, submitted before it ended (it was
    /// waiting while the victim was being reclaimed). sacct's times are
    /// whole seconds, so a time to capacity under a second shows as 0.
    pub for_job: Option<String>,
    pub for_class: Option<String>,
    /// That job's time from submission to start.
    pub time_to_capacity_s: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Audit {
    /// "would place" lines per class.
    pub would_place: BTreeMap<String, usize>,
    /// "would refuse" lines per message.
    pub would_refuse: BTreeMap<String, usize>,
    pub would_refuse_updates: usize,
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
    pub audit: Option<Audit>,
}

/// How soon after a reclaimed run ends the job that got its GPUs starts.
pub const LINK_S: f64 = 10.0;

/// Seconds of `[start, end]` inside `[from, to]`.
fn inside(start: f64, end: f64, from: f64, to: f64) -> f64 {
    (end.min(to) - start.max(from)).max(0.0)
}

pub fn compute(runs: &[Run], policy: &Policy, from: f64, to: f64) -> Report {
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
    Report {
        from,
        to,
        pool_gpus,
        classes,
        outside_gpu_hours: outside,
        idle_gpu_hours: idle,
        reclaims: reclaims(runs, policy, from, to),
        audit: None,
    }
}

fn reclaims(runs: &[Run], policy: &Policy, from: f64, to: f64) -> Vec<Reclaim> {
    let mut out = Vec::new();
    for v in
        runs.iter().filter(|r| matches!(r.state.as_str(), "PREEMPTED" | "REQUEUED") && r.end >= from && r.end <= to)
    {
        let Some(class) = policy.class_by_qos(&v.qos) else { continue };
        // A requeued run that was not preempted (scontrol requeue) is not a reclaim.
        if v.state == "REQUEUED" && class.reclaim() != Some(ReclaimMode::Requeue) {
            continue;
        }
        let mode = match class.reclaim() {
            Some(ReclaimMode::Immediate) => "immediate",
            Some(ReclaimMode::Graceful) => "graceful",
            Some(ReclaimMode::Requeue) => "requeue",
            None => "protected",
        };
        let taker = runs
            .iter()
            .filter(|p| p.id != v.id && p.start >= v.end && p.start <= v.end + LINK_S)
            .filter(|p| p.submit <= v.end && p.nodes.iter().any(|n| v.nodes.contains(n)))
            .min_by(|a, b| a.start.total_cmp(&b.start));
        out.push(Reclaim {
            job: v.id.clone(),
            class: class.name.clone(),
            mode: mode.into(),
            at_s: v.end - from,
            run_gpu_hours: f64::from(v.gpus) * (v.end - v.start).max(0.0) / 3600.0,
            for_job: taker.map(|p| p.id.clone()),
            for_class: taker.and_then(|p| policy.class_by_qos(&p.qos)).map(|c| c.name.clone()),
            time_to_capacity_s: taker.map(|p| p.start - p.submit),
        });
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// job_submit/onepool's audit lines in slurmctld's log, within the period.
pub fn audit(log: &str, from: f64, to: f64) -> Audit {
    let mut a = Audit::default();
    for line in log.lines() {
        let Some(rest) = line.split_once("job_submit/onepool: audit: ").map(|x| x.1) else { continue };
        // "[2026-12-04T14:44:36.123] ..." (the log's own time stamp).
        let at = line
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
            .and_then(|(t, _)| onepool_decisions::trace::parse_time(t));
        if at.is_some_and(|t| t < from || t > to) {
            continue;
        }
        let what = rest.split_once(": ").map_or(rest, |x| x.1);
        if let Some(p) = what.strip_prefix("would place: ") {
            // "class NAME qos QOS ..." (the plugin's description of a placement).
            let class = p.strip_prefix("class ").and_then(|x| x.split_whitespace().next()).unwrap_or(p);
            *a.would_place.entry(class.to_string()).or_default() += 1;
        } else if let Some(r) = what.strip_prefix("would refuse: ") {
            *a.would_refuse.entry(r.to_string()).or_default() += 1;
        } else if what.starts_with("would refuse update") {
            a.would_refuse_updates += 1;
        }
    }
    a
}

/// `sacct -P -n` output in [`SACCT_FORMAT`] order; lines that are not
/// allocations with GPUs, or never started, are skipped.
pub const SACCT_FORMAT: &str = "JobIDRaw,JobName,QOS,State,Submit,Start,End,AllocTRES,NodeList";

pub fn parse_sacct(text: &str) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() < 9 {
            return Err(format!("sacct line {}: {} fields, expected 9 ({SACCT_FORMAT})", n + 1, f.len()));
        }
        let t = |s: &str| onepool_decisions::trace::parse_time(s);
        let (Some(submit), Some(start)) = (t(f[4]), t(f[5])) else { continue };
        // Still running: it holds its GPUs up to now (the caller clips).
        let end = t(f[6]).unwrap_or(f64::INFINITY);
        let (gpus, _) =
            onepool_simulator::input::jobs::gpus_from_tres(f[7]).map_err(|e| format!("sacct line {}: {e}", n + 1))?;
        if gpus == 0 {
            continue;
        }
        let nodes = match f[8] {
            "None assigned" | "" => Vec::new(),
            list => onepool_decisions::hostlist::expand(list)
                .map_err(|e| format!("sacct line {}: NodeList {list}: {e}", n + 1))?,
        };
        let state = f[3].split_whitespace().next().unwrap_or("").to_string();
        runs.push(Run { id: f[0].into(), name: f[1].into(), qos: f[2].into(), state, submit, start, end, gpus, nodes });
    }
    Ok(runs)
}
