//! The endpoint's queue and its yields: requests waiting for a slot at
//! their class's place (issue #44), the keys of a class in turns, the
//! streams of lower classes asked to give up their slot, and the slot
//! handed straight to the waiter that can use it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::classes::Rank;
use crate::endpoint::lease::Lease;
use crate::endpoint::waiting::{Handed, Waiter, YieldSignal, Yieldable};
use crate::endpoint::{Endpoint, Inner};
use crate::registry::{ReplicaId, ReplicaState};

#[derive(Clone, Debug)]
pub struct QueueSettings {
    /// Requests that may wait at once; one more gets 503.
    pub size: usize,
    /// How long a request waits for a replica before it gets 503.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    #[error("every replica is busy and the queue is full")]
    QueueFull,
    #[error("no replica became free within the queue timeout")]
    TimedOut,
    /// A class below the endpoint's own is past its own bound (429).
    #[error("this request class's share of the queue is full")]
    ClassFull,
    /// The class is at its bound and the request's API key holds its
    /// share of it already (429, issue #51).
    #[error("this API key holds its share of its class's queue")]
    KeyFull,
}

/// What a request asks of the endpoint for a slot.
#[derive(Clone, Copy, Debug, Default)]
pub struct Want<'a> {
    /// Replicas it failed on.
    pub exclude: &'a [ReplicaId],
    /// Its prompt's prefix, when the endpoint routes by prefix.
    pub prefix: &'a [u64],
    pub rank: Rank,
    /// A class below the endpoint's own: past its bound it gets
    /// [`AcquireError::ClassFull`] rather than [`AcquireError::QueueFull`].
    pub lower: bool,
    /// An answer that moved or yielded: ahead of new requests of its rank,
    /// and past the bound (it was accepted once already).
    pub ahead: bool,
    /// Its longest wait; the queue timeout when none.
    pub wait: Option<Duration>,
    /// Its API key (the tokens file's line; 0: none): keys of one class
    /// take turns in the queue ([`crate::fair`]).
    pub key: u32,
}

/// A stream's registration as yieldable; dropped with the stream's lease.
pub struct YieldTicket {
    endpoint: Arc<Endpoint>,
    id: u64,
    pub signal: Arc<YieldSignal>,
}

impl Drop for YieldTicket {
    fn drop(&mut self) {
        self.endpoint.lock().yieldable.remove(&self.id);
    }
}

impl Inner {
    /// Takes the `i`th waiter out of the queue (`served`: handed a slot).
    fn take_waiter(&mut self, i: usize, served: bool) -> Option<Waiter> {
        let w = self.waiters.remove(i)?;
        if !w.ahead {
            self.fair.leave(w.rank, w.key, w.tag, served);
        }
        Some(w)
    }
}

/// Takes a waiter out of the queue when its request is dropped mid-wait,
/// or gives back the slot it was handed and never used.
pub(super) struct WaiterGuard<'a> {
    pub(super) endpoint: &'a Endpoint,
    pub(super) id: u64,
    pub(super) rx: Option<oneshot::Receiver<Handed>>,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let mut g = self.endpoint.lock();
        if let Some(i) = g.waiters.iter().position(|w| w.id == self.id) {
            g.take_waiter(i, false);
            self.endpoint.set_queue_gauge(&g);
        } else if let Ok(h) = rx.try_recv() {
            self.endpoint.uncount_own(&mut g, h.own, h.rank);
            self.endpoint.release_locked(&mut g, h.id, &h.shared);
        }
    }
}

impl Endpoint {
    /// A replica for one request: at once if one has room, else after
    /// waiting in the bounded queue. `exclude` lists replicas this request
    /// already failed on.
    pub async fn acquire(self: &Arc<Self>, exclude: &[ReplicaId]) -> Result<Lease, AcquireError> {
        self.acquire_for(exclude, &[]).await
    }

    /// [`Endpoint::acquire`] for a request whose prompt is `prefix`
    /// ([`crate::prefix::prefix_key`]): with prefix routing on, the
    /// replica that holds the longest part of it, within the load bound.
    pub async fn acquire_for(self: &Arc<Self>, exclude: &[ReplicaId], prefix: &[u64]) -> Result<Lease, AcquireError> {
        self.acquire_want(Want { exclude, prefix, ..Want::default() }).await
    }

