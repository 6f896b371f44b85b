//! The simulation's own state: jobs as they live, the event queue and its
//! order, each endpoint's router and autoscaler, and the run itself.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::autoscale::Autoscaler;

use crate::engine::model::{ClassStats, Config, JobLogEntry, Workload};
use crate::slurm::SlurmModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum St {
    Pending,
    Running,
    Draining,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Batch { job: usize },
    Replica { ep: usize },
}

#[derive(Debug, Clone)]
pub(super) struct Live {
    pub(super) kind: Kind,
    pub(super) class: usize,
    pub(super) island: usize,
    pub(super) nodes: u32,
    pub(super) per_node: u32,
    pub(super) gpu_type: Option<usize>,
    pub(super) submit: f64,
    pub(super) remaining: f64,
    pub(super) st: St,
    pub(super) start: f64,
    pub(super) alloc: Vec<(usize, u64)>,
    pub(super) gen: u32,
    pub(super) ready: bool,
    pub(super) inflight: u32,
    pub(super) being_reclaimed: bool,
    pub(super) reclaim: Option<ReclaimMode>,
    pub(super) drain: Option<std::time::Duration>,
    /// The pending job waits for GPUs its preemption frees until then.
    pub(super) reclaim_wait: f64,
    /// When it was told it is reclaimed (its notice).
    pub(super) notice: f64,
    /// A requeued job may not start before this (Slurm's BeginTime).
    pub(super) not_before: f64,
    /// A replica that already runs when the trace starts: ready at once.
    pub(super) preloaded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ev {
    ReqDone { ep: usize, job: usize, gen: u32 },
    End { job: usize, gen: u32 },
    Free { job: usize, gen: u32 },
    Ready { job: usize, gen: u32 },
    Wake,
}

impl Ev {
    pub(super) fn rank(&self) -> u8 {
        match self {
            Ev::ReqDone { .. } => 0,
            Ev::End { .. } => 1,
            Ev::Free { .. } => 2,
            Ev::Ready { .. } => 3,
            Ev::Wake => 4,
        }
    }
}

pub(super) struct Item(pub(super) f64, pub(super) u8, pub(super) u64, pub(super) Ev);
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

pub(super) struct EpState {
    pub(super) queue: VecDeque<(f64, f32)>,
    pub(super) next_req: usize,
    /// Replica jobs that count toward the target (pending, starting, ready).
    pub(super) active: Vec<usize>,
    pub(super) slots: Vec<(usize, u32)>,
    pub(super) inflight: u32,
    pub(super) scaler: Autoscaler,
    pub(super) target: u32,
    /// Every request served: the endpoint's replicas are gone.
    pub(super) done: bool,
    /// Replica jobs submitted by the autoscaler.
    pub(super) submitted: u32,
}

pub(super) struct Sim<'a> {
    pub(super) w: &'a Workload,
    pub(super) cfg: &'a Config,
    pub(super) model: Option<&'a SlurmModel>,
    pub(super) order: Vec<usize>,
    pub(super) node_gpus: Vec<u32>,
    pub(super) node_type: Vec<Option<usize>>,
    pub(super) free: Vec<u64>,
    pub(super) types: Vec<String>,
    pub(super) island_nodes: Vec<std::ops::Range<usize>>,
    pub(super) live: Vec<Live>,
    pub(super) pending: Vec<VecDeque<usize>>,
    pub(super) heap: BinaryHeap<Item>,
    pub(super) seq: u64,
    pub(super) now: f64,
    pub(super) next_job: usize,
    pub(super) eps: Vec<EpState>,
    pub(super) used: Vec<u32>,
    /// Most GPUs held at once, every class together.
    pub(super) peak_gpus: u32,
    pub(super) demand: Vec<f64>,
    pub(super) stats: Vec<ClassStats>,
    pub(super) dirty: bool,
    pub(super) wake_at: f64,
    pub(super) batch_left: usize,
    pub(super) unprotected: f64,
    pub(super) used_in_window: f64,
    /// The last time any GPU was held.
    pub(super) last_busy: f64,
    pub(super) log: Vec<JobLogEntry>,
    pub(super) request_log: Vec<(usize, f32, f32)>,
    pub(super) events: u64,
}

pub(super) fn mask_low(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}
