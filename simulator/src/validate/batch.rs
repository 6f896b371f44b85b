//! The batch part: the scenario's jobs as the cluster ran them (sacct, and
//! job.sh's own event logs) beside the simulator's `--job-log`, every run
//! of every job; the protected jobs' time to capacity; the victims told in
//! advance.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::Tier;

use super::format::{python_float, signed_tenths, tenths};
use super::sacct::{self, SacctRun};
use super::{read, read_if_there};
use crate::input::{jobs, OnBadRow};
use crate::job_log::{self, LoggedRun};
use crate::scenario::Scenario;

/// How a class's jobs are submitted and told: its reclaim mode (`None`:
/// protected, never reclaimed) and the seconds job.sh takes from the
/// notice to giving its GPUs back (the scenario's `[victims]`
/// release_after, as the simulator takes it).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassNotice {
    pub name: String,
    pub mode: Option<ReclaimMode>,
    pub notice_s: Option<f64>,
}

impl ClassNotice {
    fn told_in_advance(&self) -> bool {
        matches!(self.mode, Some(ReclaimMode::Graceful | ReclaimMode::Requeue))
    }
}

/// Every class of the scenario's policy.
pub fn class_notices(sc: &Scenario) -> Vec<ClassNotice> {
    sc.policy
        .classes
        .iter()
        .zip(&sc.workload.victims)
        .map(|(c, v)| ClassNotice {
            name: c.name.clone(),
            mode: match c.tier {
                Tier::Protected { .. } => None,
                Tier::Flexible { reclaim, .. } => Some(reclaim),
            },
            notice_s: v.release_after_s,
        })
        .collect()
}

/// The line the script reads for each job it submits: `NAME MODE NOTICE`,
/// `-` for what the class does not have.
impl fmt::Display for ClassNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = self.mode.map_or("-", ReclaimMode::as_str);
        let notice = self.notice_s.map_or_else(|| "-".to_string(), python_float);
        write!(f, "{} {mode} {notice}", self.name)
    }
}

/// What the batch part left in its folder, read.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub classes: Vec<ClassNotice>,
    /// Protected classes: their jobs' time to capacity is compared.
    pub protected: Vec<String>,
    /// `ids`: each submitted job's index (its row of jobs.csv), Slurm job
    /// id and class.
    pub submitted: Vec<(usize, String, String)>,
    /// jobs.csv's submit times, in row order.
    pub submit_at: Vec<f64>,
    pub sacct: Vec<SacctRun>,
    pub simulated: Vec<LoggedRun>,
    /// job.sh's events per job index: epoch seconds and the event.
    pub events: BTreeMap<usize, Vec<(f64, String)>>,
}

impl Inputs {
    /// `out`: the script's folder (ids, sacct.txt, job-log.tsv,
    /// events-N.log); the scenario and its jobs.csv as the script was given them.
    pub fn load(out: &Path, scenario: &Path, jobs_csv: &Path) -> Result<Inputs, String> {
        let sc = crate::scenario::load(scenario, OnBadRow::Abort)?;
        let protected = sc.policy.classes.iter().filter(|c| c.is_protected()).map(|c| c.name.clone()).collect();
        let csv = read(jobs_csv)?;
        let rows = jobs::read_csv(&jobs_csv.display().to_string(), &csv, OnBadRow::Abort).map_err(|e| e.to_string())?;
        // The script submits every row: one the reader leaves out would
        // shift the indices the job log and the ids agree on.
        if let Some((why, n)) = rows.ignored.first() {
            return Err(format!("{}: {n} row(s) left out ({why}); every row must be a job", jobs_csv.display()));
        }
        let submitted = read_ids(&read(&out.join("ids"))?)?;
        let mut events = BTreeMap::new();
        for (i, _, _) in &submitted {
            if let Some(text) = read_if_there(&out.join(format!("events-{i}.log")))? {
                events.insert(*i, read_events(&text)?);
            }
        }
        Ok(Inputs {
            classes: class_notices(&sc),
            protected,
            submitted,
            submit_at: rows.rows.iter().map(|r| r.submit).collect(),
            sacct: sacct::read(&read(&out.join("sacct.txt"))?, sacct::BATCH_FORMAT)?,
            simulated: job_log::read(&read(&out.join("job-log.tsv"))?)?,
            events,
        })
    }
}

/// The script's `ids`: `INDEX JOBID CLASS` a line.
fn read_ids(text: &str) -> Result<Vec<(usize, String, String)>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
            [i, id, class] => {
                Ok((i.parse().map_err(|_| format!("ids: {l:?}: no job index"))?, id.to_string(), class.to_string()))
            }
            _ => Err(format!("ids: {l:?} is not INDEX JOBID CLASS")),
        })
        .collect()
}

