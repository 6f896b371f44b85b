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
//! one in parentheses; a victim whose grace time ran out is killed or
//! requeued "for `JobId=Invalid`" (no job in particular).
//!
//! A user's text can reach the log (a job's comment, its name, a job id
//! given as text) and, with a line break, read as slurmctld's own lines:
//! the report reads only the lines [`super::log_trust`] finds are
//! slurmctld's, and checks every preemption against accounting
//! ([`super::reclaims`]).

use std::collections::HashMap;

use onepool_decisions::trace::parse_time;

use super::log_trust::{self, Zone};

/// Every submission, start and end the log names for one job, in the
/// log's order (seconds, the log's clock: the cluster's local time, like
/// sacct's). A requeued job has a start and an end per run; a line a
/// user's text may have written is among them too, so the report takes
/// the one that agrees with accounting ([`super::reclaims`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobTimes {
    pub submits: Vec<f64>,
    pub starts: Vec<f64>,
    pub ends: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub at: f64,
    pub victim: String,
    /// `None`: Slurm named no job (`JobId=Invalid`: a victim whose grace
    /// time ran out is killed or requeued for no job in particular).
    pub taker: Option<String>,
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
    /// Only from lines no user's text can have written ([`Zone::Clear`]).
    pub preemptions: Vec<Preemption>,
    /// Preemption lines a user's text may have written ([`Zone::Unsure`]):
    /// not used, only told (their reclaims are found from accounting).
    pub unsure_preemptions: Vec<Preemption>,
    /// Lines left out because their stamps go backwards.
    pub out_of_order: usize,
}

impl LogFacts {
    /// Whether the log goes back to `from` (it is written up to now, so
    /// its end is the period's).
    pub fn covers_from(&self, from: f64) -> bool {
        self.first.is_some_and(|f| f <= from)
    }

    pub fn times(&self, job: &str) -> &JobTimes {
        static NONE: JobTimes = JobTimes { submits: Vec::new(), starts: Vec::new(), ends: Vec::new() };
        self.jobs.get(job).unwrap_or(&NONE)
    }
}

/// The log's lines that are slurmctld's own ([`log_trust`]): a line a
/// user's text certainly wrote is left out, one it may have written gives
/// times but no preemption, and stamps never go backwards. `trusted`: the
/// jobs (raw ids) whose comment and name no ordinary user can set.
pub fn read(text: &str, trusted: &dyn Fn(&str) -> bool) -> LogFacts {
    let lines: Vec<&str> = text.lines().collect();
    let zones = log_trust::zones(&lines, trusted);
    let parsed: Vec<Option<(f64, &str)>> = lines
        .iter()
        .zip(&zones)
        .map(|(line, zone)| {
            let (stamp, rest) = line.strip_prefix('[')?.split_once("] ")?;
            (*zone != Zone::Inside).then_some(())?;
            Some((stamp_time(stamp)?, rest))
        })
        .collect();
    let keep = log_trust::in_order(&parsed.iter().map(|p| p.map(|(at, _)| at)).collect::<Vec<_>>());
    let mut facts = LogFacts {
        out_of_order: parsed.iter().zip(&keep).filter(|(p, k)| p.is_some() && !**k).count(),
        ..LogFacts::default()
    };
    for ((p, zone), _) in parsed.iter().zip(&zones).zip(&keep).filter(|(_, k)| **k) {
        let Some((at, rest)) = *p else { continue };
        facts.first.get_or_insert(at);
        facts.last = Some(at);
        line(&mut facts, at, rest, *zone == Zone::Clear);
    }
    facts
}

/// What one line says; a preemption only when `clear`.
fn line(facts: &mut LogFacts, at: f64, rest: &str, clear: bool) {
    if let Some(r) = rest.strip_prefix("_slurm_rpc_submit_batch_job: ") {
        if let Some(id) = job_id(r) {
            facts.jobs.entry(id).or_default().submits.push(at);
        }
    } else if let Some(r) = rest.strip_prefix("sched: _slurm_rpc_allocate_resources ") {
        if let Some(id) = job_id(r) {
            let t = facts.jobs.entry(id.clone()).or_default();
            t.submits.push(at);
            // "NodeList=(null)": queued, started later by the scheduler.
            if let Some(nodes) = word_after(r, "NodeList=").filter(|n| *n != "(null)") {
                t.starts.push(at);
                facts.starts.push((at, id, expand(nodes)));
            }
        }
    } else if let Some(r) = rest.strip_prefix("sched: Allocate ") {
        if let Some(id) = job_id(r) {
            facts.jobs.entry(id.clone()).or_default().starts.push(at);
            facts.starts.push((at, id, word_after(r, "NodeList=").map(expand).unwrap_or_default()));
        }
    } else if rest.contains("backfill") && rest.contains("Started JobId=") {
        if let Some((id, r)) = rest.split_once("Started ").and_then(|(_, r)| Some((job_id(r)?, r))) {
            facts.jobs.entry(id.clone()).or_default().starts.push(at);
            facts.starts.push((at, id, word_after(r, " on ").map(expand).unwrap_or_default()));
        }
    } else if let Some(r) = rest.strip_prefix("_job_complete: ") {
        if let (Some(id), true) = (job_id(r), r.trim_end().ends_with(" done")) {
            facts.jobs.entry(id).or_default().ends.push(at);
        }
    } else if let Some(r) = rest.strip_prefix("Requeuing ") {
        // A run that ends in the queue again (a requeue reclaim).
        if let Some(id) = job_id(r) {
            facts.jobs.entry(id).or_default().ends.push(at);
        }
    } else if let Some(p) = preemption_line(at, rest) {
        match clear {
            true => facts.preemptions.push(p),
            false => facts.unsure_preemptions.push(p),
        }
    }
}

