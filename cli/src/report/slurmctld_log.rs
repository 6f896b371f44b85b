//! What slurmctld's log says about jobs, to the millisecond: when each was
//! submitted and started, and which job Slurm preempted for which. sacct
//! keeps whole seconds and never names a preemptor; the log does, in the
//! same words on 22.05, 24.11 and 26.05 (measured on each):
//!
//! - `_slurm_rpc_submit_batch_job: JobId=N ...` (26.05 adds `SLUID=...`)
//! - `sched: _slurm_rpc_allocate_resources JobId=N NodeList=...` (salloc,
//!   srun: submitted and started at once)
//! - `sched: Allocate JobId=N NodeList=...`, `sched/backfill: _start_job:
//!   Started JobId=N in PART on NODES`
//! - `_job_complete: JobId=N done`, `Requeuing JobId=N`
//! - `preempted JobId=V has been killed|requeued to reclaim resources for
//!   JobId=T`: a victim without grace time, at Slurm's decision
//! - `setting N sec preemption grace time for JobId=V to reclaim resources
//!   for JobId=T`: a victim with grace time (graceful), but only at
//!   `SlurmctldDebug=debug` or more; at the usual `info` a graceful victim
//!   is not named, and the report finds it by its replica's drain note and
//!   its taker by node and time (to the millisecond here as well)
//!
//! `%pJ` prints an array task or a hetjob component as `JobId=12_3(15)` or
//! `JobId=20+1(21)`: the raw id, the one sacct's `JobIDRaw` shows, is the
//! one in parentheses.

use std::collections::HashMap;

use onepool_decisions::trace::parse_time;

/// A job's submission and start as the log has them (seconds, the log's
/// clock: the cluster's local time, like sacct's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobTimes {
    pub submit: Option<f64>,
    pub start: Option<f64>,
    pub end: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub at: f64,
    pub victim: String,
    pub taker: String,
    /// "requeued", "killed" (cancelled at once), or "grace" (a grace time
    /// to drain or checkpoint in).
    pub verb: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogFacts {
    /// The first and last time stamps the log holds: a period outside them
    /// is not covered (the log was rotated, or slurmctld started later).
    pub first: Option<f64>,
    pub last: Option<f64>,
    pub jobs: HashMap<String, JobTimes>,
    /// (start, job, nodes) of every allocation, in the log's order.
    pub starts: Vec<(f64, String, Vec<String>)>,
    pub preemptions: Vec<Preemption>,
}

impl LogFacts {
    /// Whether the log goes back to `from` (it is written up to now, so
    /// its end is the period's).
    pub fn covers_from(&self, from: f64) -> bool {
        self.first.is_some_and(|f| f <= from)
    }

    pub fn times(&self, job: &str) -> JobTimes {
        self.jobs.get(job).copied().unwrap_or_default()
    }
}

