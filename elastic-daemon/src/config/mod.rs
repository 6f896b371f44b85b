//! onepoold's TOML configuration. The whole file is checked and every
//! problem reported as FILE:LINE:COL before the daemon refuses to start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use onepool_decisions::policy::Diagnostic;
use onepool_router::registry::HealthThresholds;
use onepool_router::settings::{HealthCheck, ProxySettings};

use file::RawFile;

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
}

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

/// The listener settings the router reads, defined with its other settings.
pub use onepool_router::settings::{ConnSettings, PathRoute, Routes, MODEL_PATHS};

#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

struct Checker {
    diags: Vec<Diagnostic>,
}

/// `[access_log]`: a path (absolute: the daemon's working directory is
/// no place for it), and bounds on each file and on how many are kept.
fn access_log(c: &mut Checker, a: &AccessLogFile<Raw>) -> onepool_router::access_log::AccessLogSettings {
    let path = PathBuf::from(a.path.get_ref());
    if !path.is_absolute() {
        c.error(a.path.span(), format!("access_log.path {:?} must be an absolute path", a.path.get_ref()));
    }
    onepool_router::access_log::AccessLogSettings {
        path,
        max_file_bytes: c.number(&a.max_file_bytes, "access_log.max_file_bytes", 64 << 10, 1 << 40, 100 << 20) as u64,
        keep_files: c.number(&a.keep_files, "access_log.keep_files", 1, 100, 5) as u32,
    }
}

impl Checker {
    fn error(&mut self, span: Range<usize>, msg: String) {
        self.diags.push(Diagnostic::error(Some(span), msg));
    }

    fn duration(&mut self, v: &Option<At<String>>, key: &str, default: Duration) -> Duration {
        let Some(v) = v else { return default };
        match onepool_decisions::duration::parse_millis(v.get_ref()) {
            Ok(d) if d.is_zero() => {
                self.error(v.span(), format!("{key} must be longer than zero"));
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.error(v.span(), format!("{key}: {e}"));
                default
            }
        }
    }

    fn number(&mut self, v: &Option<At<i64>>, key: &str, min: i64, max: i64, default: i64) -> i64 {
        let Some(v) = v else { return default };
        let n = *v.get_ref();
        if n < min || n > max {
            self.error(v.span(), format!("{key} = {n} is out of range; use {min} to {max}"));
            return default;
        }
        n
    }

    fn address(&mut self, v: &At<String>, key: &str) -> Option<SocketAddr> {
        match v.get_ref().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.error(
                    v.span(),
                    format!("{key} = {:?} is not an IP address with a port (127.0.0.1:8000, [::1]:8000)", v.get_ref()),
                );
                None
            }
        }
    }
}

/// Shortest token accepted: shorter ones can be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// The tokens of `[endpoint.auth] bearer_tokens_file`, or an error at the
/// key: the file is unreadable, open to anyone but its owner, empty, or
/// holds a short token.
fn bearer_tokens(c: &mut Checker, path: &At<String>, key: &str) -> Option<onepool_router::settings::BearerTokens> {
    use std::os::unix::fs::PermissionsExt;
    let (file, span) = (path.get_ref(), path.span());
    let text = match std::fs::metadata(file).and_then(|m| Ok((m, std::fs::read_to_string(file)?))) {
        Ok((m, _)) if m.permissions().mode() & 0o077 != 0 => {
            let mode = m.permissions().mode() & 0o777;
            c.error(span, format!("{key} {file:?} is readable or writable by others (mode {mode:o}): chmod 600 it and make onepoold's user its owner"));
            return None;
        }
        Ok((_, text)) => text,
        Err(e) => {
            c.error(span, format!("{key} {file:?}: cannot read it: {e}"));
            return None;
        }
    };
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.split('#').next().unwrap_or("").trim();
        if t.is_empty() {
            continue;
        }
        if t.len() < MIN_TOKEN_LEN || t.contains(char::is_whitespace) || !t.is_ascii() {
            c.error(span.clone(), format!("{key} {file:?} line {}: a token is one word of at least {MIN_TOKEN_LEN} ASCII characters (e.g. `openssl rand -hex 32`)", i + 1));
            return None;
        }
        tokens.push(t.to_string());
    }
    if tokens.is_empty() {
        c.error(span, format!("{key} {file:?} holds no token: every request would be refused"));
        return None;
    }
    Some(onepool_router::settings::BearerTokens::new(tokens))
}

