//! What the controller shows: its replica jobs, reclaims and failed starts for
//! `onepool status`, and the gauges it exports.

use super::*;

/// Every [`ReplicaJob::kind`].
pub(super) const KINDS: [&str; 3] = ["baseline", "supplemental", "warm"];

/// Every [`ReplicaJob::phase`].
pub(super) const PHASES: [&str; 5] = ["pending", "starting", "serving", "draining", "cancelled"];

/// One replica as the controller sees it (for tests and status); a job
/// hosting several shows as several, with the same `job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaJob {
    pub job: u32,
    pub port: u16,
    /// "baseline", "supplemental" or "warm".
    pub kind: &'static str,
    /// "pending", "starting", "serving" or "draining"; "cancelled" once
    /// scancel (or a shrink releasing its node) was sent and Slurm has not
    /// let go of it yet.
    pub phase: &'static str,
    /// Where the router reaches it, once it runs.
    pub address: Option<SocketAddr>,
    /// The node it runs on.
    pub node: Option<String>,
    /// Slurm picked its job as a preemption victim (its grace time runs).
    pub preempted: bool,
    /// While draining: when it is released at the latest (Unix seconds),
    /// the earlier of onepoold's drain timeout and Slurm's preemption end.
    pub drain_deadline: Option<u64>,
}

/// What the controller did so far; updated after every poll.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ControllerView {
    /// Polls done (successful or not).
    pub rounds: u64,
    pub jobs: Vec<ReplicaJob>,
    pub min: u32,
    pub max: u32,
    /// Replicas the autoscaler wants now (baseline included).
    pub desired: u32,
    /// With warm headroom: the warm replicas wanted above `desired`, and
    /// whether a job waited for the pool's GPUs at the last poll (then no
    /// warm replica is added and surplus ones go).
    pub headroom: Option<u32>,
    pub gpus_wanted: Option<bool>,
    /// In flight plus queued, as the autoscaler saw it last.
    pub load: f64,
    /// Requests answered per second over the last poll.
    pub rate: f64,
    /// With `load_metrics`: replicas whose own metrics were read at the
    /// last poll, of those serving (the rest counted with the router's).
    pub scraped: Option<(usize, usize)>,
    /// Replica jobs submitted by this controller since it started.
    pub submitted: Vec<u32>,
    /// Nodes released from running jobs by shrinking them, as (job, node).
    pub shrunk: Vec<(u32, String)>,
    /// The last failed Slurm call, if the last poll had one.
    pub last_error: Option<String>,
    /// Replica jobs that failed to start, and the back-off they caused.
    pub start_failures: StartFailures,
    /// The last reclaims of this endpoint's replicas (at most
    /// [`RECENT_RECLAIMS`], newest last).
    pub reclaims: Vec<ReclaimView>,
    /// Set by the control socket (`onepool retry ENDPOINT`): the next poll
    /// ends the back-off. The view is the one thing both share.
    #[serde(skip)]
    pub retry_requested: bool,
}

/// How many reclaims the view keeps.
pub const RECENT_RECLAIMS: usize = 5;

/// A replica job Slurm took back for other work, as onepoold saw it
/// (issue #26): from the poll that first found it being preempted to the
/// poll that found it gone. The taker and its time to capacity are
/// `onepool report`'s (slurmctld's log has them; onepoold only watches
/// its own jobs).
#[derive(Clone, Debug, Serialize)]
pub struct ReclaimView {
    pub job: u32,
    pub kind: &'static str,
    /// "graceful" (a grace time to drain in) or "immediate" (none).
    pub mode: &'static str,
    /// Unix seconds when onepoold saw Slurm's pick.
    pub at: u64,
    /// Seconds from that poll to the poll that found the job gone: its
    /// GPUs were free by then (poll-interval resolution).
    pub released_after_s: f64,
    /// The job that took its GPUs: the first another user started on its
    /// nodes after Slurm's pick (found in the polls after its release).
    pub taker: Option<u32>,
    /// The taker's submission to its start, in whole seconds (squeue's);
    /// `onepool report` has it to the millisecond from slurmctld's log.
    pub time_to_capacity_s: Option<u64>,
}

/// What `onepool status` shows of failed starts (issue #24).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StartFailures {
    /// Failed starts in a row; 0 when the endpoint is not backing off.
    pub in_a_row: u32,
    /// Every failed start since onepoold started.
    pub total: u64,
    /// No replica job is submitted until `next_attempt` (or, once it
    /// passed, until the one probe job served or failed).
    pub backing_off: bool,
    /// Unix seconds.
    pub next_attempt: Option<u64>,
    pub last: Option<FailedStartView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedStartView {
    pub job: u32,
    /// Unix seconds.
    pub at: u64,
    /// Slurm's end of the job, the server's signal or exit code, its last
    /// output lines; or why onepoold gave up on it.
    pub cause: String,
}

impl Controller {
    /// `onepool_replica_jobs` and `onepool_replica_desired` from the view
    /// just made (every kind and phase, so one that emptied reads 0).
    pub(super) fn export(&self, v: &ControllerView) {
        for kind in KINDS {
            for phase in PHASES {
                let n = v.jobs.iter().filter(|j| j.kind == kind && j.phase == phase).count();
                let labels =
                    ReplicaJobLabels { endpoint: self.name.clone(), kind: kind.to_string(), phase: phase.to_string() };
                self.metrics.replicas.get_or_create(&labels).set(n as i64);
            }
        }
        let labels = EndpointLabels { endpoint: self.name.clone() };
        self.metrics.desired.get_or_create(&labels).set(i64::from(v.desired));
        let f = &v.start_failures;
        self.metrics.backoff_failures.get_or_create(&labels).set(i64::from(f.in_a_row));
        let left = f.next_attempt.filter(|_| f.backing_off).map_or(0, |t| t.saturating_sub(unix_now()));
        self.metrics.backoff_seconds.get_or_create(&labels).set(left as i64);
    }

    pub(super) fn jobs_view(&self) -> Vec<ReplicaJob> {
        let snap = self.endpoint.snapshot();
        let mut out = Vec::new();
        for (job, t) in &self.tracked {
            for (port, m) in &t.members {
                let state = m.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a)).map(|r| r.state);
                out.push(ReplicaJob {
                    job: *job,
                    port: *port,
                    kind: kind_name(t.kind),
                    phase: if m.released {
                        "cancelled"
                    } else if m.draining() || state == Some(ReplicaState::Draining) {
                        "draining"
                    } else {
                        match state {
                            Some(ReplicaState::Ready | ReplicaState::Out) => "serving",
                            Some(ReplicaState::Starting) => "starting",
                            _ if m.address.is_some() || t.running => "starting",
                            _ => "pending",
                        }
                    },
                    address: m.address,
                    node: m.node.clone(),
                    preempted: t.preempt_end.is_some(),
                    drain_deadline: match (m.drain_started_unix, t.preempt_end) {
                        (Some(d), p) => {
                            let ours = d + self.settings.drain_timeout.as_secs();
                            Some(p.map_or(ours, |p| p.min(ours)))
                        }
                        (None, p) => p,
                    },
                });
            }
        }
        out
    }
}