pub fn read(text: &str) -> LogFacts {
    let mut facts = LogFacts::default();
    for line in text.lines() {
        let Some((stamp, rest)) = line.strip_prefix('[').and_then(|l| l.split_once("] ")) else { continue };
        let Some(at) = stamp_time(stamp) else { continue };
        facts.first.get_or_insert(at);
        facts.last = Some(at);
        if let Some(r) = rest.strip_prefix("_slurm_rpc_submit_batch_job: ") {
            if let Some(id) = job_id(r) {
                facts.jobs.entry(id).or_default().submit.get_or_insert(at);
            }
        } else if let Some(r) = rest.strip_prefix("sched: _slurm_rpc_allocate_resources ") {
            if let Some(id) = job_id(r) {
                let t = facts.jobs.entry(id.clone()).or_default();
                t.submit.get_or_insert(at);
                // "NodeList=(null)": queued, started later by the scheduler.
                if let Some(nodes) = word_after(r, "NodeList=").filter(|n| *n != "(null)") {
                    t.start = Some(at);
                    facts.starts.push((at, id, expand(nodes)));
                }
            }
        } else if let Some(r) = rest.strip_prefix("sched: Allocate ") {
            if let Some(id) = job_id(r) {
                facts.jobs.entry(id.clone()).or_default().start = Some(at);
                facts.starts.push((at, id, word_after(r, "NodeList=").map(expand).unwrap_or_default()));
            }
        } else if rest.contains("backfill") && rest.contains("Started JobId=") {
            if let Some((id, r)) = rest.split_once("Started ").and_then(|(_, r)| Some((job_id(r)?, r))) {
                facts.jobs.entry(id.clone()).or_default().start = Some(at);
                facts.starts.push((at, id, word_after(r, " on ").map(expand).unwrap_or_default()));
            }
        } else if let Some(r) = rest.strip_prefix("_job_complete: ") {
            if let (Some(id), true) = (job_id(r), r.trim_end().ends_with(" done")) {
                facts.jobs.entry(id).or_default().end = Some(at);
            }
        } else if let Some(r) = rest.strip_prefix("Requeuing ") {
            // A run that ends in the queue again (a requeue reclaim).
            if let Some(id) = job_id(r) {
                facts.jobs.entry(id).or_default().end = Some(at);
            }
        } else if let Some(r) = rest.split_once("preemption grace time for ").map(|x| x.1) {
            // debug: "setting 60 sec preemption grace time for JobId=V to reclaim resources for JobId=T"
            let Some((victim, taker)) = r.split_once(" to reclaim resources for ") else { continue };
            if let (Some(victim), Some(taker)) = (job_id(victim), job_id(taker)) {
                facts.preemptions.push(Preemption { at, victim, taker, verb: "grace".into() });
            }
        } else if let Some(r) = rest.strip_prefix("preempted ") {
            // "JobId=V has been killed to reclaim resources for JobId=T"
            let Some((victim, r)) = r.split_once(" has been ") else { continue };
            let Some((verb, taker)) = r.split_once(" to reclaim resources for ") else { continue };
            if let (Some(victim), Some(taker)) = (job_id(victim), job_id(taker)) {
                facts.preemptions.push(Preemption { at, victim, taker, verb: verb.to_string() });
            }
        }
    }
    facts
}

/// The word after `key` in `s`.
fn word_after<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    s.split_once(key)?.1.split_whitespace().next()
}

fn expand(list: &str) -> Vec<String> {
    onepool_decisions::hostlist::expand(list).unwrap_or_default()
}

/// The log's time stamp: `2026-12-05T04:17:10.707` (LogTimeFormat's
/// default iso8601_ms, or iso8601), or rfc5424's with a zone offset, which
/// is dropped (sacct prints the same local time without one).
fn stamp_time(stamp: &str) -> Option<f64> {
    let local = match stamp.rfind(['+', '-']) {
        Some(i) if i > 10 && stamp[..i].contains('T') => &stamp[..i],
        _ => stamp.strip_suffix('Z').unwrap_or(stamp),
    };
    parse_time(local)
}