/// Parses and checks `source`; `file` names it in every error.
pub fn parse(file: &str, source: &str) -> Result<Config, ConfigError> {
    let raw: RawFile = toml::from_str(source).map_err(|e| {
        let d = Diagnostic::error(e.span(), e.message().to_string());
        ConfigError(vec![d.render(file, source)])
    })?;
    let mut c = Checker { diags: Vec::new() };
    let control_socket_mode = control_socket_mode(&mut c, &raw);
    let metrics_address = metrics_address(&mut c, &raw);
    let metrics_auth =
        raw.metrics_bearer_tokens_file.as_ref().and_then(|f| bearer_tokens(&mut c, f, "metrics_bearer_tokens_file"));
    let shutdown_grace = c.duration(&raw.shutdown_grace, "shutdown_grace", Duration::from_secs(30));
    let access_log = raw.access_log.as_ref().map(|a| access_log(&mut c, a.get_ref()));
    let max_buffered_body_bytes =
        c.number(&raw.max_buffered_body_bytes, "max_buffered_body_bytes", 1 << 20, 1 << 40, 256 << 20) as usize;
    if raw.endpoints.is_empty() {
        c.diags.push(Diagnostic::error(None, "no [[endpoint]]; add at least one with name and listen".to_string()));
    }
    let mut names: BTreeMap<String, Range<usize>> = BTreeMap::new();
    let mut listens: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let endpoints: Vec<EndpointConfig> = raw
        .endpoints
        .iter()
        .map(|e| endpoint(&mut c, e.get_ref(), &raw, max_buffered_body_bytes, &mut names, &mut listens))
        .collect();
    let listeners = listeners(&mut c, &raw.listeners, &names, &mut listens, max_buffered_body_bytes);
    check_reachable(&mut c, &raw.endpoints, &listeners);
    if c.diags.iter().any(|d| d.is_error()) {
        return Err(ConfigError(c.diags.iter().map(|d| d.render(file, source)).collect()));
    }
    Ok(Config {
        control_socket: PathBuf::from(raw.control_socket.into_inner()),
        control_socket_mode,
        metrics_address,
        metrics_auth,
        shutdown_grace,
        max_buffered_body_bytes,
        endpoints,
        listeners,
        slurm_conf: raw.slurm_conf.map(|s| PathBuf::from(s.into_inner())),
        replica_key_named: raw.replica_key_file.is_some(),
        replica_key_file: raw
            .replica_key_file
            .map_or_else(|| PathBuf::from(DEFAULT_REPLICA_KEY_FILE), |s| PathBuf::from(s.into_inner())),
        policy: raw.policy.map(|s| PathBuf::from(s.into_inner())),
        access_log,
    })
}

/// The control socket's mode (default 0600; never open to others), and a
/// check that it has a path.
fn control_socket_mode(c: &mut Checker, raw: &RawFile) -> u32 {
    if raw.control_socket.get_ref().is_empty() {
        c.error(
            raw.control_socket.span(),
            "control_socket is empty; give a path like /run/onepool/onepoold.sock".into(),
        );
    }
    match &raw.control_socket_mode {
        None => 0o600,
        Some(m) => match u32::from_str_radix(m.get_ref(), 8) {
            Ok(v) if v & 0o777 == v && v & 0o007 == 0 => v,
            _ => {
                c.error(m.span(), format!("control_socket_mode = {:?}: expected an octal mode without access for others, like \"0600\" or \"0660\"", m.get_ref()));
                0o600
            }
        },
    }
}

