//! The control API's requests and answers as types, shared by onepoold
//! (which serializes them) and every client (which reads them): a field
//! renamed on one side fails to compile on the other, instead of reading
//! as a silent zero.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `GET /v1/state`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub endpoints: Vec<EndpointState>,
    /// Which onepoold instance acts on Slurm (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leadership: Option<Leadership>,
}

/// Which of several onepoold instances acts on Slurm (docs/ha.md): this
/// one, or the one the lock's server names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Leadership {
    /// This instance's name (`[ha] instance`, the host name by default).
    pub instance: String,
    /// Several instances share the work through a lock (`[ha] lock`);
    /// false: this one is alone and always acts.
    pub shared: bool,
    /// Whether this instance acts now.
    pub acting: bool,
    /// Since when it acts (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acting_since: Option<f64>,
    /// The acting instance: this one's name, or another's as the lock's
    /// server describes its connection; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acting_instance: Option<String>,
    /// Times this instance took the lock.
    pub takeovers: u64,
    /// When it last did (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_takeover: Option<f64>,
    /// Why the lock cannot be reached, or why this instance last lost it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The lock's holder when it is not an onepoold instance of this
    /// configuration (it holds no proof made with the replica key): while
    /// it holds the lock, no instance acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreign_holder: Option<String>,
}

impl State {
    pub fn endpoint(&self, name: &str) -> Option<&EndpointState> {
        self.endpoints.iter().find(|e| e.name == name)
    }
}

/// One endpoint as its router holds it, and (with `[endpoint.replicas]`)
/// what its controller did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EndpointState {
    pub name: String,
    /// Requests waiting for a replica now.
    pub queued: usize,
    pub peak_queued: usize,
    pub replicas: Vec<Replica>,
    /// Requests handed to replicas so far, including those that left.
    pub served_total: u64,
    /// Absent when onepoold submits no replica job for the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_jobs: Option<ControllerView>,
    /// How answers continue on another replica (issue #43); absent when
    /// they do not (`[endpoint.resume] method = "off"`, or an older onepoold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeState>,
    /// Its request classes (issue #44), highest first; empty without.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassState>,
}

/// One request class of an endpoint (issue #44).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassState {
    pub name: String,
    /// 0 for protected classes, else the policy's rank (lower goes first).
    pub rank: u32,
    /// Requests of the class waiting for a replica now.
    pub queued: usize,
    /// Requests of the class on replicas now (absent from older daemons).
    #[serde(default)]
    pub in_flight: u32,
    /// Ranked below the endpoint's own class (absent from older daemons).
    #[serde(default)]
    pub lower: bool,
    pub requests: u64,
    /// Refused because the class's share of the queue was full.
    pub shed: u64,
    /// Streams that gave their slot to a higher class.
    pub yielded: u64,
    /// Its generation requests by whether the router follows their answer
    /// (`yes`: it can yield its slot and move; `replay`: it moves only by
    /// being generated again) or why not (`whole`, `several_choices`, ...:
    /// issue #51 item 6); absent from older daemons.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub followed: BTreeMap<String, u64>,
}

/// An endpoint's continued answers (issue #43).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeState {
    /// "tokens" or "text".
    pub method: String,
    pub max_moves: u32,
    /// Moves of answers to another replica so far.
    pub moved: u64,
    /// Answers that could not be continued and ended with an error event.
    pub not_moved: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Added, waiting for enough passing health checks.
    Starting,
    /// Takes new requests.
    Ready,
    /// Takes no new requests; the ones in flight finish.
    Draining,
    /// Failed enough health checks in a row; takes no requests until it
    /// passes enough in a row again.
    Out,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Starting => "starting",
            ReplicaState::Ready => "ready",
            ReplicaState::Draining => "draining",
            ReplicaState::Out => "out",
        }
    }
}

