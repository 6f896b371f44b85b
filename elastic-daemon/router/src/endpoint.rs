//! One endpoint at run time: its replica pool behind a lock, the bounded
//! FIFO of requests waiting for a free replica, and drains. Waiting uses
//! oneshot channels and `Notify`, never polling: a released slot is handed
//! straight to the oldest waiter that can use it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use prometheus_client::metrics::gauge::Gauge;

use crate::backend_pool::{IdleConns, Transport};
use crate::metrics::{replica_labels, Metrics, PrefixLabels, ReplicaMetrics, RequestCounters};
use crate::prefix::{Affine, Affinity, PrefixSettings};
use crate::registry::{HealthThresholds, Pool, RegistryError, Replica, ReplicaId, ReplicaState, Transition};
use prometheus_client::metrics::counter::Counter;

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
}

pub use crate::classes::Rank;

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

pub use onepool_control::api::DrainOutcome;

struct Waiter {
    id: u64,
    exclude: Vec<ReplicaId>,
    /// Its prompt's prefix, when the endpoint routes by prefix.
    prefix: crate::prefix::PrefixKey,
    tx: oneshot::Sender<(ReplicaId, Arc<ReplicaShared>)>,
    rank: Rank,
    /// Of a class below the endpoint's own: lent replicas first.
    lower: bool,
    /// An answer that moved here from another replica (served first within
    /// its rank).
    ahead: bool,
    /// Its API key, and its turn among its class's keys (0 for a moved
    /// answer: those go first).
    key: u32,
    tag: u64,
}

impl Waiter {
    /// Its place: by rank, moved answers first within a rank, then by its
    /// key's turn, then by arrival (the queue keeps this order).
    fn place(&self) -> (Rank, bool, u64) {
        (self.rank, !self.ahead, self.tag)
    }
}

/// What the requests to one replica share beside its counters in the
/// pool: its metric handles (no label look-up per request) and its idle
/// keep-alive connections. Requests hold it through their lease, so a
/// removed replica's connections close when its last request ends.
pub struct ReplicaShared {
    pub address: SocketAddr,
    pub metrics: ReplicaMetrics,
    pub conns: Arc<IdleConns>,
    /// The connections of the router's own calls (health checks, model
    /// lists, onepoold's scrapes), on the same transport but apart from the
    /// requests' (as when those calls had a client of their own): a check
    /// never hands a request a connection the replica may be closing.
    pub own_conns: Arc<IdleConns>,
    /// Whether its health checks get any answer ([`crate::reach`]).
    pub reach: crate::reach::Reach,
}

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
}

/// A stream in flight that may give its slot to a higher class's request.
struct Yieldable {
    replica: ReplicaId,
    rank: Rank,
    signal: Arc<YieldSignal>,
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

    fn ask(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }
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
    fn shared(&self, id: ReplicaId) -> Option<&Arc<ReplicaShared>> {
        self.shared.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }

