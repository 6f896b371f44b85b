//! What onepoold runs with once its configuration file is checked: the
//! daemon's, each endpoint's and listener's settings, and why a file was
//! refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use onepool_router::registry::HealthThresholds;
use onepool_router::settings::{ConnSettings, HealthCheck, ProxySettings, Routes};

use crate::config::ha::HaSettings;

#[derive(Clone, Debug)]
pub struct Config {
    pub control_socket: PathBuf,
    /// File mode of the control socket (0600 unless set).
    pub control_socket_mode: u32,
    pub metrics_address: Option<SocketAddr>,
    /// Tokens a scrape of the metrics listener must carry
    /// (`metrics_bearer_tokens_file`); `None`: every local process may read
    /// them.
    pub metrics_auth: Option<onepool_router::settings::BearerTokens>,
    /// How long in-flight requests may run on after SIGTERM.
    pub shutdown_grace: Duration,
    /// Request body bytes all requests in flight may hold at once (bodies
    /// are kept whole for retries); a body that would pass it gets 503.
    pub max_buffered_body_bytes: usize,
    pub endpoints: Vec<EndpointConfig>,
    /// Shared listeners that pick the endpoint per request.
    pub listeners: Vec<ListenerConfig>,
    /// SLURM_CONF for the Slurm commands the replica controllers run
    /// (`None`: the daemon's own environment decides).
    pub slurm_conf: Option<PathBuf>,
    /// The policy file the replica settings are checked against (`None`:
    /// `$ONEPOOL_POLICY`, else `onepool.toml` beside `slurm_conf`, else
    /// /etc/slurm/onepool.toml).
    pub policy: Option<PathBuf>,
    /// The replica key's file (made at the first start, readable by
    /// onepoold's user only): every request to a replica carries the key,
    /// and launchers answer nothing else ([`crate::replica_key`]).
    pub replica_key_file: PathBuf,
    /// `replica_key_file` was named: the key is read (and sent) even with
    /// no `[endpoint.replicas]`, for launchers added through the control
    /// socket.
    pub replica_key_named: bool,
    /// `[access_log]`: one JSON line per request, rotated by size.
    pub access_log: Option<onepool_router::access_log::AccessLogSettings>,
    /// `[decision_log]`: one JSON line per replica decision, rotated by
    /// size ([`onepool_decisions::decision_log`]).
    pub decision_log: Option<onepool_router::line_log::LineLogSettings>,
    /// `[ha]`: this instance's name, and the lock that decides which of
    /// several acts (none: it always acts).
    pub ha: HaSettings,
}

impl Config {
    /// Whether onepoold reads (or makes) the replica key at start: for its
    /// replicas, for launchers added by hand (`replica_key_file` named),
    /// and for the `[ha]` lock's names ([`crate::leader::names`]).
    /// `onepoold --check` checks the key's file on the same condition.
    pub fn needs_replica_key(&self) -> bool {
        self.replica_key_named || self.ha.lock.is_some() || self.endpoints.iter().any(|e| e.replicas.is_some())
    }
}

/// Where the replica key lives unless `replica_key_file` says otherwise
/// (the unit's `StateDirectory=onepool`).
pub const DEFAULT_REPLICA_KEY_FILE: &str = "/var/lib/onepool/replica.key";

#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub name: String,
    /// The endpoint's own listener; `None` when only shared listeners
    /// (`[[listener]]`) reach it.
    pub listen: Option<SocketAddr>,
    pub replica_concurrency: u32,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub proxy: ProxySettings,
    pub health: Option<HealthCheck>,
    pub thresholds: HealthThresholds,
    /// Replicas onepoold runs itself as Slurm jobs (`[endpoint.replicas]`);
    /// `None`: replicas come only through the control socket.
    pub replicas: Option<ReplicaSettings>,
    /// Request classes (issue #44): the class of requests whose key names
    /// none (`request_class`; default: the replicas' supplemental
    /// workload), and the classes the keys name, each with where (the
    /// tokens file and line). Resolved against the policy into
    /// `proxy.classes` ([`crate::policy_check::resolve_from_policy`]).
    pub request_class: Option<String>,
    pub keyed_classes: Vec<(String, String)>,
    /// `[endpoint.headroom]`, by class name: resolved with the classes.
    pub headroom: HeadroomConfig,
    /// `[endpoint.priority]`, by class name: resolved with the classes
    /// ([`crate::engine_priority`]).
    pub engine_priority: EnginePriorityConfig,
}

/// `[endpoint.priority]` as written (issue #51).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnginePriorityConfig {
    pub engine: EngineChoice,
    /// Classes with their own value, each with where it is written.
    pub values: Vec<(String, u32, String)>,
}

/// Which engine's priority the requests carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    /// The engine the replicas' command runs, when it runs it with its
    /// priority scheduling on.
    #[default]
    Auto,
    Sglang,
    Vllm,
    Off,
}

/// `[endpoint.headroom]` as written: ceilings by class name (issue #51).
#[derive(Clone, Debug, PartialEq)]
pub struct HeadroomConfig {
    /// Each class below the endpoint's own.
    pub share: f64,
    pub quiet: Duration,
    /// Classes with their own share, each with where it is written.
    pub classes: Vec<(String, f64, String)>,
}

impl Default for HeadroomConfig {
    fn default() -> HeadroomConfig {
        HeadroomConfig { share: DEFAULT_SHARE, quiet: Duration::from_secs(10), classes: Vec::new() }
    }
}