/// One replica in an endpoint's router.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Replica {
    pub id: u64,
    pub address: SocketAddr,
    pub state: ReplicaState,
    pub in_flight: u32,
    /// Most requests this replica serves at once.
    pub limit: u32,
    /// Requests handed to this replica since it was added.
    pub served: u64,
    pub peak_in_flight: u32,
    /// Warm headroom: takes requests only when every other ready replica
    /// is at its limit.
    pub spill: bool,
    /// Lent to the classes below the endpoint's own (issue #44): their
    /// requests go there first (absent from older daemons).
    #[serde(default)]
    pub lent: bool,
}

/// How a drain ended (`POST .../replicas/drain`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DrainOutcome {
    /// Every in-flight request finished.
    Drained { millis: u64 },
    /// The deadline passed with requests still in flight.
    TimedOut { in_flight: u32 },
    /// The replica was removed while draining.
    Removed { in_flight: u32 },
}

/// `POST /v1/endpoints/NAME/replicas`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddReplica {
    pub address: SocketAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Absent: ready at once unless the endpoint health-checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The SHA-256 (64 hex digits) of the certificate the replica serves
    /// TLS with (`onepool replica --tls`); absent: clear HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
}

/// The answer to [`AddReplica`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Added {
    pub id: u64,
}

/// `POST .../replicas/remove` and `.../replicas/drain`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaRef {
    pub address: SocketAddr,
    /// Drain only: how long in-flight requests may take ("30s" when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// The answer to a remove: the replica as it was when it left.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Removed {
    pub removed: Replica,
}

/// The answer to `POST /v1/endpoints/NAME/retry`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RetryAccepted {
    pub endpoint: String,
    /// The back-off that the retry ends.
    pub was: StartFailures,
    pub retry: String,
}

/// Every answer that is not a success.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorAnswer {
    pub error: String,
}

/// What a replica job is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaKind {
    /// Up to the endpoint's `min`, in its protected class.
    Baseline,
    /// Above `min`, reclaimable.
    Supplemental,
    /// Headroom above what the load asks (`warm`).
    Warm,
    /// Above `min`, for demand only request classes below the endpoint's
    /// own bring (`lower_workload`, issue #44).
    #[serde(rename = "lower-class")]
    Lower,
}

impl ReplicaKind {
    pub const ALL: [ReplicaKind; 4] =
        [ReplicaKind::Baseline, ReplicaKind::Supplemental, ReplicaKind::Warm, ReplicaKind::Lower];

    /// The name in metrics labels, job names and status.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaKind::Baseline => "baseline",
            ReplicaKind::Supplemental => "supplemental",
            ReplicaKind::Warm => "warm",
            ReplicaKind::Lower => "lower-class",
        }
    }
}

impl std::fmt::Display for ReplicaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a replica job is in its life, as the controller saw it last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    Pending,
    Starting,
    Serving,
    Draining,
    /// scancel (or a shrink releasing its node) was sent and Slurm has not
    /// let go of it yet.
    Cancelled,
}

