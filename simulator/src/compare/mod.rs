//! Separate islands vs one shared pool on the same workload, and the
//! fleet-size searches behind "GPUs needed".
//!
//! A class meets its target when every request of its endpoints waits at
//! most the endpoint's p99 queueing-delay SLO at the 99th percentile, and
//! (batch classes) the p95 wait is at most `max_p95_wait` with every job
//! started. Separate pools: each class gets the smallest island (nodes of
//! the fleet's mix, by bisection) where it meets its target alone. Shared:
//! the smallest fleet where every class meets its target under the policy.
//!
//! The searches themselves, and what they guarantee: search.rs.

mod figures;
mod search;
mod why;

use onepool_decisions::policy::Policy;
use serde::Serialize;

use crate::engine::{RunResult, Workload};
use crate::fleet::Fleet;

pub use figures::{figures, run_islands, run_separate, run_shared, ClassFigures, Miss, Settings, SEARCH_BUDGET};
pub use search::{bisect, bisect_runs, decide_search, run_size, Search};
use search::{search_shared, size_separate};
pub use why::{Because, ClassMisses, Missed, NoSaving, SearchEstimate, SharedSearch, Unmet};

/// An endpoint whose first replicas run in a (protected) class in the
/// shared pool; its requests are counted under the endpoint's own class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BaselineOf {
    pub endpoint: String,
    pub replicas: u32,
    pub requests_counted_under: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub classes: Vec<ClassRow>,
    /// GPUs the separate islands need in all: each class alone on the
    /// smallest island (nodes of the fleet's mix) where it meets its target.
    pub separate_gpus: Option<u64>,
    /// GPUs of the smallest shared pool found where every class meets its
    /// target under the policy (`None`: not searched, or unmet).
    pub shared_gpus_needed: Option<u64>,
    /// The size below `shared_gpus_needed` that the search tried, and who missed there.
    pub shared_smaller_missed: Option<Missed>,
    /// Why `separate_gpus` is `None` (`None` when it is a number).
    pub separate_unmet: Option<Unmet>,
    /// Why `shared_gpus_needed` is `None` (`None` when it is a number).
    pub shared_unmet: Option<Unmet>,
    /// The islands needed no more GPUs than one pool: what the runs show
    /// about why.
    pub no_saving: Option<NoSaving>,
    /// The largest shared pool the search may try.
    pub shared_max_gpus: u64,
    pub shared_searched: bool,
    pub shared_search: SharedSearch,
    /// false: `--shared-only`, the separate islands were not sized.
    pub separate_sized: bool,
    /// The fleet the shared pool was simulated on for the per-class
    /// figures (the scenario's, or `--nodes`), whatever the search found.
    pub shared_fleet_gpus: u64,
    pub separate_idle_gpu_hours: f64,
    pub shared_idle_gpu_hours: f64,
    /// From the first submission or request to when all work would be
    /// done with unlimited GPUs: the later of `jobs_end_hours` and
    /// `requests_end_hours`.
    pub window_hours: f64,
    pub jobs_end_hours: Option<f64>,
    pub requests_end_hours: Option<f64>,
    /// When the last GPU was released in the shared run (past the window
    /// when the fleet delayed work).
    pub shared_last_busy_hours: f64,
    /// Simulations of both searches, and of the shared one alone.
    pub search_runs: u32,
    pub shared_search_runs: u32,
    pub search_seconds: f64,
    pub shared_run_seconds: f64,
    /// Per bucket (seconds from the window start): per class demand and allocation in the shared run.
    pub bucket_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassRow {
    /// false: the class has no work of its own (e.g. only an endpoint's
    /// baseline replicas, which share the endpoint's island when separate).
    pub own_island: bool,
    pub separate_gpus_needed: Option<u64>,
    /// GPU-hours the class's own island (of `separate_gpus_needed`) sat idle in the window.
    pub separate_idle_gpu_hours: Option<f64>,
    pub separate: Option<ClassFigures>,
    pub shared: ClassFigures,
    /// Endpoints whose baseline replicas this class runs in the shared pool.
    pub baseline_of: Vec<BaselineOf>,
    #[serde(skip)]
    pub demand: Vec<f64>,
    #[serde(skip)]
    pub alloc: Vec<f64>,
}

