//! The replicas of one endpoint and the pure decisions about them: which
//! replica takes the next request (least outstanding requests among ready
//! replicas with room), when health checks move a replica in or out, and
//! what draining means for its counters. No I/O and no waiting here, so
//! every rule is unit-tested; `endpoint.rs` adds the queue and the waiting.

use std::net::SocketAddr;
use std::time::Instant;

pub type ReplicaId = u64;

/// The state names are the control API's, so status and the router agree.
pub use onepool_control::api::ReplicaState;

/// Consecutive results needed before a replica changes state (pingora
/// style), so one lost probe neither adds nor drops a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthThresholds {
    pub healthy_after: u32,
    pub unhealthy_after: u32,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        HealthThresholds { healthy_after: 2, unhealthy_after: 3 }
    }
}

#[derive(Clone, Debug)]
pub struct Replica {
    pub id: ReplicaId,
    pub address: SocketAddr,
    pub state: ReplicaState,
    pub in_flight: u32,
    /// Most requests this replica serves at once.
    pub limit: u32,
    /// Requests handed to this replica since it was added.
    pub served: u64,
    pub peak_in_flight: u32,
    /// Headroom (a warm replica): takes requests only when every other
    /// ready replica is at its limit, so that it stays idle, and quick to
    /// give back, until a burst needs it.
    pub spill: bool,
    /// Lent to the classes below the endpoint's own (issue #44: a replica
    /// onepoold submitted in such a class for their demand): their requests
    /// go there first, the endpoint's own class only when no other replica
    /// has room, so that reclaiming it moves little live traffic.
    pub lent: bool,
    passes: u32,
    failures: u32,
    /// Out because a request to it failed (not its health checks): one
    /// passing check brings it back.
    ejected: bool,
    pub drain_started: Option<Instant>,
}

impl Replica {
    /// As the control API shows it.
    pub fn view(&self) -> onepool_control::api::Replica {
        onepool_control::api::Replica {
            id: self.id,
            address: self.address,
            state: self.state,
            in_flight: self.in_flight,
            limit: self.limit,
            served: self.served,
            peak_in_flight: self.peak_in_flight,
            spill: self.spill,
            lent: self.lent,
        }
    }

    pub(crate) fn has_room(&self) -> bool {
        self.state == ReplicaState::Ready && self.in_flight < self.limit
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("replica {address} is already in endpoint {endpoint:?}; remove it first to change its settings")]
    Duplicate { endpoint: String, address: SocketAddr },
    #[error("replica {address} is not in endpoint {endpoint:?}; `GET /v1/state` lists the replicas")]
    UnknownReplica { endpoint: String, address: SocketAddr },
    #[error("replica {address}: a concurrency limit of 0 would never serve a request; use 1 or more")]
    ZeroLimit { address: SocketAddr },
}

/// What a state change did, for logging and for waking waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: ReplicaState,
    pub to: ReplicaState,
}

#[derive(Debug)]
pub struct Pool {
    endpoint: String,
    replicas: Vec<Replica>,
    next_id: ReplicaId,
    thresholds: HealthThresholds,
    /// Requests handed to any replica since the pool was made; unlike the
    /// replicas' own counts it does not drop when one leaves, so a rate
    /// taken from it stays true across scale-down.
    served_total: u64,
}

impl Pool {
    pub fn new(endpoint: &str, thresholds: HealthThresholds) -> Pool {
        Pool { endpoint: endpoint.to_string(), replicas: Vec::new(), next_id: 1, thresholds, served_total: 0 }
    }

    pub fn thresholds(&self) -> HealthThresholds {
        self.thresholds
    }

