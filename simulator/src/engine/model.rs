//! What a run takes and gives: the workload (jobs, requests, endpoints),
//! the fleet's layout and the policy's model, and the run's result (each
//! class's figures, the job and request logs).

use std::sync::Arc;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::autoscale::ScalingPolicy;
use onepool_decisions::replicas::WarmSpec;
use serde::Serialize;

use crate::fleet::Fleet;
use crate::slurm::SlurmModel;

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
