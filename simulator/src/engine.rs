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
    pub events: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Pending,
    Running,
    Draining,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Batch { job: usize },
    Replica { ep: usize },
}

#[derive(Debug, Clone)]
struct Live {
    kind: Kind,
    class: usize,
    island: usize,
    nodes: u32,
    per_node: u32,
    gpu_type: Option<usize>,
    submit: f64,
    remaining: f64,
    st: St,
    start: f64,
    alloc: Vec<(usize, u64)>,
    gen: u32,
    ready: bool,
    inflight: u32,
    being_reclaimed: bool,
    reclaim: Option<ReclaimMode>,
    drain: Option<std::time::Duration>,
    /// The pending job waits for GPUs its preemption frees until then.
    reclaim_wait: f64,
    /// When it was told it is reclaimed (its notice).
    notice: f64,
    /// A requeued job may not start before this (Slurm's BeginTime).
    not_before: f64,
    /// A replica that already runs when the trace starts: ready at once.
    preloaded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    ReqDone { ep: usize, job: usize, gen: u32 },
    End { job: usize, gen: u32 },
    Free { job: usize, gen: u32 },
    Ready { job: usize, gen: u32 },
    Wake,
}

impl Ev {
    fn rank(&self) -> u8 {
        match self {
            Ev::ReqDone { .. } => 0,
            Ev::End { .. } => 1,
            Ev::Free { .. } => 2,
            Ev::Ready { .. } => 3,
            Ev::Wake => 4,
        }
    }
}

struct Item(f64, u8, u64, Ev);
impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (time, kind, seq).
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1)).then(o.2.cmp(&self.2))
    }
}

struct EpState {
    queue: VecDeque<(f64, f32)>,
    next_req: usize,
    /// Replica jobs that count toward the target (pending, starting, ready).
    active: Vec<usize>,
    slots: Vec<(usize, u32)>,
    inflight: u32,
    scaler: Autoscaler,
    target: u32,
    /// Every request served: the endpoint's replicas are gone.
    done: bool,
    /// Replica jobs submitted by the autoscaler.
    submitted: u32,
}

struct Sim<'a> {
    w: &'a Workload,
    cfg: &'a Config,
    model: Option<&'a SlurmModel>,
    order: Vec<usize>,
    node_gpus: Vec<u32>,
    node_type: Vec<Option<usize>>,
    free: Vec<u64>,
    types: Vec<String>,
    island_nodes: Vec<std::ops::Range<usize>>,
    live: Vec<Live>,
    pending: Vec<VecDeque<usize>>,
    heap: BinaryHeap<Item>,
    seq: u64,
    now: f64,
    next_job: usize,
    eps: Vec<EpState>,
    used: Vec<u32>,
    demand: Vec<f64>,
    stats: Vec<ClassStats>,
    dirty: bool,
    wake_at: f64,
    batch_left: usize,
    unprotected: f64,
    used_in_window: f64,
    /// The last time any GPU was held.
    last_busy: f64,
    log: Vec<JobLogEntry>,
    request_log: Vec<(usize, f32, f32)>,
    events: u64,
}