/// Per class: the endpoints whose baseline replicas it runs.
fn baselines(w: &Workload, c: usize) -> Vec<BaselineOf> {
    w.endpoints
        .iter()
        .filter_map(|e| e.baseline.filter(|b| b.0 == c && e.class != c).map(|b| (e, b.1)))
        .map(|(e, replicas)| BaselineOf {
            endpoint: e.name.clone(),
            replicas,
            requests_counted_under: w.classes[e.class].clone(),
        })
        .collect()
}

/// Runs the comparison: the separate islands sized by search (unless
/// `--shared-only`), the smallest shared pool searched as `search` and
/// its cost decide, and the shared pool simulated on `fleet`.
pub fn compare(w: &Workload, policy: &Policy, fleet: &Fleet, s: &Settings, search: Search) -> (Comparison, RunResult) {
    let started = std::time::Instant::now();
    let max = s.max_nodes.max(fleet.nodes());
    let sep = size_separate(w, fleet, s, max);
    let decision = decide_search(search, w, s, fleet.nodes().max(sep.nodes));
    let found = if decision.ran() {
        search_shared(w, policy, fleet, s, max)
    } else {
        search::SharedFound {
            gpus: None,
            below: None,
            unmet: Some(Unmet::NotSearched { search: decision }),
            peak_gpus: None,
            runs: 0,
        }
    };
    let search_seconds = started.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let res = run_shared(w, policy, fleet, s);
    let shared_run_seconds = t.elapsed().as_secs_f64();
    let classes = sep
        .rows
        .into_iter()
        .enumerate()
        .map(|(c, (own, need, idle, sep))| ClassRow {
            own_island: own,
            separate_gpus_needed: need,
            separate_idle_gpu_hours: idle,
            separate: sep,
            shared: figures(w, s, c, &res.classes[c]),
            baseline_of: baselines(w, c),
            demand: res.classes[c].demand.clone(),
            alloc: res.classes[c].alloc.clone(),
        })
        .collect();
    let (jobs_end, requests_end) = w.ends();
    let mut cmp = Comparison {
        classes,
        separate_gpus: sep.gpus,
        shared_gpus_needed: found.gpus,
        shared_smaller_missed: found.below,
        separate_unmet: sep.unmet,
        shared_unmet: found.unmet,
        no_saving: None,
        shared_max_gpus: fleet.scaled(max).gpus(),
        shared_searched: decision.ran(),
        shared_search: decision,
        separate_sized: s.separate,
        shared_fleet_gpus: fleet.gpus(),
        separate_idle_gpu_hours: sep.idle_gpu_hours,
        shared_idle_gpu_hours: (fleet.gpus() as f64 * res.window_s - res.used_in_window_gpu_s) / 3600.0,
        window_hours: res.window_s / 3600.0,
        jobs_end_hours: jobs_end.map(|t| t / 3600.0),
        requests_end_hours: requests_end.map(|t| t / 3600.0),
        shared_last_busy_hours: res.last_busy_s / 3600.0,
        search_runs: sep.runs + found.runs,
        shared_search_runs: found.runs,
        search_seconds,
        shared_run_seconds,
        bucket_s: ((w.t1 - w.t0) / 300.0).max(60.0),
    };
    cmp.no_saving = NoSaving::find(&cmp, found.peak_gpus, fleet.scaled(1).gpus());
    (cmp, res)
}

impl NoSaving {
    /// `None` unless both figures are numbers and the islands' is no
    /// larger than the pool's.
    fn find(c: &Comparison, together_peak_gpus: Option<u32>, smallest: u64) -> Option<NoSaving> {
        let (separate_gpus, shared_gpus) = (c.separate_gpus?, c.shared_gpus_needed?);
        if separate_gpus > shared_gpus || !c.separate_sized {
            return None;
        }
        let own: Vec<&ClassRow> = c.classes.iter().filter(|r| r.own_island).collect();
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
