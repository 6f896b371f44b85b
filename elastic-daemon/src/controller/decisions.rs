//! Every replica decision said where an admin looks (issue #28): onepoold's
//! log, `onepool_replica_decisions_total`, and the decision log that
//! `onepool report` reads. In advisory mode this is all that happens: the
//! decisions of a round are logged once each while they stay wanted
//! ([`Advice`]) and nothing is submitted, drained or released.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use onepool_decisions::decision_log::{explain, kind_str, DecisionAction, DecisionEntry, DecisionMode};
use onepool_decisions::latency::LatencyVerdict;
use onepool_decisions::replicas::{Action, EndpointTarget, Kind, Phase, Replica};
use onepool_decisions::trace::format_time_ms;
use onepool_router::endpoint::EndpointSnapshot;
use onepool_router::metrics::{AdvisedLabels, DecisionLabels, LatencyLabels};
use onepool_router::registry::ReplicaState;

use crate::controller::Controller;

impl Controller {
    /// Says one decision: log line, counter, decision log.
    pub(super) fn decided(&self, mode: DecisionMode, action: &Action, replicas: &[Replica], target: &EndpointTarget) {
        let why = explain(action, replicas, target);
        let (job, port, kind) = match *action {
            Action::Submit(k) => (None, None, kind_str(k)),
            Action::Drain { job, slot } | Action::Release { job, slot } => {
                let kind = replicas
                    .iter()
                    .find(|r| (r.job, r.slot) == (job, slot))
                    .map_or("supplemental", |r| kind_str(r.kind));
                (Some(job), Some(slot), kind)
            }
        };
        let replica = port.and_then(|p| self.address_of(job, p)).map(|a| a.to_string());
        // Replicas onepoold has no job for (an advisory endpoint's own)
        // carry a made-up job number: say none rather than that.
        let job = job.filter(|j| self.tracked.contains_key(j));
        let what = DecisionAction::of(action);
        match mode {
            DecisionMode::Advisory => tracing::info!(endpoint = %self.name, job, replica = replica.as_deref(),
                "advisory: would {} {kind}: {why}", what.as_str()),
            DecisionMode::Act => tracing::info!(endpoint = %self.name, instance = self.leadership.instance(), job,
                replica = replica.as_deref(), "decided to {} {kind}: {why}", what.as_str()),
        }
        let labels = DecisionLabels {
            endpoint: self.name.clone(),
            action: what.as_str().to_string(),
            mode: mode.as_str().to_string(),
        };
        self.metrics.decisions.get_or_create(&labels).inc();
        let Some(log) = &self.decision_log else { return };
        let entry = DecisionEntry {
            time: format_time_ms(unix_now_f64()),
            endpoint: self.name.clone(),
            mode,
            action: what,
            kind: kind.to_string(),
            job,
            port: port.filter(|_| job.is_some()),
            replica,
            why,
            desired: self.seen.desired,
            serving: self.seen.serving,
            load: self.seen.load,
            instance: Some(self.leadership.instance().to_string()),
        };
        match serde_json::to_string(&entry) {
            Ok(line) => log.send(line),
            Err(e) => tracing::warn!(endpoint = %self.name, "decision log: {e}"),
        }
    }

    /// Advisory mode's round: the new decisions said, the gauges and the
    /// view set to what would be done now, nothing carried out.
    pub(super) fn advise(&mut self, actions: &[Action], replicas: &[Replica], target: &EndpointTarget) {
        let new: Vec<Action> = self.advice.update(actions).into_iter().cloned().collect();
        for a in &new {
            self.decided(DecisionMode::Advisory, a, replicas, target);
        }
        for (action, n) in self.advice.counts() {
            let labels = AdvisedLabels { endpoint: self.name.clone(), action: action.as_str().to_string() };
            self.metrics.advised.get_or_create(&labels).set(i64::from(n));
        }
        let advised = actions
            .iter()
            .map(|a| {
                let kind = match a {
                    Action::Submit(k) => format!(" {}", kind_str(*k)),
                    Action::Drain { job, slot } | Action::Release { job, slot } => {
                        self.address_of(Some(*job), *slot).map_or_else(|| format!(" job {job}"), |a| format!(" {a}"))
                    }
                };
                format!("{}{kind}: {}", DecisionAction::of(a).as_str(), explain(a, replicas, target))
            })
            .collect();
        self.view.lock().unwrap_or_else(|e| e.into_inner()).advised = advised;
    }