impl JobPhase {
    pub const ALL: [JobPhase; 5] =
        [JobPhase::Pending, JobPhase::Starting, JobPhase::Serving, JobPhase::Draining, JobPhase::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Pending => "pending",
            JobPhase::Starting => "starting",
            JobPhase::Serving => "serving",
            JobPhase::Draining => "draining",
            JobPhase::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for JobPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One replica as the controller sees it; a job hosting several shows as
/// several, with the same `job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaJob {
    pub job: u32,
    pub port: u16,
    pub kind: ReplicaKind,
    pub phase: JobPhase,
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

/// What an endpoint's controller did so far; updated after every poll.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ControllerView {
    /// Polls done (successful or not).
    pub rounds: u64,
    pub jobs: Vec<ReplicaJob>,
    pub min: u32,
    pub max: u32,
    /// Replicas the autoscaler wants now (baseline included).
    pub desired: u32,
    /// Of those, the replicas only request classes below the endpoint's
    /// own ask for, submitted in its `lower_workload` class (issue #44).
    #[serde(default)]
    pub lower: u32,
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
    /// Advisory mode: decisions are logged, never carried out.
    #[serde(default)]
    pub advisory: bool,
    /// With latency targets: the latency rule's last verdict, e.g. "ttft
    /// p99 1.8 s > target 1.0 s over 43 requests: 3 -> 4".
    #[serde(default)]
    pub latency: Option<String>,
    /// In advisory mode, what onepoold would be doing now, each with why
    /// (e.g. "submit supplemental: the load wants 3 replicas, 2 live").
    #[serde(default)]
    pub advised: Vec<String>,
    /// Set by the control socket (`onepool retry ENDPOINT`): the next poll
    /// ends the back-off. The view is the one thing both share; never
    /// sent.
    #[serde(skip)]
    pub retry_requested: bool,
}

/// How many reclaims the view keeps.
pub const RECENT_RECLAIMS: usize = 5;

/// A replica job Slurm took back for other work, as onepoold saw it: from
/// the poll that first found it being preempted to the poll that found it
/// gone.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReclaimView {
    pub job: u32,
    pub kind: ReplicaKind,
    pub mode: ReclaimMode,
    /// Unix seconds of Slurm's pick (the job's `PreemptTime` record).
    pub at: u64,
    /// Seconds from the pick to the job's end (`EndTime`): its GPUs were
    /// free then (whole seconds, as Slurm keeps them).
    pub released_after_s: f64,
    /// The job that took its GPUs: the first another user started on its
    /// nodes after Slurm's pick (slurmctld's records of the jobs on those
    /// nodes, running or ended).
    pub taker: Option<u32>,
    /// The taker's submission to its start, in whole seconds (squeue's);
    /// `onepool report` has it to the millisecond from slurmctld's log.
    pub time_to_capacity_s: Option<u64>,
}

/// How a replica yielded its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimMode {
    /// A grace time to drain in.
    Graceful,
    /// None: cancelled at once.
    Immediate,
}

impl ReclaimMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimMode::Graceful => "graceful",
            ReclaimMode::Immediate => "immediate",
        }
    }
}

impl std::fmt::Display for ReclaimMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `onepool status` shows of failed starts.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailedStartView {
    pub job: u32,
    /// Unix seconds.
    pub at: u64,
    /// Slurm's end of the job, the server's signal or exit code, its last
    /// output lines; or why onepoold gave up on it.
    pub cause: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names clients and dashboards already read stay what they were
    /// when the view was untyped JSON.
    #[test]
    fn the_wire_names_are_the_ones_clients_read() {
        let job = ReplicaJob {
            job: 7,
            port: 8000,
            kind: ReplicaKind::Supplemental,
            phase: JobPhase::Cancelled,
            address: None,
            node: Some("node1".into()),
            preempted: true,
            drain_deadline: Some(5),
        };
        let v = serde_json::to_value(&job).unwrap();
        assert_eq!(v["kind"], "supplemental");
        assert_eq!(v["phase"], "cancelled");
        let r: ReclaimView = serde_json::from_value(serde_json::json!({
            "job": 1, "kind": "warm", "mode": "graceful", "at": 2, "released_after_s": 0.5,
            "taker": null, "time_to_capacity_s": null
        }))
        .unwrap();
        assert_eq!((r.kind, r.mode), (ReplicaKind::Warm, ReclaimMode::Graceful));
        let d = serde_json::to_value(DrainOutcome::TimedOut { in_flight: 2 }).unwrap();
        assert_eq!(d, serde_json::json!({"outcome": "timed_out", "in_flight": 2}));
        for k in ReplicaKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for p in JobPhase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for r in [ReplicaState::Starting, ReplicaState::Ready, ReplicaState::Draining, ReplicaState::Out] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }

    #[test]
    fn a_state_without_replica_jobs_reads_back() {
        let s = State {
            endpoints: vec![EndpointState { name: "chat".into(), served_total: 3, ..EndpointState::default() }],
            leadership: None,
        };
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("replica_jobs"), "{text}");
        let back: State = serde_json::from_str(&text).unwrap();
        assert_eq!(back.endpoint("chat").map(|e| e.served_total), Some(3));
        assert!(back.endpoint("other").is_none());
    }

    #[test]
    fn a_request_with_an_unknown_field_is_refused() {
        let e = serde_json::from_str::<AddReplica>(r#"{"address":"127.0.0.1:1","concurency":2}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `concurency`"), "{e}");
    }
}
