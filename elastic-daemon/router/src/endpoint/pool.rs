//! The endpoint's replica pool: replicas added, removed and drained,
//! their health and reach, the choice of one for a request, and what the
//! requests to one replica share (metrics, idle connections).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onepool_control::api::DrainOutcome;
use tokio::sync::Notify;

use crate::backend_pool::{IdleConns, Transport};
use crate::endpoint::shared::ReplicaShared;
use crate::endpoint::{Endpoint, Inner};
use crate::metrics::{replica_labels, PrefixLabels};
use crate::prefix::{Affine, Affinity, PrefixSettings};
use crate::registry::{RegistryError, Replica, ReplicaId, ReplicaState, Transition};

impl Inner {
    fn shared(&self, id: ReplicaId) -> Option<&Arc<ReplicaShared>> {
        self.shared.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }
}

impl Endpoint {
    /// Adds a replica reached in clear HTTP.
    pub fn add(&self, address: SocketAddr, limit: Option<u32>, ready: bool) -> Result<ReplicaId, RegistryError> {
        self.add_with(address, Transport::Plain, limit, ready)
    }

    /// Adds a replica reached over `transport` (TLS pinned to the
    /// certificate its launcher reported, issue #36). Its transport is
    /// fixed with it: no request can leave before it is known.
    pub fn add_with(
        &self,
        address: SocketAddr,
        transport: Transport,
        limit: Option<u32>,
        ready: bool,
    ) -> Result<ReplicaId, RegistryError> {
        let mut g = self.lock();
        let id = g.pool.add(address, limit.unwrap_or(self.default_limit), ready)?;
        let shared = self.new_shared(address, transport);
        shared.metrics.in_flight.set(0);
        g.shared.push((id, Arc::new(shared)));
        self.dispatch(&mut g);
        Ok(id)
    }

    /// Marks a replica as headroom: it takes requests only when every
    /// other ready replica is at its limit.
    pub fn set_spill(&self, address: SocketAddr, spill: bool) -> Result<(), RegistryError> {
        self.lock().pool.set_spill(address, spill)
    }

    /// Marks a replica as lent to the classes below the endpoint's own:
    /// their requests take it first, the others only when no other replica
    /// has room.
    pub fn set_lent(&self, address: SocketAddr, lent: bool) -> Result<(), RegistryError> {
        self.lock().pool.set_lent(address, lent)
    }

    /// Routes by prompt prefix from now on ([`crate::prefix`]), with an
    /// empty table.
    pub fn set_prefix_routing(&self, settings: PrefixSettings) {
        let counter = |outcome: &str| {
            let labels = PrefixLabels { endpoint: self.name.clone(), outcome: outcome.to_string() };
            self.metrics.prefix_routed.get_or_create(&labels).clone()
        };
        let counters = Affine::SLOTS.map(counter);
        let mut g = self.lock();
        g.affinity = Some(Affinity::new(settings));
        g.affine_counts = Some(counters);
    }

    /// Requests routed by prefix so far: hits, misses, over the bound, and
    /// without a prefix ([`Affine::SLOTS`]' order); `None` without prefix
    /// routing.
    pub fn prefix_counts(&self) -> Option<[u64; 4]> {
        self.lock().affine_counts.as_ref().map(|c| [c[0].get(), c[1].get(), c[2].get(), c[3].get()])
    }

    pub fn remove(&self, address: SocketAddr) -> Result<Replica, RegistryError> {
        let mut g = self.lock();
        let r = g.pool.remove(address)?;
        g.shared.retain(|(id, _)| *id != r.id);
        if let Some(a) = g.affinity.as_mut() {
            a.forget(r.id);
        }
        if let Some(n) = g.drains.remove(&r.id) {
            n.notify_waiters();
        }
        Ok(r)
    }

    /// Records a health-check result; a replica that became ready takes
    /// waiting requests at once.
    pub fn health_result(&self, id: ReplicaId, ok: bool) -> Option<Transition> {
        let mut g = self.lock();
        let t = g.pool.health_result(id, ok);
        if matches!(t, Some(Transition { to: ReplicaState::Ready, .. })) {
            self.dispatch(&mut g);
        }
        t
    }

