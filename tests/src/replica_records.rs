//! An endpoint's replica jobs as Slurm's accounting keeps them (sacct):
//! what the cluster tests and the HA measurement count duplicates from,
//! not from polls that miss a job shorter than their interval.

use std::collections::{BTreeMap, BTreeSet};

use crate::TestCluster;

#[derive(Clone, Debug)]
pub struct Job {
    pub id: u32,
    pub name: String,
    /// Unix seconds; `None` for a time Slurm has not set (not started, not ended).
    pub submit: Option<i64>,
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub state: String,
}

/// How the names of `endpoint`'s replica jobs begin (`onepool-ENDPOINT-SLOT`).
pub fn prefix(endpoint: &str) -> String {
    format!("onepool-{endpoint}-")
}

/// The endpoint's replica jobs submitted at or after `since` (Unix
/// seconds), from accounting.
pub fn submitted_since(c: &TestCluster, endpoint: &str, since: i64) -> Vec<Job> {
    let start = c.ok("date", &["-d", &format!("@{since}"), "+%Y-%m-%dT%H:%M:%S"]);
    let out = c
        .cmd("sacct")
        .env("SLURM_TIME_FORMAT", "%s")
        .args(["-X", "-n", "-P", "-a", "-S", start.trim(), "-o", "JobID,JobName,Submit,Start,End,State"])
        .output()
        .expect("sacct");
    let t = |s: &str| s.parse::<i64>().ok();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            if f.len() < 6 || !f[1].starts_with(&prefix(endpoint)) {
                return None;
            }
            let job = Job {
                id: f[0].parse().ok()?,
                name: f[1].to_string(),
                submit: t(f[2]),
                start: t(f[3]),
                end: t(f[4]),
                state: f[5].to_string(),
            };
            job.submit.is_some_and(|s| s >= since).then_some(job)
        })
        .collect()
}

/// Slots (job names) with two jobs whose running intervals overlap.
pub fn overlapping_slots(jobs: &[Job]) -> BTreeSet<String> {
    let mut by_slot: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for j in jobs {
        if let Some(start) = j.start {
            by_slot.entry(&j.name).or_default().push((start, j.end.unwrap_or(i64::MAX)));
        }
    }
    by_slot
        .into_iter()
        .filter(|(_, v)| v.iter().enumerate().any(|(i, a)| v[i + 1..].iter().any(|b| a.0 < b.1 && b.0 < a.1)))
        .map(|(name, _)| name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u32, name: &str, start: Option<i64>, end: Option<i64>) -> Job {
        Job { id, name: name.into(), submit: Some(0), start, end, state: "X".into() }
    }

    #[test]
    fn two_jobs_of_one_slot_running_at_once_overlap_one_after_the_other_do_not() {
        let jobs = [
            job(1, "onepool-ha-0", Some(10), Some(20)),
            job(2, "onepool-ha-0", Some(20), None),
            job(3, "onepool-ha-1", Some(10), None),
            job(4, "onepool-ha-1", Some(15), Some(16)),
            job(5, "onepool-ha-2", None, None),
            job(6, "onepool-ha-2", Some(1), None),
        ];
        let got: Vec<String> = overlapping_slots(&jobs).into_iter().collect();
        assert_eq!(got, ["onepool-ha-1"]);
    }
}