/// Where the metrics are served: loopback only.
fn metrics_address(c: &mut Checker, raw: &RawFile) -> Option<SocketAddr> {
    let a = raw.metrics_address.as_ref()?;
    let addr = c.address(a, "metrics_address")?;
    if !addr.ip().is_loopback() {
        c.error(
            a.span(),
            format!("metrics_address {addr} is not a loopback address; metrics are served on 127.0.0.1 or ::1 only"),
        );
    }
    Some(addr)
}

/// One `[[endpoint]]`; `names` and `listens` collect what the endpoints
/// before it took, so that a second use is an error at its key.
fn endpoint(
    c: &mut Checker,
    e: &EndpointFile<Raw>,
    raw: &RawFile,
    max_buffered_body_bytes: usize,
    names: &mut BTreeMap<String, Range<usize>>,
    listens: &mut BTreeMap<SocketAddr, String>,
) -> EndpointConfig {
    let name = e.name.get_ref().clone();
    if name.is_empty() || !name.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)) {
        c.error(e.name.span(), format!("endpoint name {name:?} must be non-empty letters, digits, '-', '_' or '.'"));
    }
    if names.insert(name.clone(), e.name.span()).is_some() {
        c.error(e.name.span(), format!("endpoint {name:?} is defined twice; endpoint names must be unique"));
    }
    let listen = e.listen.as_ref().and_then(|l| c.address(l, "listen"));
    // Port 0 lets the kernel choose, so it never collides.
    if let (Some(l), Some(raw)) = (listen.filter(|l| l.port() != 0), &e.listen) {
        if let Some(other) = listens.insert(l, format!("endpoint {name:?}")) {
            c.error(raw.span(), format!("listen {l} is also used by {other}; give each its own address"));
        }
    }
    let proxy = proxy_settings(c, e, raw, &name, max_buffered_body_bytes);
    let (health, thresholds) = health(c, e.health.as_ref());
    let mut replicas = e.replicas.as_ref().map(|r| replica_settings(c, r));
    if let Some(r) = &mut replicas {
        r.serve_paths = serve_paths(health.as_ref().map(|h| h.path.as_str()), &r.metrics_path);
    }
    EndpointConfig {
        name,
        listen,
        replica_concurrency: c.number(&e.replica_concurrency, "replica_concurrency", 1, 100_000, 8) as u32,
        queue_size: c.number(&e.queue_size, "queue_size", 0, 1_000_000, 256) as usize,
        queue_timeout: c.duration(&e.queue_timeout, "queue_timeout", Duration::from_secs(10)),
        proxy,
        health,
        thresholds,
        replicas,
    }
}

/// How the endpoint's requests are proxied: limits, timeouts, retries,
/// its listener's connections and its API keys.
fn proxy_settings(
    c: &mut Checker,
    e: &EndpointFile<Raw>,
    raw: &RawFile,
    name: &str,
    max_buffered_body_bytes: usize,
) -> ProxySettings {
    let retry = e.retry.as_ref();
    let attempts = retry.map(|r| c.number(&r.attempts, "retry.attempts", 0, 10, 2)).unwrap_or(2);
    let conn = conn_settings(
        c,
        [&e.header_read_timeout, &e.http2_idle_timeout],
        [&e.max_header_bytes, &e.max_connections, &e.max_connections_per_ip],
        e.tls.as_ref(),
    );
    let max_request_body = c.number(&e.max_request_body, "max_request_body", 1, 1 << 30, 8 << 20) as usize;
    if max_request_body > max_buffered_body_bytes {
        let span = e.max_request_body.as_ref().or(raw.max_buffered_body_bytes.as_ref()).map(|v| v.span());
        c.diags.push(Diagnostic::error(
            span,
            format!("max_request_body = {max_request_body} of endpoint {name:?} is above max_buffered_body_bytes = {max_buffered_body_bytes}; its largest requests could never be served"),
        ));
    }
    ProxySettings {
        request_timeout: c.duration(&e.request_timeout, "request_timeout", Duration::from_secs(300)),
        connect_timeout: c.duration(&e.connect_timeout, "connect_timeout", Duration::from_secs(2)),
        max_request_body,
        body_read_timeout: c.duration(&e.body_read_timeout, "body_read_timeout", Duration::from_secs(30)),
        response_idle_timeout: c.duration(&e.response_idle_timeout, "response_idle_timeout", Duration::from_secs(60)),
        retries: attempts as u32,
        idempotent: retry.and_then(|r| r.idempotent.as_ref()).is_some_and(|i| *i.get_ref()),
        conn,
        auth: e.auth.as_ref().and_then(|a| bearer_tokens(c, &a.bearer_tokens_file, "auth.bearer_tokens_file")),
    }
}