/// Who Slurm preempted for whom.
fn preemption_line(at: f64, rest: &str) -> Option<Preemption> {
    let rest = rest.strip_prefix("debug:  ").unwrap_or(rest);
    if let Some(r) = rest.strip_prefix("setting ") {
        // debug: "setting 60 sec preemption grace time for JobId=V to reclaim resources for JobId=T"
        let (secs, r) = r.split_once(" sec preemption grace time for ")?;
        let (victim, taker) = r.split_once(" to reclaim resources for ")?;
        if !secs.is_empty() && secs.bytes().all(|b| b.is_ascii_digit()) {
            return preemption(at, victim, taker, "grace");
        }
    } else if let Some(r) = rest.strip_prefix("preempted ") {
        // "JobId=V has been killed to reclaim resources for JobId=T"
        let (victim, r) = r.split_once(" has been ")?;
        let (verb, taker) = r.split_once(" to reclaim resources for ")?;
        if verb == "killed" || verb == "requeued" {
            return preemption(at, victim, taker, verb);
        }
    }
    None
}

/// A preemption line's victim and taker, each exactly one job id (a line
/// with more after the taker is not Slurm's: `%pJ` ends it).
fn preemption(at: f64, victim: &str, taker: &str, verb: &str) -> Option<Preemption> {
    let (Some(victim), Some(taker)) = (exact_job_id(victim), exact_job_id(taker.trim_end())) else { return None };
    if victim == "Invalid" {
        return None;
    }
    let taker = (taker != "Invalid").then_some(taker);
    Some(Preemption { at, victim, taker, verb: verb.into() })
}