/// job.sh's log: `EPOCH EVENT [details]` a line.
fn read_events(text: &str) -> Result<Vec<(f64, String)>, String> {
    let mut events = Vec::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = l.split_whitespace();
        let (Some(t), Some(what)) = (f.next(), f.next()) else { return Err(format!("job.sh log: {l:?}: no event")) };
        let t = t.parse::<f64>().map_err(|_| format!("job.sh log: {l:?}: {t:?} is not a time"))?;
        events.push((t, what.to_string()));
    }
    Ok(events)
}

/// One run on the cluster, times in seconds after the first submission.
#[derive(Debug, Clone, PartialEq)]
struct RealRun {
    start: Option<f64>,
    end: Option<f64>,
    state: String,
    eligible: Option<f64>,
}

/// One simulated run, as the job log has it.
#[derive(Debug, Clone, PartialEq)]
struct SimRun {
    start: f64,
    end: f64,
    reclaimed: bool,
}

/// A submitted job's runs, real and simulated, each in start order.
#[derive(Debug, Clone, PartialEq)]
struct Job {
    index: usize,
    id: String,
    class: String,
    submit_at: f64,
    real: Vec<RealRun>,
    sim: Vec<SimRun>,
    /// job.sh's events, seconds after the first submission.
    events: Vec<(f64, String)>,
}