/// The classes below the endpoint's own hold at most half its own
/// replicas' slots while a class above has requests: those classes find
/// the other half free, the classes below keep half and every replica lent
/// to them. A site whose live traffic peaks above half its replicas sets
/// a lower share.
pub const DEFAULT_SHARE: f64 = 0.5;

/// `[endpoint.replicas]`: how onepoold submits, scales and drains the
/// endpoint's replica jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaSettings {
    /// The model server's command line (a shell command), run under
    /// `onepool replica`; it listens on `$ONEPOOL_BACKEND_PORT`.
    pub command: String,
    /// GPUs per replica (one node each).
    pub gpus: u32,
    /// Replicas one job hosts, each on its own node (default 1). Above 1 a
    /// job runs one `srun` step per node and scales down node by node:
    /// the drained replica's node is released with `scontrol update
    /// JobId=.. NodeList=<the rest>`.
    pub replicas_per_job: u32,
    /// Baseline replicas (protected class), always kept.
    pub min: u32,
    /// Baseline plus supplemental (flexible class) replicas at most.
    pub max: u32,
    /// Requests in flight plus queued that one replica should carry.
    pub target_per_replica: f64,
    pub drain_timeout: Duration,
    /// Longest model load: a replica not ready this long after it started
    /// running is cancelled and replaced.
    pub startup_timeout: Duration,
    pub baseline_workload: String,
    pub supplemental_workload: String,
    /// The class of replicas submitted for demand that only request classes
    /// below the endpoint's own bring (issue #44). As written, `None` means
    /// automatic and "off" none; once resolved from the policy
    /// ([`crate::policy_check::resolve_from_policy`]) it is the class, or
    /// `None` for none: the flexible class ranked next below the endpoint's
    /// own request class (its warm class aside), when its requests have classes.
    pub lower_workload: Option<String>,
    /// Ports for the replicas' listeners (each replica takes a pair: the
    /// launcher's port and, one above, its server's).
    pub port_range: (u16, u16),
    /// The `onepool` binary on the compute nodes.
    pub launcher: String,
    pub poll_interval: Duration,
    /// The jobs' `--time`; `None`: the class's default.
    pub time_limit: Option<Duration>,
    /// Autoscaler windows (Knative KPA style).
    pub stable_window: Duration,
    pub panic_window: Duration,
    pub panic_threshold: f64,
    pub scale_down_delay: Duration,
    /// sbatch `-o` of the replica jobs.
    pub output: String,
    /// Metrics whose samples, summed, are one replica's load instead of
    /// the router's count of its requests in flight (empty: the router's).
    pub load_metrics: Vec<String>,
    /// Where the replicas serve those metrics.
    pub metrics_path: String,
    /// The paths the replicas' launchers pass on (filled from the health
    /// check's and metrics' paths; see [`serve_paths`]).
    pub serve_paths: Vec<String>,
    /// How far ahead the autoscaler projects a rising load (zero: not).
    pub trend_horizon: Duration,
    /// Warm headroom on idle pool GPUs (`[endpoint.replicas.warm]`).
    pub warm: Option<WarmSettings>,
    /// `[endpoint.replicas.latency]`: latency targets the autoscaler adds
    /// replicas for (issue #28); `None`: the in-flight rule alone.
    pub latency: Option<onepool_decisions::latency::LatencyTargets>,
    /// Decide every round, act on nothing: the decisions go to the log,
    /// the metrics and the decision log only (`advisory` here or at the
    /// top of the file).
    pub advisory: bool,
    /// Filled at start from the policy: its classes reclaimed immediately
    /// (GraceTime 0). A replica in one is submitted `--reclaim immediate`,
    /// so its launcher cuts at Slurm's SIGTERM instead of draining while
    /// the protected job waits for the GPUs.
    pub immediate_classes: Vec<String>,
    /// How the router reaches the replicas (`transport`, issue #36).
    pub transport: ReplicaTransport,
}

/// `[endpoint.replicas] transport`: TLS pinned to the certificate each
/// launcher reports (the default), or clear HTTP, where the replica key
/// and every prompt cross the cluster network readable to anyone on it
/// (`onepool doctor` warns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicaTransport {
    #[default]
    Tls,
    Plain,
}

impl ReplicaTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaTransport::Tls => "tls",
            ReplicaTransport::Plain => "plain",
        }
    }
}

/// `[endpoint.replicas.warm]`: replicas kept loaded above the load's need
/// while no job waits for the pool's GPUs
/// ([`onepool_decisions::replicas::Headroom`]).
#[derive(Clone, Debug, PartialEq)]
pub struct WarmSettings {
    /// Their class: flexible, ranked below every other flexible class.
    pub workload: String,
    pub spec: onepool_decisions::replicas::WarmSpec,
    /// Filled at start from the policy: the pool's partitions (where a
    /// waiting job wants the GPUs) and the warm classes' QOS (whose
    /// waiting jobs want nothing).
    pub scope: PoolScope,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolScope {
    pub partitions: Vec<String>,
    pub warm_qos: Vec<String>,
}

/// One shared listener: every request is routed to an endpoint by its
/// `Host`, its path prefix, or the OpenAI `model` field of its JSON body.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub listen: SocketAddr,
    pub routes: Routes,
    pub conn: ConnSettings,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);
