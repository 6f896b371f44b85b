//! onepoold.toml's keys and tables, defined once for both ways: onepoold
//! reads the file into these types ([`Raw`] form) and checks it
//! ([`super::parse`]); the demo, the cluster tests and the benchmarks build
//! them ([`Typed`] form, the default) and write them with `toml`.
//!
//! A key left `None` is left out of the file and takes [`super::parse`]'s
//! default. The order of the fields is the order of the keys in the
//! messages about an unknown one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::form::{as_text, Form, Raw, Typed};

/// onepoold's configuration file: `ConfigFile` as a program builds it,
/// `ConfigFile<Raw>` as onepoold reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct ConfigFile<F: Form = Typed> {
    /// Written as `#` lines at the top, e.g. who wrote the file; not read.
    #[serde(skip)]
    pub comment: Option<String>,
    pub control_socket: F::Path,
    #[serde(default, with = "as_text")]
    pub control_socket_mode: Option<F::Mode>,
    #[serde(default, with = "as_text")]
    pub metrics_address: Option<F::Address>,
    pub metrics_bearer_tokens_file: Option<F::Path>,
    #[serde(default, with = "as_text")]
    pub shutdown_grace: Option<F::Duration>,
    pub max_buffered_body_bytes: Option<F::Usize>,
    pub slurm_conf: Option<F::Path>,
    pub replica_key_file: Option<F::Path>,
    pub policy: Option<F::Path>,
    pub access_log: Option<F::Table<AccessLogFile<F>>>,
    /// Every endpoint's replica decisions logged, never carried out.
    pub advisory: Option<F::Bool>,
    /// `[decision_log]`: the replica decisions, a JSON line each (the same
    /// keys as `[access_log]`).
    pub decision_log: Option<F::Table<AccessLogFile<F>>>,
    #[serde(rename = "endpoint", default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<F::Table<EndpointFile<F>>>,
    #[serde(rename = "listener", default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<F::Table<ListenerFile<F>>>,
    /// `[ha]`: several instances, one acting ([`super::HaSettings`]).
    pub ha: Option<F::Table<HaFile<F>>>,
}

/// `[ha]`: see [`super::HaSettings`] and [`super::LockSettings`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct HaFile<F: Form = Typed> {
    pub instance: Option<F::Text>,
    /// "none" (the default) or "mariadb".
    pub lock: Option<F::Text>,
    /// The accounting database server, "HOST:PORT".
    pub database: Option<F::Text>,
    pub user: Option<F::Text>,
    pub password_file: Option<F::Path>,
    pub ca_file: Option<F::Path>,
    pub lock_name: Option<F::Text>,
    #[serde(default, with = "as_text")]
    pub check_interval: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub lost_after: Option<F::Duration>,
}

/// `[access_log]`, and `[decision_log]` with the same keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct AccessLogFile<F: Form = Typed> {
    pub path: F::Path,
    pub max_file_bytes: Option<F::U64>,
    pub keep_files: Option<F::U32>,
}

/// One `[[endpoint]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct EndpointFile<F: Form = Typed> {
    pub name: F::Text,
    #[serde(default, with = "as_text")]
    pub listen: Option<F::Address>,
    pub replica_concurrency: Option<F::U32>,
    pub queue_size: Option<F::Usize>,
    #[serde(default, with = "as_text")]
    pub queue_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub request_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub connect_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub header_read_timeout: Option<F::Duration>,
    pub max_header_bytes: Option<F::Usize>,
    pub max_connections: Option<F::Usize>,
    pub max_connections_per_ip: Option<F::Usize>,
    #[serde(default, with = "as_text")]
    pub http2_idle_timeout: Option<F::Duration>,
    pub max_request_body: Option<F::Usize>,
    #[serde(default, with = "as_text")]
    pub body_read_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub response_idle_timeout: Option<F::Duration>,
    pub retry: Option<RetryFile<F>>,
    pub routing: Option<RoutingFile<F>>,
    pub health: Option<HealthFile<F>>,
    pub auth: Option<AuthFile<F>>,
    pub tls: Option<TlsFile<F>>,
    pub resume: Option<Box<ResumeFile<F>>>,
    pub headroom: Option<Box<HeadroomFile<F>>>,
    pub priority: Option<Box<PriorityFile<F>>>,
    /// The class of requests whose API key names none (issue #44).
    pub request_class: Option<F::Text>,
    pub replicas: Option<F::Table<ReplicasFile<F>>>,
}

/// `[endpoint.resume]`: answers continued on another replica when theirs
/// cannot finish them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct ResumeFile<F: Form = Typed> {
    /// "auto" (the default), "tokens", "text" or "off".
    pub method: Option<F::Text>,
    pub max_moves: Option<F::U32>,
    /// A seed of the router's for streams without the client's (default
    /// true).
    pub seed: Option<F::Bool>,
}