    /// A slot for a request as `want` says: at once if a replica has room,
    /// else in the queue at its rank's place (issue #44), past which a
    /// stream of a lower class is asked to yield its slot.
    pub async fn acquire_want(self: &Arc<Self>, want: Want<'_>) -> Result<Lease, AcquireError> {
        let (waiter_id, rx) = {
            let mut g = self.lock();
            // Ceilings ([`crate::headroom`]) hold new requests of the
            // classes below; a moved or yielded answer was admitted under
            // them already and goes on.
            let held = match self.headroom().is_some() && !want.ahead {
                true => {
                    let now = Instant::now();
                    self.seen(&mut g, want.rank, now);
                    self.holds(&g, want.rank, now, &mut None)
                }
                false => false,
            };
            if let Some(id) = Self::choose(&mut g, want.exclude, want.prefix, want.lower, held) {
                return Ok(self.lease_chosen(&mut g, id, want.rank));
            }
            if !want.ahead {
                self.admit(&g, &want)?;
            }
            let (tx, rx) = oneshot::channel();
            let wid = g.next_waiter;
            g.next_waiter += 1;
            let prefix = if g.affinity.is_some() { want.prefix.to_vec() } else { Vec::new() };
            let tag = if want.ahead { 0 } else { g.fair.join(want.rank, want.key) };
            let w = Waiter {
                id: wid,
                exclude: want.exclude.to_vec(),
                prefix,
                tx,
                rank: want.rank,
                lower: want.lower,
                ahead: want.ahead,
                key: want.key,
                tag,
            };
            let place = w.place();
            let at = g.waiters.iter().position(|o| o.place() > place).unwrap_or(g.waiters.len());
            g.waiters.insert(at, w);
            Self::ask_to_yield(&mut g, want.rank, want.exclude);
            if !g.pool.replicas().iter().any(|r| r.state == ReplicaState::Ready) {
                self.cold.notify_one();
            }
            g.peak_queue = g.peak_queue.max(g.waiters.len());
            self.set_queue_gauge(&g);
            if held {
                g.held = true;
                self.keep_quiet_timer(&mut g);
            }
            (wid, rx)
        };
        // Boxed: most requests find a replica free above and so never carry
        // the waiting's state along.
        let since = Instant::now();
        let wait = want.wait.unwrap_or(self.queue.timeout);
        let mut lease = Box::pin(self.wait_in_queue(waiter_id, rx, wait)).await?;
        lease.queued.set_wait(since.elapsed());
        Ok(lease)
    }

    async fn wait_in_queue(
        self: &Arc<Self>,
        waiter_id: u64,
        rx: oneshot::Receiver<Handed>,
        wait: Duration,
    ) -> Result<Lease, AcquireError> {
        // The guard owns the receiver so that a request dropped mid-wait
        // (client gone) leaves the queue, or gives back a slot it was handed.
        let mut guard = WaiterGuard { endpoint: self, id: waiter_id, rx: Some(rx) };
        let granted = {
            let rx = guard.rx.as_mut().expect("set above");
            tokio::time::timeout(wait, rx).await
        };
        match granted {
            Ok(Ok(handed)) => {
                guard.rx = None;
                let mut g = self.lock();
                Ok(self.lease(&mut g, handed))
            }
            // The sender is dropped only after a send or with its queue
            // entry; neither leaves a slot behind.
            Ok(Err(_)) => {
                guard.rx = None;
                Err(AcquireError::TimedOut)
            }
            Err(_) => {
                let mut rx = guard.rx.take().expect("set above");
                let mut g = self.lock();
                if let Some(i) = g.waiters.iter().position(|w| w.id == waiter_id) {
                    g.take_waiter(i, false);
                    self.set_queue_gauge(&g);
                    return Err(AcquireError::TimedOut);
                }
                // Handed a slot just as the timeout fired: use it.
                match rx.try_recv() {
                    Ok(handed) => Ok(self.lease(&mut g, handed)),
                    Err(_) => Err(AcquireError::TimedOut),
                }
            }
        }
    }

