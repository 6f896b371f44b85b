//! One endpoint at run time: its replica pool behind a lock, the bounded
//! FIFO of requests waiting for a free replica, and drains. Waiting uses
//! oneshot channels and `Notify`, never polling: a released slot is handed
//! straight to the oldest waiter that can use it. Here the endpoint's
//! state and what reads it whole (snapshots, classes, latency samples);
//! the replica pool in [`pool`], the queue and its yields in [`queue`], a
//! request's claim on a replica in [`lease`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

use crate::endpoint::waiting::{Waiter, Yieldable};
use crate::metrics::{Metrics, RequestCounters};
use crate::prefix::Affinity;
use crate::registry::{HealthThresholds, Pool, Replica, ReplicaId};

mod held;
mod lease;
mod pool;
mod queue;
mod shared;
mod waiting;

pub use crate::classes::Rank;
pub use lease::Lease;
pub use onepool_control::api::DrainOutcome;
pub use queue::{AcquireError, QueueSettings, Want, YieldTicket};
pub use shared::ReplicaShared;
pub use waiting::YieldSignal;

struct Inner {
    pool: Pool,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    /// Woken when a draining replica's last request ends (or it is removed).
    drains: HashMap<ReplicaId, Arc<Notify>>,
    peak_queue: usize,
    shared: Vec<(ReplicaId, Arc<ReplicaShared>)>,
    /// With prefix-aware routing: which replica took each prompt prefix
    /// last ([`crate::prefix`]).
    affinity: Option<Affinity>,
    /// `onepool_router_prefix_routed_total` of this endpoint, in
    /// [`Affine::SLOTS`]'s order (looked up once, not per request).
    affine_counts: Option<[Counter; 4]>,
    /// Streams that may yield their slot to a higher class (issue #44),
    /// by registration number.
    yieldable: BTreeMap<u64, Yieldable>,
    next_yieldable: u64,
    /// Requests on replicas now, by rank (what each class's demand is
    /// beside its queue, for the replica controller: issue #44); one entry
    /// per rank ever seen, the policy's classes at most.
    in_flight_by_rank: BTreeMap<Rank, u32>,
    /// The turns of the keys waiting in each class.
    fair: crate::fair::FairTags,
    /// With ceilings ([`crate::headroom`]): requests on the endpoint's own
    /// (not lent) replicas by rank, when the ranks a ceiling looks above
    /// last had a request arrive or end, whether the last dispatch held a
    /// waiter back, and whether a timer will dispatch when their quiet ends.
    own_by_rank: BTreeMap<Rank, u32>,
    seen: BTreeMap<Rank, Instant>,
    held: bool,
    quiet_timer: bool,
}

pub struct Endpoint {
    name: String,
    default_limit: u32,
    queue: QueueSettings,
    inner: Mutex<Inner>,
    metrics: Arc<Metrics>,
    queue_depth: Gauge,
    /// Answers given without a replica (queue full, bad request).
    requests: RequestCounters,
    /// Set when health checks run: only they can bring an ejected
    /// replica back, so without them a failed request ejects nothing.
    ejects: std::sync::atomic::AtomicBool,
    /// Asks the health checks for a round now (after an ejection).
    probe_now: Notify,
    /// Tells the replica controller a request is waiting and no replica
    /// can take it (scale from zero: it need not wait for its next poll).
    cold: Notify,
    /// onepoold's replica key ([`Endpoint::set_replica_key`]).
    replica_key: std::sync::OnceLock<http::HeaderValue>,
    /// Latency samples kept for the replica controller's targets; off (one
    /// atomic load a request) unless an endpoint sets them.
    sampling: std::sync::atomic::AtomicBool,
    latencies: Mutex<VecDeque<LatencySample>>,
    /// How its answers continue elsewhere, and how often they did.
    resume: std::sync::OnceLock<crate::resume::ResumeSettings>,
    moved: std::sync::atomic::AtomicU64,
    not_moved: std::sync::atomic::AtomicU64,
    /// Its request classes (their counts are the metrics').
    classes: std::sync::OnceLock<Arc<crate::classes::RequestClasses>>,
    /// Generation requests by class and whether their answer is followed
    /// (`yes`) or why not (issue #51 item 6), for `onepool status`.
    followed: Mutex<Vec<(Arc<str>, &'static str, Counter)>>,
}

/// One answered request: when its first byte came, after how long, and
/// how much of that it waited in the queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencySample {
    pub at: Instant,
    /// Seconds from the request's arrival to the answer's first body byte.
    pub ttfb: f64,
    /// Seconds it waited in the queue for a replica.
    pub queued: f64,
}

/// Samples kept between two reads by the controller (each poll): beyond
/// it the oldest go, so a flood costs bounded memory.
const LATENCY_SAMPLES: usize = 16 * 1024;

/// An endpoint as the control API shows it (without its controller's view,
/// which onepoold adds).
pub type EndpointSnapshot = onepool_control::api::EndpointState;