/// `[endpoint.headroom]`: the share of the endpoint's own replicas' slots
/// a class, with those below it, may hold while a class above it has
/// requests (issue #51).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct HeadroomFile<F: Form = Typed> {
    /// Each class below the endpoint's own, 0 to 1 (1: no ceiling).
    pub share: Option<F::Float>,
    /// How long a class counts as having requests after its last one.
    #[serde(default, with = "as_text")]
    pub quiet: Option<F::Duration>,
    /// A class's own share, in place of `share`.
    pub classes: Option<std::collections::BTreeMap<String, F::Float>>,
}

/// `[endpoint.priority]`: each request's class sent as the engine's own
/// `priority` (issue #51).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct PriorityFile<F: Form = Typed> {
    /// "auto" (the default: from the replicas' command), "sglang", "vllm"
    /// or "off".
    pub engine: Option<F::Text>,
    /// A class's own value, in place of the one from its rank.
    pub values: Option<std::collections::BTreeMap<String, F::U32>>,
}

/// `[endpoint.retry]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct RetryFile<F: Form = Typed> {
    pub attempts: Option<F::U32>,
    pub idempotent: Option<F::Bool>,
}

/// `[endpoint.routing]`: how a replica is picked for a request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct RoutingFile<F: Form = Typed> {
    /// "least_outstanding" (the default) or "prefix".
    pub policy: Option<F::Text>,
    pub block_bytes: Option<F::Usize>,
    pub load_bound: Option<F::Float>,
    pub table_entries: Option<F::Usize>,
}

/// `[endpoint.health]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct HealthFile<F: Form = Typed> {
    pub path: F::Text,
    #[serde(default, with = "as_text")]
    pub interval: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub timeout: Option<F::Duration>,
    pub healthy_after: Option<F::U32>,
    pub unhealthy_after: Option<F::U32>,
}

/// `[endpoint.auth]`: requests must carry one of these bearer tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct AuthFile<F: Form = Typed> {
    /// One token per line; `#` starts a comment. Readable by the daemon's
    /// user only.
    pub bearer_tokens_file: F::Path,
}

/// `[endpoint.tls]`, `[listener.tls]`: the listener terminates TLS.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct TlsFile<F: Form = Typed> {
    /// The chain, leaf first (PEM).
    pub cert_file: F::Path,
    /// Its private key (PEM), readable by the daemon's user only.
    pub key_file: F::Path,
}

/// `[endpoint.replicas]`: see [`super::ReplicaSettings`] for each key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct ReplicasFile<F: Form = Typed> {
    pub command: F::Text,
    pub gpus: Option<F::U32>,
    pub replicas_per_job: Option<F::U32>,
    pub min: Option<F::U32>,
    pub max: Option<F::U32>,
    pub target_per_replica: Option<F::Float>,
    #[serde(default, with = "as_text")]
    pub drain_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub startup_timeout: Option<F::Duration>,
    pub baseline_workload: Option<F::Text>,
    pub supplemental_workload: Option<F::Text>,
    /// The class of replicas for demand only lower request classes bring
    /// (issue #44): a class name, or "off".
    pub lower_workload: Option<F::Text>,
    #[serde(default, with = "as_text")]
    pub port_range: Option<F::Ports>,
    pub launcher: Option<F::Text>,
    #[serde(default, with = "as_text")]
    pub poll_interval: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub time_limit: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub stable_window: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub panic_window: Option<F::Duration>,
    pub panic_threshold: Option<F::Float>,
    #[serde(default, with = "as_text")]
    pub scale_down_delay: Option<F::Duration>,
    pub output: Option<F::Text>,
    /// Metric names, or "auto" for the model servers onepool knows
    /// ([`crate::replica_metrics::KNOWN_SERVERS`]).
    pub load_metrics: Option<F::Metrics>,
    pub metrics_path: Option<F::Text>,
    #[serde(default, with = "as_text")]
    pub trend_horizon: Option<F::Duration>,
    pub warm: Option<F::Table<WarmFile<F>>>,
    /// This endpoint's replica decisions logged, never carried out.
    pub advisory: Option<F::Bool>,
    pub latency: Option<F::Table<LatencyFile<F>>>,
    /// "tls" (the default) or "plain": how the router reaches the replicas.
    pub transport: Option<F::Text>,
}

/// `[endpoint.replicas.warm]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct WarmFile<F: Form = Typed> {
    pub workload: Option<F::Text>,
    pub replicas: Option<F::U32>,
    pub fraction: Option<F::Float>,
}

/// `[endpoint.replicas.latency]`: targets the autoscaler holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct LatencyFile<F: Form = Typed> {
    /// p99 of the time to an answer's first byte, queueing included.
    #[serde(default, with = "as_text")]
    pub ttft_p99: Option<F::Duration>,
    /// p99 of the time a request waits in the router's queue.
    #[serde(default, with = "as_text")]
    pub queue_p99: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub window: Option<F::Duration>,
    pub min_samples: Option<F::U32>,
}

