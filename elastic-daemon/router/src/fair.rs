//! Fair turns between the API keys of one request class (issue #44): a
//! key that floods its class's queue does not keep another key of the
//! same class waiting behind all of it. Start-time fair queueing: each
//! waiting request gets a tag, one past the later of its class's clock
//! (the tag last served) and its key's last tag; the queue serves a class
//! by tag, so keys take turns, and a key that was idle gets no credit for
//! it. Requests without a key all share one, first come first served.

use std::collections::HashMap;

use crate::classes::Rank;

#[derive(Default)]
pub struct FairTags {
    /// Each (class, key) with requests waiting: its last tag, and how many.
    keys: HashMap<(Rank, u32), (u64, u32)>,
    /// Each class's clock: the tag last served.
    clock: HashMap<Rank, u64>,
}

impl FairTags {
    /// The tag of a request of `key` joining `rank`'s queue.
    pub fn join(&mut self, rank: Rank, key: u32) -> u64 {
        let now = self.clock.get(&rank).copied().unwrap_or(0);
        let (last, waiting) = self.keys.entry((rank, key)).or_insert((0, 0));
        *last = (*last).max(now) + 1;
        *waiting += 1;
        *last
    }

    /// A request of `key` left `rank`'s queue: served (its `tag` moves the
    /// class's clock on) or not (timed out, its client gone).
    pub fn leave(&mut self, rank: Rank, key: u32, tag: u64, served: bool) {
        if served {
            let clock = self.clock.entry(rank).or_insert(0);
            *clock = (*clock).max(tag);
        }
        if let Some((_, waiting)) = self.keys.get_mut(&(rank, key)) {
            *waiting -= 1;
            if *waiting == 0 {
                self.keys.remove(&(rank, key));
            }
        }
    }

    /// (class, key) pairs with requests waiting (bounded by the queue).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_a_class_take_turns_and_an_idle_key_earns_no_credit() {
        let mut f = FairTags::default();
        let r = Rank(3);
        // Key 1 queues three, then key 2 two: their tags interleave.
        let a: Vec<u64> = (0..3).map(|_| f.join(r, 1)).collect();
        let b: Vec<u64> = (0..2).map(|_| f.join(r, 2)).collect();
        assert_eq!((a, b.clone()), (vec![1, 2, 3], vec![1, 2]));
        // Serving moves the clock: a key joining later starts from there.
        f.leave(r, 1, 1, true);
        f.leave(r, 2, 1, true);
        f.leave(r, 1, 2, true);
        assert_eq!(f.join(r, 7), 3);
        // Another class has a clock of its own.
        assert_eq!(f.join(Rank(2), 1), 1);
        // Every waiter gone: nothing is kept of its keys.
        f.leave(r, 2, 2, true);
        f.leave(r, 1, 3, false);
        f.leave(r, 7, 3, true);
        f.leave(Rank(2), 1, 1, false);
        assert_eq!(f.tracked(), 0);
        // Key 1, idle since, starts at the clock, not at its old tag.
        assert_eq!(f.join(r, 1), 4);
    }
}