impl Endpoint {
    pub fn new(
        name: &str,
        default_limit: u32,
        queue: QueueSettings,
        thresholds: HealthThresholds,
        metrics: Arc<Metrics>,
    ) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            name: name.to_string(),
            default_limit,
            queue,
            inner: Mutex::new(Inner {
                pool: Pool::new(name, thresholds),
                waiters: VecDeque::new(),
                next_waiter: 0,
                drains: HashMap::new(),
                peak_queue: 0,
                shared: Vec::new(),
                affinity: None,
                affine_counts: None,
                yieldable: BTreeMap::new(),
                next_yieldable: 0,
                in_flight_by_rank: BTreeMap::new(),
                fair: crate::fair::FairTags::default(),
                own_by_rank: BTreeMap::new(),
                seen: BTreeMap::new(),
                held: false,
                quiet_timer: false,
            }),
            queue_depth: metrics.queue_depth(name),
            requests: metrics.request_counters(name, ""),
            metrics,
            ejects: std::sync::atomic::AtomicBool::new(false),
            probe_now: Notify::new(),
            cold: Notify::new(),
            replica_key: std::sync::OnceLock::new(),
            sampling: std::sync::atomic::AtomicBool::new(false),
            latencies: Mutex::new(VecDeque::new()),
            resume: std::sync::OnceLock::new(),
            moved: std::sync::atomic::AtomicU64::new(0),
            not_moved: std::sync::atomic::AtomicU64::new(0),
            classes: std::sync::OnceLock::new(),
            followed: Mutex::new(Vec::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets onepoold's replica key, sent on every request to this
    /// endpoint's replicas (proxied, health checks, model lists, metrics
    /// reads); once, before traffic. A second call is ignored.
    pub fn set_replica_key(&self, key: http::HeaderValue) {
        let mut key = key;
        key.set_sensitive(true);
        let _ = self.replica_key.set(key);
    }

    /// The replica key, if set (`x-onepool-replica-key`).
    pub fn replica_key(&self) -> Option<&http::HeaderValue> {
        self.replica_key.get()
    }

    /// The daemon's metrics (the replica controller counts into them too).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn queue_settings(&self) -> &QueueSettings {
        &self.queue
    }

    /// Counts an answer the router gave without a replica.
    pub fn count_answer(&self, status: u16) {
        self.requests.count(status);
    }

    /// Counts a 503 by its reason (`onepool_router_unavailable_total`).
    pub fn count_unavailable(&self, reason: crate::metrics::Unavailable) {
        self.metrics.count_unavailable(&self.name, reason);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves counters that are still
        // consistent enough to serve; keep routing rather than cascade.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> EndpointSnapshot {
        let g = self.lock();
        EndpointSnapshot {
            name: self.name.clone(),
            queued: g.waiters.len(),
            peak_queued: g.peak_queue,
            replicas: g.pool.replicas().iter().map(Replica::view).collect(),
            served_total: g.pool.served_total(),
            replica_jobs: None,
            resume: self.resume.get().map(|r| onepool_control::api::ResumeState {
                method: r.method.as_str().to_string(),
                max_moves: r.max_moves,
                moved: self.moved.load(std::sync::atomic::Ordering::Relaxed),
                not_moved: self.not_moved.load(std::sync::atomic::Ordering::Relaxed),
            }),
            classes: self.class_states(&g),
        }
    }

    /// The endpoint's request classes (once, from its settings).
    pub fn set_classes(&self, c: Arc<crate::classes::RequestClasses>) {
        let _ = self.classes.set(c);
    }

    /// Each request class with what it waits for and did, highest first.
    fn class_states(&self, g: &Inner) -> Vec<onepool_control::api::ClassState> {
        let Some(classes) = self.classes.get() else { return Vec::new() };
        let mut out: Vec<onepool_control::api::ClassState> = classes
            .all()
            .map(|(name, rank)| {
                let [requests, shed, yielded] = self.metrics.class_counts(&self.name, name);
                let queued = g.waiters.iter().filter(|w| w.rank == rank).count();
                onepool_control::api::ClassState {
                    name: name.to_string(),
                    rank: rank.0,
                    queued,
                    in_flight: g.in_flight_by_rank.get(&rank).copied().unwrap_or(0),
                    lower: classes.lower(rank),
                    requests,
                    shed,
                    yielded,
                    followed: self.followed_of(name),
                }
            })
            .collect();
        out.sort_by_key(|c| c.rank);
        out
    }

    /// A generation request of `class` (empty without classes) whose
    /// answer is followed (`yes`) or not, and why (issue #51 item 6).
    pub fn note_followed(&self, class: &str, followed: &'static str) {
        let mut tally = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        match tally.iter().find(|(c, f, _)| &**c == class && *f == followed) {
            Some((_, _, n)) => {
                n.inc();
            }
            None => {
                let n = self.metrics.followed_counter(&self.name, class, followed);
                n.inc();
                tally.push((Arc::from(class), followed, n));
            }
        }
    }

    /// A class's generation requests by whether their answer was followed.
    fn followed_of(&self, class: &str) -> BTreeMap<String, u64> {
        let tally = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        tally.iter().filter(|(c, _, _)| &**c == class).map(|(_, f, n)| (f.to_string(), n.get())).collect()
    }

    /// How the endpoint's answers continue on another replica (once, from
    /// its settings).
    pub fn set_resume(&self, r: crate::resume::ResumeSettings) {
        let _ = self.resume.set(r);
    }

    /// An answer moved to another replica (`Ok(why)`), or could not
    /// (`Err(why)`): in the metrics and the endpoint's totals for status.
    pub fn note_move(&self, moved: Result<crate::resume::Why, &str>) {
        let n = match moved {
            Ok(why) => {
                self.metrics.count_moved(&self.name, why);
                &self.moved
            }
            Err(why) => {
                self.metrics.count_move_failed(&self.name, why);
                &self.not_moved
            }
        };
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps latency samples from now on ([`Endpoint::take_latencies`]).
    pub fn sample_latencies(&self) {
        self.sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn record_first_byte(&self, ttfb: Duration, queued: Duration) {
        if !self.sampling.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let sample = LatencySample { at: Instant::now(), ttfb: ttfb.as_secs_f64(), queued: queued.as_secs_f64() };
        let mut l = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() >= LATENCY_SAMPLES {
            l.pop_front();
        }
        l.push_back(sample);
    }

    /// The samples since the last call, oldest first.
    pub fn take_latencies(&self) -> Vec<LatencySample> {
        self.latencies.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect()
    }
}

#[cfg(test)]
mod tests;
