//! Prometheus metrics per endpoint and replica. They are the autoscaler's
//! signals too (request rate, queue depth), so they are updated where the
//! router decides, not sampled afterwards.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabels {
    pub endpoint: String,
    pub replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// The listener's bound address.
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: String,
    /// "max_connections" or "max_connections_per_ip": the cap it hit.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Empty when a shared listener answered without choosing an endpoint
    /// (no such host, path or model; its model list).
    pub endpoint: String,
    /// Empty when the router answered without a replica (queue full, bad request).
    pub replica: String,
    /// "2xx", "3xx", "4xx", "5xx".
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixLabels {
    pub endpoint: String,
    /// [`crate::prefix::Affine::label`].
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnavailableLabels {
    pub endpoint: String,
    /// [`Unavailable::as_str`].
    pub reason: String,
}

/// Why a request was answered 503: the router's own reasons, and a
/// replica's own 503 passed on. A 503 after a reclaim means different
/// things (too little capacity, a drain with nowhere to go, a sick
/// server), and only the reason says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// Every replica was busy and the endpoint's queue was full.
    QueueFull,
    /// The request waited queue_timeout without a replica coming free.
    QueueTimeout,
    /// A replica answered "draining" and no other one took the request.
    Draining,
    /// The replica itself answered 503 (not its launcher's drain answer).
    Replica,
}

impl Unavailable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::QueueFull => "queue_full",
            Unavailable::QueueTimeout => "queue_timeout",
            Unavailable::Draining => "draining",
            Unavailable::Replica => "replica",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub endpoint: String,
    /// The request's class (issue #44).
    pub class: String,
}

impl ClassLabels {
    fn of(endpoint: &str, class: &str) -> ClassLabels {
        ClassLabels { endpoint: endpoint.to_string(), class: class.to_string() }
    }
}

/// A generation request's class and whether the router follows its
/// answer (`yes`), or why not (issue #51 item 6).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowLabels {
    pub endpoint: String,
    /// Its class; empty on an endpoint without classes.
    pub class: String,
    pub followed: String,
}

/// What happened to a request of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassEvent {
    /// It arrived.
    Request,
    /// Its class's share of the queue was full: 429 (a class below the
    /// endpoint's) or 503.
    Shed,
    /// Its stream gave its slot to a higher class's request.
    Yielded,
    /// Its answer moved to another replica, its own having failed or been
    /// reclaimed (a yield is not a move).
    Moved,
}

/// Why a request was sent to another replica after an attempt
/// (`onepool_router_retries_total{endpoint,reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// It never reached the replica (no connection could be made).
    NotSent,
    /// The replica was lost before it answered ([`crate::reach`]).
    Lost,
    /// The replica answered that it drains.
    Draining,
    /// The exchange failed after the request was written (or the model
    /// server failed it before answering), on a request that may be sent
    /// twice: a safe method, an OpenAI generation POST, or any on an
    /// endpoint with `retry.idempotent`.
    Failed,
}

