//! What the controller shows: its replica jobs, reclaims and failed starts for
//! `onepool status`, and the gauges it exports.

// The view's types are the control API's: what status reads is what is
// sent.
use crate::controller::{kind_name, unix_now, Controller};

pub use onepool_control::api::{
    ControllerView, FailedStartView, JobPhase, ReclaimMode, ReclaimView, ReplicaJob, ReplicaKind, StartFailures,
    RECENT_RECLAIMS,
};
use onepool_router::metrics::EndpointLabels;
use onepool_router::metrics::ReplicaJobLabels;
use onepool_router::registry::ReplicaState;

impl Controller {
    /// `onepool_replica_jobs` and `onepool_replica_desired` from the view
    /// just made (every kind and phase, so one that emptied reads 0).
    pub(super) fn export(&self, v: &ControllerView) {
        for kind in ReplicaKind::ALL {
            for phase in JobPhase::ALL {
                let n = v.jobs.iter().filter(|j| j.kind == kind && j.phase == phase).count();
                let labels = ReplicaJobLabels {
                    endpoint: self.name.clone(),
                    kind: kind.as_str().to_string(),
                    phase: phase.as_str().to_string(),
                };
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
                        JobPhase::Cancelled
                    } else if m.draining() || state == Some(ReplicaState::Draining) {
                        JobPhase::Draining
                    } else {
                        match state {
                            Some(ReplicaState::Ready | ReplicaState::Out) => JobPhase::Serving,
                            Some(ReplicaState::Starting) => JobPhase::Starting,
                            _ if m.address.is_some() || t.running => JobPhase::Starting,
                            _ => JobPhase::Pending,
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