/// `[endpoint.health]`: the check and how many results in a row move a
/// replica in or out (defaults without the table).
fn health(c: &mut Checker, h: Option<&HealthFile<Raw>>) -> (Option<HealthCheck>, HealthThresholds) {
    let Some(h) = h else { return (None, HealthThresholds::default()) };
    if !h.path.get_ref().starts_with('/') {
        c.error(h.path.span(), format!("health.path {:?} must start with '/'", h.path.get_ref()));
    }
    let check = HealthCheck {
        path: h.path.get_ref().clone(),
        interval: c.duration(&h.interval, "health.interval", Duration::from_secs(2)),
        timeout: c.duration(&h.timeout, "health.timeout", Duration::from_secs(1)),
    };
    let t = HealthThresholds {
        healthy_after: c.number(&h.healthy_after, "health.healthy_after", 1, 100, 2) as u32,
        unhealthy_after: c.number(&h.unhealthy_after, "health.unhealthy_after", 1, 100, 3) as u32,
    };
    (Some(check), t)
}

/// Every endpoint has a listener of its own or a shared one that routes
/// to it.
fn check_reachable(c: &mut Checker, endpoints: &[At<EndpointFile<Raw>>], listeners: &[ListenerConfig]) {
    for e in endpoints {
        let e = e.get_ref();
        let name = e.name.get_ref();
        let routed = listeners.iter().any(|l| l.routes.endpoints().any(|n| n == name));
        if e.listen.is_none() && !routed {
            c.error(
                e.name.span(),
                format!(
                    "endpoint {name:?} has no listen and no [[listener.route]] names it; clients could not reach it"
                ),
            );
        }
    }
}

/// A listener's connection limits, from an `[[endpoint]]` (its own
/// listener) or a `[[listener]]`: `[header_read_timeout,
/// http2_idle_timeout]`, `[max_header_bytes, max_connections,
/// max_connections_per_ip]`, and its `tls` table.
fn conn_settings(
    c: &mut Checker,
    [head_timeout, h2_idle]: [&Option<At<String>>; 2],
    [header_bytes, max_conns, per_ip]: [&Option<At<i64>>; 3],
    tls: Option<&TlsFile<Raw>>,
) -> ConnSettings {
    let max_connections = c.number(max_conns, "max_connections", 1, 1_000_000, 4096) as usize;
    let mut max_connections_per_ip = c.number(per_ip, "max_connections_per_ip", 1, 1_000_000, 512) as usize;
    if max_connections_per_ip > max_connections {
        match per_ip {
            Some(v) => c.error(
                v.span(),
                format!(
                    "max_connections_per_ip = {max_connections_per_ip} is above max_connections = {max_connections}"
                ),
            ),
            // Only the total was lowered: one client may take all of it.
            None => max_connections_per_ip = max_connections,
        }
    }
    ConnSettings {
        header_read_timeout: c.duration(head_timeout, "header_read_timeout", Duration::from_secs(10)),
        max_header_bytes: c.number(header_bytes, "max_header_bytes", 8192, 1 << 20, 16384) as usize,
        max_connections,
        max_connections_per_ip,
        http2_idle_timeout: c.duration(h2_idle, "http2_idle_timeout", Duration::from_secs(60)),
        tls: tls.and_then(|t| tls_settings(c, t)),
    }
}

