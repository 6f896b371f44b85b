//! `[[jobs]]`: the job history files, their rows classified as onepool's
//! plugin would have placed them (or as it did, for records of a cluster
//! that runs onepool).

use std::path::{Path, PathBuf};
use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{classify, JobRequest, Verdict};
use onepool_decisions::policy::{Policy, Tier};
use serde::Deserialize;

use crate::engine::Job;
use crate::input::{jobs, BadRow, OnBadRow};
use crate::scenario::reading::{count, read, take, Nobody, Placed, USER};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJobs {
    file: PathBuf,
    #[serde(default = "csv")]
    format: String,
    #[serde(default)]
    keep_times: bool,
    #[serde(default)]
    classified: bool,
}

fn csv() -> String {
    "csv".into()
}

/// Every `[[jobs]]` file's rows, their times from 0 unless kept.
pub(super) fn job_rows(
    base: &Path,
    raw: &[RawJobs],
    on_bad: OnBadRow,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<(jobs::JobRow, bool)>, String> {
    let mut rows = Vec::new();
    for j in raw {
        let (f, t) = read(base, &j.file)?;
        let r = match j.format.as_str() {
            "csv" => jobs::read_csv(&f, &t, on_bad),
            "sacct" => jobs::read_sacct(&f, &t, on_bad),
            "sacct-json" => jobs::read_sacct_json(&f, &t, on_bad),
            other => return Err(format!("jobs format {other:?}: use csv, sacct or sacct-json")),
        };
        let mut got = take(r, bad_rows, ignored)?;
        if !j.keep_times {
            let first = got.iter().map(|r| r.submit).fold(f64::INFINITY, f64::min);
            got.iter_mut().for_each(|r| r.submit -= first);
        }
        rows.extend(got.into_iter().map(|r| (r, j.classified)));
    }
    Ok(rows)
}

/// The rows the policy accepts, as jobs of their classes in submission
/// order; the others counted in `ignored` with the reason. Rows of a
/// `classified` file keep the class the plugin gave them.
pub(super) fn classify_jobs(
    policy: &Policy,
    rows: Vec<(jobs::JobRow, bool)>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<Job>, String> {
    let class_idx = |name: &str| policy.classes.iter().position(|c| c.name == name);
    let mut work_jobs = Vec::new();
    for (r, classified) in rows {
        let placed = if classified {
            match already_classified(policy, &r) {
                Some(placed) => placed,
                None => {
                    count(ignored, "outside the pool (its class or QOS is no class of the policy)".into(), 1);
                    continue;
                }
            }
        } else {
            match classify(policy, &Nobody, USER, &job_request(&r)) {
                Verdict::Accept(p) => {
                    let c = class_idx(&p.class).ok_or("classifier returned an unknown class")?;
                    (c, p.record.reclaim, p.record.drain_timeout)
                }
                Verdict::Outside => {
                    count(ignored, "outside the pool (partition or GPU type)".into(), 1);
                    continue;
                }
                Verdict::Refuse(f) => {
                    count(ignored, format!("refused by the policy: {}", f.message), 1);
                    continue;
                }
            }
        };
        let (c, reclaim, drain) = placed;
        work_jobs.push(Job {
            submit: r.submit,
            duration: r.duration,
            gpus: r.gpus,
            per_node: r.gpus_per_node.unwrap_or(r.gpus),
            gpu_type: r.gpu_type,
            class: c,
            island: c,
            reclaim,
            drain,
        });
    }
    work_jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(work_jobs)
}

/// A record's class as the plugin gave it (the class name, else the
/// class whose QOS it ran under), with that class's reclaim behaviour.
fn already_classified(policy: &Policy, r: &jobs::JobRow) -> Option<Placed> {
    let class = match &r.class {
        Some(name) => policy.class(name)?,
        None => policy.class_by_qos(r.qos.as_deref()?)?,
    };
    let i = policy.classes.iter().position(|k| k.name == class.name)?;
    Some(match class.tier {
        Tier::Protected { .. } => (i, None, None),
        Tier::Flexible { reclaim, drain_timeout, .. } => (i, Some(reclaim), Some(drain_timeout)),
    })
}

/// What the plugin would have been asked at submission.
fn job_request(r: &jobs::JobRow) -> JobRequest {
    JobRequest {
        account: r.account.clone(),
        partition: r.partition.clone(),
        qos: r.qos.clone(),
        annotation: Annotation { workload: r.class.clone(), ..Annotation::default() },
        gpus: u64::from(r.gpus),
        gpu_type: r.gpu_type.clone(),
        time_limit: Some(Duration::from_secs_f64(r.duration.ceil().max(1.0))),
        // The records hold what the jobs held: counted as they ran.
        exclusive: false,
        nodes: 1,
    }
}
