//! One request's claim on a replica, from the slot it got to its
//! release.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::classes::Rank;
use crate::endpoint::shared::ReplicaShared;
use crate::endpoint::waiting::Handed;
use crate::endpoint::{Endpoint, Inner};
use crate::registry::ReplicaId;

/// One request's claim on a replica; dropping it ends the request there.
pub struct Lease {
    endpoint: Arc<Endpoint>,
    id: ReplicaId,
    shared: Arc<ReplicaShared>,
    /// Its request's class rank (counted in the class's in-flight).
    rank: Rank,
    pub(super) queued: Queued,
}

/// How long a request waited in the queue for its replica, in
/// microseconds (31 bits: saturating at 35 minutes, far past any queue
/// timeout), and in the top bit whether its slot counts against the
/// ceilings (an own replica's, with ceilings set). One u32 beside the rank
/// in 8 bytes: every response body holds a lease.
#[derive(Clone, Copy)]
pub(super) struct Queued(u32);

impl Queued {
    const OWN: u32 = 1 << 31;

    fn new(own: bool) -> Queued {
        Queued(if own { Queued::OWN } else { 0 })
    }

    pub(super) fn set_wait(&mut self, waited: Duration) {
        let us = u32::try_from(waited.as_micros()).unwrap_or(u32::MAX).min(Queued::OWN - 1);
        self.0 = (self.0 & Queued::OWN) | us;
    }

    fn wait(self) -> Duration {
        Duration::from_micros(u64::from(self.0 & !Queued::OWN))
    }

    fn own(self) -> bool {
        self.0 & Queued::OWN != 0
    }
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
        self.queued.wait()
    }
    /// The answer's first body byte came `ttfb` after the request did:
    /// a latency sample for the endpoint's targets, when they are on.
    pub fn first_byte(&self, ttfb: Duration) {
        self.endpoint.record_first_byte(ttfb, self.queued());
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.endpoint.release_lease(self.id, &self.shared, self.rank, self.queued.own());
    }
}

impl Endpoint {
    /// The lease of a replica `choose` just picked.
    pub(super) fn lease_chosen(self: &Arc<Self>, g: &mut Inner, id: ReplicaId, rank: Rank) -> Lease {
        let shared = self.shared_of(g, id);
        let own = self.count_own(g, id, rank);
        self.lease(g, Handed { id, shared, rank, own })
    }

    pub(super) fn lease(self: &Arc<Self>, g: &mut Inner, handed: Handed) -> Lease {
        let Handed { id, shared, rank, own } = handed;
        if let Some(r) = g.pool.get(id) {
            shared.metrics.in_flight.set(r.in_flight as i64);
        }
        *g.in_flight_by_rank.entry(rank).or_default() += 1;
        Lease { endpoint: self.clone(), id, shared, rank, queued: Queued::new(own) }
    }

    /// A lease ended: its slot and its class's count go back.
    fn release_lease(self: &Arc<Self>, id: ReplicaId, shared: &ReplicaShared, rank: Rank, own: bool) {
        let mut g = self.lock();
        // Kept at zero: a rank's entry comes and goes with every request
        // otherwise (an allocation each time), and ranks are few.
        if let Some(n) = g.in_flight_by_rank.get_mut(&rank) {
            *n = n.saturating_sub(1);
        }
        self.uncount_own(&mut g, own, rank);
        if self.headroom().is_some() {
            self.seen(&mut g, rank, std::time::Instant::now());
        }
        self.release_locked(&mut g, id, shared);
        self.keep_quiet_timer(&mut g);
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