impl Retry {
    pub fn as_str(self) -> &'static str {
        match self {
            Retry::NotSent => "not_sent",
            Retry::Lost => "replica_lost",
            Retry::Draining => "draining",
            Retry::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    pub endpoint: String,
    pub replica: String,
    /// "drained", "timed_out" or "removed".
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaJobLabels {
    pub endpoint: String,
    /// "baseline", "supplemental" or "warm".
    pub kind: String,
    /// "pending", "starting", "serving", "draining" or "cancelled".
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReclaimLabels {
    pub endpoint: String,
    /// "graceful" (Slurm gave a grace time) or "immediate".
    pub mode: String,
}

/// One onepoold instance (`[ha] instance`, the host name by default).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub endpoint: String,
    /// "submit", "drain" or "release".
    pub action: String,
    /// "act" (carried out) or "advisory" (only logged).
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub endpoint: String,
    /// "ttft" (to the answer's first byte) or "queue" (waiting for a replica).
    pub what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdvisedLabels {
    pub endpoint: String,
    /// "submit", "drain" or "release".
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlurmCallLabels {
    pub endpoint: String,
    /// "sbatch", "scancel", "scontrol_update", "scontrol_show_job",
    /// "squeue", "squeue_steps" or "sinfo".
    pub call: String,
    /// "ok", "retryable" (Slurm did not answer in time, or was busy) or
    /// "failed" (trying again will not help).
    pub outcome: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s: covers a proxied health check up to a long generation.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn drain_histogram() -> Histogram {
    // 10 ms .. ~1.4 h: drains wait for the longest in-flight stream.
    Histogram::new(exponential_buckets(0.01, 2.0, 20))
}

/// Every metric the router exports, registered once.
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub in_flight: Family<ReplicaLabels, Gauge>,
    pub queue_depth: Family<EndpointLabels, Gauge>,
    pub latency: HistogramFamily<ReplicaLabels>,
    pub drains: Family<DrainLabels, Counter>,
    pub drain_seconds: HistogramFamily<ReplicaLabels>,
    /// The replica controllers' view of their Slurm jobs (`onepool_replica_*`).
    pub replicas: Family<ReplicaJobLabels, Gauge>,
    pub desired: Family<EndpointLabels, Gauge>,
    pub preemptions: Family<EndpointLabels, Counter>,
    /// Preempted replica jobs that released their GPUs, and how long after
    /// Slurm's pick was seen (issue #26).
    pub reclaims: Family<ReclaimLabels, Counter>,
    pub reclaim_release_seconds: HistogramFamily<ReclaimLabels>,
    /// The job that took a reclaimed replica's GPUs: from its submission
    /// to its start (whole seconds, as squeue has them).
    pub reclaim_time_to_capacity_seconds: HistogramFamily<ReclaimLabels>,
    /// Replica jobs that ended before serving (or soon after), and the
    /// start back-off they cause (issue #24).
    pub failed_starts: Family<EndpointLabels, Counter>,
    pub backoff_failures: Family<EndpointLabels, Gauge>,
    pub backoff_seconds: Family<EndpointLabels, Gauge>,
    pub slurm_calls: Family<SlurmCallLabels, Counter>,
    /// Replica decisions, carried out or (advisory) only logged (issue #28).
    pub decisions: Family<DecisionLabels, Counter>,
    /// What an advisory endpoint would be doing now.
    pub advised: Family<AdvisedLabels, Gauge>,
    /// Decision log lines dropped because its writer fell behind.
    pub decision_log_dropped: Counter,
    /// With latency targets: the p99s the autoscaler judged by.
    pub latency_p99: Family<LatencyLabels, Gauge<f64, AtomicU64>>,
    /// Client connections open, by listener.
    pub connections: Family<ListenerLabels, Gauge>,
    pub connections_refused: Family<RefusedLabels, Counter>,
    /// Request body bytes held by requests in flight, all endpoints.
    pub buffered_body_bytes: Gauge,
    /// Requests refused because their body would pass max_buffered_body_bytes.
    pub body_budget_refused: Counter,
    pub response_idle_timeouts: Family<ReplicaLabels, Counter>,
    pub unavailable: Family<UnavailableLabels, Counter>,
    /// By [`Retry::as_str`] (the same two labels as `unavailable`).
    pub retries: Family<UnavailableLabels, Counter>,
    /// Answers moved to another replica (issue #43), by
    /// [`crate::resume::Why::as_str`]; those that could not be, by why;
    /// the pause their clients saw; what the router keeps to move them.
    pub streams_moved: Family<UnavailableLabels, Counter>,
    pub stream_moves_failed: Family<UnavailableLabels, Counter>,
    /// Streams passed as they came (not followed) whose replica ended them
    /// before their answer did: the router ended them with the error event
    /// (issue #50).
    pub streams_cut: Family<UnavailableLabels, Counter>,
    pub stream_move_pause_seconds: HistogramFamily<EndpointLabels>,
    pub resume_kept_bytes: Gauge,
    /// Requests by class (issue #44): arrived, shed, yielded; and their
    /// wait in the queue.
    pub class_requests: Family<ClassLabels, Counter>,
    pub class_shed: Family<ClassLabels, Counter>,
    pub class_yielded: Family<ClassLabels, Counter>,
    pub class_moved: Family<ClassLabels, Counter>,
    pub class_tokens: Family<ClassLabels, Counter>,
    /// Generation requests by class, followed or why not (issue #51).
    pub class_followed: Family<FollowLabels, Counter>,
    pub class_queue_seconds: HistogramFamily<ClassLabels>,
    /// Access log lines dropped because its writer fell behind.
    pub access_log_dropped: Counter,
    /// Requests routed by prompt prefix, by how ([`crate::prefix::Affine`]).
    pub prefix_routed: Family<PrefixLabels, Counter>,
    /// Which of several onepoold instances acts on Slurm (issue #37):
    /// 1 while this one does, since when (Unix seconds, 0 while it
    /// follows), its last takeover (Unix seconds, 0: none) and how many.
    pub ha_acting: Family<InstanceLabels, Gauge>,
    pub ha_lock_foreign: Family<InstanceLabels, Gauge>,
    pub ha_acting_since: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    pub ha_last_takeover: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    pub ha_takeovers: Family<InstanceLabels, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            requests: Family::default(),
            in_flight: Family::default(),
            queue_depth: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            drains: Family::default(),
            drain_seconds: Family::new_with_constructor(drain_histogram),
            replicas: Family::default(),
            desired: Family::default(),
            preemptions: Family::default(),
            reclaims: Family::default(),
            reclaim_release_seconds: Family::new_with_constructor(drain_histogram),
            reclaim_time_to_capacity_seconds: Family::new_with_constructor(drain_histogram),
            failed_starts: Family::default(),
            backoff_failures: Family::default(),
            backoff_seconds: Family::default(),
            slurm_calls: Family::default(),
            decisions: Family::default(),
            advised: Family::default(),
            decision_log_dropped: Counter::default(),
            latency_p99: Family::default(),
            connections: Family::default(),
            connections_refused: Family::default(),
            buffered_body_bytes: Gauge::default(),
            body_budget_refused: Counter::default(),
            response_idle_timeouts: Family::default(),
            unavailable: Family::default(),
            retries: Family::default(),
            streams_moved: Family::default(),
            stream_moves_failed: Family::default(),
            streams_cut: Family::default(),
            stream_move_pause_seconds: Family::new_with_constructor(latency_histogram),
            resume_kept_bytes: Gauge::default(),
            class_requests: Family::default(),
            class_shed: Family::default(),
            class_yielded: Family::default(),
            class_moved: Family::default(),
            class_tokens: Family::default(),
            class_followed: Family::default(),
            class_queue_seconds: Family::new_with_constructor(latency_histogram),
            access_log_dropped: Counter::default(),
            prefix_routed: Family::default(),
            ha_acting: Family::default(),
            ha_lock_foreign: Family::default(),
            ha_acting_since: Family::default(),
            ha_last_takeover: Family::default(),
            ha_takeovers: Family::default(),
            registry: Registry::with_prefix("onepool"),
        };
        m.register_router();
        m.register_moves_and_classes();
        m.register_controllers();
        m.register_ha();
        m
    }

    /// `onepool_router_*` of answers that move (issue #43) and of request
    /// classes (issue #44).
    fn register_moves_and_classes(&mut self) {
        let r = self.registry.sub_registry_with_prefix("router");
        r.register(
            "streams_moved",
            "Answers continued on another replica mid-stream, by reason: reclaimed (its launcher ended it for a reclaim), replica_lost, failed (the connection failed), ended_early (the body ended before the answer: a model server that died), silent (nothing for response_idle_timeout)",
            self.streams_moved.clone(),
        );
        r.register(
            "stream_moves_failed",
            "Answers that could not be continued and ended with an error event, by reason: max_moves, too_long (past what the router keeps), queue_full, queue_timeout, replica_failed (the replicas tried refused the continuation), diverged (generated again, it came out otherwise than what its client had), tool_call_cut (a tool call or reasoning begun after a continuation by text)",
            self.stream_moves_failed.clone(),
        );
        r.register(
            "streams_cut",
            "Streams the router passes without following them (tools, several choices, ...) that their replica ended before the answer's end; each ended with an error event, by reason: replica_failed (the connection failed or the body ended early), replica_silent (nothing for response_idle_timeout), replica_lost",
            self.streams_cut.clone(),
        );
        r.register(
            "stream_move_pause_seconds",
            "The pause a client saw when its answer moved: from the cut to the continuation's first byte on its way",
            self.stream_move_pause_seconds.clone(),
        );
        r.register(
            "resume_kept_bytes",
            "Heap bytes the router keeps for the answers it follows (token ids, text, partial events)",
            self.resume_kept_bytes.clone(),
        );
        r.register("class_requests", "Requests by request class (issue #44)", self.class_requests.clone());
        r.register(
            "class_shed",
            "Requests refused because their class's share of the queue was full: 429 for a class below the endpoint's own, 503 otherwise",
            self.class_shed.clone(),
        );
        r.register(
            "class_yielded",
            "Streams that gave their replica slot to a request of a higher class and continued later",
            self.class_yielded.clone(),
        );
        r.register(
            "class_moved",
            "Answers that moved to another replica because theirs failed or was reclaimed, by request class",
            self.class_moved.clone(),
        );
        r.register(
            "class_answers_followed",
            "Generation requests by request class (empty: the endpoint has none), by whether the router follows the answer so that it can yield and move (yes), moves it only by generating it again from its start with its seed (replay: a grammar, a JSON schema, several choices; it keeps its slot), or why not: several_choices (best_of), completion_shape, not_json, whole (an answer given whole, sent again whole if its replica fails before its head)",
            self.class_followed.clone(),
        );
        r.register(
            "class_tokens",
            "Answer tokens of the answers the router follows, by request class (token ids, or text events)",
            self.class_tokens.clone(),
        );
        r.register(
            "class_queue_seconds",
            "How long requests of each class waited in the queue for a replica",
            self.class_queue_seconds.clone(),
        );
    }

    /// `onepool_router_*`: what the proxy and the endpoints count.
    fn register_router(&mut self) {
        let r = self.registry.sub_registry_with_prefix("router");
        r.register("requests", "Requests answered, by replica and status class", self.requests.clone());
        r.register("in_flight", "Requests a replica is serving now", self.in_flight.clone());
        r.register("queue_depth", "Requests waiting for a free replica", self.queue_depth.clone());
        r.register("request_duration_seconds", "Time from request to the last response byte", self.latency.clone());
        r.register("drains", "Replica drains, by outcome", self.drains.clone());
        r.register("drain_duration_seconds", "How long drains took", self.drain_seconds.clone());
        r.register("connections", "Client connections open, by listener", self.connections.clone());
        r.register(
            "connections_refused",
            "Client connections closed at once: the listener's cap or the client IP's was reached",
            self.connections_refused.clone(),
        );
        r.register(
            "buffered_body_bytes",
            "Request body bytes held by requests in flight (at most max_buffered_body_bytes)",
            self.buffered_body_bytes.clone(),
        );
        r.register(
            "body_budget_refused",
            "Requests answered 503 because their body would pass max_buffered_body_bytes",
            self.body_budget_refused.clone(),
        );
        r.register(
            "response_idle_timeouts",
            "Responses cut off because the replica sent nothing for response_idle_timeout",
            self.response_idle_timeouts.clone(),
        );
        r.register("unavailable", "Requests answered 503, by reason: queue_full, queue_timeout, draining (no other replica took it), replica (its own 503)", self.unavailable.clone());
        r.register(
            "retries",
            "Requests sent to another replica after an attempt, by reason: not_sent (no connection), replica_lost (its health checks got no answer), draining, failed (the exchange failed, or the model server failed it before answering, on a request that may be sent twice: safe methods, OpenAI generation POSTs, retry.idempotent)",
            self.retries.clone(),
        );
        r.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind (requests never wait for the disk)",
            self.access_log_dropped.clone(),
        );
        r.register(
            "prefix_routed",
            "Requests of endpoints that route by prompt prefix, by outcome: hit (to the replica that held the prompt's \
             longest known prefix), miss (nobody held it), over_bound (its holder was above the load bound), no_key \
             (no prompt to route by)",
            self.prefix_routed.clone(),
        );
    }

    /// `onepool_replica_*`: what the replica controllers count. sacct
    /// records a replica that drained and exited in its grace time as
    /// COMPLETED: `reclaims` is where reclaims are counted.
    fn register_controllers(&mut self) {
        let r = self.registry.sub_registry_with_prefix("replica");
        r.register("jobs", "onepoold's replicas in Slurm jobs, by kind and phase", self.replicas.clone());
        r.register("desired", "Replicas the autoscaler wants (baseline included)", self.desired.clone());
        r.register(
            "preemptions",
            "Replica jobs Slurm picked as preemption victims (their PreemptTime record, counted when they end)",
            self.preemptions.clone(),
        );
        r.register(
            "reclaims",
            "Preempted replica jobs that released their GPUs, by mode (graceful: within a grace time; immediate), from \
             each job's record when it ended",
            self.reclaims.clone(),
        );
        r.register(
            "reclaim_release_seconds",
            "From Slurm's pick of a replica job (its PreemptTime) to its end (EndTime, its GPUs free), in whole seconds \
             as Slurm keeps them",
            self.reclaim_release_seconds.clone(),
        );
        r.register("reclaim_time_to_capacity_seconds", "The job that took a reclaimed replica job's GPUs (the first to start on its nodes): from its submission to \
             its start, in whole seconds", self.reclaim_time_to_capacity_seconds.clone());
        r.register(
            "failed_starts",
            "Replica jobs that ended before serving or within their first minutes of it, or never became healthy",
            self.failed_starts.clone(),
        );
        r.register(
            "decisions",
            "Replica decisions (submit, drain, release) by mode: act (carried out) or advisory (logged, not carried out)",
            self.decisions.clone(),
        );
        r.register(
            "advised",
            "What an advisory endpoint would be doing now, by action (each counted once while it stays wanted)",
            self.advised.clone(),
        );
        r.register(
            "latency_p99_seconds",
            "Endpoints with latency targets: the p99 the autoscaler judged at its last poll, of the time to an answer's \
             first byte (what=ttft) or in the router's queue (what=queue), over the requests since the replica count \
             last changed",
            self.latency_p99.clone(),
        );
        r.register(
            "decision_log_dropped",
            "Decision log lines dropped because the writer fell behind",
            self.decision_log_dropped.clone(),
        );
        r.register(
            "backoff_failures",
            "Failed starts in a row (0: the endpoint is not backing off)",
            self.backoff_failures.clone(),
        );
        r.register(
            "backoff_seconds",
            "Seconds until the endpoint may submit a replica job again (0: now, or not backing off)",
            self.backoff_seconds.clone(),
        );
        r.register("slurm_calls", "Slurm commands the replica controllers ran, by outcome", self.slurm_calls.clone());
    }

    /// `onepool_ha_*`: which instance acts (docs/ha.md).
    fn register_ha(&mut self) {
        let r = self.registry.sub_registry_with_prefix("ha");
        r.register(
            "acting",
            "1 while this instance acts on Slurm (submits, drains, cancels), 0 while it follows",
            self.ha_acting.clone(),
        );
        r.register(
            "acting_since_seconds",
            "Since when this instance acts (Unix seconds; 0 while it follows)",
            self.ha_acting_since.clone(),
        );
        r.register(
            "last_takeover_seconds",
            "When this instance last took the lock and began to act (Unix seconds; 0: never)",
            self.ha_last_takeover.clone(),
        );
        r.register("takeovers", "Times this instance took the lock and began to act", self.ha_takeovers.clone());
        r.register(
            "lock_foreign",
            "1 while the lock is held by a connection that is not an onepoold instance of this configuration (no \
             proof made with the replica key): then no instance acts",
            self.ha_lock_foreign.clone(),
        );
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn count_request(&self, endpoint: &str, replica: &str, status: u16) {
        let class = format!("{}xx", status / 100);
        self.requests
            .get_or_create(&RequestLabels { endpoint: endpoint.to_string(), replica: replica.to_string(), class })
            .inc();
    }

    /// One Slurm command a replica controller ran, by its outcome.
    pub fn count_slurm_call(&self, endpoint: &str, call: &str, outcome: &str) {
        let labels =
            SlurmCallLabels { endpoint: endpoint.to_string(), call: call.to_string(), outcome: outcome.to_string() };
        self.slurm_calls.get_or_create(&labels).inc();
    }

    /// The request counters of one endpoint and replica (`replica` empty:
    /// answers the router gave itself), to count without building labels.
    pub fn request_counters(&self, endpoint: &str, replica: &str) -> RequestCounters {
        RequestCounters {
            family: self.requests.clone(),
            endpoint: endpoint.to_string(),
            replica: replica.to_string(),
            by_class: Default::default(),
        }
    }

    /// One replica's metrics, looked up once when the replica is added.
    pub fn replica(&self, endpoint: &str, replica: &str) -> ReplicaMetrics {
        let labels = replica_labels(endpoint, replica);
        ReplicaMetrics {
            in_flight: self.in_flight.get_or_create(&labels).clone(),
            latency: self.latency.get_or_create(&labels).clone(),
            response_idle_timeouts: self.response_idle_timeouts.get_or_create(&labels).clone(),
            requests: self.request_counters(endpoint, replica),
        }
    }

    pub fn count_retry(&self, endpoint: &str, reason: Retry) {
        let labels = UnavailableLabels { endpoint: endpoint.to_string(), reason: reason.as_str().to_string() };
        self.retries.get_or_create(&labels).inc();
    }

    /// A request of `class` (issue #44).
    pub fn count_class(&self, endpoint: &str, class: &str, what: ClassEvent) {
        let labels = ClassLabels::of(endpoint, class);
        let family = match what {
            ClassEvent::Request => &self.class_requests,
            ClassEvent::Shed => &self.class_shed,
            ClassEvent::Yielded => &self.class_yielded,
            ClassEvent::Moved => &self.class_moved,
        };
        family.get_or_create(&labels).inc();
    }

    /// An answer of `class` ended with `tokens` answer tokens.
    pub fn count_class_tokens(&self, endpoint: &str, class: &str, tokens: u64) {
        self.class_tokens.get_or_create(&ClassLabels::of(endpoint, class)).inc_by(tokens);
    }

    /// The counter of generation requests of `class` whose answer is
    /// followed (`yes`) or not, and why (issue #51).
    /// Its counter, looked up once per (class, followed) and kept by the
    /// endpoint: no label strings are made per request.
    pub fn followed_counter(&self, endpoint: &str, class: &str, followed: &str) -> Counter {
        let labels =
            FollowLabels { endpoint: endpoint.to_string(), class: class.to_string(), followed: followed.to_string() };
        self.class_followed.get_or_create(&labels).clone()
    }

    /// A class's requests, shed and yielded so far (for `onepool status`).
    pub fn class_counts(&self, endpoint: &str, class: &str) -> [u64; 3] {
        let labels = ClassLabels::of(endpoint, class);
        [&self.class_requests, &self.class_shed, &self.class_yielded].map(|f| f.get_or_create(&labels).get())
    }

    pub fn observe_class_wait(&self, endpoint: &str, class: &str, seconds: f64) {
        self.class_queue_seconds.get_or_create(&ClassLabels::of(endpoint, class)).observe(seconds);
    }

    /// An answer moved to another replica (issue #43).
    pub fn count_moved(&self, endpoint: &str, why: crate::resume::Why) {
        let labels = UnavailableLabels { endpoint: endpoint.to_string(), reason: why.as_str().to_string() };
        self.streams_moved.get_or_create(&labels).inc();
    }

    /// An answer that could not move, by
    /// [`crate::resume::moving::Failed::label`] or the body's own reason.
    pub fn count_move_failed(&self, endpoint: &str, why: &str) {
        let labels = UnavailableLabels { endpoint: endpoint.to_string(), reason: why.to_string() };
        self.stream_moves_failed.get_or_create(&labels).inc();
    }

    /// A stream the router passed without following it ended with the
    /// error event (issue #50).
    pub fn count_stream_cut(&self, endpoint: &str, why: &str) {
        let labels = UnavailableLabels { endpoint: endpoint.to_string(), reason: why.to_string() };
        self.streams_cut.get_or_create(&labels).inc();
    }

    pub fn observe_move_pause(&self, endpoint: &str, seconds: f64) {
        let labels = EndpointLabels { endpoint: endpoint.to_string() };
        self.stream_move_pause_seconds.get_or_create(&labels).observe(seconds);
    }

    pub fn count_unavailable(&self, endpoint: &str, reason: Unavailable) {
        let labels = UnavailableLabels { endpoint: endpoint.to_string(), reason: reason.as_str().to_string() };
        self.unavailable.get_or_create(&labels).inc();
    }

    pub fn queue_depth(&self, endpoint: &str) -> Gauge {
        self.queue_depth.get_or_create(&EndpointLabels { endpoint: endpoint.to_string() }).clone()
    }
}

/// `onepool_router_requests` of one endpoint and replica, by status class.
/// Each class's series is created on its first request, as
/// [`Metrics::count_request`] does, then counted without a look-up.
pub struct RequestCounters {
    family: Family<RequestLabels, Counter>,
    endpoint: String,
    replica: String,
    by_class: [OnceLock<Counter>; 10],
}

impl RequestCounters {
    pub fn count(&self, status: u16) {
        let class = usize::from(status / 100).min(9);
        self.by_class[class]
            .get_or_init(|| {
                let labels = RequestLabels {
                    endpoint: self.endpoint.clone(),
                    replica: self.replica.clone(),
                    class: format!("{class}xx"),
                };
                self.family.get_or_create(&labels).clone()
            })
            .inc();
    }
}

/// The handles of one replica's series (the same series as the families'
/// look-ups by label).
pub struct ReplicaMetrics {
    pub in_flight: Gauge,
    pub latency: Histogram,
    pub response_idle_timeouts: Counter,
    pub requests: RequestCounters,
}

pub fn replica_labels(endpoint: &str, replica: &str) -> ReplicaLabels {
    ReplicaLabels { endpoint: endpoint.to_string(), replica: replica.to_string() }
}

#[cfg(test)]
#[path = "dashboard_tests.rs"]
mod dashboard_tests;