    pub fn served_total(&self) -> u64 {
        self.served_total
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    pub fn get(&self, id: ReplicaId) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.id == id)
    }

    fn get_mut(&mut self, id: ReplicaId) -> Option<&mut Replica> {
        self.replicas.iter_mut().find(|r| r.id == id)
    }

    pub fn find(&self, address: SocketAddr) -> Result<&Replica, RegistryError> {
        self.replicas
            .iter()
            .find(|r| r.address == address)
            .ok_or_else(|| RegistryError::UnknownReplica { endpoint: self.endpoint.clone(), address })
    }

    /// Adds a replica. `ready` skips the health checks (for endpoints that
    /// have none, or a replica the caller has already checked).
    pub fn add(&mut self, address: SocketAddr, limit: u32, ready: bool) -> Result<ReplicaId, RegistryError> {
        if limit == 0 {
            return Err(RegistryError::ZeroLimit { address });
        }
        if self.replicas.iter().any(|r| r.address == address) {
            return Err(RegistryError::Duplicate { endpoint: self.endpoint.clone(), address });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.replicas.push(Replica {
            id,
            address,
            state: if ready { ReplicaState::Ready } else { ReplicaState::Starting },
            in_flight: 0,
            limit,
            served: 0,
            peak_in_flight: 0,
            spill: false,
            lent: false,
            passes: 0,
            failures: 0,
            ejected: false,
            drain_started: None,
        });
        Ok(id)
    }

    pub fn remove(&mut self, address: SocketAddr) -> Result<Replica, RegistryError> {
        let i = self
            .replicas
            .iter()
            .position(|r| r.address == address)
            .ok_or_else(|| RegistryError::UnknownReplica { endpoint: self.endpoint.clone(), address })?;
        Ok(self.replicas.remove(i))
    }

    fn at_mut(&mut self, address: SocketAddr) -> Result<&mut Replica, RegistryError> {
        let endpoint = self.endpoint.clone();
        self.replicas
            .iter_mut()
            .find(|r| r.address == address)
            .ok_or(RegistryError::UnknownReplica { endpoint, address })
    }

    /// Marks a replica as headroom ([`Replica::spill`]) or not.
    pub fn set_spill(&mut self, address: SocketAddr, spill: bool) -> Result<(), RegistryError> {
        self.at_mut(address)?.spill = spill;
        Ok(())
    }

    /// Marks a replica as lent to lower classes ([`Replica::lent`]) or not.
    pub fn set_lent(&mut self, address: SocketAddr, lent: bool) -> Result<(), RegistryError> {
        self.at_mut(address)?.lent = lent;
        Ok(())
    }

    /// Picks the ready replica with room and the fewest requests in flight,
    /// skipping `exclude` (replicas a retried request already failed on),
    /// and counts the request on it; headroom replicas only when no other
    /// has room. Ties go to the replica that has served fewer requests, so
    /// equal replicas share the load evenly.
    pub fn choose(&mut self, exclude: &[ReplicaId]) -> Option<ReplicaId> {
        self.choose_as(exclude, false)
    }

    /// [`Pool::choose`] for a request of a class below the endpoint's own
    /// (`lower`) or not: each side takes its own replicas ([`Replica::lent`]
    /// or not) before the other's.
    pub fn choose_as(&mut self, exclude: &[ReplicaId], lower: bool) -> Option<ReplicaId> {
        self.choose_among(exclude, lower, false)
    }

    /// [`Pool::choose_as`] a lower class's request among the replicas lent
    /// to the lower classes only.
    pub fn choose_lent(&mut self, exclude: &[ReplicaId]) -> Option<ReplicaId> {
        self.choose_among(exclude, true, true)
    }

    fn choose_among(&mut self, exclude: &[ReplicaId], lower: bool, lent_only: bool) -> Option<ReplicaId> {
        let (i, _) = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.has_room() && !exclude.contains(&r.id) && (r.lent || !lent_only))
            .min_by_key(|(_, r)| (r.spill, r.lent != lower, r.in_flight, r.served))?;
        Some(self.take_at(i))
    }

    /// Counts a request on the `i`th replica, which has room.
    pub(crate) fn take_at(&mut self, i: usize) -> ReplicaId {
        let r = &mut self.replicas[i];
        r.in_flight += 1;
        r.served += 1;
        r.peak_in_flight = r.peak_in_flight.max(r.in_flight);
        self.served_total += 1;
        r.id
    }

    /// A request on `id` finished. Returns true when that made a draining
    /// replica drained. A replica removed meanwhile is ignored.
    pub fn release(&mut self, id: ReplicaId) -> bool {
        match self.get_mut(id) {
            Some(r) => {
                r.in_flight = r.in_flight.saturating_sub(1);
                r.in_flight == 0 && r.state == ReplicaState::Draining
            }
            None => false,
        }
    }

    /// Stops new requests to the replica at once. Draining is final: only
    /// removing and adding the replica again brings it back.
    pub fn begin_drain(&mut self, id: ReplicaId, now: Instant) -> Option<Transition> {
        let r = self.get_mut(id)?;
        if r.state == ReplicaState::Draining {
            return None;
        }
        let from = r.state;
        r.state = ReplicaState::Draining;
        r.drain_started = Some(now);
        Some(Transition { from, to: ReplicaState::Draining })
    }

    /// Records one health-check result and moves the replica in or out when
    /// enough consecutive results agree. Draining replicas keep their state.
    pub fn health_result(&mut self, id: ReplicaId, ok: bool) -> Option<Transition> {
        let t = self.thresholds;
        let r = self.get_mut(id)?;
        if ok {
            r.passes = r.passes.saturating_add(1);
            r.failures = 0;
        } else {
            r.failures = r.failures.saturating_add(1);
            r.passes = 0;
        }
        let from = r.state;
        let readmit_after = if r.ejected { 1 } else { t.healthy_after };
        let to = match from {
            ReplicaState::Starting if r.passes >= t.healthy_after => ReplicaState::Ready,
            ReplicaState::Out if r.passes >= readmit_after => ReplicaState::Ready,
            ReplicaState::Ready if r.failures >= t.unhealthy_after => ReplicaState::Out,
            other => other,
        };
        if to == from {
            return None;
        }
        r.state = to;
        r.ejected = false;
        Some(Transition { from, to })
    }

    /// A request to a ready replica failed at the connection (refused,
    /// reset, closed before answering): it leaves rotation at once rather
    /// than after `unhealthy_after` health checks, because until then every
    /// request sent to a replica whose node just died fails too. Its next
    /// passing health check brings it back, so a replica that only lost
    /// one connection is out for one probe. Starting, draining and already
    /// out replicas keep their state.
    pub fn eject(&mut self, id: ReplicaId) -> Option<Transition> {
        let r = self.get_mut(id)?;
        if r.state != ReplicaState::Ready {
            return None;
        }
        r.state = ReplicaState::Out;
        r.ejected = true;
        r.passes = 0;
        Some(Transition { from: ReplicaState::Ready, to: ReplicaState::Out })
    }

    pub fn total_in_flight(&self) -> u32 {
        self.replicas.iter().map(|r| r.in_flight).sum()
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
