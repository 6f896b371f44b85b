//! Headroom for the classes above (issue #51): while a class above has
//! requests, a class with a ceiling, together with the classes below it,
//! holds at most its ceiling's share of the endpoint's own replicas'
//! slots. The rest stay for the classes above, whose requests then find a
//! slot at once rather than wait for an answer to yield, which an answer
//! with tools, a schema or several choices cannot do (the Gateway API
//! Inference Extension's and llm-d's per-band ceilings).
//!
//! A ceiling on what the classes below hold, not on how full the replicas
//! are: an agents' answer holds its slot for seconds, so a class below
//! that took whatever is free whenever live traffic dips would hold it
//! through the next burst.
//!
//! "Has requests" is remembered for `quiet` after a class's last request
//! arrived or ended: live traffic comes in bursts with gaps between, and a
//! gap must not hand every slot to the class below just before the next
//! burst. Replicas lent to the lower classes (onepoold's replicas for their
//! demand) are theirs: the ceiling counts the endpoint's own only.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::rank::Rank;

/// An endpoint's ceilings, from its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Headroom {
    /// (class rank, share of the own replicas' slots it and the classes
    /// below it may hold), by rank.
    ceilings: Vec<(Rank, f64)>,
    quiet: Duration,
}

/// What the endpoint holds now, as the ceilings read it.
pub struct Load<'a> {
    /// Slots of its own (not lent) ready replicas.
    pub slots: u32,
    /// Requests on its own replicas, by rank.
    pub own: &'a BTreeMap<Rank, u32>,
    /// Requests on any replica, by rank.
    pub in_flight: &'a BTreeMap<Rank, u32>,
    /// When each rank last had a request arrive or end.
    pub seen: &'a BTreeMap<Rank, Instant>,
}

impl Headroom {
    /// `ceilings`: each class's rank and share (0 to 1; 1 holds nothing
    /// back); `quiet`: how long a class counts as having requests after
    /// its last one.
    pub fn new(ceilings: impl IntoIterator<Item = (Rank, f64)>, quiet: Duration) -> Headroom {
        let mut ceilings: Vec<(Rank, f64)> = ceilings.into_iter().filter(|(_, s)| *s < 1.0).collect();
        ceilings.sort_by_key(|(r, _)| *r);
        Headroom { ceilings, quiet }
    }

    pub fn quiet(&self) -> Duration {
        self.quiet
    }

    /// Each ceiling: its rank and share.
    pub fn ceilings(&self) -> &[(Rank, f64)] {
        &self.ceilings
    }

    /// Whether a new request of `rank` must leave the endpoint's own
    /// replicas to the classes above: a ceiling at or above its rank is
    /// reached while a class above that ceiling has requests.
    pub fn holds(&self, rank: Rank, load: &Load<'_>, now: Instant) -> bool {
        self.ceilings.iter().take_while(|(c, _)| *c <= rank).any(|(c, share)| {
            let cap = (share * f64::from(load.slots)).floor() as u32;
            let held: u32 = load.own.range(*c..).map(|(_, n)| *n).sum();
            held >= cap && self.busy_above(*c, load, now)
        })
    }

    /// Whether a class ranked above `rank` has a request in flight, or had
    /// one within `quiet`.
    fn busy_above(&self, rank: Rank, load: &Load<'_>, now: Instant) -> bool {
        load.in_flight.range(..rank).any(|(_, n)| *n > 0)
            || load.seen.range(..rank).any(|(_, t)| now.saturating_duration_since(*t) < self.quiet)
    }

    /// When the classes' quiet ends, if it has not yet: what holds a
    /// request back for want of a request in flight above lifts then.
    pub fn quiet_ends(&self, seen: &BTreeMap<Rank, Instant>, now: Instant) -> Option<Instant> {
        let last = seen.values().max()?;
        Some(*last + self.quiet).filter(|t| *t > now)
    }

    /// Whether a request of `rank` arriving or ending is remembered: only
    /// the ranks a ceiling looks above are.
    pub fn watches(&self, rank: Rank) -> bool {
        self.ceilings.last().is_some_and(|(c, _)| rank < *c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: Rank = Rank(2);
    const AGENTS: Rank = Rank(3);
    const EVAL: Rank = Rank(4);

    fn map<T: Copy>(pairs: &[(Rank, T)]) -> BTreeMap<Rank, T> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_class_below_holds_its_share_only_while_a_class_above_has_requests() {
        let h = Headroom::new([(AGENTS, 0.5)], Duration::from_secs(10));
        let t0 = Instant::now();
        let own = map(&[(AGENTS, 2)]);
        let none = map(&[]);
        let quiet = Load { slots: 4, own: &own, in_flight: &own, seen: &none };
        assert!(!h.holds(AGENTS, &quiet, t0), "no class above: every slot");
        let live = map(&[(LIVE, 1), (AGENTS, 2)]);
        let busy = Load { slots: 4, own: &own, in_flight: &live, seen: &none };
        assert!(h.holds(AGENTS, &busy, t0), "2 of 4 held, live in flight");
        assert!(h.holds(EVAL, &busy, t0), "a class below shares the ceiling of the one above it");
        assert!(!h.holds(LIVE, &busy, t0), "the class above is never held");
        let one = map(&[(AGENTS, 1)]);
        let under = Load { slots: 4, own: &one, in_flight: &live, seen: &none };
        assert!(!h.holds(AGENTS, &under, t0), "1 of 4: under the ceiling");
        // Remembered for `quiet` after live's last request.
        let seen = map(&[(LIVE, t0)]);
        let after = Load { slots: 4, own: &own, in_flight: &own, seen: &seen };
        assert!(h.holds(AGENTS, &after, t0 + Duration::from_secs(9)));
        assert!(!h.holds(AGENTS, &after, t0 + Duration::from_secs(10)));
        assert_eq!(h.quiet_ends(&seen, t0 + Duration::from_secs(3)), Some(t0 + Duration::from_secs(10)));
        assert_eq!(h.quiet_ends(&seen, t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn a_share_rounds_down_and_nested_ceilings_each_hold() {
        let h = Headroom::new([(EVAL, 0.25), (AGENTS, 0.5), (LIVE, 1.0)], Duration::from_secs(1));
        assert_eq!(h.ceilings(), &[(AGENTS, 0.5), (EVAL, 0.25)], "1.0 holds nothing back");
        let t0 = Instant::now();
        let seen = map(&[(LIVE, t0)]);
        // 3 slots: agents and eval 1 together, eval 0 alone.
        let idle = map(&[]);
        let l = Load { slots: 3, own: &idle, in_flight: &idle, seen: &seen };
        assert!(!h.holds(AGENTS, &l, t0));
        assert!(h.holds(EVAL, &l, t0), "floor(0.75) = 0 slots for eval while live has requests");
        // Eval's own ceiling looks above eval: agents' requests hold it too.
        let agents_seen = map(&[(AGENTS, t0)]);
        let l = Load { slots: 8, own: &map(&[(EVAL, 2)]), in_flight: &map(&[]), seen: &agents_seen };
        assert!(h.holds(EVAL, &l, t0));
        assert!(!h.holds(AGENTS, &l, t0));
        assert!(h.watches(LIVE) && h.watches(AGENTS) && !h.watches(EVAL));
    }
}
