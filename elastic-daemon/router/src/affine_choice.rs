//! The pool's pick for a request with a prompt: prefix affinity
//! ([`crate::prefix`]) over the replicas of [`crate::registry`], which
//! know nothing of prompts. Here, above both, so that neither imports the
//! other.

use crate::prefix::{within_bound, Affine, Affinity};
use crate::registry::{Pool, Replica, ReplicaId, ReplicaState};

impl Pool {
    /// [`Pool::choose`] for a request whose prompt is `key`: the replica
    /// that took the longest prefix of it last, if it has room and stays
    /// within the load bound, else the least outstanding. Headroom
    /// replicas hold prefixes too, but take them under the same rule as
    /// any request: only when no other replica has room. Records the pick
    /// as the prompt's holder.
    pub fn choose_for(
        &mut self,
        exclude: &[ReplicaId],
        key: &[u64],
        affinity: &mut Affinity,
    ) -> Option<(ReplicaId, Affine)> {
        if key.is_empty() {
            return self.choose(exclude).map(|id| (id, Affine::NoKey));
        }
        let others_have_room = |spill: bool| !spill || !self.replicas().iter().any(|r| !r.spill && r.has_room());
        let may_take = |id: ReplicaId| {
            self.get(id).is_some_and(|r| r.has_room() && !exclude.contains(&id) && others_have_room(r.spill))
        };
        let held = affinity.lookup(key, may_take);
        let serving = || self.replicas().iter().filter(|r| r.state == ReplicaState::Ready && !r.spill);
        let ready = serving().count().max(1);
        let least = serving().map(|r| r.in_flight).min().unwrap_or(0);
        let total = self.total_in_flight();
        let bound = affinity.settings().load_bound;
        let fits = |r: &Replica| within_bound(r.in_flight, total, least, ready, bound);
        let (id, how) = match held {
            Some((id, blocks)) if self.get(id).is_some_and(fits) => {
                let i = self.replicas().iter().position(|r| r.id == id)?;
                (self.take_at(i), Affine::Hit { blocks })
            }
            Some(_) => (self.choose(exclude)?, Affine::OverBound),
            None => (self.choose(exclude)?, Affine::Miss),
        };
        affinity.record(key, id);
        Some((id, how))
    }
}
