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

mod search;
mod why;

use serde::{Deserialize, Serialize};

use crate::engine::{self, quantile, quantile_f32, ClassStats, Config, Layout, RunResult, Workload};
use crate::fleet::Fleet;
use onepool_decisions::policy::Policy;

use crate::slurm::SlurmModel;
pub use search::{bisect, bisect_runs, decide_search, run_size, Search, SearchEstimate, SharedSearch, SEARCH_BUDGET};
use search::{search_shared, size_separate};
pub use why::{Because, ClassMisses, Miss, NoSaving, Unmet};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub tick_s: f64,
    pub grace_after_s: f64,
    pub max_p95_wait_s: f64,
    /// Largest fleet a search tries, in nodes.
    pub max_nodes: u32,
    pub job_log: bool,
    /// Size the separate islands (off: only the shared run).
    pub separate: bool,
    /// Most simulated items a shared-pool search may cost by default
    /// ([`Search::Auto`]); see [`SEARCH_BUDGET`].
    pub search_budget: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tick_s: 2.0,
            grace_after_s: 86_400.0,
            max_p95_wait_s: 3600.0,
            max_nodes: 4096,
            job_log: false,
            separate: true,
            search_budget: SEARCH_BUDGET,
        }
    }
}

/// One class's figures in one run (read back from `--json` by the
/// validation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClassFigures {
    pub class: String,
    pub has_work: bool,
    pub gpu_hours_used: f64,
    pub borrowed_gpu_hours: f64,
    pub peak_gpus: u32,
    pub jobs_started: usize,
    pub wait_mean_s: f64,
    pub wait_p95_s: f64,
    pub requests: usize,
    pub p50_queue_delay_s: f64,
    pub p90_queue_delay_s: f64,
    pub p99_queue_delay_s: f64,
    /// Tightest SLO of the class's endpoints.
    pub slo_p99_s: Option<f64>,
    pub failed_requests: u64,
    pub unserved: u64,
    pub unstarted_jobs: u64,
    pub reclaims: u32,
    /// GPU-hours of reclaimed batch runs that did not advance their job: a
    /// cancelled run's whole run, a requeued run's notice-to-release time.
    pub lost_gpu_hours: f64,
    /// Reclaimed batch jobs dropped (scenario `[victims] cancelled =
    /// "drop"`) and the GPU-hours of work they never did.
    pub dropped_jobs: u64,
    pub dropped_gpu_hours: f64,
    /// Shared pool, protected classes: the capacity (GrpTRES), GPU-hours of
    /// it the class did not hold in the window (lent to flexible work or idle), and of
    /// its reserved part (no flexible job may hold that either).
    pub capacity_gpus: Option<u32>,
    pub unused_capacity_gpu_hours: Option<f64>,
    pub unused_reserved_gpu_hours: Option<f64>,
    pub time_to_capacity_mean_s: f64,
    pub time_to_capacity_max_s: f64,
    pub meets_target: bool,
    /// The targets it missed (empty: `meets_target`).
    pub missed: Vec<Miss>,
}

pub fn figures(w: &Workload, s: &Settings, c: usize, st: &ClassStats) -> ClassFigures {
    let mut waits = st.waits.clone();
    let mut delays = st.delays.clone();
    let slo = w.endpoints.iter().filter(|e| e.class == c).map(|e| e.slo_p99_s).reduce(f64::min);
    let has_batch = w.jobs.iter().any(|j| j.class == c);
    let wait_p95 = quantile(&mut waits, 0.95);
    let p99 = quantile_f32(&mut delays, 0.99);
    let p50 = quantile_f32(&mut delays, 0.5);
    let p90 = quantile_f32(&mut delays, 0.9);
    let ttc = &st.time_to_capacity;
    let mut f = ClassFigures {
        class: w.classes[c].clone(),
        has_work: has_batch || slo.is_some() || w.endpoints.iter().any(|e| e.baseline.is_some_and(|b| b.0 == c)),
        gpu_hours_used: st.used_gpu_s / 3600.0,
        borrowed_gpu_hours: st.borrowed_gpu_s / 3600.0,
        peak_gpus: st.peak_gpus,
        jobs_started: waits.len() - usize::try_from(st.unstarted_jobs).unwrap_or(0).min(waits.len()),
        wait_mean_s: if waits.is_empty() { 0.0 } else { waits.iter().sum::<f64>() / waits.len() as f64 },
        wait_p95_s: wait_p95,
        requests: delays.len(),
        p50_queue_delay_s: p50,
        p90_queue_delay_s: p90,
        p99_queue_delay_s: p99,
        slo_p99_s: slo,
        failed_requests: st.failed_requests,
        unserved: st.unserved,
        unstarted_jobs: st.unstarted_jobs,
        reclaims: st.reclaims,
        lost_gpu_hours: st.lost_gpu_s / 3600.0,
        dropped_jobs: st.dropped_jobs,
        dropped_gpu_hours: st.dropped_gpu_s / 3600.0,
        capacity_gpus: st.capacity,
        unused_capacity_gpu_hours: st.capacity.map(|_| st.unused_capacity_gpu_s / 3600.0),
        unused_reserved_gpu_hours: st.capacity.map(|_| st.unused_reserved_gpu_s / 3600.0),
        time_to_capacity_mean_s: if ttc.is_empty() { 0.0 } else { ttc.iter().sum::<f64>() / ttc.len() as f64 },
        time_to_capacity_max_s: ttc.iter().copied().fold(0.0, f64::max),
        meets_target: false,
        missed: Vec::new(),
    };
    f.missed = why::misses(&f, has_batch, s.max_p95_wait_s);
    f.meets_target = f.missed.is_empty();
    f
}

fn config(fleet: Fleet, layout: Layout, s: &Settings, w: &Workload) -> Config {
    Config {
        fleet,
        layout,
        tick_s: s.tick_s,
        bucket_s: ((w.t1 - w.t0) / 300.0).max(60.0),
        grace_after_s: s.grace_after_s,
        job_log: s.job_log,
    }
}

/// One class alone on an island of `fleet`.
pub fn run_separate(w: &Workload, class: usize, fleet: &Fleet, s: &Settings) -> RunResult {
    let sub = w.island(class);
    engine::run(
        &sub,
        &config(fleet.clone(), Layout::Islands(vec![0..fleet.nodes() as usize; w.islands.len()]), s, &sub),
    )
}

/// Everything on one pool under the policy (applied to this fleet's size).
pub fn run_shared(w: &Workload, policy: &Policy, fleet: &Fleet, s: &Settings) -> RunResult {
    let model = SlurmModel::for_fleet(policy, fleet.gpus());
    engine::run(w, &config(fleet.clone(), Layout::Shared(model), s, w))
}

/// Everything at once, each class confined to its own island: sharing off.
pub fn run_islands(w: &Workload, islands: &[Fleet], s: &Settings) -> RunResult {
    let mut fleet = Fleet { groups: Vec::new() };
    let mut ranges = Vec::new();
    for f in islands {
        let from = fleet.nodes() as usize;
        fleet = fleet.concat(f);
        ranges.push(from..fleet.nodes() as usize);
    }
    engine::run(w, &config(fleet, Layout::Islands(ranges), s, w))
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