    /// Records whether a health check got any answer from the replica:
    /// `unhealthy_after` checks in a row without one make it lost, and
    /// the requests waiting for its answer go elsewhere ([`crate::reach`]).
    pub fn reach_result(&self, id: ReplicaId, answered: bool) {
        let g = self.lock();
        let after = g.pool.thresholds().unhealthy_after;
        let Some(s) = g.shared(id).cloned() else { return };
        drop(g);
        if answered {
            s.reach.answered();
        } else if s.reach.missed(after) {
            tracing::warn!(
                endpoint = %self.name,
                replica = %s.address,
                "replica lost: {after} health checks in a row got no answer; requests waiting for its answer go to other replicas"
            );
        }
    }

    /// The replica said it is draining (the launcher's 503 with
    /// `x-onepool-draining: 1`): no new requests go to it from now on.
    pub fn backend_draining(&self, id: ReplicaId) {
        let mut g = self.lock();
        if let Some(t) = g.pool.begin_drain(id, Instant::now()) {
            tracing::info!(endpoint = %self.name, replica = id, from = ?t.from, "replica reports draining; out of rotation");
        }
        if let Some(a) = g.affinity.as_mut() {
            a.forget(id);
        }
    }

    /// Health checks run for this endpoint: from now on a replica whose
    /// request fails at the connection leaves rotation until its next
    /// check passes (see `Pool::eject`).
    pub fn eject_on_failure(&self) {
        self.ejects.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A request to the replica failed at the connection.
    pub fn exchange_failed(&self, id: ReplicaId) {
        if !self.ejects.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let ejected = self.lock().pool.eject(id);
        if ejected.is_some() {
            tracing::info!(endpoint = %self.name, replica = id, "replica failed a request at the connection; out of rotation until a health check passes");
            // One stored permit however many failures: one round follows.
            self.probe_now.notify_one();
        }
    }

    /// Resolves when a health-check round is wanted before the next tick.
    pub async fn probe_requested(&self) {
        self.probe_now.notified().await
    }

    /// Resolves once a request has queued while no replica was ready (a
    /// notice given before the call counts: one is kept).
    pub async fn cold_request(&self) {
        self.cold.notified().await
    }

    /// Closes the replicas' keep-alive connections unused for `max_idle`.
    pub fn prune_idle(&self, max_idle: Duration) {
        let shared: Vec<_> = self.lock().shared.iter().map(|(_, s)| s.clone()).collect();
        for s in shared {
            s.conns.prune(max_idle);
            s.own_conns.prune(max_idle);
        }
    }

    /// Replicas to health-check (every one not draining), each with its
    /// connections.
    pub fn health_targets(&self) -> Vec<(ReplicaId, SocketAddr, Arc<IdleConns>)> {
        let g = self.lock();
        g.pool
            .replicas()
            .iter()
            .filter(|r| r.state != ReplicaState::Draining)
            .filter_map(|r| Some((r.id, r.address, g.shared(r.id)?.own_conns.clone())))
            .collect()
    }

    /// The ready replicas with their connections, for the router's own
    /// calls to them ([`crate::replica_client`]).
    pub fn ready_conns(&self) -> Vec<(SocketAddr, Arc<IdleConns>)> {
        let g = self.lock();
        g.pool
            .replicas()
            .iter()
            .filter(|r| r.state == ReplicaState::Ready)
            .filter_map(|r| Some((r.address, g.shared(r.id)?.own_conns.clone())))
            .collect()
    }

    /// The connections of the replica at `address` (onepoold's scrapes of
    /// its metrics take them, so they are pinned like its requests).
    pub fn conns_of(&self, address: SocketAddr) -> Option<Arc<IdleConns>> {
        let g = self.lock();
        let id = g.pool.replicas().iter().find(|r| r.address == address)?.id;
        Some(g.shared(id)?.own_conns.clone())
    }

    /// The replica for a request: by prefix when the endpoint routes so,
    /// counted by how it was routed; else on the request's side of the
    /// lent replicas first (`lower`: of a class below the endpoint's own).
    /// Prefix routing keeps its own choice: the replica holding a prompt's
    /// prefix saves more than the side it is on.
    /// `held`: a ceiling holds the request back ([`crate::headroom`]):
    /// a lent replica only.
    pub(super) fn choose(
        g: &mut Inner,
        exclude: &[ReplicaId],
        prefix: &[u64],
        lower: bool,
        held: bool,
    ) -> Option<ReplicaId> {
        let Inner { pool, affinity, affine_counts, .. } = g;
        if held {
            return pool.choose_lent(exclude);
        }
        let Some(affinity) = affinity.as_mut() else { return pool.choose_as(exclude, lower) };
        let (id, how) = pool.choose_for(exclude, prefix, affinity)?;
        if let Some(c) = affine_counts {
            c[how.slot()].inc();
        }
        Some(id)
    }

    /// The shared part of a replica in the pool (made with the replica in
    /// `add`; made here too should that ever have been missed).
    pub(super) fn shared_of(&self, g: &mut Inner, id: ReplicaId) -> Arc<ReplicaShared> {
        if let Some(s) = g.shared(id) {
            return s.clone();
        }
        let address = g.pool.get(id).map(|r| r.address).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        // Its transport went with what was missed: nothing is sent to it
        // rather than risk the replica key in clear.
        let s = Arc::new(self.new_shared(address, Transport::Refused));
        g.shared.push((id, s.clone()));
        s
    }

    fn new_shared(&self, address: SocketAddr, transport: Transport) -> ReplicaShared {
        ReplicaShared {
            address,
            metrics: self.metrics.replica(&self.name, &address.to_string()),
            conns: Arc::new(IdleConns::new(transport.clone())),
            own_conns: Arc::new(IdleConns::new(transport)),
            reach: crate::reach::Reach::default(),
        }
    }

    /// Stops new requests to the replica at once, then waits until its
    /// in-flight requests are done or `deadline` passes.
    pub async fn drain(&self, address: SocketAddr, deadline: Duration) -> Result<DrainOutcome, RegistryError> {
        let started = Instant::now();
        let notify = {
            let mut g = self.lock();
            let id = g.pool.find(address)?.id;
            g.pool.begin_drain(id, started);
            // What it holds is no reason to send anything its way now.
            if let Some(a) = g.affinity.as_mut() {
                a.forget(id);
            }
            g.drains.entry(id).or_insert_with(|| Arc::new(Notify::new())).clone()
        };
        let labels = replica_labels(&self.name, &address.to_string());
        let outcome = loop {
            // Register interest before looking, so a release between the
            // look and the wait is not missed.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let in_flight = {
                let g = self.lock();
                match g.pool.find(address) {
                    Ok(r) => r.in_flight,
                    Err(_) => break DrainOutcome::Removed { in_flight: 0 },
                }
            };
            if in_flight == 0 {
                break DrainOutcome::Drained { millis: started.elapsed().as_millis() as u64 };
            }
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                let g = self.lock();
                let in_flight = g.pool.find(address).map(|r| r.in_flight).unwrap_or(0);
                if in_flight == 0 {
                    break DrainOutcome::Drained { millis: started.elapsed().as_millis() as u64 };
                }
                break DrainOutcome::TimedOut { in_flight };
            }
        };
        let name = match &outcome {
            DrainOutcome::Drained { .. } => "drained",
            DrainOutcome::TimedOut { .. } => "timed_out",
            DrainOutcome::Removed { .. } => "removed",
        };
        self.metrics
            .drains
            .get_or_create(&crate::metrics::DrainLabels {
                endpoint: labels.endpoint.clone(),
                replica: labels.replica.clone(),
                outcome: name.to_string(),
            })
            .inc();
        self.metrics.drain_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        Ok(outcome)
    }
}