/// `JobId=N` (or an array's or hetjob's form, or `JobId=Invalid`) and
/// nothing else: the raw id, or "Invalid".
fn exact_job_id(s: &str) -> Option<String> {
    let token = s.strip_prefix("JobId=")?;
    if token == "Invalid" {
        return Some(token.into());
    }
    (!token.contains(char::is_whitespace)).then(|| job_id(s)).flatten()
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
[2026-12-05T04:44:04.000] preempted JobId=24 has been requeued to reclaim resources for JobId=Invalid
";

    fn t(s: &str) -> f64 {
        parse_time(s).unwrap()
    }

    #[test]
    fn submissions_starts_and_preemptions_to_the_millisecond() {
        let f = read(LOG, &|_| false);
        assert_eq!(f.first, Some(t("2026-12-05T04:17:10.707")));
        assert_eq!(f.last, Some(t("2026-12-05T04:44:04")));
        let j = f.times("18");
        assert!((j.starts[0] - j.submits[0] - 0.053).abs() < 1e-6);
        assert_eq!(f.times("32").starts, [t("2026-12-05T04:43:57.053")]);
        let t40 =
            JobTimes { submits: vec![t("2026-12-05T04:44:00")], starts: vec![t("2026-12-05T04:44:00")], ends: vec![] };
        assert_eq!(f.times("40"), &t40);
        let t41 = JobTimes {
            submits: vec![t("2026-12-05T04:44:01")],
            starts: vec![t("2026-12-05T04:44:03.5")],
            ends: vec![],
        };
        assert_eq!(f.times("41"), &t41);
        assert_eq!(f.times("16").ends, [t("2026-12-05T04:17:11.002")]);
        assert_eq!(f.times("17").ends, [t("2026-12-05T04:17:11.5")]);
        let p: Vec<(&str, &str, Option<&str>)> =
            f.preemptions.iter().map(|p| (p.victim.as_str(), p.verb.as_str(), p.taker.as_deref())).collect();
        assert_eq!(
            p,
            [
                ("16", "killed", Some("18")),
                ("22", "grace", Some("23")),
                ("15", "requeued", Some("32")),
                ("21", "killed", Some("41")),
                ("24", "requeued", None)
            ]
        );
        let starts: Vec<(&str, String)> = f.starts.iter().map(|(_, j, n)| (j.as_str(), n.join(","))).collect();
        assert_eq!(
            starts,
            [("18", "node3".to_string()), ("32", "node3".into()), ("40", "node1".into()), ("41", "node2".into())]
        );
        assert_eq!(f.times("99"), &JobTimes::default());
        assert_eq!(f.out_of_order, 0);
    }

    /// The attacks (#35): a comment with a line break, and lines
    /// shaped like Slurm's but not as `%pJ` writes them.
    #[test]
    fn a_user_s_text_names_no_preemption() {
        let log = "\
[2026-12-05T10:00:00.000] slurmctld version 22.05.8 started
[2026-12-05T10:00:01.000] _update_job: setting comment to x
[2026-12-05T10:00:01.001] preempted JobId=5 has been killed to reclaim resources for JobId=6 for JobId=9
[2026-12-05T10:00:01.002] _slurm_rpc_update_job: complete JobId=9 uid=1001 usec=50
[2026-12-05T10:00:02.000] _update_job: setting comment to y
[2026-12-05T10:00:02.001] preempted JobId=7 has been killed to reclaim resources for JobId=9
[2026-12-05T10:00:02.002] sched: Allocate JobId=9 NodeList=n1 #CPUs=1 Partition=gpu
z for JobId=9
[2026-12-05T10:00:03.000] _slurm_rpc_update_job: complete JobId=9 uid=1001 usec=50
[2026-12-05T10:00:04.000] preempted JobId=Invalid has been killed to reclaim resources for JobId=6
[2026-12-05T10:00:05.000] preempted JobId=8 has been killed to reclaim resources for JobId=6 x
{}[2026-12-05T10:00:06.000] preempted JobId=8 has been killed to reclaim resources for JobId=6
";
        // Beyond the second comment's reach (Slurm's 1024 bytes).
        let log = log.replace("{}", &"[2026-12-05T10:00:05.500] sched: something else\n".repeat(30));
        let f = read(&log, &|_| false);
        let p: Vec<(&str, Option<&str>)> =
            f.preemptions.iter().map(|p| (p.victim.as_str(), p.taker.as_deref())).collect();
        assert_eq!(p, [("8", Some("6"))], "only the last line is Slurm's");
        // The allocation after a line that may end the second comment may
        // be slurmctld's: a time, which accounting must confirm.
        assert_eq!(f.times("9").starts, [t("2026-12-05T10:00:02.002")]);
        assert_eq!(f.last, Some(t("2026-12-05T10:00:06")));
    }

    /// A preemption line an ordinary user's comment may have written is
    /// set aside, to be told; the same line is used when every job whose
    /// comment it could end is trusted (9, and 6 that it names last).
    #[test]
    fn a_preemption_line_a_user_s_text_may_have_written_is_set_aside() {
        let log = "\
[2026-12-05T10:00:00.000] _update_job: setting comment to x for JobId=9
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
y for JobId=9
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu
";
        let victims = |ps: &[Preemption]| ps.iter().map(|p| p.victim.clone()).collect::<Vec<_>>();
        let f = read(log, &|_| false);
        assert_eq!((victims(&f.preemptions), victims(&f.unsure_preemptions)), (vec![], vec!["5".to_string()]));
        let f = read(log, &|id| id == "9" || id == "6");
        assert_eq!((victims(&f.preemptions), victims(&f.unsure_preemptions)), (vec!["5".to_string()], vec![]));
    }

    /// A line stamped ahead is left out, not the real lines after it.
    #[test]
    fn stamps_never_go_backwards() {
        let log = "\
[2026-12-05T10:00:00.000] _slurm_rpc_submit_batch_job: JobId=6 InitPrio=1 usec=1
[2027-01-01T00:00:00.000] preempted JobId=5 has been killed to reclaim resources for JobId=6
[2026-12-05T10:00:01.000] preempted JobId=8 has been killed to reclaim resources for JobId=6
[2026-12-05T10:00:02.000] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu
[2026-12-05T09:00:00.000] preempted JobId=4 has been killed to reclaim resources for JobId=6
";
        let f = read(log, &|_| false);
        let p: Vec<&str> = f.preemptions.iter().map(|p| p.victim.as_str()).collect();
        assert_eq!(p, ["8"]);
        assert_eq!((f.out_of_order, f.last), (2, Some(t("2026-12-05T10:00:02"))));
    }

    #[test]
    fn coverage_is_the_log_s_own_span() {
        let f = read(LOG, &|_| false);
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