fn mask_low(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Runs one simulation.
pub fn run(w: &Workload, cfg: &Config) -> RunResult {
    let nodes = cfg.fleet.node_list();
    let mut types: Vec<String> = Vec::new();
    let type_id = |t: Option<&str>, types: &mut Vec<String>| {
        t.map(|t| match types.iter().position(|x| x == t) {
            Some(i) => i,
            None => {
                types.push(t.to_string());
                types.len() - 1
            }
        })
    };
    let node_type: Vec<Option<usize>> = nodes.iter().map(|(_, t)| type_id(*t, &mut types)).collect();
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
    if let Some(m) = model {
        for (s, q) in stats.iter_mut().zip(&m.classes) {
            s.capacity = q.protected.then(|| q.grp_gpus.unwrap_or(0));
        }
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
        let room: u32 = sim.island_nodes[e.island]
            .clone()
            .filter(|&i| e.gpu_type.is_none() || sim.node_type[i] == sim.type_of(e.gpu_type.as_deref()))
            .map(|i| sim.node_gpus[i] / e.gpus_per_replica.max(1))
            .sum();
        let mut p = e.scaling.clone();
        p.max = p.max.min(room).max(p.min.min(room));
        p.min = p.min.min(p.max);
        sim.eps.push(EpState {
            queue: VecDeque::new(),
            next_req: 0,
            active: Vec::new(),
            slots: Vec::new(),
            inflight: 0,
            scaler: Autoscaler::new(p),
            target: 0,
            done: false,
            submitted: 0,
        });
    }
    for ep in 0..sim.eps.len() {
        sim.warm_start(ep);
    }
    // Replicas that serve when the trace starts hold their GPUs before the
    // first round looks at what waits.
    sim.dirty = false;
    sim.schedule();
    sim.main_loop();
    let window_s = (w.t1 - w.t0).max(0.0);
    RunResult {
        classes: sim.stats,
        fleet_gpus: cfg.fleet.gpus(),
        window_s,
        used_in_window_gpu_s: sim.used_in_window,
        last_busy_s: (sim.last_busy - w.t0).max(0.0),
        job_log: sim.log,
        request_log: sim.request_log,
        replicas_submitted: sim.eps.iter().map(|e| e.submitted).collect(),
        events: sim.events,
    }
}

impl Sim<'_> {
    fn type_of(&self, t: Option<&str>) -> Option<usize> {
        t.and_then(|t| self.types.iter().position(|x| x == t)).or(t.map(|_| usize::MAX))
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item(t, ev.rank(), self.seq, ev));
    }

    fn endpoints_busy(&self) -> bool {
        self.eps
            .iter()
            .enumerate()
            .any(|(i, e)| e.next_req < self.w.endpoints[i].requests.len() || !e.queue.is_empty() || e.inflight > 0)
    }

    fn main_loop(&mut self) {
        let cutoff = self.w.t1 + self.cfg.grace_after_s;
        let tick = self.cfg.tick_s.max(1e-3);
        let mut next_tick = if self.w.endpoints.is_empty() { f64::INFINITY } else { self.w.t0 };
        loop {
            let t_heap = self.heap.peek().map(|i| i.0).unwrap_or(f64::INFINITY);
            let t_job = self.w.jobs.get(self.next_job).map(|j| j.submit).unwrap_or(f64::INFINITY);
            let mut t_req = f64::INFINITY;
            for (i, e) in self.eps.iter().enumerate() {
                if let Some(r) = self.w.endpoints[i].requests.get(e.next_req) {
                    t_req = t_req.min(r.t);
                }
            }
            let busy = self.endpoints_busy();
            let t_tick = if busy { next_tick } else { f64::INFINITY };
            let t = t_heap.min(t_job).min(t_req).min(t_tick);
            if !t.is_finite() || t > cutoff {
                break;
            }
            self.advance(t);
            // Events at this instant, in a fixed order: heap, submissions, arrivals, tick.
            while self.heap.peek().is_some_and(|i| i.0 <= t) {
                let Item(_, _, _, ev) = self.heap.pop().unwrap();
                self.events += 1;
                self.handle(ev);
            }
            while self.w.jobs.get(self.next_job).is_some_and(|j| j.submit <= t) {
                self.submit_batch(self.next_job);
                self.next_job += 1;
            }
            for ep in 0..self.eps.len() {
                let reqs = &self.w.endpoints[ep].requests;
                let mut arrived = false;
                while let Some(r) = reqs.get(self.eps[ep].next_req).filter(|r| r.t <= t) {
                    self.eps[ep].queue.push_back((r.t, r.service));
                    self.eps[ep].next_req += 1;
                    self.events += 1;
                    arrived = true;
                }
                if arrived {
                    self.dispatch(ep);
                }
            }
            if t_tick <= t {
                for ep in 0..self.eps.len() {
                    if !self.eps[ep].done {
                        self.autoscale(ep);
                    }
                }
                next_tick += tick;
            }
            for ep in 0..self.eps.len() {
                if !self.eps[ep].done && self.endpoint_finished(ep) {
                    self.retire(ep);
                }
            }
            if self.dirty {
                self.dirty = false;
                self.schedule();
            }
        }
        self.finish(cutoff);
    }

    /// Integrates GPUs held and demanded from `self.now` to `t`.
    fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        if dt <= 0.0 {
            return;
        }
        let (t0, t1, b) = (self.w.t0, self.w.t1, self.cfg.bucket_s.max(1.0));
        let flex_used: f64 = self
            .model
            .map(|m| (0..self.used.len()).filter(|&c| !m.classes[c].protected).map(|c| f64::from(self.used[c])).sum())
            .unwrap_or(0.0);
        let borrowed = (flex_used - self.unprotected).max(0.0);
        let total_used: f64 = self.used.iter().map(|&u| f64::from(u)).sum();
        let in_win = (t.min(t1) - self.now.max(t0)).max(0.0);
        self.used_in_window += total_used * in_win;
        if total_used > 0.0 {
            self.last_busy = t;
        }
        for c in 0..self.used.len() {
            let u = f64::from(self.used[c]);
            let d = self.demand[c];
            let s = &mut self.stats[c];
            s.used_gpu_s += u * dt;
            if borrowed > 0.0 && self.model.is_some_and(|m| !m.classes[c].protected) {
                s.borrowed_gpu_s += borrowed * u / flex_used * dt;
            }
            if let Some(q) = self.model.map(|m| &m.classes[c]).filter(|q| q.protected) {
                let cap = f64::from(q.grp_gpus.unwrap_or(0));
                s.unused_capacity_gpu_s += (cap - u).max(0.0) * in_win;
                s.unused_reserved_gpu_s += (f64::from(q.reserved) - u).max(0.0) * in_win;
            }
            if u == 0.0 && d == 0.0 {
                continue;
            }
            let mut from = self.now;
            while from < t {
                let k = ((from - t0) / b).floor().max(0.0) as usize;
                let edge = (t0 + (k as f64 + 1.0) * b).min(t);
                let span = edge - from;
                if s.alloc.len() <= k {
                    s.alloc.resize(k + 1, 0.0);
                    s.demand.resize(k + 1, 0.0);
                }
                s.alloc[k] += u * span / b;
                s.demand[k] += d * span / b;
                from = if edge > from { edge } else { t };
            }
        }
        self.now = t;
    }

    fn new_live(
        &mut self,
        kind: Kind,
        class: usize,
        island: usize,
        gpus: u32,
        per_node: u32,
        ty: Option<&str>,
    ) -> usize {
        let per = per_node.max(1);
        let gpu_type = self.type_of(ty);
        let (reclaim, drain, remaining) = match kind {
            Kind::Batch { job } => (self.w.jobs[job].reclaim, self.w.jobs[job].drain, self.w.jobs[job].duration),
            Kind::Replica { ep } => (self.w.endpoints[ep].reclaim, self.w.endpoints[ep].drain, f64::INFINITY),
        };
        self.live.push(Live {
            kind,
            class,
            island,
            nodes: gpus.div_ceil(per).max(1),
            per_node: per.min(gpus.max(1)),
            gpu_type,
            submit: self.now,
            remaining,
            st: St::Pending,
            start: 0.0,
            alloc: Vec::new(),
            gen: 0,
            ready: false,
            inflight: 0,
            being_reclaimed: false,
            reclaim,
            drain,
            reclaim_wait: f64::NEG_INFINITY,
            notice: 0.0,
            not_before: f64::NEG_INFINITY,
            preloaded: false,
        });
        let id = self.live.len() - 1;
        self.pending[class].push_back(id);
        self.dirty = true;
        id
    }

    fn submit_batch(&mut self, j: usize) {
        let job = &self.w.jobs[j];
        let (class, island, gpus, per, ty) = (job.class, job.island, job.gpus, job.per_node, job.gpu_type.clone());
        self.demand[class] += f64::from(gpus);
        self.new_live(Kind::Batch { job: j }, class, island, gpus, per, ty.as_deref());
    }

    fn gpus(&self, id: usize) -> u32 {
        self.live[id].nodes * self.live[id].per_node
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ReqDone { ep, job, gen } => {
                self.eps[ep].inflight -= 1;
                if self.live[job].gen != gen {
                    return;
                }
                self.live[job].inflight -= 1;
                match self.live[job].st {
                    St::Draining if self.live[job].inflight == 0 => self.release(job),
                    St::Running => {
                        self.eps[ep].slots.push((job, gen));
                        self.dispatch(ep);
                    }
                    _ => {}
                }
            }
            Ev::End { job, gen } => {
                if self.live[job].gen == gen && self.live[job].st == St::Running {
                    self.release(job);
                }
            }
            Ev::Free { job, gen } => {
                if self.live[job].gen == gen && self.live[job].st != St::Done {
                    self.release(job);
                }
            }
            Ev::Ready { job, gen } => {
                if self.live[job].gen != gen || self.live[job].st != St::Running {
                    return;
                }
                let Kind::Replica { ep } = self.live[job].kind else { return };
                self.live[job].ready = true;
                if self.now > self.w.t0 {
                    let ttc = self.now - self.live[job].submit;
                    self.stats[self.live[job].class].time_to_capacity.push(ttc);
                }
                for _ in 0..self.w.endpoints[ep].max_concurrent.max(1) {
                    self.eps[ep].slots.push((job, gen));
                }
                self.dispatch(ep);
            }
            Ev::Wake => self.dirty = true,
        }
    }

    /// Frees a job's GPUs (it ended, drained, or was reclaimed).
    fn release(&mut self, id: usize) {
        let class = self.live[id].class;
        let gpus = self.gpus(id);
        // A batch victim whose work ends before it is made to stop simply
        // completes (on Slurm: COMPLETED, not requeued).
        let finished = matches!(self.live[id].kind, Kind::Batch { .. })
            && self.now - self.live[id].start >= self.live[id].remaining;
        let reclaimed = self.live[id].being_reclaimed && !finished;
        for (node, mask) in std::mem::take(&mut self.live[id].alloc) {
            self.free[node] |= mask;
        }
        self.used[class] -= gpus;
        self.dirty = true;
        let victims = self.w.victims.get(class).copied().unwrap_or_default();
        let now = self.now;
        let l = &mut self.live[id];
        l.gen += 1;
        l.ready = false;
        let ran = now - l.start;
        if self.cfg.job_log {
            self.log.push(JobLogEntry { job: id, class, submit: l.submit, start: l.start, end: now, reclaimed });
        }
        let g = f64::from(gpus);
        match l.kind {
            Kind::Batch { .. } if reclaimed && l.reclaim == Some(ReclaimMode::Requeue) => {
                // Checkpointed at the notice: resumes with the work it had
                // left then, once Slurm lets a requeued job start again.
                self.stats[class].lost_gpu_s += g * (now - l.notice).max(0.0);
                l.remaining = (l.remaining - (l.notice - l.start).max(0.0)).max(0.0);
                l.st = St::Pending;
                l.being_reclaimed = false;
                l.submit = now;
                l.not_before = now + REQUEUE_HOLD_S;
                // Started by the first scheduling pass after that: any job
                // event, or Slurm's periodic pass.
                let t0 = self.w.t0;
                let at = t0 + ((l.not_before - t0) / SCHED_INTERVAL_S).ceil() * SCHED_INTERVAL_S;
                self.pending[class].push_back(id);
                self.push(at, Ev::Wake);
            }
            Kind::Batch { .. } if reclaimed => {
                // Cancelled: the run's work is lost.
                self.stats[class].lost_gpu_s += g * ran.max(0.0);
                l.being_reclaimed = false;
                match victims.cancelled {
                    Cancelled::Resubmit => {
                        l.st = St::Pending;
                        l.submit = now;
                        self.pending[class].push_back(id);
                    }
                    Cancelled::Drop => {
                        l.st = St::Done;
                        let s = &mut self.stats[class];
                        s.dropped_jobs += 1;
                        s.dropped_gpu_s += g * l.remaining;
                        self.demand[class] -= g;
                        self.batch_left -= 1;
                    }
                }
            }
            Kind::Batch { .. } => {
                l.st = St::Done;
                self.demand[class] -= g;
                self.batch_left -= 1;
            }
            Kind::Replica { ep } => {
                let lost = l.inflight;
                l.inflight = 0;
                l.st = St::Done;
                self.stats[class].failed_requests += u64::from(lost);
                self.eps[ep].active.retain(|&j| j != id);
            }
        }
    }

    fn dispatch(&mut self, ep: usize) {
        let warm = self.w.endpoints[ep].warm.filter(|_| self.model.is_some()).map(|w| w.0);
        let e = &mut self.eps[ep];
        while !e.queue.is_empty() {
            // A warm replica's slot only when no other replica has one (the
            // router's spill), so that Slurm takes warm replicas back idle.
            let pick = e.slots.iter().rposition(|&(j, _)| Some(self.live[j].class) != warm);
            let Some(i) = pick.or(e.slots.len().checked_sub(1)) else { break };
            let (job, gen) = e.slots.remove(i);
            let l = &mut self.live[job];
            if l.gen != gen || l.st != St::Running || !l.ready {
                continue;
            }
            let (arr, service) = e.queue.pop_front().unwrap();
            l.inflight += 1;
            e.inflight += 1;
            let class = self.w.endpoints[ep].class;
            let delay = (self.now - arr) as f32;
            self.stats[class].delays.push(delay);
            if self.cfg.job_log {
                self.request_log.push((ep, (arr - self.w.t0) as f32, delay));
            }
            self.seq += 1;
            let ev = Ev::ReqDone { ep, job, gen };
            self.heap.push(Item(self.now + f64::from(service), ev.rank(), self.seq, ev));
        }
    }

    fn autoscale(&mut self, ep: usize) {
        let e = &mut self.eps[ep];
        let load = f64::from(e.inflight) + e.queue.len() as f64;
        e.scaler.record(self.now, load);
        let replicas: Vec<replicas::Replica> = self.eps[ep].active.iter().map(|&j| self.replica(ep, j)).collect();
        let ready = replicas.iter().filter(|r| r.phase == Phase::Serving).count() as u32;
        let want = self.eps[ep].scaler.recommend(self.now, ready).replicas;
        self.set_target(ep, want);
        let p = self.eps[ep].scaler.policy();
        let (min, max) = (self.baseline(ep).map_or(0, |b| b.1).min(p.max), p.max);
        let headroom = self.warm(ep).map(|(_, spec)| Headroom {
            replicas: spec.replicas_above(want.clamp(min, max.max(min))),
            gpus_wanted: self.gpus_wanted(),
        });
        // Replicas never reach Slurm's time limit here, and model loads
        // always finish: no renewals, no stale starters.
        let target = EndpointTarget {
            min,
            max,
            desired: want,
            renew_before: std::time::Duration::ZERO,
            startup_timeout: std::time::Duration::MAX,
            headroom,
        };
        let spec = &self.w.endpoints[ep];
        let (island, gpr, ty) = (spec.island, spec.gpus_per_replica.max(1), spec.gpu_type.clone());
        for action in reconcile(&target, &replicas) {
            match action {
                Action::Submit(kind) => {
                    let c = self.class_of(ep, kind);
                    let id = self.new_live(Kind::Replica { ep }, c, island, gpr, gpr, ty.as_deref());
                    self.eps[ep].active.push(id);
                    self.eps[ep].submitted += 1;
                }
                Action::Drain { job, .. } | Action::Release { job, .. } => {
                    let j = job as usize;
                    self.eps[ep].active.retain(|&x| x != j);
                    match (self.live[j].st, self.live[j].ready) {
                        (St::Pending, _) => self.live[j].st = St::Done,
                        (St::Running, true) if self.live[j].inflight > 0 => self.live[j].st = St::Draining,
                        (St::Running, _) => self.release(j),
                        _ => {}
                    }
                }
            }
        }
    }

    /// A replica as onepoold's reconcile sees it.
    fn replica(&self, ep: usize, j: usize) -> replicas::Replica {
        let l = &self.live[j];
        let kind = match self.baseline(ep) {
            Some((c, _)) if c == l.class => replicas::Kind::Baseline,
            _ if self.warm(ep).is_some_and(|w| w.0 == l.class) => replicas::Kind::Warm,
            _ => replicas::Kind::Supplemental,
        };
        let (phase, age) = match (l.st, l.ready) {
            (St::Pending, _) => (Phase::Pending, 0.0),
            (St::Running, false) => (Phase::Starting, self.now - l.start),
            (St::Running, true) => (Phase::Serving, self.now - l.start),
            _ => (Phase::Draining, self.now - l.start),
        };
        let age = std::time::Duration::from_secs_f64(age.max(0.0));
        replicas::Replica {
            job: j as u32,
            slot: 0,
            pinned: false,
            kind,
            phase,
            in_flight: l.inflight,
            age,
            starting_for: age,
            time_left: None,
            being_preempted: false,
        }
    }

    /// The baseline (class, replicas), in the shared pool only.
    fn baseline(&self, ep: usize) -> Option<(usize, u32)> {
        self.w.endpoints[ep].baseline.filter(|_| self.model.is_some())
    }

    /// The warm headroom (class, spec), in the shared pool only.
    fn warm(&self, ep: usize) -> Option<(usize, WarmSpec)> {
        self.w.endpoints[ep].warm.filter(|_| self.model.is_some())
    }

    fn class_of(&self, ep: usize, kind: replicas::Kind) -> usize {
        let spec = &self.w.endpoints[ep];
        match kind {
            replicas::Kind::Baseline => self.baseline(ep).map_or(spec.class, |b| b.0),
            replicas::Kind::Supplemental => spec.class,
            replicas::Kind::Warm => self.warm(ep).map_or(spec.class, |w| w.0),
        }
    }

    /// As onepoold asks squeue: does a pending job other than a warm
    /// replica wait for GPUs (not held by its begin time, not by a QOS
    /// limit, whose reason Slurm gives as the limit, not Resources)?
    fn gpus_wanted(&self) -> bool {
        let warm: Vec<usize> = self.w.endpoints.iter().filter_map(|e| e.warm.map(|w| w.0)).collect();
        self.pending.iter().enumerate().filter(|(c, _)| !warm.contains(c)).any(|(_, q)| {
            q.iter().any(|&id| {
                let l = &self.live[id];
                l.st == St::Pending && l.not_before <= self.now && self.within_limits(id)
            })
        })
    }

    fn endpoint_finished(&self, ep: usize) -> bool {
        let e = &self.eps[ep];
        e.next_req >= self.w.endpoints[ep].requests.len() && e.queue.is_empty() && e.inflight == 0
    }

    /// The trace is over and served: the endpoint's replicas go.
    fn retire(&mut self, ep: usize) {
        self.eps[ep].done = true;
        self.set_target(ep, 0);
        for j in std::mem::take(&mut self.eps[ep].active) {
            match self.live[j].st {
                St::Pending => self.live[j].st = St::Done,
                St::Running => self.release(j),
                _ => {}
            }
        }
    }

    /// Sets the endpoint's replica target and the GPUs it demands. In the
    /// shared pool its first baseline replicas run in the baseline class
    /// ([`Sim::replica_class`]; scale-down drains them last), so that class
    /// demands their GPUs and the endpoint's class the rest: each class's
    /// demand is then set against what the same class held.
    fn set_target(&mut self, ep: usize, target: u32) {
        for (c, g) in self.target_demand(ep, self.eps[ep].target) {
            self.demand[c] -= g;
        }
        for (c, g) in self.target_demand(ep, target) {
            self.demand[c] += g;
        }
        self.eps[ep].target = target;
    }

    /// GPUs of `target` replicas per class: (baseline class, endpoint's class).
    fn target_demand(&self, ep: usize, target: u32) -> [(usize, f64); 2] {
        let spec = &self.w.endpoints[ep];
        let gpr = f64::from(spec.gpus_per_replica.max(1));
        let (base, n) = match spec.baseline {
            Some((c, n)) if self.model.is_some() => (c, n.min(target)),
            _ => (spec.class, 0),
        };
        [(base, gpr * f64::from(n)), (spec.class, gpr * f64::from(target - n))]
    }

    /// The endpoint already serves when the trace starts: as many ready
    /// replicas as the first minute's load needs at the autoscaler's
    /// target (baseline ones first), and its warm headroom on top.
    fn warm_start(&mut self, ep: usize) {
        let spec = &self.w.endpoints[ep];
        let p = self.eps[ep].scaler.policy().clone();
        let first: f64 =
            spec.requests.iter().take_while(|r| r.t < self.w.t0 + 60.0).map(|r| f64::from(r.service)).sum();
        let want = ((first / 60.0) / p.target_per_replica.max(1e-9)).ceil() as u32;
        let want = want.clamp(p.min, p.max.max(p.min));
        let base = self.baseline(ep).map_or(0, |b| b.1).min(want);
        let warm = self.warm(ep).map_or(0, |w| w.1.replicas_above(want).min(p.max.saturating_sub(want)));
        let (island, gpr, ty) = (spec.island, spec.gpus_per_replica.max(1), spec.gpu_type.clone());
        let kinds = std::iter::repeat_n(replicas::Kind::Baseline, base as usize)
            .chain(std::iter::repeat_n(replicas::Kind::Supplemental, (want - base) as usize))
            .chain(std::iter::repeat_n(replicas::Kind::Warm, warm as usize));
        for kind in kinds {
            let c = self.class_of(ep, kind);
            let id = self.new_live(Kind::Replica { ep }, c, island, gpr, gpr, ty.as_deref());
            self.live[id].preloaded = true;
            self.eps[ep].active.push(id);
        }
        self.set_target(ep, want);
    }

    fn allowed_nodes(&self, id: usize) -> std::ops::Range<usize> {
        self.island_nodes.get(self.live[id].island).cloned().unwrap_or(0..0)
    }

    fn fits_type(&self, id: usize, node: usize) -> bool {
        self.live[id].gpu_type.is_none() || self.live[id].gpu_type == self.node_type[node]
    }

    /// First-fit placement: (node, mask) per node, lowest nodes and GPU indices.
    fn place(&self, id: usize) -> Option<Vec<(usize, u64)>> {
        let (n, per) = (self.live[id].nodes, self.live[id].per_node);
        let mut out = Vec::new();
        for node in self.allowed_nodes(id) {
            if !self.fits_type(id, node) || self.free[node].count_ones() < per {
                continue;
            }
            let mut m = 0u64;
            let mut f = self.free[node];
            for _ in 0..per {
                let low = f & f.wrapping_neg();
                m |= low;
                f &= !low;
            }
            out.push((node, m));
            if out.len() as u32 == n {
                return Some(out);
            }
        }
        None
    }

    fn within_limits(&self, id: usize) -> bool {
        let Some(m) = self.model else { return true };
        let (class, g) = (self.live[id].class, self.gpus(id));
        let q = &m.classes[class];
        if q.grp_gpus.is_some_and(|cap| self.used[class] + g > cap) {
            return false;
        }
        if !q.protected {
            if let Some(cap) = m.flexible_cap {
                let flex: u32 = (0..self.used.len()).filter(|&c| !m.classes[c].protected).map(|c| self.used[c]).sum();
                if flex + g > cap {
                    return false;
                }
            }
        }
        true
    }

    fn start(&mut self, id: usize, alloc: Vec<(usize, u64)>) {
        for &(node, mask) in &alloc {
            self.free[node] &= !mask;
        }
        let class = self.live[id].class;
        let g = self.gpus(id);
        self.used[class] += g;
        let s = &mut self.stats[class];
        s.peak_gpus = s.peak_gpus.max(self.used[class]);
        let now = self.now;
        let l = &mut self.live[id];
        l.alloc = alloc;
        l.st = St::Running;
        l.start = now;
        let (gen, kind, submit, first) = (l.gen, l.kind, l.submit, l.gen == 0);
        match kind {
            Kind::Batch { job } => {
                if first {
                    self.stats[class].waits.push(now - self.w.jobs[job].submit);
                }
                self.stats[class].time_to_capacity.push(now - submit);
                let rem = self.live[id].remaining;
                self.push(now + rem, Ev::End { job: id, gen });
            }
            Kind::Replica { ep } => {
                let s = if self.live[id].preloaded { 0.0 } else { self.w.endpoints[ep].startup_s };
                self.live[id].preloaded = false;
                self.push(now + s, Ev::Ready { job: id, gen });
            }
        }
    }

    /// One pass of the scheduler (see the Slurm model for the rules). A
    /// job that waits for GPUs being reclaimed for it (or for borrowers to
    /// pass PreemptExemptTime) holds back every lower-priority job, so what
    /// is freed for it is not taken by others first.
    fn schedule(&mut self) {
        for k in 0..self.order.len() {
            let class = self.order[k];
            let mut i = 0;
            while let Some(&id) = self.pending[class].get(i) {
                if self.live[id].st != St::Pending {
                    self.pending[class].remove(i);
                    continue;
                }
                if self.live[id].not_before > self.now {
                    // Held (a requeued job's BeginTime): it blocks no one.
                    i += 1;
                    continue;
                }
                if !self.within_limits(id) {
                    break;
                }
                if let Some(a) = self.place(id) {
                    self.pending[class].remove(i);
                    self.start(id, a);
                    continue;
                }
                if self.model.is_some() {
                    let coming = if self.now >= self.live[id].reclaim_wait { self.preempt_for(id) } else { true };
                    if coming {
                        return;
                    }
                }
                break;
            }
        }
    }

    /// Picks and reclaims victims for a pending job; whether GPUs are
    /// coming for it (victims draining, or borrowers soon past the exempt time).
    fn preempt_for(&mut self, id: usize) -> bool {
        let Some(m) = self.model else { return false };
        let class = self.live[id].class;
        let preempts = &m.classes[class].preempts;
        if preempts.is_empty() {
            return false;
        }
        let mut view: Vec<(u32, Vec<Holder>)> = Vec::new();
        let nodes: Vec<usize> = self.allowed_nodes(id).filter(|&n| self.fits_type(id, n)).collect();
        let mut node_pos = vec![usize::MAX; self.free.len()];
        for (i, &n) in nodes.iter().enumerate() {
            node_pos[n] = i;
            view.push((self.free[n].count_ones(), Vec::new()));
        }
        let mut next_eligible = f64::INFINITY;
        for (j, l) in self.live.iter().enumerate() {
            if !matches!(l.st, St::Running | St::Draining) || !preempts.contains(&l.class) {
                continue;
            }
            let old_enough = self.now - l.start >= m.exempt_s;
            if !old_enough && !l.being_reclaimed {
                next_eligible = next_eligible.min(l.start + m.exempt_s);
            }
            for &(node, mask) in &l.alloc {
                if node_pos[node] != usize::MAX {
                    view[node_pos[node]].1.push(Holder {
                        job: j,
                        priority: m.classes[l.class].priority,
                        lowest_gpu: mask.trailing_zeros(),
                        gpus: mask.count_ones(),
                        eligible: old_enough && !l.being_reclaimed && l.st == St::Running,
                    });
                }
            }
        }
        let Some(victims) = pick_victims(&view, self.live[id].nodes, self.live[id].per_node) else {
            // Blocked only by PreemptExemptTime: look again when the next borrower becomes reclaimable.
            if next_eligible.is_finite() && (self.wake_at <= self.now || next_eligible < self.wake_at) {
                self.wake_at = next_eligible;
                self.push(next_eligible, Ev::Wake);
            }
            return next_eligible.is_finite();
        };
        let mut wait = self.now;
        for v in victims {
            let vclass = self.live[v].class;
            self.stats[vclass].reclaims += 1;
            self.live[v].being_reclaimed = true;
            self.live[v].notice = self.now;
            let gen = self.live[v].gen;
            let free_at = match (self.live[v].kind, self.live[v].reclaim) {
                (_, None | Some(ReclaimMode::Immediate)) => self.now + IMMEDIATE_FREE_S,
                (Kind::Replica { ep }, Some(_)) => {
                    // Graceful: stop sending it requests; free when drained or at the drain timeout.
                    self.eps[ep].active.retain(|&x| x != v);
                    self.live[v].st = St::Draining;
                    let limit = self.now + m.batch_free_after(self.live[v].reclaim, self.live[v].drain, vclass, None);
                    if self.live[v].inflight == 0 || !self.live[v].ready {
                        self.now + IMMEDIATE_FREE_S
                    } else {
                        limit
                    }
                }
                (Kind::Batch { .. }, mode) => {
                    let by_itself = self.w.victims.get(vclass).and_then(|v| v.release_after_s);
                    self.now + m.batch_free_after(mode, self.live[v].drain, vclass, by_itself)
                }
            };
            if let Kind::Replica { ep } = self.live[v].kind {
                self.eps[ep].active.retain(|&x| x != v);
                if self.live[v].st == St::Running {
                    self.live[v].st = St::Draining;
                }
            }
            wait = wait.max(free_at);
            self.push(free_at, Ev::Free { job: v, gen });
        }
        self.live[id].reclaim_wait = wait;
        true
    }

    /// What was never done counts against the run: jobs never started wait
    /// until the cut-off, requests never served are delayed until it.
    fn finish(&mut self, cutoff: f64) {
        for l in &self.live {
            if let Kind::Batch { job } = l.kind {
                if l.st == St::Pending && l.gen == 0 {
                    self.stats[l.class].waits.push(cutoff - self.w.jobs[job].submit);
                    self.stats[l.class].unstarted_jobs += 1;
                }
            }
        }
        for (ep, e) in self.eps.iter().enumerate() {
            let spec = &self.w.endpoints[ep];
            let s = &mut self.stats[spec.class];
            for (arr, _) in &e.queue {
                s.delays.push((cutoff - arr) as f32);
                s.unserved += 1;
            }
            for r in &spec.requests[e.next_req..] {
                s.delays.push((cutoff - r.t).max(0.0) as f32);
                s.unserved += 1;
            }
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
