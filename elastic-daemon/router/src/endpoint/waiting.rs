//! What waits in the endpoint's queue (a request, at its class's place)
//! and what may give its slot up (a lower class's stream), as the
//! endpoint's state holds them.

use std::sync::Arc;

use tokio::sync::{oneshot, Notify};

use crate::classes::Rank;
use crate::endpoint::shared::ReplicaShared;
use crate::registry::ReplicaId;

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) exclude: Vec<ReplicaId>,
    /// Its prompt's prefix, when the endpoint routes by prefix.
    pub(super) prefix: crate::prefix::PrefixKey,
    pub(super) tx: oneshot::Sender<Handed>,
    pub(super) rank: Rank,
    /// Of a class below the endpoint's own: lent replicas first.
    pub(super) lower: bool,
    /// An answer that moved here from another replica (served first within
    /// its rank).
    pub(super) ahead: bool,
    /// Its API key, and its turn among its class's keys (0 for a moved
    /// answer: those go first).
    pub(super) key: u32,
    pub(super) tag: u64,
}

impl Waiter {
    /// Its place: by rank, moved answers first within a rank, then by its
    /// key's turn, then by arrival (the queue keeps this order).
    pub(super) fn place(&self) -> (Rank, bool, u64) {
        (self.rank, !self.ahead, self.tag)
    }
}

/// A slot handed to a waiter. Counted against the ceilings when handed,
/// not when its waiter wakes: the next waiter of the same dispatch must
/// see it.
pub(super) struct Handed {
    pub(super) id: ReplicaId,
    pub(super) shared: Arc<ReplicaShared>,
    pub(super) rank: Rank,
    /// Counted against the ceilings (`count_own`).
    pub(super) own: bool,
}

/// A stream in flight that may give its slot to a higher class's request.
pub(super) struct Yieldable {
    pub(super) replica: ReplicaId,
    pub(super) rank: Rank,
    pub(super) signal: Arc<YieldSignal>,
}

/// Set when a stream is asked to yield its slot; its body wakes on it.
#[derive(Default)]
pub struct YieldSignal {
    asked: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl YieldSignal {
    pub fn asked(&self) -> bool {
        self.asked.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once the stream is asked to yield.
    pub async fn wait(&self) {
        while !self.asked() {
            self.notify.notified().await;
        }
    }

    pub(super) fn ask(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }
}