    /// The latency rule's verdict said: its p99s exported, and a log line
    /// when it asks for a replica or lets one go (not every poll it holds).
    pub(super) fn latency_verdict(&mut self, v: &LatencyVerdict) -> String {
        let Some(targets) = self.autoscaler.latency_targets() else { return String::new() };
        let mut reason = v.reason(targets);
        let (ttft, queue, moves) = match *v {
            LatencyVerdict::Missed { ttft_p99, queue_p99, ready, want, .. } => {
                (ttft_p99, queue_p99, Some((ready, want)))
            }
            LatencyVerdict::Held { ttft_p99, queue_p99, ready, want, fewer_ok, .. } => {
                (ttft_p99, queue_p99, fewer_ok.then_some((ready, want)))
            }
            _ => (None, None, None),
        };
        if moves.is_some_and(|(_, want)| want > self.settings.max) {
            reason.push_str(&format!(" (held at max = {})", self.settings.max));
        }
        for (what, p99) in [("ttft", ttft), ("queue", queue)] {
            if let Some(p99) = p99 {
                let labels = LatencyLabels { endpoint: self.name.clone(), what: what.to_string() };
                self.metrics.latency_p99.get_or_create(&labels).set(p99);
            }
        }
        // Said when the count it asks for changes, not every poll while
        // its figures move.
        if moves.is_some() && moves != self.said_latency {
            tracing::info!(endpoint = %self.name, "latency target: {reason}");
        }
        self.said_latency = moves;
        reason
    }

    /// Where the replica (`job`, `port`) serves: a tracked member's
    /// address, else (an advisory endpoint's own replica) the router's
    /// replica on that port.
    fn address_of(&self, job: Option<u32>, port: u16) -> Option<SocketAddr> {
        if let Some(a) =
            job.and_then(|j| self.tracked.get(&j)).and_then(|t| t.members.get(&port)).and_then(|m| m.address)
        {
            return Some(a);
        }
        let j = job?;
        let i = u32::MAX - j;
        self.untracked.get(i as usize).copied().filter(|a| a.port() == port)
    }

    /// An advisory endpoint's replicas that no job of onepoold's holds
    /// (the admin's own, added through the control socket), as reconcile
    /// sees replicas: the first `min` as baseline, the rest supplemental,
    /// under job numbers counted down from `u32::MAX`. Acting, onepoold
    /// leaves such replicas alone and does not count them; advising, it
    /// counts them so that its advice is about the endpoint as it serves.
    pub(super) fn untracked_replicas(&mut self, snap: &EndpointSnapshot) -> Vec<Replica> {
        let ours: Vec<SocketAddr> =
            self.tracked.values().flat_map(|t| t.members.values()).filter_map(|m| m.address).collect();
        self.untracked = snap.replicas.iter().map(|r| r.address).filter(|a| !ours.contains(a)).collect();
        let mut out = Vec::new();
        for (i, r) in snap.replicas.iter().filter(|r| !ours.contains(&r.address)).enumerate() {
            let phase = match r.state {
                ReplicaState::Ready | ReplicaState::Out => Phase::Serving,
                ReplicaState::Draining => Phase::Draining,
                ReplicaState::Starting => Phase::Starting,
            };
            out.push(Replica {
                job: u32::MAX - i as u32,
                slot: r.address.port(),
                pinned: false,
                kind: if (i as u32) < self.settings.min { Kind::Baseline } else { Kind::Supplemental },
                phase,
                in_flight: r.in_flight,
                // Old: never taken for a replica just started.
                age: Duration::from_secs(365 * 24 * 3600),
                starting_for: Duration::ZERO,
                time_left: None,
                being_preempted: false,
            });
        }
        out
    }
}

fn unix_now_f64() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
