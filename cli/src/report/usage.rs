//! What the pool did over a period, from Slurm's accounting: the measured
//! counterpart of `onepool simulate`. Pure: it takes the allocations
//! `sacct` reports and the policy, and returns the figures.

use std::collections::BTreeMap;

use onepool_decisions::policy::{Policy, Tier};
use onepool_decisions::record::JobRecord;
use onepool_launcher::conventions::{DrainNote, ReplicaNote};
use serde::Serialize;

use super::failures::{self, ReplicaFailures};
use super::reclaims::{self, Reclaim};
use super::replica_jobs::ReplicaJobs;
use super::slurmctld_log::LogFacts;

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
    pub user: String,
    /// job_submit/onepool's record in the job's AdminComment (its class,
    /// the endpoint it serves), which no user can set.
    pub record: Option<JobRecord>,
    /// A replica launcher's note in the job's comment (issue #26): why its
    /// server ended, what its drain did. The job's user writes the comment:
    /// the report reads it only on a replica job ([`ReplicaJobs`]).
    pub note: Option<ReplicaNote>,
}

impl Run {
    /// The first drain its launcher(s) noted.
    pub fn drain(&self) -> Option<DrainNote> {
        self.note.as_ref().and_then(|n| n.drained.first()).map(|(_, d)| *d)
    }
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
    /// Where the reclaims come from: slurmctld's log for the span it
    /// covers, accounting alone before it (or without it), and why.
    pub reclaim_source: String,
    /// Which jobs count as onepoold's replicas, whose drain and end notes
    /// the reclaims and failures read ([`ReplicaJobs`]).
    pub replica_jobs: String,
    /// Replica jobs that ended as failures, per endpoint.
    pub replica_failures: Vec<ReplicaFailures>,
    pub audit: Option<Audit>,
    /// What the pool saved: the simulator on the period's records.
    pub saved: Option<super::saved::Saved>,
    /// onepoold's replica decisions in the period (acted and advisory),
    /// when its configuration names a decision log.
    pub decisions: Option<super::decisions::Decisions>,
}

/// Seconds of `[start, end]` inside `[from, to]`.
fn inside(start: f64, end: f64, from: f64, to: f64) -> f64 {
    (end.min(to) - start.max(from)).max(0.0)
}

/// `log`: what slurmctld's log says (`None`: it was not read);
/// `replicas`: which runs' notes count.
pub fn compute(
    runs: &[Run],
    policy: &Policy,
    from: f64,
    to: f64,
    log: Option<&LogFacts>,
    replicas: &ReplicaJobs,
) -> Report {
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
        reclaims: reclaims::find(&trusted, policy, log, from, to),
        reclaim_source: reclaim_source(log, from),
        replica_jobs: replicas.said.clone(),
        replica_failures: failures::find(&trusted, replicas, from, to),
        audit: None,
        saved: None,
        decisions: None,
    }
}

fn reclaim_source(log: Option<&LogFacts>, from: f64) -> String {
    match log.and_then(|l| l.first) {
        None => "accounting only (slurmctld's log was not read): times in whole seconds, takers guessed by node and \
                 time, graceful reclaims found by their replica's drain note"
            .to_string(),
        Some(_) if log.is_some_and(|l| l.covers_from(from)) => "slurmctld's log".to_string(),
        Some(first) => format!(
            "slurmctld's log from {} (rotated or started later), accounting only before it",
            onepool_decisions::trace::format_time(first)
        ),
    }
}

/// job_submit/onepool's audit lines in slurmctld's log, within the period.
/// Lines a user's text may have written (a comment with a line break in
/// slurmctld's log: [`super::log_trust::zones`]) are not counted.
pub fn audit(log: &str, from: f64, to: f64, trusted: &dyn Fn(&str) -> bool) -> Audit {
    let mut a = Audit::default();
    let lines: Vec<&str> = log.lines().collect();
    let zones = super::log_trust::zones(&lines, trusted);
    for (line, _) in lines.iter().zip(&zones).filter(|(_, z)| **z == super::log_trust::Zone::Clear) {
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

/// The fields the report asks sacct for. The comment is last: it is the
/// one field a job's user writes freely, and whatever it holds (the
/// delimiter, line breaks) is then the last field's. The admin comment
/// (job_submit/onepool's record) is an administrator's, before it.
pub const SACCT_FORMAT: &str =
    "JobIDRaw,JobName,QOS,State,Submit,Start,End,AllocTRES,NodeList,User,AdminComment,Comment";
const FIELDS: usize = 12;

/// `sacct -P -n --delimiter=DELIM` output in [`SACCT_FORMAT`] order. The
/// caller picks a delimiter no user can know in advance ([`delimiter`]):
/// with sacct's `|`, a job named `a|b` broke the report for everyone, and
/// a comment with a line break could have added a made-up run. A line
/// without the delimiter continues the previous line's comment. Lines that
/// are not allocations with GPUs, or never started, are skipped; so are
/// records with too few fields (a job name with a line break), whose line
/// numbers come back beside the runs so the caller can say so.
pub fn parse_sacct(text: &str, delim: &str) -> Result<(Vec<Run>, Vec<usize>), String> {
    let mut records: Vec<(usize, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        match records.last_mut() {
            Some((_, r)) if !line.contains(delim) => {
                r.push('\n');
                r.push_str(line);
            }
            _ if line.trim().is_empty() => {}
            _ => records.push((n + 1, line.to_string())),
        }
    }
    let (mut runs, mut malformed) = (Vec::new(), Vec::new());
    for (n, line) in &records {
        let f: Vec<&str> = line.splitn(FIELDS, delim).collect();
        if f.len() < FIELDS {
            malformed.push(*n);
            continue;
        }
        let t = |s: &str| onepool_decisions::trace::parse_time(s);
        let (Some(submit), Some(start)) = (t(f[4]), t(f[5])) else { continue };
        // Still running: it holds its GPUs up to now (the caller clips).
        let end = t(f[6]).unwrap_or(f64::INFINITY);
        let (gpus, _) =
            onepool_simulator::input::jobs::gpus_from_tres(f[7]).map_err(|e| format!("sacct line {n}: {e}"))?;
        if gpus == 0 {
            continue;
        }
        let nodes = match f[8] {
            "None assigned" | "" => Vec::new(),
            list => onepool_decisions::hostlist::expand(list)
                .map_err(|e| format!("sacct line {n}: NodeList {list}: {e}"))?,
        };
        let state = f[3].split_whitespace().next().unwrap_or("").to_string();
        runs.push(Run {
            id: f[0].into(),
            name: f[1].into(),
            qos: f[2].into(),
            state,
            submit,
            start,
            end,
            gpus,
            nodes,
            user: f[9].into(),
            record: JobRecord::decode(f[10]),
            note: ReplicaNote::decode(f[11]),
        });
    }
    Ok((runs, malformed))
}

/// A delimiter for [`parse_sacct`] that no job's name or comment holds but
/// by chance: random, made at each run.
pub fn delimiter() -> std::io::Result<String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))?;
    Ok(format!("~{}~", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
}