/// The listener's certificate and key, read and checked now (a listener
/// that could not complete a handshake is an error here, not at the first
/// client); the error sits at the key whose file is wrong.
fn tls_settings(c: &mut Checker, t: &TlsFile<Raw>) -> Option<std::sync::Arc<onepool_router::tls::Tls>> {
    use onepool_router::tls::{Tls, TlsError, TlsFiles};
    let files = TlsFiles { cert: t.cert_file.get_ref().into(), key: t.key_file.get_ref().into() };
    match Tls::new(files) {
        Ok(tls) => Some(std::sync::Arc::new(tls)),
        Err(e) => {
            let at = match &e {
                TlsError::Read { what: "cert_file", .. }
                | TlsError::Empty { what: "cert_file", .. }
                | TlsError::Pem { what: "cert_file", .. } => t.cert_file.span(),
                _ => t.key_file.span(),
            };
            c.error(at, format!("tls: {e}"));
            None
        }
    }
}

fn positive(c: &mut Checker, v: &Option<At<f64>>, key: &str, default: f64) -> f64 {
    let Some(v) = v else { return default };
    let x = *v.get_ref();
    if !(x.is_finite() && x > 0.0) {
        c.error(v.span(), format!("{key} = {x} must be a number above zero"));
        return default;
    }
    x
}

fn workload(c: &mut Checker, v: &Option<At<String>>, key: &str, default: &str) -> String {
    let Some(v) = v else { return default.to_string() };
    let w = v.get_ref();
    if w.is_empty() || !w.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_".contains(ch)) {
        c.error(v.span(), format!("{key} = {w:?} is not a workload class name (letters, digits, '-', '_')"));
    }
    w.clone()
}

/// The paths a replica's launcher passes on: the OpenAI-compatible API and
/// what onepoold reads (its health checks, its metrics reads); every other
/// path, a model server's administrative ones among them, is refused.
fn serve_paths(health: Option<&str>, metrics: &str) -> Vec<String> {
    let mut paths = vec!["/v1/".to_string()];
    for p in [health.unwrap_or("/health"), metrics] {
        let p = p.split('?').next().unwrap_or(p);
        if !p.starts_with("/v1/") && !paths.iter().any(|q| q == p) {
            paths.push(p.to_string());
        }
    }
    paths
}

