//! Inference endpoints: the router handing requests to replicas, and
//! onepoold's autoscaler and reconciler deciding replicas, as onepoold does.

use std::collections::VecDeque;

use onepool_decisions::autoscale::Autoscaler;
use onepool_decisions::replicas::{self, reconcile, Action, EndpointTarget, Headroom, Phase, WarmSpec};

use crate::engine::model::Endpoint;
use crate::engine::state::{EpState, Ev, Item, Kind, Sim, St};

impl Sim<'_> {
    /// An endpoint before its first request: its autoscaler's bounds cut to
    /// the replicas its island can hold at all.
    pub(super) fn endpoint_state(&self, e: &Endpoint) -> EpState {
        let room: u32 = self.island_nodes[e.island]
            .clone()
            .filter(|&i| e.gpu_type.is_none() || self.node_type[i] == self.type_of(e.gpu_type.as_deref()))
            .map(|i| self.node_gpus[i] / e.gpus_per_replica.max(1))
            .sum();
        let mut p = e.scaling.clone();
        p.max = p.max.min(room).max(p.min.min(room));
        p.min = p.min.min(p.max);
        EpState {
            queue: VecDeque::new(),
            next_req: 0,
            active: Vec::new(),
            slots: Vec::new(),
            inflight: 0,
            scaler: match &e.latency {
                Some(t) => Autoscaler::with_latency(p, t.clone()),
                None => Autoscaler::new(p),
            },
            target: 0,
            done: false,
            submitted: 0,
        }
    }

    pub(super) fn dispatch(&mut self, ep: usize) {
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
            // The router's samples: its queue wait, and its first byte,
            // here its whole answer's (the model has no separate prefill
            // time): the time to first token of a request not streamed.
            e.scaler.record_latency(self.now, f64::from(delay + service), f64::from(delay));
            self.stats[class].delays.push(delay);
            if self.cfg.job_log {
                self.request_log.push((ep, (arr - self.w.t0) as f32, delay));
            }
            self.seq += 1;
            let ev = Ev::ReqDone { ep, job, gen };
            self.heap.push(Item(self.now + f64::from(service), ev.rank(), self.seq, ev));
        }
    }

    pub(super) fn autoscale(&mut self, ep: usize) {
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
            lower: 0,
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
    pub(super) fn replica(&self, ep: usize, j: usize) -> replicas::Replica {
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
    pub(super) fn baseline(&self, ep: usize) -> Option<(usize, u32)> {
        self.w.endpoints[ep].baseline.filter(|_| self.model.is_some())
    }

    /// The warm headroom (class, spec), in the shared pool only.
    pub(super) fn warm(&self, ep: usize) -> Option<(usize, WarmSpec)> {
        self.w.endpoints[ep].warm.filter(|_| self.model.is_some())
    }

    pub(super) fn class_of(&self, ep: usize, kind: replicas::Kind) -> usize {
        let spec = &self.w.endpoints[ep];
        match kind {
            replicas::Kind::Baseline => self.baseline(ep).map_or(spec.class, |b| b.0),
            replicas::Kind::Supplemental => spec.class,
            replicas::Kind::Warm => self.warm(ep).map_or(spec.class, |w| w.0),
            // Its targets never ask for lower-class replicas (`lower: 0`).
            replicas::Kind::Lower => spec.class,
        }
    }

    /// As onepoold asks squeue: does a pending job other than a warm
    /// replica wait for GPUs (not held by its begin time, not by a QOS
    /// limit, whose reason Slurm gives as the limit, not Resources)?
    pub(super) fn gpus_wanted(&self) -> bool {
        let warm: Vec<usize> = self.w.endpoints.iter().filter_map(|e| e.warm.map(|w| w.0)).collect();
        self.pending.iter().enumerate().filter(|(c, _)| !warm.contains(c)).any(|(_, q)| {
            q.iter().any(|&id| {
                let l = &self.live[id];
                l.st == St::Pending && l.not_before <= self.now && self.within_limits(id)
            })
        })
    }

    pub(super) fn endpoint_finished(&self, ep: usize) -> bool {
        let e = &self.eps[ep];
        e.next_req >= self.w.endpoints[ep].requests.len() && e.queue.is_empty() && e.inflight == 0
    }

    /// The trace is over and served: the endpoint's replicas go.
    pub(super) fn retire(&mut self, ep: usize) {
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
    pub(super) fn set_target(&mut self, ep: usize, target: u32) {
        for (c, g) in self.target_demand(ep, self.eps[ep].target) {
            self.demand[c] -= g;
        }
        for (c, g) in self.target_demand(ep, target) {
            self.demand[c] += g;
        }
        self.eps[ep].target = target;
        // The scenario's own cap, not the island's room: only that one
        // stays whatever the fleet's size.
        let spec = &self.w.endpoints[ep];
        if target > 0 && target >= spec.scaling.max {
            let seen = &mut self.stats[spec.class].at_max_replicas;
            if !seen.iter().any(|(name, _)| *name == spec.name) {
                seen.push((spec.name.clone(), spec.scaling.max));
            }
        }
    }

    /// GPUs of `target` replicas per class: (baseline class, endpoint's class).
    pub(super) fn target_demand(&self, ep: usize, target: u32) -> [(usize, f64); 2] {
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
    pub(super) fn warm_start(&mut self, ep: usize) {
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
}
