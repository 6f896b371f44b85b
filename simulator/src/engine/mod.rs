//! The discrete-event simulation: one run of a workload on a fleet, either
//! as one shared pool under the policy (Slurm's QOS limits and preemption,
//! see [`crate::slurm`]) or as islands that never lend to each other.
//! Deterministic: time is seconds (`f64`), ties are broken by event kind
//! and sequence number, and nothing depends on hashing or threads.
//!
//! Inference endpoints: requests arrive from the trace, a router queues
//! them first come first served and hands each to a ready replica with a
//! free slot (`max_concurrent` per replica); a request takes
//! `context/prefill_tokens_per_s + generated/decode_tokens_per_s` seconds.
//! Every `tick_s` the endpoint's load (in flight + queued) is fed to
//! onepool's own [`Autoscaler`], and its recommendation to onepoold's own
//! [`reconcile`]: what it submits, drains and releases is what onepoold
//! would do (baseline replicas in the baseline class, supplemental in the
//! endpoint's, warm headroom in the warm class while no job waits for
//! GPUs). A replica serves `startup_s` after it gets its GPUs; a warm
//! replica gets requests only when every other one is full, as
//! onepoold's router does.

mod events;
mod scheduling;
mod serving;
mod state;

#[allow(unused_imports)]
use state::*;

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::autoscale::{Autoscaler, ScalingPolicy};
use onepool_decisions::replicas::{self, reconcile, Action, EndpointTarget, Headroom, Phase, WarmSpec};
use serde::Serialize;

use crate::fleet::Fleet;
use crate::slurm::{pick_victims, Holder, SlurmModel, IMMEDIATE_FREE_S, REQUEUE_HOLD_S, SCHED_INTERVAL_S};

/// A batch job, classified.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub submit: f64,
    pub duration: f64,
    pub gpus: u32,
    /// GPUs on each node it runs on (`gpus` is a multiple).
    pub per_node: u32,
    pub gpu_type: Option<String>,
    pub class: usize,
    /// The separate pool it belongs to.
    pub island: usize,
    pub reclaim: Option<ReclaimMode>,
    pub drain: Option<std::time::Duration>,
}

/// One request: arrival and service time on one replica slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Req {
    pub t: f64,
    pub service: f32,
}

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: String,
    pub class: usize,
    pub island: usize,
    pub gpus_per_replica: u32,
    pub gpu_type: Option<String>,
    pub max_concurrent: u32,
    pub startup_s: f64,
    pub slo_p99_s: f64,
    /// `max` is lowered to what the GPUs the endpoint may use can hold.
    pub scaling: ScalingPolicy,
    pub reclaim: Option<ReclaimMode>,
    pub drain: Option<std::time::Duration>,
    /// In the shared pool, the first `baseline_replicas` replicas run in
    /// this (protected) class; in separate pools all run in `class`.
    pub baseline: Option<(usize, u32)>,
    /// Warm headroom (onepoold's `[endpoint.replicas.warm]`): its class and
    /// how many replicas; in the shared pool only.
    pub warm: Option<(usize, WarmSpec)>,
    /// Latency targets (onepoold's `[endpoint.replicas.latency]`).
    pub latency: Option<onepool_decisions::latency::LatencyTargets>,
    pub requests: Arc<[Req]>,
}

/// What a batch job that is reclaimed and not requeued (immediate reclaim,
/// or graceful after its drain) does next. Slurm ends it (PREEMPTED) and
/// does nothing more; whether its owner submits it again is not Slurm's
/// doing, so it is a model input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cancelled {
    /// Its owner submits it again at once, from the beginning: the work it
    /// did is lost and done again (the islands do all the work too, so the
    /// comparison stays like for like).
    #[default]
    Resubmit,
    /// It ends, as Slurm leaves it: its work is never done (what a replay of
    /// the same jobs on a cluster shows, with nobody resubmitting).
    Drop,
}

impl Cancelled {
    pub fn parse(s: &str) -> Option<Cancelled> {
        match s {
            "resubmit" => Some(Cancelled::Resubmit),
            "drop" => Some(Cancelled::Drop),
            _ => None,
        }
    }
}

/// How one class's batch jobs behave when reclaimed (scenario `[victims]`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VictimModel {
    pub cancelled: Cancelled,
    /// Seconds from the reclaim notice until a graceful or requeue batch
    /// victim gives its GPUs back by itself (checkpoint saved and requeued,
    /// or drained and exited). `None`: it holds them to its drain timeout,
    /// the latest Slurm allows.
    pub release_after_s: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Workload {
    /// Class names, as in the policy.
    pub classes: Vec<String>,
    pub islands: Vec<String>,
    /// Sorted by submit time.
    pub jobs: Vec<Job>,
    pub endpoints: Vec<Endpoint>,
    /// Per class (same order as `classes`): what its reclaimed batch jobs do.
    pub victims: Vec<VictimModel>,
    /// Start of the window every run reports on (first submission or request).
    pub t0: f64,
    /// End of the window: when all work would be done with unlimited GPUs.
    pub t1: f64,
}

