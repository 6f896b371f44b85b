//! Why a "GPUs needed" figure is not a number, and why separate islands
//! needed no more GPUs than one pool, as data the searches keep (issue
//! #38): a reader is told which target could not be met at which sizes,
//! or what in the period left sharing nothing to save, instead of an
//! internal state ("unmet or not searched"). [`crate::report::reasons`]
//! puts it into the words every output uses.

use serde::{Deserialize, Serialize};

use super::{ClassFigures, SharedSearch};
use crate::engine::ClassStats;

/// A target a class missed in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "snake_case")]
pub enum Miss {
    /// Its requests' p99 queueing delay was over the tightest SLO of its
    /// endpoints.
    P99QueueDelay { p99_s: f64, slo_s: f64 },
    /// Its batch jobs' p95 wait was over `max_p95_wait`.
    P95Wait { p95_s: f64, max_s: f64 },
    /// Requests were still unserved at the cut-off.
    Unserved { requests: u64 },
    /// Jobs had not started by the cut-off.
    Unstarted { jobs: u64 },
}

/// The targets `f` missed (none: [`ClassFigures::meets_target`]).
pub(super) fn misses(f: &ClassFigures, has_batch: bool, max_p95_wait_s: f64) -> Vec<Miss> {
    let mut out = Vec::new();
    if has_batch && over(f.wait_p95_s, max_p95_wait_s) {
        out.push(Miss::P95Wait { p95_s: f.wait_p95_s, max_s: max_p95_wait_s });
    }
    if let Some(slo) = f.slo_p99_s.filter(|slo| over(f.p99_queue_delay_s, *slo)) {
        out.push(Miss::P99QueueDelay { p99_s: f.p99_queue_delay_s, slo_s: slo });
    }
    if f.unserved > 0 {
        out.push(Miss::Unserved { requests: f.unserved });
    }
    if f.unstarted_jobs > 0 {
        out.push(Miss::Unstarted { jobs: f.unstarted_jobs });
    }
    out
}

/// Over the limit, or not a number: a figure that cannot be compared
/// does not meet its target.
fn over(v: f64, limit: f64) -> bool {
    !matches!(v.partial_cmp(&limit), Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal))
}

/// One class's misses at one size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassMisses {
    pub class: String,
    pub missed: Vec<Miss>,
    /// Its endpoints whose autoscaler reached their `max_replicas` there
    /// (endpoint, maximum): more GPUs add no replica to them.
    pub at_max_replicas: Vec<(String, u32)>,
}

impl ClassMisses {
    /// `None` when the class met its target.
    pub(super) fn of(f: &ClassFigures, st: &ClassStats) -> Option<ClassMisses> {
        (!f.missed.is_empty()).then(|| ClassMisses {
            class: f.class.clone(),
            missed: f.missed.clone(),
            at_max_replicas: st.at_max_replicas.clone(),
        })
    }
}

/// Why a "GPUs needed" figure is not a number.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Unmet {
    /// Every size tried missed a target: the sizes tried (GPUs, smallest
    /// first) and, at the largest, who missed what.
    NoSizeMet { tried_gpus: Vec<u64>, at_largest: Vec<ClassMisses> },
    /// The shared pool was not searched, and why.
    NotSearched { search: SharedSearch },
    /// `--shared-only`: the islands were not sized.
    NotSized,
}

/// What the runs show about a period where separate islands needed no
/// more GPUs than one pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoSaving {
    pub separate_gpus: u64,
    pub shared_gpus: u64,
    /// The classes with an island of their own.
    pub islands: Vec<String>,
    /// Most GPUs the classes held at once in the shared pool of
    /// `shared_gpus`.
    pub together_peak_gpus: u32,
    /// Each class's most GPUs held at once alone on its island, added up.
    pub apart_peak_gpus: u32,
    /// Every island is the smallest size searched: its GPUs.
    pub smallest_island_gpus: Option<u64>,
    /// The size below `shared_gpus` the search tried, and who missed there.
    pub below: Option<super::Missed>,
    pub because: Because,
}

/// The reason a [`NoSaving`] gives first, decided from its figures in
/// this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Because {
    /// One class had work of its own: nothing to share.
    OneClass,
    /// The classes' busiest moments came together: in one pool they held
    /// as many GPUs at once as their own peaks add up to.
    PeaksTogether,
    /// Every island is already the smallest size searched, and a pool
    /// the next size down missed a target.
    SmallestIslands,
    /// The peaks were apart, but a pool the next size down missed a target.
    SmallerPoolMissed,
}

impl NoSaving {
    /// `None` unless both figures are numbers and the islands' is no
    /// larger than the pool's.
    pub(super) fn find(c: &super::Comparison, together_peak_gpus: Option<u32>, smallest: u64) -> Option<NoSaving> {
        let (separate_gpus, shared_gpus) = (c.separate_gpus?, c.shared_gpus_needed?);
        if separate_gpus > shared_gpus || !c.separate_sized {
            return None;
        }
        let own: Vec<&super::ClassRow> = c.classes.iter().filter(|r| r.own_island).collect();
        let together_peak_gpus = together_peak_gpus?;
        let apart_peak_gpus = own.iter().filter_map(|r| r.separate.as_ref()).map(|f| f.peak_gpus).sum();
        let smallest_island_gpus = own.iter().all(|r| r.separate_gpus_needed == Some(smallest)).then_some(smallest);
        let because = if own.len() <= 1 {
            Because::OneClass
        } else if together_peak_gpus >= apart_peak_gpus {
            Because::PeaksTogether
        } else if smallest_island_gpus.is_some() {
            Because::SmallestIslands
        } else {
            Because::SmallerPoolMissed
        };
        Some(NoSaving {
            separate_gpus,
            shared_gpus,
            islands: own.iter().map(|r| r.shared.class.clone()).collect(),
            together_peak_gpus,
            apart_peak_gpus,
            smallest_island_gpus,
            below: c.shared_smaller_missed.clone(),
            because,
        })
    }
}