/// Checks one `[endpoint.replicas]` table.
fn replica_settings(c: &mut Checker, r: &At<ReplicasFile<Raw>>) -> ReplicaSettings {
    let span = r.span();
    let r = r.get_ref();
    if r.command.get_ref().trim().is_empty() {
        c.error(r.command.span(), "replicas.command is empty; give the model server's command line".into());
    }
    let min = c.number(&r.min, "replicas.min", 0, 1000, 1) as u32;
    let max = c.number(&r.max, "replicas.max", 1, 1000, i64::from(min.max(1))) as u32;
    if max < min {
        let s = r.max.as_ref().map(|m| m.span()).unwrap_or(span.clone());
        c.error(s, format!("replicas.max = {max} is below replicas.min = {min}"));
    }
    let port_range = match &r.port_range {
        None => (18000, 18999),
        Some(p) => match form::parse_ports(p.get_ref()) {
            Some((a, b)) if u32::from(b - a) + 1 >= 2 * max => (a, b),
            Some((a, b)) => {
                c.error(
                    p.span(),
                    format!("port_range {a}-{b} holds too few ports: each of max = {max} replicas takes two"),
                );
                (a, b)
            }
            None => {
                c.error(
                    p.span(),
                    format!(
                        "port_range = {:?}: expected \"FIRST-LAST\" with FIRST below LAST, like \"18000-18999\"",
                        p.get_ref()
                    ),
                );
                (18000, 18999)
            }
        },
    };
    let launcher = r.launcher.as_ref().map(|l| l.get_ref().clone()).unwrap_or_else(|| "onepool".into());
    if let (Some(l), true) = (&r.launcher, launcher.is_empty()) {
        c.error(l.span(), "replicas.launcher is empty; give the path of the onepool binary".into());
    }
    let output = r.output.as_ref().map(|o| o.get_ref().clone()).unwrap_or_else(|| "/dev/null".into());
    if let (Some(o), true) = (&r.output, output.is_empty()) {
        c.error(o.span(), "replicas.output is empty; give an sbatch -o path (default /dev/null)".into());
    }
    let names = |v: &[toml::Value]| v.iter().map(|n| n.as_str().map(str::to_string)).collect::<Option<Vec<_>>>();
    let load_metrics = match r.load_metrics.as_ref().map(|m| (m.get_ref(), m.span())) {
        None => Vec::new(),
        Some((toml::Value::String(p), _)) if p == "auto" => crate::replica_metrics::known_load_metrics(),
        Some((toml::Value::Array(v), _)) if names(v).is_some() => names(v).unwrap_or_default(),
        Some((other, span)) => {
            c.error(
                span,
                format!(
                    "replicas.load_metrics = {other}: give a list of metric names, or \"auto\" (the load gauges of llama.cpp, vLLM, SGLang and TGI)"
                ),
            );
            Vec::new()
        }
    };
    if let Some(m) = &r.load_metrics {
        let valid = |n: &str| {
            let mut chars = n.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        if let Some(bad) = load_metrics.iter().find(|n| !valid(n)) {
            c.error(
                m.span(),
                format!("replicas.load_metrics: {bad:?} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"),
            );
        }
    }
    let metrics_path = r.metrics_path.as_ref().map(|p| p.get_ref().clone()).unwrap_or_else(|| "/metrics".into());
    if let (Some(p), false) = (&r.metrics_path, metrics_path.starts_with('/')) {
        c.error(p.span(), format!("replicas.metrics_path = {metrics_path:?} must start with '/'"));
    }
    let defaults = onepool_decisions::autoscale::ScalingPolicy::default();
    let warm = r.warm.as_ref().map(|w| warm_settings(c, w, max));
    ReplicaSettings {
        command: r.command.get_ref().clone(),
        gpus: c.number(&r.gpus, "replicas.gpus", 1, 64, 1) as u32,
        replicas_per_job: c.number(&r.replicas_per_job, "replicas.replicas_per_job", 1, 256, 1) as u32,
        min,
        max,
        target_per_replica: positive(c, &r.target_per_replica, "replicas.target_per_replica", 8.0),
        drain_timeout: c.duration(&r.drain_timeout, "replicas.drain_timeout", Duration::from_secs(30)),
        startup_timeout: c.duration(&r.startup_timeout, "replicas.startup_timeout", Duration::from_secs(300)),
        baseline_workload: workload(c, &r.baseline_workload, "replicas.baseline_workload", "inference-baseline"),
        supplemental_workload: workload(c, &r.supplemental_workload, "replicas.supplemental_workload", "inference"),
        port_range,
        launcher,
        poll_interval: c.duration(&r.poll_interval, "replicas.poll_interval", Duration::from_secs(2)),
        time_limit: r.time_limit.as_ref().map(|_| c.duration(&r.time_limit, "replicas.time_limit", Duration::ZERO)),
        stable_window: c.duration(&r.stable_window, "replicas.stable_window", defaults.stable_window),
        panic_window: c.duration(&r.panic_window, "replicas.panic_window", defaults.panic_window),
        panic_threshold: positive(c, &r.panic_threshold, "replicas.panic_threshold", defaults.panic_threshold),
        scale_down_delay: c.duration(&r.scale_down_delay, "replicas.scale_down_delay", defaults.scale_down_delay),
        output,
        load_metrics,
        metrics_path,
        serve_paths: Vec::new(),
        trend_horizon: r
            .trend_horizon
            .as_ref()
            .map_or(Duration::ZERO, |_| c.duration(&r.trend_horizon, "replicas.trend_horizon", Duration::ZERO)),
        warm,
    }
}

fn warm_settings(c: &mut Checker, w: &At<WarmFile<Raw>>, max: u32) -> WarmSettings {
    let span = w.span();
    let w = w.get_ref();
    let replicas = c.number(&w.replicas, "replicas.warm.replicas", 0, 1000, 0) as u32;
    let fraction = match &w.fraction {
        None => 0.0,
        Some(f) if f.get_ref().is_finite() && *f.get_ref() >= 0.0 && *f.get_ref() <= 100.0 => *f.get_ref(),
        Some(f) => {
            c.error(f.span(), format!("replicas.warm.fraction = {} is out of range; use 0 to 100", f.get_ref()));
            0.0
        }
    };
    if replicas == 0 && fraction == 0.0 {
        c.error(
            span,
            "[endpoint.replicas.warm] asks for no headroom: give replicas (idle replicas to keep) or fraction (of the replicas the load needs)".into(),
        );
    } else if replicas >= max {
        let at = w.replicas.as_ref().map(|r| r.span()).unwrap_or(span);
        c.error(at, format!("replicas.warm.replicas = {replicas} leaves no room under replicas.max = {max} for replicas the load needs; max bounds all of them"));
    }
    WarmSettings {
        workload: workload(c, &w.workload, "replicas.warm.workload", "inference-warm"),
        spec: onepool_decisions::replicas::WarmSpec { replicas, fraction },
        scope: PoolScope::default(),
    }
}

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| !l.is_empty() && l.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-'))
}

