//! onepoold's TOML configuration. The whole file is checked and every
//! problem reported as FILE:LINE:COL before the daemon refuses to start.
//!
//! The file's types ([`ConfigFile`] and its tables) are defined once, for
//! reading and writing; [`parse`] reads them in their [`Raw`] form and
//! checks them, section by section, into a [`Config`].

mod check;
mod conn;
mod endpoint;
mod file;
mod form;
mod ha;
mod listener;
mod replicas;
mod settings;
mod tokens;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use check::Checker;
use onepool_decisions::policy::Diagnostic;

pub use endpoint::{auto_method, command_words, resume_summary};
use endpoint::{check_reachable, endpoint};
use file::RawFile;
use listener::listeners;
use tokens::bearer_tokens;

pub use file::{
    AccessLogFile, AuthFile, ConfigFile, EndpointFile, HaFile, HeadroomFile, HealthFile, LatencyFile, ListenerFile,
    PriorityFile, ReplicasFile, ResumeFile, RetryFile, RouteFile, RoutingFile, TlsFile, WarmFile,
};
pub use form::{AsText, Form, FormValue, Mode, Raw, Typed};
pub use ha::{host_name, HaSettings, LockSettings};
pub use settings::{
    Config, ConfigError, EndpointConfig, EngineChoice, EnginePriorityConfig, HeadroomConfig, ListenerConfig, PoolScope,
    ReplicaSettings, ReplicaTransport, WarmSettings, DEFAULT_REPLICA_KEY_FILE,
};

/// The listener settings the router reads, defined with its other settings.
pub use onepool_router::settings::{ConnSettings, PathRoute, Routes, MODEL_PATHS};

/// Parses and checks `source`; `file` names it in every error.
pub fn parse(file: &str, source: &str) -> Result<Config, ConfigError> {
    let raw: RawFile = toml::from_str(source).map_err(|e| {
        let d = Diagnostic::error(e.span(), e.message().to_string());
        ConfigError(vec![d.render(file, source)])
    })?;
    let mut c = Checker { diags: Vec::new() };
    let control_socket_mode = control_socket_mode(&mut c, &raw);
    let metrics_address = metrics_address(&mut c, &raw);
    let metrics_auth = raw
        .metrics_bearer_tokens_file
        .as_ref()
        .and_then(|f| bearer_tokens(&mut c, f, "metrics_bearer_tokens_file", false))
        .map(|(t, _)| t);
    let shutdown_grace = c.duration(&raw.shutdown_grace, "shutdown_grace", Duration::from_secs(30));
    let access_log = raw.access_log.as_ref().map(|a| line_log(&mut c, a.get_ref(), "access_log"));
    let decision_log = raw.decision_log.as_ref().map(|a| line_log(&mut c, a.get_ref(), "decision_log"));
    let advisory = raw.advisory.as_ref().is_some_and(|a| *a.get_ref());
    let max_buffered_body_bytes =
        c.number(&raw.max_buffered_body_bytes, "max_buffered_body_bytes", 1 << 20, 1 << 40, 256 << 20) as usize;
    if raw.endpoints.is_empty() {
        c.diags.push(Diagnostic::error(None, "no [[endpoint]]; add at least one with name and listen".to_string()));
    }
    let mut names: BTreeMap<String, Range<usize>> = BTreeMap::new();
    let mut listens: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let mut endpoints: Vec<EndpointConfig> = raw
        .endpoints
        .iter()
        .map(|e| endpoint(&mut c, e.get_ref(), &raw, max_buffered_body_bytes, &mut names, &mut listens))
        .collect();
    // The whole daemon advisory: no endpoint may act, whatever its own key.
    for r in endpoints.iter_mut().filter_map(|e| e.replicas.as_mut()) {
        r.advisory |= advisory;
    }
    let listeners = listeners(&mut c, &raw.listeners, &names, &mut listens, max_buffered_body_bytes);
    let ha = ha::ha(&mut c, raw.ha.as_ref());
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
        decision_log,
        ha,
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

/// `[access_log]` or `[decision_log]` (`table`): a path (absolute: the
/// daemon's working directory is no place for it), and bounds on each file
/// and on how many are kept.
fn line_log(c: &mut Checker, a: &AccessLogFile<Raw>, table: &str) -> onepool_router::line_log::LineLogSettings {
    let path = PathBuf::from(a.path.get_ref());
    if !path.is_absolute() {
        c.error(a.path.span(), format!("{table}.path {:?} must be an absolute path", a.path.get_ref()));
    }
    let max_file_bytes = c.number(&a.max_file_bytes, &format!("{table}.max_file_bytes"), 64 << 10, 1 << 40, 100 << 20);
    onepool_router::line_log::LineLogSettings {
        path,
        max_file_bytes: max_file_bytes as u64,
        keep_files: c.number(&a.keep_files, &format!("{table}.keep_files"), 1, 100, 5) as u32,
    }
}

/// Reads and parses the file at `path`.
impl ConfigFile {
    /// What onepoold makes of the file: [`parse`] of [`ConfigFile::to_toml`].
    pub fn build(&self) -> Result<Config, ConfigError> {
        parse("onepoold.toml (built)", &self.to_toml())
    }
}

pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(vec![format!("{file}: cannot read the router configuration: {e}")]))?;
    parse(&file, &source)
}

#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod ha_tests;
#[cfg(test)]
mod tests;