/// The raw id after `JobId=` at the start of `s`: `JobId=15`, or the id in
/// parentheses of `JobId=12_3(15)` and `JobId=20+1(21)`.
fn job_id(s: &str) -> Option<String> {
    let token = s.trim_start().strip_prefix("JobId=")?.split_whitespace().next()?;
    let raw = match token.split_once('(') {
        Some((_, inner)) => inner.strip_suffix(')')?,
        None => token,
    };
    (!raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit())).then(|| raw.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as 22.05, 24.11 and 26.05 wrote them in this repository's
    // cluster tests (job numbers kept; one array and one hetjob form).
    const LOG: &str = "\
[2026-12-05T04:17:10.707] _slurm_rpc_submit_batch_job: JobId=18 InitPrio=10000 usec=866
[2026-12-05T04:17:10.718] preempted JobId=16 has been killed to reclaim resources for JobId=18
[2026-12-05T04:17:10.760] sched: Allocate JobId=18 NodeList=node3 #CPUs=1 Partition=gpu
[2026-12-05T04:17:11.000] _job_complete: JobId=16 WEXITSTATUS 0
[2026-12-05T04:17:11.002] _job_complete: JobId=16 done
[2026-12-05T04:17:11.500] Requeuing JobId=17
[2026-12-05T04:17:12.000] setting 60 sec preemption grace time for JobId=22 to reclaim resources for JobId=23
[2026-12-05T04:43:56.651] _slurm_rpc_submit_batch_job: JobId=32 SLUID=s1PHM92885BA00 InitPrio=10000 usec=970
[2026-12-05T04:43:56.700] preempted JobId=12_3(15) has been requeued to reclaim resources for JobId=32
[2026-12-05T04:43:57.053] sched/backfill: _start_job: Started JobId=32 in gpu on node3
[2026-12-05T04:44:00.000] sched: _slurm_rpc_allocate_resources JobId=40 NodeList=node1 usec=12
[2026-12-05T04:44:01.000] sched: _slurm_rpc_allocate_resources JobId=41 NodeList=(null) usec=12
[2026-12-05T04:44:02.000] preempted JobId=20+1(21) has been killed to reclaim resources for JobId=41
not a log line
[2026-12-05T04:44:03.5+01:00] sched: Allocate JobId=41 NodeList=node2 #CPUs=1 Partition=gpu
";

    fn t(s: &str) -> f64 {
        parse_time(s).unwrap()
    }

    #[test]
    fn submissions_starts_and_preemptions_to_the_millisecond() {
        let f = read(LOG);
        assert_eq!(f.first, Some(t("2026-12-05T04:17:10.707")));
        assert_eq!(f.last, Some(t("2026-12-05T04:44:03.5")));
        let j = f.times("18");
        assert!((j.start.unwrap() - j.submit.unwrap() - 0.053).abs() < 1e-6);
        assert_eq!(f.times("32").start, Some(t("2026-12-05T04:43:57.053")));
        let at = |s: &str| Some(t(s));
        let t40 = JobTimes { submit: at("2026-12-05T04:44:00"), start: at("2026-12-05T04:44:00"), end: None };
        assert_eq!(f.times("40"), t40);
        let t41 = JobTimes { submit: at("2026-12-05T04:44:01"), start: at("2026-12-05T04:44:03.5"), end: None };
        assert_eq!(f.times("41"), t41);
        assert_eq!(f.times("16").end, at("2026-12-05T04:17:11.002"));
        assert_eq!(f.times("17").end, at("2026-12-05T04:17:11.5"));
        let p: Vec<(&str, &str, &str)> =
            f.preemptions.iter().map(|p| (p.victim.as_str(), p.verb.as_str(), p.taker.as_str())).collect();
        assert_eq!(
            p,
            [("16", "killed", "18"), ("22", "grace", "23"), ("15", "requeued", "32"), ("21", "killed", "41")]
        );
        let starts: Vec<(&str, String)> = f.starts.iter().map(|(_, j, n)| (j.as_str(), n.join(","))).collect();
        assert_eq!(
            starts,
            [("18", "node3".to_string()), ("32", "node3".into()), ("40", "node1".into()), ("41", "node2".into())]
        );
        assert_eq!(f.times("99"), JobTimes::default());
    }

    #[test]
    fn coverage_is_the_log_s_own_span() {
        let f = read(LOG);
        assert!(f.covers_from(t("2026-12-05T04:17:10.707")));
        assert!(!f.covers_from(t("2026-12-05T04:00:00")));
        assert!(!LogFacts::default().covers_from(0.0));
    }

    #[test]
    fn job_ids_are_the_raw_ones() {
        assert_eq!(job_id("JobId=15 x").as_deref(), Some("15"));
        assert_eq!(job_id("JobId=12_3(15)").as_deref(), Some("15"));
        assert_eq!(job_id("JobId=20+1(21)").as_deref(), Some("21"));
        for bad in ["JobId=", "JobId=1x", "JobId=12_3(15", "Job=1", "JobId=(x)"] {
            assert_eq!(job_id(bad), None, "{bad}");
        }
    }
}