/// Checks `[[listener]]` tables; endpoint names must be known already.
fn listeners(
    c: &mut Checker,
    raw: &[At<ListenerFile<Raw>>],
    endpoints: &BTreeMap<String, Range<usize>>,
    listens: &mut BTreeMap<SocketAddr, String>,
    max_buffered: usize,
) -> Vec<ListenerConfig> {
    raw.iter().map(|l| listener(c, l, endpoints, listens, max_buffered)).collect()
}

/// One `[[listener]]`: its address, what it routes by, its connection
/// bounds, then its routes.
fn listener(
    c: &mut Checker,
    l: &At<ListenerFile<Raw>>,
    endpoints: &BTreeMap<String, Range<usize>>,
    listens: &mut BTreeMap<SocketAddr, String>,
    max_buffered: usize,
) -> ListenerConfig {
    let span = l.span();
    let l = l.get_ref();
    let listen = c.address(&l.listen, "listen");
    if let Some(a) = listen.filter(|a| a.port() != 0) {
        if let Some(other) = listens.insert(a, format!("[[listener]] {a}")) {
            c.error(l.listen.span(), format!("listen {a} is also used by {other}; give each its own address"));
        }
    }
    let at = listen.map(|a| a.to_string()).unwrap_or_else(|| l.listen.get_ref().clone());
    let by = l.by.get_ref().as_str();
    if !matches!(by, "host" | "path" | "model") {
        c.error(l.by.span(), format!("by = {by:?}: a listener routes by \"host\", \"path\" or \"model\""));
    }
    for (v, key) in [
        (l.max_model_body.as_ref().map(|v| v.span()), "max_model_body"),
        (l.model_body_timeout.as_ref().map(|v| v.span()), "model_body_timeout"),
    ] {
        if let (Some(s), false) = (v, by == "model") {
            c.error(s, format!("{key} applies only to a listener with by = \"model\""));
        }
    }
    let conn = conn_settings(
        c,
        [&l.header_read_timeout, &l.http2_idle_timeout],
        [&l.max_header_bytes, &l.max_connections, &l.max_connections_per_ip],
        l.tls.as_ref(),
    );
    let max_body = c.number(&l.max_model_body, "max_model_body", 1, 1 << 30, 1 << 20) as usize;
    if let (Some(v), true) = (&l.max_model_body, max_body > max_buffered) {
        c.error(
            v.span(),
            format!("max_model_body = {max_body} is above max_buffered_body_bytes = {max_buffered}; such bodies could never be read"),
        );
    }
    let body_timeout = c.duration(&l.model_body_timeout, "model_body_timeout", Duration::from_secs(30));
    if l.routes.is_empty() {
        c.diags.push(Diagnostic::error(
            Some(span.clone()),
            format!("listener {at} has no [[listener.route]]; add at least one with {by} = ... and endpoint = ..."),
        ));
    }
    let (pairs, paths) = listener_routes(c, l, &at, by, endpoints);
    let routes = match by {
        "host" => Routes::Host(pairs),
        "path" => Routes::Path(paths),
        _ => Routes::Model { max_body, body_timeout, routes: pairs },
    };
    ListenerConfig { listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))), routes, conn }
}

