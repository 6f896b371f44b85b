//! Requests held back by a ceiling ([`crate::headroom`]): whether one
//! must leave the endpoint's own replicas to the classes above, what the
//! ceilings count, and the timer that serves those held once the classes
//! above are quiet.

use std::sync::Arc;
use std::time::Instant;

use crate::classes::Rank;
use crate::endpoint::{Endpoint, Inner};
use crate::headroom::{Headroom, Load};
use crate::registry::ReplicaState;

impl Endpoint {
    pub(super) fn headroom(&self) -> Option<&Headroom> {
        self.classes.get().and_then(|c| c.headroom())
    }

    /// Whether a request of `rank` must take a lent replica or wait.
    /// `slots`: the own replicas' slots, counted at the first call that
    /// needs them (a dispatch asks once per waiter; they do not change
    /// within it).
    pub(super) fn holds(&self, g: &Inner, rank: Rank, now: Instant, slots: &mut Option<u32>) -> bool {
        let Some(h) = self.headroom() else { return false };
        if h.ceilings().first().is_none_or(|(c, _)| *c > rank) {
            return false;
        }
        let slots = *slots.get_or_insert_with(|| {
            g.pool.replicas().iter().filter(|r| !r.lent && r.state == ReplicaState::Ready).map(|r| r.limit).sum()
        });
        h.holds(rank, &Load { slots, own: &g.own_by_rank, in_flight: &g.in_flight_by_rank, seen: &g.seen }, now)
    }

    /// A request of `rank` arrived or ended: remembered where a ceiling
    /// looks at its rank.
    pub(super) fn seen(&self, g: &mut Inner, rank: Rank, now: Instant) {
        if self.headroom().is_some_and(|h| h.watches(rank)) {
            g.seen.insert(rank, now);
        }
    }

    /// Whether a lease on replica `on` counts against the ceilings, and
    /// counts it.
    pub(super) fn count_own(&self, g: &mut Inner, on: crate::registry::ReplicaId, rank: Rank) -> bool {
        let own = self.headroom().is_some() && g.pool.get(on).is_some_and(|r| !r.lent);
        if own {
            *g.own_by_rank.entry(rank).or_default() += 1;
        }
        own
    }

    /// A slot counted by [`Endpoint::count_own`] went back (`own`).
    pub(super) fn uncount_own(&self, g: &mut Inner, own: bool, rank: Rank) {
        if let Some(n) = g.own_by_rank.get_mut(&rank).filter(|_| own) {
            *n = n.saturating_sub(1);
        }
    }

    /// While a waiter is held back and the classes above are not yet
    /// quiet, a timer dispatches when they are: nothing else may happen
    /// then (no request ends, none arrives).
    pub(super) fn keep_quiet_timer(self: &Arc<Self>, g: &mut Inner) {
        if !g.held || g.quiet_timer {
            return;
        }
        let Some(at) = self.headroom().and_then(|h| h.quiet_ends(&g.seen, Instant::now())) else { return };
        // Leases end in Drop, which may run outside a runtime (a test's
        // last drop): the next request or release dispatches then.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        g.quiet_timer = true;
        let endpoint = Arc::downgrade(self);
        rt.spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at.into()).await;
                let Some(e) = endpoint.upgrade() else { return };
                let mut g = e.lock();
                e.dispatch(&mut g);
                let next = match g.held {
                    true => e.headroom().and_then(|h| h.quiet_ends(&g.seen, Instant::now())),
                    false => None,
                };
                match next {
                    Some(t) => at = t,
                    None => {
                        g.quiet_timer = false;
                        return;
                    }
                }
            }
        });
    }
}
