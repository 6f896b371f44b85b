//! One run of each layout (islands, one shared pool) and the figures it
//! gives each class: the settings they run with, the service figures, and
//! the targets a class missed.
use onepool_decisions::policy::Policy;
use serde::{Deserialize, Serialize};

use crate::engine::{self, quantile, quantile_f32, ClassStats, Config, Layout, RunResult, Workload};
use crate::fleet::Fleet;
use crate::slurm::SlurmModel;

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
    f.missed = misses(&f, has_batch, s.max_p95_wait_s);
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

/// Simulated items (jobs, requests, autoscaler ticks), summed over the
/// shared-pool search's runs, that a search may cost without `--search`.
/// The simulation handles about 4 M requests a second in a release build
/// on the 2-core machine of bench/RESULTS.md, so this is about half a
/// minute: a 10-day, 3.3 M-request trace on 125 nodes is searched by
/// default, a 30-day one is not.
pub const SEARCH_BUDGET: u64 = 100_000_000;