impl Workload {
    /// Only the work of one island (same classes, same window).
    pub fn island(&self, island: usize) -> Workload {
        Workload {
            classes: self.classes.clone(),
            islands: self.islands.clone(),
            jobs: self.jobs.iter().filter(|j| j.island == island).cloned().collect(),
            endpoints: self.endpoints.iter().filter(|e| e.island == island).cloned().collect(),
            victims: self.victims.clone(),
            t0: self.t0,
            t1: self.t1,
        }
    }

    /// When the batch jobs and when the requests would all be done with
    /// unlimited GPUs, in seconds from `t0` (`None`: no work of that kind).
    /// The window ends at the later of the two, so a report can say which
    /// input set its length.
    pub fn ends(&self) -> (Option<f64>, Option<f64>) {
        let jobs = self.jobs.iter().map(|j| j.submit + j.duration).reduce(f64::max);
        let reqs =
            self.endpoints.iter().flat_map(|e| e.requests.iter()).map(|r| r.t + f64::from(r.service)).reduce(f64::max);
        (jobs.map(|t| t - self.t0), reqs.map(|t| t - self.t0))
    }
}

#[derive(Debug, Clone)]
pub enum Layout {
    /// One pool: every class may use every node; QOS limits and preemption
    /// as the Slurm model says.
    Shared(SlurmModel),
    /// Island `i` owns the nodes in `ranges[i]`; no limits, no preemption.
    Islands(Vec<std::ops::Range<usize>>),
}

#[derive(Debug, Clone)]
pub struct Config {
    pub fleet: Fleet,
    pub layout: Layout,
    /// Autoscaler period.
    pub tick_s: f64,
    /// Width of the time buckets of the demand/allocation series.
    pub bucket_s: f64,
    /// Work not done this long after the window ends counts as never done.
    pub grace_after_s: f64,
    /// Keep every job's start and end.
    pub job_log: bool,
}

/// What one class did in one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassStats {
    pub used_gpu_s: f64,
    /// GPU-seconds held by flexible work beyond the pool's unprotected GPUs.
    pub borrowed_gpu_s: f64,
    pub peak_gpus: u32,
    pub waits: Vec<f64>,
    pub time_to_capacity: Vec<f64>,
    pub reclaims: u32,
    /// GPU-seconds of reclaimed batch runs that did not advance the job's
    /// work: a cancelled run's whole run; a requeued run's time from the
    /// notice to the release (it checkpointed at the notice).
    pub lost_gpu_s: f64,
    /// Reclaimed batch jobs that ended there (`Cancelled::Drop`), and the
    /// GPU-seconds of work they never did.
    pub dropped_jobs: u64,
    pub dropped_gpu_s: f64,
    /// Shared pool, protected classes: the capacity (GrpTRES) and, inside
    /// the window, GPU-seconds of it the class did not hold, and of its
    /// reserved part (which no flexible job may use either).
    pub capacity: Option<u32>,
    pub unused_capacity_gpu_s: f64,
    pub unused_reserved_gpu_s: f64,
    /// Queueing delays of this class's requests (seconds).
    pub delays: Vec<f32>,
    pub failed_requests: u64,
    /// Requests not served before the cut-off.
    pub unserved: u64,
    /// Jobs not started before the cut-off.
    pub unstarted_jobs: u64,
    /// Per bucket: mean GPUs demanded, mean GPUs held.
    pub demand: Vec<f64>,
    pub alloc: Vec<f64>,
    /// The class's endpoints whose autoscaler asked for the most replicas
    /// their scenario allows (`max_replicas`), with that maximum: more
    /// GPUs cannot shorten their queues.
    pub at_max_replicas: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobLogEntry {
    pub job: usize,
    pub class: usize,
    pub submit: f64,
    pub start: f64,
    pub end: f64,
    pub reclaimed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub classes: Vec<ClassStats>,
    pub fleet_gpus: u64,
    pub window_s: f64,
    /// GPU-seconds held by anyone inside the window.
    pub used_in_window_gpu_s: f64,
    /// Seconds from the window's start to the last moment any GPU was held:
    /// work delayed by the fleet runs past the window.
    pub last_busy_s: f64,
    pub job_log: Vec<JobLogEntry>,
    /// With `job_log`: every request served, (endpoint, arrival and
    /// queueing delay in seconds from the window's start).
    pub request_log: Vec<(usize, f32, f32)>,
    /// Per endpoint: replica jobs submitted after the start (those already
    /// serving when the trace starts not counted), withdrawn ones included.
    pub replicas_submitted: Vec<u32>,
    /// Most GPUs held at once, every class together: set against the
    /// classes' own peaks, whether their busiest moments came together.
    pub peak_gpus: u32,
    pub events: u64,
}