    /// Takes the `i`th waiter out of the queue (`served`: handed a slot).
    fn take_waiter(&mut self, i: usize, served: bool) -> Option<Waiter> {
        let w = self.waiters.remove(i)?;
        if !w.ahead {
            self.fair.leave(w.rank, w.key, w.tag, served);
        }
        Some(w)
    }
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
                }
            })
            .collect();
        out.sort_by_key(|c| c.rank);
        out
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

    /// Adds a replica reached in clear HTTP.
    pub fn add(&self, address: SocketAddr, limit: Option<u32>, ready: bool) -> Result<ReplicaId, RegistryError> {
        self.add_with(address, Transport::Plain, limit, ready)
    }

    /// Adds a replica reached over `transport` (TLS pinned to the
    /// certificate its launcher reported, issue #36). Its transport is
    /// fixed with it: no request can leave before it is known.
    pub fn add_with(
        &self,
        address: SocketAddr,
        transport: Transport,
        limit: Option<u32>,
        ready: bool,
    ) -> Result<ReplicaId, RegistryError> {
        let mut g = self.lock();
        let id = g.pool.add(address, limit.unwrap_or(self.default_limit), ready)?;
        let shared = self.new_shared(address, transport);
        shared.metrics.in_flight.set(0);
        g.shared.push((id, Arc::new(shared)));
        self.dispatch(&mut g);
        Ok(id)
    }

    /// Marks a replica as headroom: it takes requests only when every
    /// other ready replica is at its limit.
    pub fn set_spill(&self, address: SocketAddr, spill: bool) -> Result<(), RegistryError> {
        self.lock().pool.set_spill(address, spill)
    }

    /// Marks a replica as lent to the classes below the endpoint's own:
    /// their requests take it first, the others only when no other replica
    /// has room.
    pub fn set_lent(&self, address: SocketAddr, lent: bool) -> Result<(), RegistryError> {
        self.lock().pool.set_lent(address, lent)
    }

    /// Routes by prompt prefix from now on ([`crate::prefix`]), with an
    /// empty table.
    pub fn set_prefix_routing(&self, settings: PrefixSettings) {
        let counter = |outcome: &str| {
            let labels = PrefixLabels { endpoint: self.name.clone(), outcome: outcome.to_string() };
            self.metrics.prefix_routed.get_or_create(&labels).clone()
        };
        let counters = Affine::SLOTS.map(counter);
        let mut g = self.lock();
        g.affinity = Some(Affinity::new(settings));
        g.affine_counts = Some(counters);
    }

    /// Requests routed by prefix so far: hits, misses, over the bound, and
    /// without a prefix ([`Affine::SLOTS`]' order); `None` without prefix
    /// routing.
    pub fn prefix_counts(&self) -> Option<[u64; 4]> {
        self.lock().affine_counts.as_ref().map(|c| [c[0].get(), c[1].get(), c[2].get(), c[3].get()])
    }

    pub fn remove(&self, address: SocketAddr) -> Result<Replica, RegistryError> {
        let mut g = self.lock();
        let r = g.pool.remove(address)?;
        g.shared.retain(|(id, _)| *id != r.id);
        if let Some(a) = g.affinity.as_mut() {
            a.forget(r.id);
        }
        if let Some(n) = g.drains.remove(&r.id) {
            n.notify_waiters();
        }
        Ok(r)
    }

    /// Records a health-check result; a replica that became ready takes
    /// waiting requests at once.
    pub fn health_result(&self, id: ReplicaId, ok: bool) -> Option<Transition> {
        let mut g = self.lock();
        let t = g.pool.health_result(id, ok);
        if matches!(t, Some(Transition { to: ReplicaState::Ready, .. })) {
            self.dispatch(&mut g);
        }
        t
    }

    /// Records whether a health check got any answer from the replica:
    /// `unhealthy_after` checks in a row without one make it lost, and
    /// the requests waiting for its answer go elsewhere ([`crate::reach`]).
    pub fn reach_result(&self, id: ReplicaId, answered: bool) {
        let g = self.lock();
        let after = g.pool.thresholds().unhealthy_after;
        let Some(s) = g.shared(id).cloned() else { return };
        drop(g);
        if answered {
            s.reach.answered();
        } else if s.reach.missed(after) {
            tracing::warn!(
                endpoint = %self.name,
                replica = %s.address,
                "replica lost: {after} health checks in a row got no answer; requests waiting for its answer go to other replicas"
            );
        }
    }

    /// The replica said it is draining (the launcher's 503 with
    /// `x-onepool-draining: 1`): no new requests go to it from now on.
    pub fn backend_draining(&self, id: ReplicaId) {
        let mut g = self.lock();
        if let Some(t) = g.pool.begin_drain(id, Instant::now()) {
            tracing::info!(endpoint = %self.name, replica = id, from = ?t.from, "replica reports draining; out of rotation");
        }
        if let Some(a) = g.affinity.as_mut() {
            a.forget(id);
        }
    }

    /// Health checks run for this endpoint: from now on a replica whose
    /// request fails at the connection leaves rotation until its next
    /// check passes (see `Pool::eject`).
    pub fn eject_on_failure(&self) {
        self.ejects.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A request to the replica failed at the connection.
    pub fn exchange_failed(&self, id: ReplicaId) {
        if !self.ejects.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let ejected = self.lock().pool.eject(id);
        if ejected.is_some() {
            tracing::info!(endpoint = %self.name, replica = id, "replica failed a request at the connection; out of rotation until a health check passes");
            // One stored permit however many failures: one round follows.
            self.probe_now.notify_one();
        }
    }

    /// Resolves when a health-check round is wanted before the next tick.
    pub async fn probe_requested(&self) {
        self.probe_now.notified().await
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

    /// Resolves once a request has queued while no replica was ready (a
    /// notice given before the call counts: one is kept).
    pub async fn cold_request(&self) {
        self.cold.notified().await
    }

    /// Closes the replicas' keep-alive connections unused for `max_idle`.
    pub fn prune_idle(&self, max_idle: Duration) {
        let shared: Vec<_> = self.lock().shared.iter().map(|(_, s)| s.clone()).collect();
        for s in shared {
            s.conns.prune(max_idle);
            s.own_conns.prune(max_idle);
        }
    }

    /// Replicas to health-check (every one not draining), each with its
    /// connections.
    pub fn health_targets(&self) -> Vec<(ReplicaId, SocketAddr, Arc<IdleConns>)> {
        let g = self.lock();
        g.pool
            .replicas()
            .iter()
            .filter(|r| r.state != ReplicaState::Draining)
            .filter_map(|r| Some((r.id, r.address, g.shared(r.id)?.own_conns.clone())))
            .collect()
    }

    /// The ready replicas with their connections, for the router's own
    /// calls to them ([`crate::replica_client`]).
    pub fn ready_conns(&self) -> Vec<(SocketAddr, Arc<IdleConns>)> {
        let g = self.lock();
        g.pool
            .replicas()
            .iter()
            .filter(|r| r.state == ReplicaState::Ready)
            .filter_map(|r| Some((r.address, g.shared(r.id)?.own_conns.clone())))
            .collect()
    }

    /// The connections of the replica at `address` (onepoold's scrapes of
    /// its metrics take them, so they are pinned like its requests).
    pub fn conns_of(&self, address: SocketAddr) -> Option<Arc<IdleConns>> {
        let g = self.lock();
        let id = g.pool.replicas().iter().find(|r| r.address == address)?.id;
        Some(g.shared(id)?.own_conns.clone())
    }

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
            if let Some(id) = Self::choose(&mut g, want.exclude, want.prefix, want.lower) {
                return Ok(self.lease_chosen(&mut g, id, want.rank));
            }
            if !want.ahead {
                let of_rank = g.waiters.iter().filter(|w| w.rank == want.rank && !w.ahead).count();
                if of_rank >= self.queue.size {
                    return Err(if want.lower { AcquireError::ClassFull } else { AcquireError::QueueFull });
                }
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
            (wid, rx)
        };
        // Boxed: most requests find a replica free above and so never carry
        // the waiting's state along.
        let since = Instant::now();
        let wait = want.wait.unwrap_or(self.queue.timeout);
        let mut lease = Box::pin(self.wait_in_queue(waiter_id, rx, wait, want.rank)).await?;
        lease.queued_us = u32::try_from(since.elapsed().as_micros()).unwrap_or(u32::MAX);
        Ok(lease)
    }

    async fn wait_in_queue(
        self: &Arc<Self>,
        waiter_id: u64,
        rx: oneshot::Receiver<(ReplicaId, Arc<ReplicaShared>)>,
        wait: Duration,
        rank: Rank,
    ) -> Result<Lease, AcquireError> {
        // The guard owns the receiver so that a request dropped mid-wait
        // (client gone) leaves the queue, or gives back a slot it was handed.
        let mut guard = WaiterGuard { endpoint: self, id: waiter_id, rx: Some(rx) };
        let granted = {
            let rx = guard.rx.as_mut().expect("set above");
            tokio::time::timeout(wait, rx).await
        };
        match granted {
            Ok(Ok((id, shared))) => {
                guard.rx = None;
                let mut g = self.lock();
                Ok(self.lease(&mut g, id, shared, rank))
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
                    Ok((id, shared)) => Ok(self.lease(&mut g, id, shared, rank)),
                    Err(_) => Err(AcquireError::TimedOut),
                }
            }
        }
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

    /// The replica for a request: by prefix when the endpoint routes so,
    /// counted by how it was routed; else on the request's side of the
    /// lent replicas first (`lower`: of a class below the endpoint's own).
    /// Prefix routing keeps its own choice: the replica holding a prompt's
    /// prefix saves more than the side it is on.
    fn choose(g: &mut Inner, exclude: &[ReplicaId], prefix: &[u64], lower: bool) -> Option<ReplicaId> {
        let Inner { pool, affinity, affine_counts, .. } = g;
        let Some(affinity) = affinity.as_mut() else { return pool.choose_as(exclude, lower) };
        let (id, how) = pool.choose_for(exclude, prefix, affinity)?;
        if let Some(c) = affine_counts {
            c[how.slot()].inc();
        }
        Some(id)
    }

    /// The lease of a replica `choose` just picked.
    fn lease_chosen(self: &Arc<Self>, g: &mut Inner, id: ReplicaId, rank: Rank) -> Lease {
        let shared = self.shared_of(g, id);
        self.lease(g, id, shared, rank)
    }

    /// The shared part of a replica in the pool (made with the replica in
    /// `add`; made here too should that ever have been missed).
    fn shared_of(&self, g: &mut Inner, id: ReplicaId) -> Arc<ReplicaShared> {
        if let Some(s) = g.shared(id) {
            return s.clone();
        }
        let address = g.pool.get(id).map(|r| r.address).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        // Its transport went with what was missed: nothing is sent to it
        // rather than risk the replica key in clear.
        let s = Arc::new(self.new_shared(address, Transport::Refused));
        g.shared.push((id, s.clone()));
        s
    }

    fn new_shared(&self, address: SocketAddr, transport: Transport) -> ReplicaShared {
        ReplicaShared {
            address,
            metrics: self.metrics.replica(&self.name, &address.to_string()),
            conns: Arc::new(IdleConns::new(transport.clone())),
            own_conns: Arc::new(IdleConns::new(transport)),
            reach: crate::reach::Reach::default(),
        }
    }

    fn lease(self: &Arc<Self>, g: &mut Inner, id: ReplicaId, shared: Arc<ReplicaShared>, rank: Rank) -> Lease {
        if let Some(r) = g.pool.get(id) {
            shared.metrics.in_flight.set(r.in_flight as i64);
        }
        *g.in_flight_by_rank.entry(rank).or_default() += 1;
        Lease { endpoint: self.clone(), id, shared, queued_us: 0, rank }
    }

    fn set_queue_gauge(&self, g: &Inner) {
        self.queue_depth.set(g.waiters.len() as i64);
    }

    /// Hands free slots to waiters, oldest first; a waiter whose excluded
    /// replicas are the only free ones lets the next one go ahead.
    fn dispatch(&self, g: &mut Inner) {
        let mut i = 0;
        while i < g.waiters.len() {
            let Some(id) = ({
                let exclude = std::mem::take(&mut g.waiters[i].exclude);
                let prefix = std::mem::take(&mut g.waiters[i].prefix);
                let id = Self::choose(g, &exclude, &prefix, g.waiters[i].lower);
                (g.waiters[i].exclude, g.waiters[i].prefix) = (exclude, prefix);
                id
            }) else {
                i += 1;
                continue;
            };
            let w = g.take_waiter(i, true).expect("index checked above");
            let shared = self.shared_of(g, id);
            if w.tx.send((id, shared)).is_err() {
                // The waiter is gone (its guard removes it under this lock, so
                // this is rare); give the slot back and try the next one.
                g.pool.release(id);
            }
        }
        self.set_queue_gauge(g);
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

    fn release_locked(&self, g: &mut Inner, id: ReplicaId, shared: &ReplicaShared) {
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

    /// Stops new requests to the replica at once, then waits until its
    /// in-flight requests are done or `deadline` passes.
    pub async fn drain(&self, address: SocketAddr, deadline: Duration) -> Result<DrainOutcome, RegistryError> {
        let started = Instant::now();
        let notify = {
            let mut g = self.lock();
            let id = g.pool.find(address)?.id;
            g.pool.begin_drain(id, started);
            // What it holds is no reason to send anything its way now.
            if let Some(a) = g.affinity.as_mut() {
                a.forget(id);
            }
            g.drains.entry(id).or_insert_with(|| Arc::new(Notify::new())).clone()
        };
        let labels = replica_labels(&self.name, &address.to_string());
        let outcome = loop {
            // Register interest before looking, so a release between the
            // look and the wait is not missed.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let in_flight = {
                let g = self.lock();
                match g.pool.find(address) {
                    Ok(r) => r.in_flight,
                    Err(_) => break DrainOutcome::Removed { in_flight: 0 },
                }
            };
            if in_flight == 0 {
                break DrainOutcome::Drained { millis: started.elapsed().as_millis() as u64 };
            }
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                let g = self.lock();
                let in_flight = g.pool.find(address).map(|r| r.in_flight).unwrap_or(0);
                if in_flight == 0 {
                    break DrainOutcome::Drained { millis: started.elapsed().as_millis() as u64 };
                }
                break DrainOutcome::TimedOut { in_flight };
            }
        };
        let name = match &outcome {
            DrainOutcome::Drained { .. } => "drained",
            DrainOutcome::TimedOut { .. } => "timed_out",
            DrainOutcome::Removed { .. } => "removed",
        };
        self.metrics
            .drains
            .get_or_create(&crate::metrics::DrainLabels {
                endpoint: labels.endpoint.clone(),
                replica: labels.replica.clone(),
                outcome: name.to_string(),
            })
            .inc();
        self.metrics.drain_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        Ok(outcome)
    }
}

/// Takes a waiter out of the queue when its request is dropped mid-wait,
/// or gives back the slot it was handed and never used.
struct WaiterGuard<'a> {
    endpoint: &'a Endpoint,
    id: u64,
    rx: Option<oneshot::Receiver<(ReplicaId, Arc<ReplicaShared>)>>,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let mut g = self.endpoint.lock();
        if let Some(i) = g.waiters.iter().position(|w| w.id == self.id) {
            g.take_waiter(i, false);
            self.endpoint.set_queue_gauge(&g);
        } else if let Ok((id, shared)) = rx.try_recv() {
            self.endpoint.release_locked(&mut g, id, &shared);
        }
    }
}

/// One request's claim on a replica; dropping it ends the request there.
pub struct Lease {
    endpoint: Arc<Endpoint>,
    id: ReplicaId,
    shared: Arc<ReplicaShared>,
    /// How long the request waited in the queue for this replica, in
    /// microseconds (saturating at 71 minutes, far past any queue
    /// timeout): a u32 fits beside the rank in 8 bytes, and every response
    /// body holds a lease.
    queued_us: u32,
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

#[cfg(test)]
#[path = "endpoint_tests.rs"]
mod tests;