/// A listener's `[[listener.route]]` tables: (key, endpoint) pairs for a
/// host or model listener, path routes for a path listener.
fn listener_routes(
    c: &mut Checker,
    l: &ListenerFile<Raw>,
    at: &str,
    by: &str,
    endpoints: &BTreeMap<String, Range<usize>>,
) -> (Vec<(String, String)>, Vec<PathRoute>) {
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    let mut pairs = Vec::new();
    let mut paths = Vec::new();
    for r in &l.routes {
        let rspan = r.span();
        let r = r.get_ref();
        let endpoint = r.endpoint.get_ref();
        if !endpoints.contains_key(endpoint) {
            let known: Vec<&String> = endpoints.keys().collect();
            c.error(
                r.endpoint.span(),
                format!("route to unknown endpoint {endpoint:?}; the [[endpoint]] names are {known:?}"),
            );
        }
        for (v, key) in [(&r.host, "host"), (&r.path, "path"), (&r.model, "model")] {
            if let (Some(v), true) = (v, key != by) {
                c.error(v.span(), format!("{key} in a route of listener {at}, which routes by {by:?}; use {by} = ..."));
            }
        }
        if let (Some(s), false) = (&r.strip_prefix, by == "path") {
            c.error(s.span(), "strip_prefix applies only to routes of a listener with by = \"path\"".into());
        }
        let key = match by {
            "host" => r.host.as_ref(),
            "path" => r.path.as_ref(),
            "model" => r.model.as_ref(),
            _ => continue,
        };
        let Some(key) = key else {
            c.error(rspan, format!("this route of listener {at} names no {by}; add {by} = ..."));
            continue;
        };
        let value = route_key(c, by, key);
        if seen.insert(value.clone(), ()).is_some() {
            c.error(key.span(), format!("{by} {value:?} is routed twice on listener {at}; each {by} needs one route"));
            continue;
        }
        if by == "path" {
            let strip = r.strip_prefix.as_ref().map(|s| *s.get_ref()).unwrap_or(false);
            paths.push(PathRoute { prefix: value, strip, endpoint: endpoint.clone() });
        } else {
            pairs.push((value, endpoint.clone()));
        }
    }
    (pairs, paths)
}

/// A route's host (lower case), path (without a trailing '/') or model
/// name, checked.
fn route_key(c: &mut Checker, by: &str, key: &At<String>) -> String {
    match by {
        "host" => {
            let h = key.get_ref().to_ascii_lowercase();
            if !valid_host(&h) {
                c.error(
                    key.span(),
                    format!("host {:?} is not a host name (letters, digits, '-' and dots; no port)", key.get_ref()),
                );
            }
            h
        }
        "path" => {
            let p = key.get_ref();
            if !p.starts_with('/') || p.contains(['?', '#']) || p.contains("//") {
                c.error(key.span(), format!("path {p:?} must start with '/' and hold no '?', '#' or '//'"));
            }
            let p = p.trim_end_matches('/');
            if p.is_empty() {
                "/".to_string()
            } else {
                p.to_string()
            }
        }
        _ => {
            if key.get_ref().is_empty() {
                c.error(key.span(), "model is empty; give the name clients send in \"model\"".into());
            }
            key.get_ref().clone()
        }
    }
}

/// Reads and parses the file at `path`.
pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(vec![format!("{file}: cannot read the router configuration: {e}")]))?;
    parse(&file, &source)
}

mod file;
mod form;
pub use file::{
    AccessLogFile, AuthFile, ConfigFile, EndpointFile, HealthFile, ListenerFile, ReplicasFile, RetryFile, RouteFile,
    TlsFile, WarmFile,
};
pub use form::{as_text, AsText, At, Form, Mode, Raw, Typed, Value};

#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod tests;
