//! onepoold's TOML configuration. The whole file is checked and every
//! problem reported as FILE:LINE:COL before the daemon refuses to start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use onepool_decisions::policy::Diagnostic;
use serde::Deserialize;
use toml::Spanned;

use crate::health::HealthCheck;
use crate::proxy::ProxySettings;
use crate::registry::HealthThresholds;

#[derive(Clone, Debug)]
pub struct Config {
    pub control_socket: PathBuf,
    /// File mode of the control socket (0600 unless set).
    pub control_socket_mode: u32,
    pub metrics_address: Option<SocketAddr>,
    /// How long in-flight requests may run on after SIGTERM.
    pub shutdown_grace: Duration,
    pub endpoints: Vec<EndpointConfig>,
}

#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub name: String,
    pub listen: SocketAddr,
    pub replica_concurrency: u32,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub proxy: ProxySettings,
    pub health: Option<HealthCheck>,
    pub thresholds: HealthThresholds,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    control_socket: Spanned<String>,
    control_socket_mode: Option<Spanned<String>>,
    metrics_address: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    #[serde(default)]
    endpoint: Vec<Spanned<RawEndpoint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    name: Spanned<String>,
    listen: Spanned<String>,
    replica_concurrency: Option<Spanned<i64>>,
    queue_size: Option<Spanned<i64>>,
    queue_timeout: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    header_read_timeout: Option<Spanned<String>>,
    max_header_bytes: Option<Spanned<i64>>,
    max_request_body: Option<Spanned<i64>>,
    retry: Option<RawRetry>,
    health: Option<RawHealth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<Spanned<i64>>,
    idempotent: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    path: Spanned<String>,
    interval: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    healthy_after: Option<Spanned<i64>>,
    unhealthy_after: Option<Spanned<i64>>,
}

/// Durations as in the policy file, plus milliseconds ("250ms"), which
/// queue and connect timeouts need.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Some(ms) = t.strip_suffix("ms") {
        return ms
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration {s:?}: expected whole milliseconds before \"ms\" (250ms)"));
    }
    onepool_decisions::duration::parse(t).map_err(|e| format!("{e}, or milliseconds (250ms)"))
}

struct Checker {
    diags: Vec<Diagnostic>,
}

impl Checker {
    fn error(&mut self, span: Range<usize>, msg: String) {
        self.diags.push(Diagnostic::error(Some(span), msg));
    }

    fn duration(&mut self, v: &Option<Spanned<String>>, key: &str, default: Duration) -> Duration {
        let Some(v) = v else { return default };
        match parse_duration(v.get_ref()) {
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

    fn number(&mut self, v: &Option<Spanned<i64>>, key: &str, min: i64, max: i64, default: i64) -> i64 {
        let Some(v) = v else { return default };
        let n = *v.get_ref();
        if n < min || n > max {
            self.error(v.span(), format!("{key} = {n} is out of range; use {min} to {max}"));
            return default;
        }
        n
    }

    fn address(&mut self, v: &Spanned<String>, key: &str) -> Option<SocketAddr> {
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

/// Parses and checks `source`; `file` names it in every error.
pub fn parse(file: &str, source: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(source).map_err(|e| {
        let d = Diagnostic::error(e.span(), e.message().to_string());
        ConfigError(vec![d.render(file, source)])
    })?;
    let mut c = Checker { diags: Vec::new() };
    let control_socket_mode = match &raw.control_socket_mode {
        None => 0o600,
        Some(m) => match u32::from_str_radix(m.get_ref(), 8) {
            Ok(v) if v & 0o777 == v && v & 0o007 == 0 => v,
            _ => {
                c.error(m.span(), format!("control_socket_mode = {:?}: expected an octal mode without access for others, like \"0600\" or \"0660\"", m.get_ref()));
                0o600
            }
        },
    };
    if raw.control_socket.get_ref().is_empty() {
        c.error(
            raw.control_socket.span(),
            "control_socket is empty; give a path like /run/onepool/onepoold.sock".into(),
        );
    }
    let metrics_address = raw.metrics_address.as_ref().and_then(|a| {
        let addr = c.address(a, "metrics_address")?;
        if !addr.ip().is_loopback() {
            c.error(
                a.span(),
                format!(
                    "metrics_address {addr} is not a loopback address; metrics are served on 127.0.0.1 or ::1 only"
                ),
            );
        }
        Some(addr)
    });
    let shutdown_grace = c.duration(&raw.shutdown_grace, "shutdown_grace", Duration::from_secs(30));
    if raw.endpoint.is_empty() {
        c.diags.push(Diagnostic::error(None, "no [[endpoint]]; add at least one with name and listen".to_string()));
    }
    let mut names: BTreeMap<String, Range<usize>> = BTreeMap::new();
    let mut listens: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let mut endpoints = Vec::new();
    for e in &raw.endpoint {
        let e = e.get_ref();
        let name = e.name.get_ref().clone();
        if name.is_empty() || !name.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)) {
            c.error(
                e.name.span(),
                format!("endpoint name {name:?} must be non-empty letters, digits, '-', '_' or '.'"),
            );
        }
        if names.insert(name.clone(), e.name.span()).is_some() {
            c.error(e.name.span(), format!("endpoint {name:?} is defined twice; endpoint names must be unique"));
        }
        let listen = c.address(&e.listen, "listen");
        if let Some(l) = listen {
            if let Some(other) = listens.insert(l, name.clone()) {
                c.error(
                    e.listen.span(),
                    format!("listen {l} is also used by endpoint {other:?}; give each endpoint its own address"),
                );
            }
        }
        let retry = e.retry.as_ref();
        let attempts = retry.map(|r| c.number(&r.attempts, "retry.attempts", 0, 10, 2)).unwrap_or(2);
        let proxy = ProxySettings {
            request_timeout: c.duration(&e.request_timeout, "request_timeout", Duration::from_secs(300)),
            connect_timeout: c.duration(&e.connect_timeout, "connect_timeout", Duration::from_secs(2)),
            max_request_body: c.number(&e.max_request_body, "max_request_body", 1, 1 << 30, 8 << 20) as usize,
            header_read_timeout: c.duration(&e.header_read_timeout, "header_read_timeout", Duration::from_secs(10)),
            max_header_bytes: c.number(&e.max_header_bytes, "max_header_bytes", 8192, 1 << 20, 16384) as usize,
            retries: attempts as u32,
            idempotent: retry.and_then(|r| r.idempotent).unwrap_or(false),
        };
        let (health, thresholds) = match &e.health {
            None => (None, HealthThresholds::default()),
            Some(h) => {
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
        };
        endpoints.push(EndpointConfig {
            name,
            listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            replica_concurrency: c.number(&e.replica_concurrency, "replica_concurrency", 1, 100_000, 8) as u32,
            queue_size: c.number(&e.queue_size, "queue_size", 0, 1_000_000, 256) as usize,
            queue_timeout: c.duration(&e.queue_timeout, "queue_timeout", Duration::from_secs(10)),
            proxy,
            health,
            thresholds,
        });
    }
    if c.diags.iter().any(|d| d.is_error()) {
        return Err(ConfigError(c.diags.iter().map(|d| d.render(file, source)).collect()));
    }
    Ok(Config {
        control_socket: PathBuf::from(raw.control_socket.into_inner()),
        control_socket_mode,
        metrics_address,
        shutdown_grace,
        endpoints,
    })
}

/// Reads and parses the file at `path`.
pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(vec![format!("{file}: cannot read the router configuration: {e}")]))?;
    parse(&file, &source)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