    /// Whether a new request may wait in its class's queue: while the
    /// class is under its bound, yes; at it, only a key under its share
    /// (issue #51: a key flooding its class does not shut another key of
    /// the class out), up to twice the bound in all.
    fn admit(&self, g: &Inner, want: &Want<'_>) -> Result<(), AcquireError> {
        let size = self.queue.size;
        let of_rank = g.waiters.iter().filter(|w| w.rank == want.rank && !w.ahead).count();
        if of_rank < size {
            return Ok(());
        }
        let keyed = want.key != 0 && size > 0 && of_rank < 2 * size;
        if !keyed {
            return Err(if want.lower { AcquireError::ClassFull } else { AcquireError::QueueFull });
        }
        let mine = g.fair.waiting(want.rank, want.key) as usize;
        match mine < g.fair.share(want.rank, want.key, size) {
            true => Ok(()),
            false => Err(AcquireError::KeyFull),
        }
    }

    /// How long a request of `key` refused a place in `rank`'s queue would
    /// wait if it came back now (its `Retry-After`): its key's turns at
    /// the pace the class is served; the queue timeout before there is a
    /// pace to go by. One second at least.
    pub fn expected_wait(&self, rank: Rank, key: u32) -> Duration {
        let g = self.lock();
        g.fair.expected_wait(rank, key).unwrap_or(self.queue.timeout).max(Duration::from_secs(1))
    }

    /// A request of `rank` waits: the newest stream of the lowest class
    /// below it, on a replica the request may use, is asked to give its
    /// slot up (issue #44); the router continues that stream later, from
    /// where its client has it. One stream per waiting request.
    fn ask_to_yield(g: &mut Inner, rank: Rank, exclude: &[ReplicaId]) {
        let chosen = g
            .yieldable
            .iter()
            .filter(|(_, y)| y.rank > rank && !y.signal.asked() && !exclude.contains(&y.replica))
            .max_by_key(|(id, y)| (y.rank, **id))
            .map(|(id, _)| *id);
        if let Some(y) = chosen.and_then(|id| g.yieldable.remove(&id)) {
            y.signal.ask();
        }
    }

    /// Registers the stream on `lease` as one that may yield its slot to a
    /// request of a class above `rank`.
    pub fn yieldable(self: &Arc<Self>, lease: &Lease, rank: Rank) -> YieldTicket {
        let signal = Arc::new(YieldSignal::default());
        let mut g = self.lock();
        let id = g.next_yieldable;
        g.next_yieldable += 1;
        g.yieldable.insert(id, Yieldable { replica: lease.id(), rank, signal: signal.clone() });
        // A request of a higher class may be waiting already.
        let waiting = g.waiters.iter().find(|w| w.rank < rank).map(|w| (w.rank, w.exclude.clone()));
        if let Some((r, exclude)) = waiting {
            Self::ask_to_yield(&mut g, r, &exclude);
        }
        YieldTicket { endpoint: self.clone(), id, signal }
    }

    fn set_queue_gauge(&self, g: &Inner) {
        self.queue_depth.set(g.waiters.len() as i64);
    }

    /// Hands free slots to waiters, oldest first; a waiter whose excluded
    /// replicas are the only free ones lets the next one go ahead.
    pub(super) fn dispatch(&self, g: &mut Inner) {
        let mut i = 0;
        let now = self.headroom().map(|_| Instant::now());
        let mut slots = None;
        g.held = false;
        while i < g.waiters.len() {
            let held = match now {
                Some(now) if !g.waiters[i].ahead => self.holds(g, g.waiters[i].rank, now, &mut slots),
                _ => false,
            };
            let Some(id) = ({
                let exclude = std::mem::take(&mut g.waiters[i].exclude);
                let prefix = std::mem::take(&mut g.waiters[i].prefix);
                let id = Self::choose(g, &exclude, &prefix, g.waiters[i].lower, held);
                (g.waiters[i].exclude, g.waiters[i].prefix) = (exclude, prefix);
                id
            }) else {
                g.held |= held;
                i += 1;
                continue;
            };
            let w = g.take_waiter(i, true).expect("index checked above");
            // Read only when a queued request is served: the class's pace.
            g.fair.served(w.rank, Instant::now());
            let shared = self.shared_of(g, id);
            let own = self.count_own(g, id, w.rank);
            if let Err(h) = w.tx.send(Handed { id, shared, rank: w.rank, own }) {
                // The waiter is gone (its guard removes it under this lock, so
                // this is rare); give the slot back and try the next one.
                self.uncount_own(g, h.own, h.rank);
                g.pool.release(id);
            }
        }
        self.set_queue_gauge(g);
    }
}