/// The jobs by index, with every time from sacct's first submission.
fn jobs(inp: &Inputs) -> Result<BTreeMap<usize, Job>, String> {
    let t0 = inp.sacct.iter().filter_map(|r| r.submit).reduce(f64::min).ok_or("sacct lists no submitted job")?;
    let mut jobs = BTreeMap::new();
    for (i, id, class) in &inp.submitted {
        let submit_at = *inp.submit_at.get(*i).ok_or_else(|| format!("job {i} has no row in jobs.csv"))?;
        let events = inp.events.get(i).map_or_else(Vec::new, |e| e.iter().map(|(t, w)| (t - t0, w.clone())).collect());
        let job = Job { index: *i, id: id.clone(), class: class.clone(), submit_at, real: vec![], sim: vec![], events };
        jobs.insert(*i, job);
    }
    let by_id: BTreeMap<&str, usize> = inp.submitted.iter().map(|(i, id, _)| (id.as_str(), *i)).collect();
    // Runs in start order (never started: last), so a requeued job's runs
    // come in the order they ran.
    let mut recs: Vec<&SacctRun> = inp.sacct.iter().collect();
    recs.sort_by(|a, b| start_key(a).total_cmp(&start_key(b)));
    let rel = |x: Option<f64>| x.map(|v| v - t0);
    for r in recs {
        if let Some(j) = by_id.get(r.id.as_str()).and_then(|i| jobs.get_mut(i)) {
            j.real.push(RealRun {
                start: rel(r.start),
                end: rel(r.end),
                state: r.state_at(),
                eligible: rel(r.eligible),
            });
        }
    }
    for s in &inp.simulated {
        let j =
            jobs.get_mut(&s.job).ok_or_else(|| format!("the job log has job {}, which was not submitted", s.job))?;
        j.sim.push(SimRun { start: s.start, end: s.end, reclaimed: s.reclaimed });
    }
    for j in jobs.values_mut() {
        j.sim.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    Ok(jobs)
}

fn start_key(r: &SacctRun) -> f64 {
    r.start.filter(|s| *s != 0.0).unwrap_or(1e18)
}

/// The batch part's report, as the script prints it.
pub fn report(inp: &Inputs) -> Result<String, String> {
    let jobs = jobs(inp)?;
    let mut out = String::new();
    let diffs = every_run(&jobs, &mut out);
    time_to_capacity(&jobs, &inp.protected, &mut out);
    victims(&jobs, &inp.classes, &mut out);
    summary(&jobs, &diffs, &mut out);
    Ok(out)
}

/// |sim - real| of every run's start and end where both are known.
struct Diffs {
    start: Vec<f64>,
    end: Vec<f64>,
}

fn every_run(jobs: &BTreeMap<usize, Job>, out: &mut String) -> Diffs {
    out.push_str("\nEvery run of every job (s after the first submission; real = sacct -D, 1 s resolution):\n\n");
    out.push_str("| job | class | submit | run | real start | sim start | diff | real end | sim end | diff | real state@node | sim |\n");
    out.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
    let mut d = Diffs { start: vec![], end: vec![] };
    for j in jobs.values() {
        for k in 0..j.real.len().max(j.sim.len()).max(1) {
            let r = j.real.get(k);
            let s = j.sim.get(k);
            let (rs, re) = (r.and_then(|r| r.start), r.and_then(|r| r.end));
            let (ss, se) = (s.map(|s| s.start), s.map(|s| s.end));
            let d1 = rs.zip(ss).map(|(r, s)| s - r);
            let d2 = re.zip(se).map(|(r, s)| s - r);
            d.start.extend(d1.map(f64::abs));
            d.end.extend(d2.map(f64::abs));
            let sim_state = s.map_or("-", |s| if s.reclaimed { "reclaimed" } else { "done" });
            let _ = writeln!(
                out,
                "| v{} ({}) | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {sim_state} |",
                j.index,
                j.id,
                j.class,
                j.submit_at,
                k + 1,
                tenths(rs),
                tenths(ss),
                signed_tenths(d1),
                tenths(re),
                tenths(se),
                signed_tenths(d2),
                r.map_or("-", |r| r.state.as_str()),
            );
        }
    }
    d
}

fn time_to_capacity(jobs: &BTreeMap<usize, Job>, protected: &[String], out: &mut String) {
    out.push_str("\nTime to capacity (protected jobs, first start - submit, s):\n\n");
    out.push_str("| job | class | real | simulated |\n| --- | --- | ---: | ---: |\n");
    for j in jobs.values().filter(|j| protected.contains(&j.class)) {
        let real = j.real.first().and_then(|r| r.start).map(|s| s - j.submit_at);
        let sim = j.sim.first().map(|s| s.start - j.submit_at);
        let _ = writeln!(out, "| v{} | {} | {} | {} |", j.index, j.class, tenths(real), tenths(sim));
    }
}

fn victims(jobs: &BTreeMap<usize, Job>, classes: &[ClassNotice], out: &mut String) {
    out.push_str(
        "\nVictims told in advance (graceful/requeue classes), from job.sh's own log (real notice), sacct (real;\n\
         eligible again = the requeued run's Eligible, i.e. its BeginTime) and --job-log (simulated):\n\n",
    );
    out.push_str("| job | class | mode | real notice | real release | sim release | real eligible again | real restart | sim restart | real hold (restart - release) | sim hold |\n");
    out.push_str("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for j in jobs.values() {
        let Some(class) = classes.iter().find(|c| c.name == j.class).filter(|c| c.told_in_advance()) else { continue };
        let notice = j.events.iter().find(|(_, e)| e == "notice").map(|(t, _)| *t);
        if notice.is_none() && !j.sim.iter().any(|s| s.reclaimed) {
            continue;
        }
        let (r, s) = (&j.real, &j.sim);
        let real_release = r.first().and_then(|r| r.end);
        let sim_release = s.first().map(|s| s.end);
        let real_restart = r.get(1).and_then(|r| r.start);
        let sim_restart = s.get(1).map(|s| s.start);
        let hold = |restart: Option<f64>, release: Option<f64>| restart.zip(release).map(|(a, b)| a - b);
        let _ = writeln!(
            out,
            "| v{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            j.index,
            j.class,
            class.mode.map_or("-", ReclaimMode::as_str),
            tenths(notice),
            tenths(real_release),
            tenths(sim_release),
            tenths(r.get(1).and_then(|r| r.eligible)),
            tenths(real_restart),
            tenths(sim_restart),
            tenths(hold(real_restart, real_release)),
            tenths(hold(sim_restart, sim_release)),
        );
    }
}

fn summary(jobs: &BTreeMap<usize, Job>, d: &Diffs, out: &mut String) {
    let real: usize = jobs.values().map(|j| j.real.len()).sum();
    let sim: usize = jobs.values().map(|j| j.sim.len()).sum();
    let _ = writeln!(
        out,
        "\nruns: {real} real, {sim} simulated; mean |sim start - real start| = {}; mean |sim end - real end| = {}",
        mean_max(&d.start),
        mean_max(&d.end)
    );
}

/// `M s over N runs (max X s)`.
fn mean_max(v: &[f64]) -> String {
    if v.is_empty() {
        return "- s over 0 runs".to_string();
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mean:.1} s over {} runs (max {max:.1} s)", v.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, submit: f64, eligible: f64, start: Option<f64>, end: Option<f64>, state: &str) -> SacctRun {
        SacctRun {
            id: id.into(),
            submit: Some(submit),
            eligible: Some(eligible),
            start,
            end,
            state: state.into(),
            node: "node2".into(),
            ..SacctRun::default()
        }
    }

    /// A requeued training job (index 0) and an agents job that never
    /// started (index 1), as the script leaves them.
    fn inputs() -> Inputs {
        Inputs {
            classes: vec![
                ClassNotice { name: "training".into(), mode: Some(ReclaimMode::Requeue), notice_s: Some(15.0) },
                ClassNotice { name: "agents".into(), mode: Some(ReclaimMode::Immediate), notice_s: None },
            ],
            protected: vec![],
            submitted: vec![(0, "43".into(), "training".into()), (1, "44".into(), "agents".into())],
            submit_at: vec![0.0, 5.0],
            // sacct's order is not the runs' order.
            sacct: vec![
                run("43", 1076.0, 1197.0, Some(1201.0), Some(1241.0), "COMPLETED"),
                run("44", 1005.0, 1005.0, None, None, "CANCELLED by 0"),
                run("43", 1000.0, 1000.0, Some(1001.0), Some(1076.0), "REQUEUED"),
            ],
            simulated: vec![
                LoggedRun { job: 0, class: "training".into(), submit: 0.0, start: 200.0, end: 240.0, reclaimed: false },
                LoggedRun { job: 0, class: "training".into(), submit: 0.0, start: 0.0, end: 75.0, reclaimed: true },
            ],
            events: BTreeMap::from([(0, vec![(1060.25, "notice".to_string())])]),
        }
    }

    #[test]
    fn runs_come_in_start_order_with_times_from_the_first_submission() {
        let jobs = jobs(&inputs()).unwrap();
        let real: Vec<_> = jobs[&0].real.iter().map(|r| (r.start, r.end, r.state.as_str(), r.eligible)).collect();
        assert_eq!(
            real,
            [
                (Some(1.0), Some(76.0), "REQUEUED@node2", Some(0.0)),
                (Some(201.0), Some(241.0), "COMPLETED@node2", Some(197.0))
            ]
        );
        let sim: Vec<_> = jobs[&0].sim.iter().map(|s| (s.start, s.reclaimed)).collect();
        assert_eq!(sim, [(0.0, true), (200.0, false)]);
        assert_eq!(jobs[&0].events, [(60.25, "notice".to_string())]);
        assert_eq!(jobs[&1].real[0].state, "CANCELLED");
        assert_eq!(jobs[&1].real[0].start, None);
    }

    #[test]
    fn a_requeued_victim_is_listed_with_its_notice_release_and_restart() {
        let jobs = jobs(&inputs()).unwrap();
        let mut out = String::new();
        victims(&jobs, &inputs().classes, &mut out);
        let row = out.lines().last().unwrap();
        assert_eq!(row, "| v0 | training | requeue | 60.2 | 76.0 | 75.0 | 197.0 | 201.0 | 200.0 | 125.0 | 125.0 |");
        // The agents job is reclaimed without a notice: not a row.
        assert!(!out.contains("| v1 |"), "{out}");
    }

    #[test]
    fn the_summary_counts_runs_and_means_only_where_both_sides_have_a_time() {
        let inp = inputs();
        let jobs = jobs(&inp).unwrap();
        let mut out = String::new();
        let d = every_run(&jobs, &mut out);
        assert_eq!((d.start.clone(), d.end.clone()), (vec![1.0, 1.0], vec![1.0, 1.0]));
        assert!(out.contains("| v1 (44) | agents | 5 | 1 | - | - | - | - | - | - | CANCELLED | - |"), "{out}");
        let mut s = String::new();
        summary(&jobs, &d, &mut s);
        assert_eq!(s, "\nruns: 3 real, 2 simulated; mean |sim start - real start| = 1.0 s over 2 runs (max 1.0 s); mean |sim end - real end| = 1.0 s over 2 runs (max 1.0 s)\n");
        assert_eq!(mean_max(&[]), "- s over 0 runs");
    }

    #[test]
    fn a_simulated_job_the_script_never_submitted_is_an_error() {
        let mut inp = inputs();
        inp.simulated[0].job = 7;
        assert_eq!(jobs(&inp).unwrap_err(), "the job log has job 7, which was not submitted");
        inp.sacct.iter_mut().for_each(|r| r.submit = None);
        assert_eq!(jobs(&inp).unwrap_err(), "sacct lists no submitted job");
    }

    #[test]
    fn ids_and_job_script_logs() {
        assert_eq!(
            read_ids("0 35 agents\n\n1 36 training\n").unwrap()[1],
            (1, "36".to_string(), "training".to_string())
        );
        assert_eq!(read_ids("0 35\n").unwrap_err(), "ids: \"0 35\" is not INDEX JOBID CLASS");
        let e = read_events("1764691991.020999908 start 43 restart=0\n1764692051.5 notice done=59.96\n").unwrap();
        assert_eq!(e[1], (1_764_692_051.5, "notice".to_string()));
        assert!(read_events("soon notice\n").unwrap_err().contains("\"soon\" is not a time"));
    }
}
