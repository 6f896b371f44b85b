//! Why a "GPUs needed" figure is not a number, and why separate islands
//! needed no more GPUs than one pool, as data the searches keep (issue
//! #38): a reader is told which target could not be met at which sizes,
//! or what in the period left sharing nothing to save, instead of an
//! internal state ("unmet or not searched"). [`crate::report::reasons`]
//! puts it into the words every output uses.

use serde::Serialize;

use crate::compare::figures::{ClassFigures, Miss};
use crate::engine::ClassStats;

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
    pub below: Option<Missed>,
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

/// Why the smallest shared pool was or was not searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum SharedSearch {
    /// `--search`.
    Asked,
    /// By default: the estimate was within the budget.
    Cheap { estimate: SearchEstimate },
    /// By default, not run: the estimate was over the budget.
    TooCostly { estimate: SearchEstimate },
    /// By default, not run: `--shared-only` times the one shared run.
    SharedOnly,
    /// `--no-search`.
    Declined,
}

impl SharedSearch {
    pub fn ran(&self) -> bool {
        matches!(self, SharedSearch::Asked | SharedSearch::Cheap { .. })
    }
}

/// What a shared-pool search was expected to cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SearchEstimate {
    /// Simulations: what the bisection takes to find a pool as large as the
    /// larger of the simulated fleet and the separate islands.
    pub runs: u32,
    /// Simulated items in one run (jobs + requests + autoscaler ticks).
    pub run_size: u64,
    /// `runs * run_size`, against `budget`.
    pub work: u64,
    pub budget: u64,
}

/// The shared pool one size below the one found: the size tried and the
/// classes that missed their target there (what made the search go up).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Missed {
    pub gpus: u64,
    pub classes: Vec<String>,
    /// What each of `classes` missed.
    pub targets: Vec<ClassMisses>,
}