/// Each node's GPU type as an index into the types seen, in order.
fn node_types(nodes: &[(u32, Option<&str>)]) -> (Vec<Option<usize>>, Vec<String>) {
    let mut types: Vec<String> = Vec::new();
    let node_type = nodes
        .iter()
        .map(|(_, t)| {
            t.map(|t| match types.iter().position(|x| x == t) {
                Some(i) => i,
                None => {
                    types.push(t.to_string());
                    types.len() - 1
                }
            })
        })
        .collect();
    (node_type, types)
}

/// Runs one simulation.
pub fn run(w: &Workload, cfg: &Config) -> RunResult {
    let nodes = cfg.fleet.node_list();
    let (node_type, types) = node_types(&nodes);
    let node_gpus: Vec<u32> = nodes.iter().map(|(g, _)| *g).collect();
    let model = match &cfg.layout {
        Layout::Shared(m) => Some(m),
        Layout::Islands(_) => None,
    };
    let island_nodes = match &cfg.layout {
        Layout::Shared(_) => vec![0..nodes.len(); w.islands.len().max(1)],
        Layout::Islands(r) => r.clone(),
    };
    let order = match model {
        Some(m) => m.priority_order(),
        None => (0..w.classes.len()).collect(),
    };
    let n = w.classes.len();
    let unprotected = match model {
        Some(m) => {
            let prot: u64 = m.classes.iter().filter(|c| c.protected).map(|c| u64::from(c.grp_gpus.unwrap_or(0))).sum();
            cfg.fleet.gpus().saturating_sub(prot) as f64
        }
        None => f64::INFINITY,
    };
    let mut stats = vec![ClassStats::default(); n];
    for (s, q) in stats.iter_mut().zip(model.iter().flat_map(|m| &m.classes)) {
        s.capacity = q.protected.then(|| q.grp_gpus.unwrap_or(0));
    }
    let mut sim = Sim {
        w,
        cfg,
        model,
        order,
        free: node_gpus.iter().map(|g| mask_low(*g)).collect(),
        node_gpus,
        node_type,
        types,
        island_nodes,
        live: Vec::new(),
        pending: vec![VecDeque::new(); n],
        heap: BinaryHeap::new(),
        seq: 0,
        now: w.t0,
        next_job: 0,
        eps: Vec::new(),
        used: vec![0; n],
        peak_gpus: 0,
        demand: vec![0.0; n],
        stats,
        dirty: false,
        wake_at: f64::INFINITY,
        batch_left: w.jobs.len(),
        unprotected,
        used_in_window: 0.0,
        last_busy: w.t0,
        log: Vec::new(),
        request_log: Vec::new(),
        events: 0,
    };
    for e in &w.endpoints {
        let state = sim.endpoint_state(e);
        sim.eps.push(state);
    }
    for ep in 0..sim.eps.len() {
        sim.warm_start(ep);
    }
    // Replicas that serve when the trace starts hold their GPUs before the
    // first round looks at what waits.
    sim.dirty = false;
    sim.schedule();
    sim.main_loop();
    sim.into_result()
}

impl Sim<'_> {
    /// What the finished run measured.
    fn into_result(self) -> RunResult {
        let (w, cfg) = (self.w, self.cfg);
        RunResult {
            classes: self.stats,
            fleet_gpus: cfg.fleet.gpus(),
            window_s: (w.t1 - w.t0).max(0.0),
            used_in_window_gpu_s: self.used_in_window,
            last_busy_s: (self.last_busy - w.t0).max(0.0),
            job_log: self.log,
            request_log: self.request_log,
            replicas_submitted: self.eps.iter().map(|e| e.submitted).collect(),
            peak_gpus: self.peak_gpus,
            events: self.events,
        }
    }
}

/// The `q` quantile (0..=1) by nearest rank; 0 for no values.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let k = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    *v.select_nth_unstable_by(k, |a, b| a.total_cmp(b)).1
}

pub fn quantile_f32(v: &mut [f32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let k = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    f64::from(*v.select_nth_unstable_by(k, |a, b| a.total_cmp(b)).1)
}
