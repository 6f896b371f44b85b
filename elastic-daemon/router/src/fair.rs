//! Fair turns between the API keys of one request class (issue #44): a
//! key that floods its class's queue does not keep another key of the
//! same class waiting behind all of it. Start-time fair queueing: each
//! waiting request gets a tag, one past the later of its class's clock
//! (the tag last served) and its key's last tag; the queue serves a class
//! by tag, so keys take turns, and a key that was idle gets no credit for
//! it. Requests without a key all share one, first come first served.
//!
//! Turns alone do not keep a flooding key from filling its class's queue
//! (issue #51): the queue therefore bounds each key's share of it while
//! other keys wait ([`FairTags::share`]), and says how long a key's turn
//! takes to come ([`FairTags::expected_wait`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::classes::Rank;

/// How much of the last gap between two served requests of a class each
/// new one counts for in its average.
const GAP_WEIGHT: f64 = 0.2;

#[derive(Default)]
pub struct FairTags {
    /// Each (class, key) with requests waiting: its last tag, and how many.
    keys: HashMap<(Rank, u32), (u64, u32)>,
    /// Each class's clock: the tag last served.
    clock: HashMap<Rank, u64>,
    /// Keys with requests waiting, by class.
    keys_waiting: HashMap<Rank, usize>,
    /// When each class's queue last handed a request a slot, and the
    /// average gap between two such (seconds).
    served: HashMap<Rank, (Instant, Option<f64>)>,
}

impl FairTags {
    /// The tag of a request of `key` joining `rank`'s queue.
    pub fn join(&mut self, rank: Rank, key: u32) -> u64 {
        let now = self.clock.get(&rank).copied().unwrap_or(0);
        let (last, waiting) = self.keys.entry((rank, key)).or_insert((0, 0));
        if *waiting == 0 {
            *self.keys_waiting.entry(rank).or_default() += 1;
        }
        *last = (*last).max(now) + 1;
        *waiting += 1;
        *last
    }

    /// Requests of `key` waiting in `rank`'s queue.
    pub fn waiting(&self, rank: Rank, key: u32) -> u32 {
        self.keys.get(&(rank, key)).map_or(0, |(_, n)| *n)
    }

    /// How many of a class's queue places a key may hold while the class
    /// is full: an equal part of `size` among the keys waiting, this one
    /// counted (at least one place each).
    pub fn share(&self, rank: Rank, key: u32, size: usize) -> usize {
        let others = self.keys_waiting.get(&rank).copied().unwrap_or(0);
        let keys = others + usize::from(self.waiting(rank, key) == 0);
        (size / keys.max(1)).max(1)
    }

    /// A request of `rank`'s queue was handed a slot `at`.
    pub fn served(&mut self, rank: Rank, at: Instant) {
        let entry = self.served.entry(rank).or_insert((at, None));
        let gap = at.saturating_duration_since(entry.0).as_secs_f64();
        if gap > 0.0 || entry.1.is_some() {
            entry.1 = Some(match entry.1 {
                Some(avg) => avg + GAP_WEIGHT * (gap - avg),
                None => gap,
            });
        }
        entry.0 = at;
    }

    /// How long until a request of `key` joining `rank`'s queue now would
    /// be served: the key's requests waiting and this one, each after a
    /// turn of every key waiting, at the pace the class has been served.
    /// `None` before the class was served twice.
    pub fn expected_wait(&self, rank: Rank, key: u32) -> Option<Duration> {
        let gap = self.served.get(&rank)?.1?;
        let keys = self.keys_waiting.get(&rank).copied().unwrap_or(0).max(1) as f64;
        let ahead = f64::from(self.waiting(rank, key)) + 1.0;
        Some(Duration::from_secs_f64((ahead * keys * gap).min(86_400.0)))
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
                if let Some(n) = self.keys_waiting.get_mut(&rank) {
                    *n = n.saturating_sub(1);
                }
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

    #[test]
    fn a_key_s_share_of_a_full_class_is_an_equal_part_among_the_keys_waiting() {
        let mut f = FairTags::default();
        let r = Rank(3);
        // Alone, a key may hold the whole bound.
        assert_eq!(f.share(r, 1, 20), 20);
        for _ in 0..20 {
            f.join(r, 1);
        }
        assert_eq!(f.share(r, 1, 20), 20);
        // A second key counts itself in: 10 places each.
        assert_eq!(f.share(r, 2, 20), 10);
        f.join(r, 2);
        assert_eq!((f.share(r, 1, 20), f.share(r, 2, 20)), (10, 10));
        // One place at least, however many keys.
        for k in 3..40 {
            f.join(r, k);
        }
        assert_eq!(f.share(r, 99, 20), 1);
        // Another class is apart.
        assert_eq!(f.share(Rank(2), 1, 20), 20);
    }

    #[test]
    fn the_expected_wait_is_the_key_s_turns_at_the_class_s_pace() {
        let mut f = FairTags::default();
        let r = Rank(3);
        let t0 = Instant::now();
        assert_eq!(f.expected_wait(r, 1), None, "no pace before two serves");
        f.served(r, t0);
        assert_eq!(f.expected_wait(r, 1), None);
        f.served(r, t0 + Duration::from_millis(500));
        // Key 1 alone with 3 waiting: its 4th is 4 turns of 0.5 s away.
        for _ in 0..3 {
            f.join(r, 1);
        }
        assert_eq!(f.expected_wait(r, 1), Some(Duration::from_secs(2)));
        // Key 2 waiting too: every turn of key 1 waits for one of key 2's.
        f.join(r, 2);
        assert_eq!(f.expected_wait(r, 1), Some(Duration::from_secs(4)));
        // The pace follows the gaps, weighted to the recent ones.
        f.served(r, t0 + Duration::from_millis(1500));
        let gap = 0.5 + GAP_WEIGHT * (1.0 - 0.5);
        let want = Duration::from_secs_f64(4.0 * 2.0 * gap);
        assert!(f.expected_wait(r, 1).unwrap().abs_diff(want) < Duration::from_millis(1));
    }
}
