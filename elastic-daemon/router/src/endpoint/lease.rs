//! One request's claim on a replica, from the slot it got to its
//! release.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::classes::Rank;
use crate::endpoint::shared::ReplicaShared;
use crate::endpoint::{Endpoint, Inner};
use crate::registry::ReplicaId;

/// One request's claim on a replica; dropping it ends the request there.
pub struct Lease {
    endpoint: Arc<Endpoint>,
    id: ReplicaId,
    shared: Arc<ReplicaShared>,
    /// How long the request waited in the queue for this replica, in
    /// microseconds (saturating at 71 minutes, far past any queue
    /// timeout): a u32 fits beside the rank in 8 bytes, and every response
    /// body holds a lease.
    pub(super) queued_us: u32,
    /// Its request's class rank (counted in the class's in-flight).
    rank: Rank,
}

impl Lease {
    pub fn id(&self) -> ReplicaId {
        self.id
    }
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }
    /// The replica's metric handles and idle connections.
    pub fn replica(&self) -> &Arc<ReplicaShared> {
        &self.shared
    }
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }
    /// How long the request waited in the endpoint's queue for it.
    pub fn queued(&self) -> Duration {
        Duration::from_micros(u64::from(self.queued_us))
    }
    /// The answer's first body byte came `ttfb` after the request did:
    /// a latency sample for the endpoint's targets, when they are on.
    pub fn first_byte(&self, ttfb: Duration) {
        self.endpoint.record_first_byte(ttfb, self.queued());
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.endpoint.release_lease(self.id, &self.shared, self.rank);
    }
}

impl Endpoint {
    /// The lease of a replica `choose` just picked.
    pub(super) fn lease_chosen(self: &Arc<Self>, g: &mut Inner, id: ReplicaId, rank: Rank) -> Lease {
        let shared = self.shared_of(g, id);
        self.lease(g, id, shared, rank)
    }

    pub(super) fn lease(
        self: &Arc<Self>,
        g: &mut Inner,
        id: ReplicaId,
        shared: Arc<ReplicaShared>,
        rank: Rank,
    ) -> Lease {
        if let Some(r) = g.pool.get(id) {
            shared.metrics.in_flight.set(r.in_flight as i64);
        }
        *g.in_flight_by_rank.entry(rank).or_default() += 1;
        Lease { endpoint: self.clone(), id, shared, queued_us: 0, rank }
    }

    /// A lease ended: its slot and its class's count go back.
    fn release_lease(&self, id: ReplicaId, shared: &ReplicaShared, rank: Rank) {
        let mut g = self.lock();
        // Kept at zero: a rank's entry comes and goes with every request
        // otherwise (an allocation each time), and ranks are few.
        if let Some(n) = g.in_flight_by_rank.get_mut(&rank) {
            *n = n.saturating_sub(1);
        }
        self.release_locked(&mut g, id, shared);
    }

    pub(super) fn release_locked(&self, g: &mut Inner, id: ReplicaId, shared: &ReplicaShared) {
        let drained = g.pool.release(id);
        if let Some(r) = g.pool.get(id) {
            shared.metrics.in_flight.set(r.in_flight as i64);
        }
        if drained {
            if let Some(n) = g.drains.get(&id) {
                n.notify_waiters();
            }
        }
        self.dispatch(g);
    }
}