/// One `[[listener]]`: a listener shared by endpoints, routing `by` "host",
/// "path" or "model".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct ListenerFile<F: Form = Typed> {
    #[serde(with = "as_text")]
    pub listen: F::Address,
    pub by: F::Text,
    pub max_model_body: Option<F::Usize>,
    #[serde(default, with = "as_text")]
    pub model_body_timeout: Option<F::Duration>,
    #[serde(default, with = "as_text")]
    pub header_read_timeout: Option<F::Duration>,
    pub max_header_bytes: Option<F::Usize>,
    pub max_connections: Option<F::Usize>,
    pub max_connections_per_ip: Option<F::Usize>,
    #[serde(default, with = "as_text")]
    pub http2_idle_timeout: Option<F::Duration>,
    pub tls: Option<TlsFile<F>>,
    #[serde(rename = "route", default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<F::Table<RouteFile<F>>>,
}

/// One `[[listener.route]]`: the listener's `by` key, and the endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct RouteFile<F: Form = Typed> {
    pub endpoint: F::Text,
    pub host: Option<F::Text>,
    pub path: Option<F::Text>,
    pub model: Option<F::Text>,
    pub strip_prefix: Option<F::Bool>,
}

/// The file as onepoold read it, before its values are checked.
pub(super) type RawFile = ConfigFile<Raw>;

/// Not derived: that would ask `Default` of an address (`SocketAddr`), if
/// only behind an `Option`.
impl Default for ConfigFile {
    fn default() -> ConfigFile {
        ConfigFile {
            comment: None,
            control_socket: PathBuf::new(),
            control_socket_mode: None,
            metrics_address: None,
            metrics_bearer_tokens_file: None,
            shutdown_grace: None,
            max_buffered_body_bytes: None,
            slurm_conf: None,
            replica_key_file: None,
            policy: None,
            access_log: None,
            advisory: None,
            decision_log: None,
            endpoints: Vec::new(),
            listeners: Vec::new(),
            ha: None,
        }
    }
}

/// Not derived: as [`ConfigFile`]'s.
impl Default for EndpointFile {
    fn default() -> EndpointFile {
        EndpointFile {
            name: String::new(),
            listen: None,
            replica_concurrency: None,
            queue_size: None,
            queue_timeout: None,
            request_timeout: None,
            connect_timeout: None,
            header_read_timeout: None,
            max_header_bytes: None,
            max_connections: None,
            max_connections_per_ip: None,
            http2_idle_timeout: None,
            max_request_body: None,
            body_read_timeout: None,
            response_idle_timeout: None,
            retry: None,
            routing: None,
            health: None,
            auth: None,
            tls: None,
            resume: None,
            headroom: None,
            priority: None,
            request_class: None,
            replicas: None,
        }
    }
}

impl ConfigFile {
    pub fn new(control_socket: impl Into<PathBuf>) -> ConfigFile {
        ConfigFile { control_socket: control_socket.into(), ..ConfigFile::default() }
    }

    /// The file's text: the comment, then the keys as [`super::parse`]
    /// reads them.
    ///
    /// # Panics
    ///
    /// On a count beyond TOML's integers (above `i64::MAX`), which onepoold
    /// would refuse anyway.
    pub fn to_toml(&self) -> String {
        let mut text = String::new();
        for line in self.comment.iter().flat_map(|c| c.lines()) {
            // TOML comments hold no control characters but tabs.
            let line: String = line.chars().map(|c| if c.is_control() && c != '\t' { '\u{fffd}' } else { c }).collect();
            text.push('#');
            if !line.is_empty() {
                text.push(' ');
                text.push_str(&line);
            }
            text.push('\n');
        }
        text + &toml::to_string(self).unwrap_or_else(|e| panic!("onepoold.toml cannot hold a value: {e}"))
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_toml())
    }
}

impl EndpointFile {
    pub fn new(name: impl Into<String>) -> EndpointFile {
        EndpointFile { name: name.into(), ..EndpointFile::default() }
    }
}

impl HealthFile {
    pub fn new(path: impl Into<String>) -> HealthFile {
        HealthFile { path: path.into(), ..HealthFile::default() }
    }
}

impl ReplicasFile {
    pub fn new(command: impl Into<String>) -> ReplicasFile {
        ReplicasFile { command: command.into(), ..ReplicasFile::default() }
    }
}

impl ListenerFile {
    /// A listener at `listen` routing by `by` ("host", "path" or "model").
    pub fn new(listen: std::net::SocketAddr, by: impl Into<String>) -> ListenerFile {
        ListenerFile {
            listen,
            by: by.into(),
            max_model_body: None,
            model_body_timeout: None,
            header_read_timeout: None,
            max_header_bytes: None,
            max_connections: None,
            max_connections_per_ip: None,
            http2_idle_timeout: None,
            tls: None,
            routes: Vec::new(),
        }
    }
}
