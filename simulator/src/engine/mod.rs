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
mod model;
mod scheduling;
mod serving;
mod state;

use std::collections::{BinaryHeap, VecDeque};

use crate::engine::state::{mask_low, Sim};

pub use model::{
    Cancelled, ClassStats, Config, Endpoint, Job, JobLogEntry, Layout, Req, RunResult, VictimModel, Workload,
};

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
