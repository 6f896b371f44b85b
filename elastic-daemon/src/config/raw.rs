//! The file's tables as serde reads them: every value with its place
//! (`Spanned`), so each problem is reported at its line and column, and
//! every unknown key refused.

#[allow(unused_imports)]
use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) control_socket: Spanned<String>,
    pub(super) control_socket_mode: Option<Spanned<String>>,
    pub(super) metrics_address: Option<Spanned<String>>,
    pub(super) metrics_bearer_tokens_file: Option<Spanned<String>>,
    pub(super) shutdown_grace: Option<Spanned<String>>,
    pub(super) max_buffered_body_bytes: Option<Spanned<i64>>,
    pub(super) slurm_conf: Option<Spanned<String>>,
    pub(super) replica_key_file: Option<Spanned<String>>,
    pub(super) policy: Option<Spanned<String>>,
    pub(super) access_log: Option<Spanned<RawAccessLog>>,
    #[serde(default)]
    pub(super) endpoint: Vec<Spanned<RawEndpoint>>,
    #[serde(default)]
    pub(super) listener: Vec<Spanned<RawListener>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    pub(super) path: Spanned<String>,
    pub(super) max_file_bytes: Option<Spanned<i64>>,
    pub(super) keep_files: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub(super) listen: Spanned<String>,
    pub(super) by: Spanned<String>,
    pub(super) max_model_body: Option<Spanned<i64>>,
    pub(super) model_body_timeout: Option<Spanned<String>>,
    pub(super) header_read_timeout: Option<Spanned<String>>,
    pub(super) max_header_bytes: Option<Spanned<i64>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) max_connections_per_ip: Option<Spanned<i64>>,
    pub(super) http2_idle_timeout: Option<Spanned<String>>,
    pub(super) tls: Option<RawTls>,
    #[serde(default)]
    pub(super) route: Vec<Spanned<RawRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) endpoint: Spanned<String>,
    pub(super) host: Option<Spanned<String>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) model: Option<Spanned<String>>,
    pub(super) strip_prefix: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    pub(super) name: Spanned<String>,
    pub(super) listen: Option<Spanned<String>>,
    pub(super) replica_concurrency: Option<Spanned<i64>>,
    pub(super) queue_size: Option<Spanned<i64>>,
    pub(super) queue_timeout: Option<Spanned<String>>,
    pub(super) request_timeout: Option<Spanned<String>>,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) header_read_timeout: Option<Spanned<String>>,
    pub(super) max_header_bytes: Option<Spanned<i64>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) max_connections_per_ip: Option<Spanned<i64>>,
    pub(super) http2_idle_timeout: Option<Spanned<String>>,
    pub(super) max_request_body: Option<Spanned<i64>>,
    pub(super) body_read_timeout: Option<Spanned<String>>,
    pub(super) response_idle_timeout: Option<Spanned<String>>,
    pub(super) retry: Option<RawRetry>,
    pub(super) routing: Option<Spanned<RawRouting>>,
    pub(super) health: Option<RawHealth>,
    pub(super) auth: Option<RawAuth>,
    pub(super) tls: Option<RawTls>,
    pub(super) replicas: Option<Spanned<RawReplicas>>,
}

/// `[endpoint.tls]`, `[listener.tls]`: the listener terminates TLS.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    /// The chain, leaf first (PEM).
    pub(super) cert_file: Spanned<String>,
    /// Its private key (PEM), readable by the daemon's user only.
    pub(super) key_file: Spanned<String>,
}

/// `[endpoint.auth]`: requests must carry one of these bearer tokens.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    /// One token per line; `#` starts a comment. Readable by the daemon's
    /// user only.
    pub(super) bearer_tokens_file: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplicas {
    pub(super) command: Spanned<String>,
    pub(super) gpus: Option<Spanned<i64>>,
    pub(super) replicas_per_job: Option<Spanned<i64>>,
    pub(super) min: Option<Spanned<i64>>,
    pub(super) max: Option<Spanned<i64>>,
    pub(super) target_per_replica: Option<Spanned<f64>>,
    pub(super) drain_timeout: Option<Spanned<String>>,
    pub(super) startup_timeout: Option<Spanned<String>>,
    pub(super) baseline_workload: Option<Spanned<String>>,
    pub(super) supplemental_workload: Option<Spanned<String>>,
    pub(super) port_range: Option<Spanned<String>>,
    pub(super) launcher: Option<Spanned<String>>,
    pub(super) poll_interval: Option<Spanned<String>>,
    pub(super) time_limit: Option<Spanned<String>>,
    pub(super) stable_window: Option<Spanned<String>>,
    pub(super) panic_window: Option<Spanned<String>>,
    pub(super) panic_threshold: Option<Spanned<f64>>,
    pub(super) scale_down_delay: Option<Spanned<String>>,
    pub(super) output: Option<Spanned<String>>,
    /// Metric names, or "auto" for the model servers onepool knows
    /// ([`crate::replica_metrics::KNOWN_SERVERS`]); read as a value so that
    /// a wrong type gets this key's own message.
    pub(super) load_metrics: Option<Spanned<toml::Value>>,
    pub(super) metrics_path: Option<Spanned<String>>,
    pub(super) trend_horizon: Option<Spanned<String>>,
    pub(super) warm: Option<Spanned<RawWarm>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWarm {
    pub(super) workload: Option<Spanned<String>>,
    pub(super) replicas: Option<Spanned<i64>>,
    pub(super) fraction: Option<Spanned<f64>>,
}

/// `[endpoint.routing]`: how a replica is picked for a request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    /// "least_outstanding" (the default) or "prefix".
    pub(super) policy: Option<Spanned<String>>,
    pub(super) block_bytes: Option<Spanned<i64>>,
    pub(super) load_bound: Option<Spanned<f64>>,
    pub(super) table_entries: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) attempts: Option<Spanned<i64>>,
    pub(super) idempotent: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) path: Spanned<String>,
    pub(super) interval: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) healthy_after: Option<Spanned<i64>>,
    pub(super) unhealthy_after: Option<Spanned<i64>>,
}
