//! What the controller keeps of its replica jobs between rounds: each job
//! it tracks and its members (one replica per node), whether Slurm has it
//! live, the jobs that ended and the reclaims whose taker is still sought,
//! and what the last round saw.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use onepool_control::api::ReclaimMode;
use onepool_decisions::replicas::Kind;
use onepool_launcher::conventions::ReplicaNote;
use onepool_slurm_commands::state::JobInfo;

/// One replica: a job's only one, or one of a job's per-node ones.
#[derive(Default)]
pub(super) struct Member {
    /// Where it runs; `None` while its job is pending.
    pub(super) node: Option<String>,
    /// In the router at this address.
    pub(super) address: Option<SocketAddr>,
    pub(super) drain_started: Option<Instant>,
    /// The same moment in Unix seconds, for status.
    pub(super) drain_started_unix: Option<u64>,
    /// scancel or a shrink was sent for it: never back into the router.
    pub(super) released: bool,
    /// Its srun step was seen (per-node jobs): once gone, the replica ended.
    pub(super) step_seen: bool,
    /// Its step ended while the node stayed in the job.
    pub(super) ended: bool,
}

impl Member {
    pub(super) fn draining(&self) -> bool {
        self.drain_started.is_some() || self.ended
    }
}

pub(super) struct TrackedJob {
    /// The port in its name; its replicas use `base_port + 2i`.
    pub(super) base_port: u16,
    pub(super) kind: Kind,
    /// Replicas it was seen to host at most (ports reserved for it).
    pub(super) width: u16,
    pub(super) running: bool,
    /// When this controller first saw the job running: a replica adopted
    /// after a restart has its model loaded long ago, but its health is
    /// being checked anew, and its startup time counts from here.
    pub(super) seen_running: Option<Instant>,
    pub(super) batch_host: Option<String>,
    /// Slurm's preemption deadline (Unix seconds) while a poll sees it
    /// picked: shown in status, never counted (a reclaim is counted from
    /// the job's record when it ends: [`ending::reclaim_of`]).
    pub(super) preempt_end: Option<u64>,
    /// By slot.
    pub(super) members: BTreeMap<u16, Member>,
    /// Where its replicas listen, from the job's comment.
    pub(super) note: Option<ReplicaNote>,
    /// When one of its replicas first served.
    pub(super) served_at: Option<Instant>,
    /// onepoold counted it as a failed start already (it gave up on it).
    pub(super) failure_counted: bool,
    /// Its nodes (a host list), once it ran.
    pub(super) nodes: String,
}

impl TrackedJob {
    pub(super) fn new(base_port: u16, kind: Kind, width: u16) -> TrackedJob {
        TrackedJob {
            base_port,
            kind,
            width: width.max(1),
            running: false,
            seen_running: None,
            batch_host: None,
            preempt_end: None,
            members: BTreeMap::new(),
            note: None,
            served_at: None,
            failure_counted: false,
            nodes: String::new(),
        }
    }

    /// Ports this job holds or may hold (each replica takes a pair).
    pub(super) fn uses(&self, port: u16) -> bool {
        let top = u32::from(self.base_port) + 2 * u32::from(self.width);
        (u32::from(port) >= u32::from(self.base_port) && u32::from(port) < top)
            || self.members.keys().any(|p| port == *p || port == p + 1)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Live {
    Pending,
    Running,
}

pub(super) fn live(job: &JobInfo) -> Option<Live> {
    match job.job_state.as_str() {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" => Some(Live::Pending),
        "RUNNING" | "SUSPENDED" => Some(Live::Running),
        // Completing, completed, cancelled, failed, preempted...: gone.
        _ => None,
    }
}

/// The nodes a running job holds, in Slurm's order (the order in which
/// `onepool replica --per-node` numbered its replicas at the start; a
/// shrink or a failed node takes nodes out of it, so positions after one
/// are only a guess).
pub(super) fn job_nodes(job: &JobInfo) -> Vec<String> {
    match onepool_decisions::hostlist::expand(&job.nodes) {
        Ok(nodes) if !nodes.is_empty() => nodes,
        _ => Some(job.batch_host.clone()).filter(|b| !b.is_empty()).into_iter().collect(),
    }
}

/// A replica job that left the queue, its record still to be read.
pub(super) struct EndedJob {
    pub(super) job: u32,
    pub(super) tracked: TrackedJob,
    /// Reads of its record that failed so far.
    pub(super) reads: u32,
}

/// A reclaimed replica whose taker is still to be found.
#[derive(Clone, Debug)]
pub(super) struct TakerSearch {
    pub(super) job: u32,
    pub(super) nodes: String,
    pub(super) mode: ReclaimMode,
    /// Unix seconds of Slurm's pick (the victim's PreemptTime): the taker
    /// starts after.
    pub(super) picked_at: u64,
    /// Given up (no other job started on its nodes) after this.
    pub(super) until: Instant,
}

/// What a decision saw, for its log line.
#[derive(Clone, Copy, Default)]
pub(super) struct Seen {
    pub(super) desired: u32,
    /// Of `desired`, for request classes below the endpoint's own only.
    pub(super) lower: u32,
    pub(super) serving: u32,
    pub(super) load: f64,
}
