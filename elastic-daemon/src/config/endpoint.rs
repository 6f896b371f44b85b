//! `[[endpoint]]` tables: each endpoint's name, listener, queue, proxying
//! and health checks ([`super::replicas`] checks its replicas).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use onepool_decisions::policy::Diagnostic;
use onepool_router::prefix::PrefixSettings;
use onepool_router::registry::HealthThresholds;
use onepool_router::resume::{Method, ResumeSettings};
use onepool_router::settings::{HealthCheck, ProxySettings};
use toml::Spanned;

use super::check::{positive, Checker};
use super::conn::conn_settings;
use super::file::{EndpointFile, HeadroomFile, HealthFile, PriorityFile, RawFile, ResumeFile, RoutingFile};
use super::form::Raw;
use super::replicas::{replica_settings, serve_paths};
use super::tokens::bearer_tokens;
use crate::config::settings::{EndpointConfig, EngineChoice, EnginePriorityConfig, HeadroomConfig, ListenerConfig};

/// One `[[endpoint]]`; `names` and `listens` collect what the endpoints
/// before it took, so that a second use is an error at its key.
pub(super) fn endpoint(
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
    let (auth, keyed_classes) = match &e.auth {
        Some(a) => match bearer_tokens(c, &a.bearer_tokens_file, "auth.bearer_tokens_file", true) {
            Some((tokens, named)) => (Some(tokens), named),
            None => (None, Vec::new()),
        },
        None => (None, Vec::new()),
    };
    let proxy = proxy_settings(c, e, raw, &name, max_buffered_body_bytes, auth);
    let (health, thresholds) = health(c, e.health.as_ref());
    let mut replicas = e.replicas.as_ref().map(|r| replica_settings(c, r));
    if let Some(r) = &mut replicas {
        r.serve_paths = serve_paths(health.as_ref().map(|h| h.path.as_str()), &r.metrics_path);
    }
    EndpointConfig {
        name,
        listen,
        request_class: e.request_class.as_ref().map(|r| r.get_ref().clone()),
        keyed_classes,
        headroom: headroom(c, e.headroom.as_deref(), e.name.get_ref()),
        engine_priority: engine_priority(c, e.priority.as_deref(), e.name.get_ref()),
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
    auth: Option<onepool_router::settings::BearerTokens>,
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
        prefix: e.routing.as_ref().and_then(|r| routing(c, r)),
        request_timeout: c.duration(&e.request_timeout, "request_timeout", Duration::from_secs(300)),
        connect_timeout: c.duration(&e.connect_timeout, "connect_timeout", Duration::from_secs(2)),
        max_request_body,
        body_read_timeout: c.duration(&e.body_read_timeout, "body_read_timeout", Duration::from_secs(30)),
        response_idle_timeout: c.duration(&e.response_idle_timeout, "response_idle_timeout", Duration::from_secs(60)),
        retries: attempts as u32,
        idempotent: retry.and_then(|r| r.idempotent.as_ref()).is_some_and(|i| *i.get_ref()),
        conn,
        auth,
        classes: None,
        resume: resume(c, e.resume.as_deref(), e.replicas.as_ref().map(|r| r.get_ref().command.get_ref().as_str())),
    }
}

/// `[endpoint.resume]`: on unless turned off; by tokens where the
/// endpoint's replicas run llama-server ("auto"), by text otherwise.
fn resume(c: &mut Checker, r: Option<&ResumeFile<Raw>>, command: Option<&str>) -> Option<ResumeSettings> {
    let max_moves = r.map(|r| c.number(&r.max_moves, "resume.max_moves", 1, 100, 3)).unwrap_or(3) as u32;
    let method = match r.and_then(|r| r.method.as_ref()).map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("auto", _)) => auto_method(command),
        Some(("tokens", _)) => Method::Tokens,
        Some(("text", _)) => Method::Text,
        Some(("off", _)) => return None,
        Some((other, span)) => {
            c.error(span, format!("resume.method = {other:?} is not a way to continue answers; use \"auto\", \"tokens\" (llama-server), \"text\" or \"off\""));
            return None;
        }
    };
    let seed = r.and_then(|r| r.seed.as_ref()).is_none_or(|s| *s.get_ref());
    Some(ResumeSettings { method, max_moves, seed })
}

/// How an endpoint's answers continue on another replica, in a line for
/// `onepoold --check` and `onepool doctor`.
pub fn resume_summary(endpoint: &str, r: Option<ResumeSettings>) -> String {
    match r {
        Some(ResumeSettings { method: Method::Tokens, max_moves, seed }) => format!(
            "endpoint {endpoint}: answers continue on another replica by token ids (llama-server's /completion: the client's tokens exactly, the rest recomputed from them), at most {max_moves} move(s) each; {}",
            replay_summary(seed)
        ),
        Some(ResumeSettings { method: Method::Text, max_moves, seed }) => format!(
            "endpoint {endpoint}: answers continue on another replica by text (the assistant's message continued: may differ at the junction), at most {max_moves} move(s) each; {}",
            replay_summary(seed)
        ),
        None => format!("endpoint {endpoint}: answers are not continued on another replica ([endpoint.resume] method = \"off\")"),
    }
}

/// What a prefill cannot continue (a tool call cut half-way, reasoning, a
/// grammar, several choices), in [`resume_summary`]'s words.
fn replay_summary(seed: bool) -> &'static str {
    match seed {
        true => "what a prefill cannot continue (a tool call begun, reasoning, a grammar or JSON schema, several choices) is generated again with the seed the router gives each stream without the client's",
        false => "what a prefill cannot continue is generated again with the client's seed only (resume.seed = false): without one, and above temperature 0, such an answer ends with the error event",
    }
}

/// By tokens when the replicas' command runs llama-server (its native API
/// takes and gives token ids), by text for any other server.
pub fn auto_method(command: Option<&str>) -> Method {
    let runs_llama_server = command.is_some_and(|c| {
        command_words(c).any(|w| std::path::Path::new(w).file_name().is_some_and(|f| f == "llama-server"))
    });
    match runs_llama_server {
        true => Method::Tokens,
        false => Method::Text,
    }
}

/// A replicas' command line's words, without the quotes of a command
/// wrapped in `sh -c '...'`: what onepool reads of which server it runs
/// and with which flags.
pub fn command_words(command: &str) -> impl Iterator<Item = &str> {
    command.split_whitespace().map(|w| w.trim_matches(['\'', '"']))
}

/// `[endpoint.routing]`: prefix-aware routing's settings, or `None` for
/// least outstanding alone.
fn routing(c: &mut Checker, r: &RoutingFile<Raw>) -> Option<PrefixSettings> {
    let d = PrefixSettings::default();
    let block_bytes = c.number(&r.block_bytes, "routing.block_bytes", 16, 1 << 20, d.block_bytes as i64) as usize;
    let table_entries =
        c.number(&r.table_entries, "routing.table_entries", 1024, 1 << 26, d.table_entries as i64) as usize;
    let load_bound = positive(c, &r.load_bound, "routing.load_bound", d.load_bound);
    if let (Some(v), true) = (&r.load_bound, load_bound < 1.0) {
        c.error(v.span(), format!("routing.load_bound = {load_bound} is below 1: no replica could take a request for a prefix it holds while the endpoint is busy; use 1 (the average) or more"));
    }
    match r.policy.as_ref().map(|p| (p.get_ref().as_str(), p.span())) {
        None | Some(("least_outstanding", _)) => None,
        Some(("prefix", _)) => Some(PrefixSettings { block_bytes, load_bound, table_entries }),
        Some((other, span)) => {
            c.error(
                span,
                format!("routing.policy = {other:?} is not a routing policy; use \"least_outstanding\" or \"prefix\""),
            );
            None
        }
    }
}

/// `[endpoint.headroom]`: each share from 0 to 1 (the defaults without
/// the table).
fn headroom(c: &mut Checker, h: Option<&HeadroomFile<Raw>>, endpoint: &str) -> HeadroomConfig {
    let d = HeadroomConfig::default();
    let Some(h) = h else { return d };
    let share = |c: &mut Checker, v: &Spanned<f64>, key: &str| {
        let s = *v.get_ref();
        if !(0.0..=1.0).contains(&s) {
            c.error(v.span(), format!("{key} = {s} is not a share of the slots; use 0 (none while a class above has requests) to 1 (no ceiling)"));
            return None;
        }
        Some(s)
    };
    let all = h.share.as_ref().and_then(|v| share(c, v, "headroom.share")).unwrap_or(d.share);
    let classes = h
        .classes
        .iter()
        .flatten()
        .filter_map(|(class, v)| {
            let key = format!("headroom.classes.{class}");
            let s = share(c, v, &key)?;
            Some((class.clone(), s, format!("endpoint {endpoint:?} {key}")))
        })
        .collect();
    HeadroomConfig { share: all, quiet: c.duration(&h.quiet, "headroom.quiet", d.quiet), classes }
}

/// `[endpoint.priority]`: the engine named, and values from 0 to a
/// million.
fn engine_priority(c: &mut Checker, p: Option<&PriorityFile<Raw>>, endpoint: &str) -> EnginePriorityConfig {
    let Some(p) = p else { return EnginePriorityConfig::default() };
    let engine = match p.engine.as_ref().map(|e| (e.get_ref().as_str(), e.span())) {
        None | Some(("auto", _)) => EngineChoice::Auto,
        Some(("sglang", _)) => EngineChoice::Sglang,
        Some(("vllm", _)) => EngineChoice::Vllm,
        Some(("off", _)) => EngineChoice::Off,
        Some((other, span)) => {
            c.error(span, format!("priority.engine = {other:?} is not an engine onepool tells a priority; use \"auto\" (from the replicas' command), \"sglang\", \"vllm\" or \"off\""));
            EngineChoice::Off
        }
    };
    let values = p
        .values
        .iter()
        .flatten()
        .map(|(class, v)| {
            let key = format!("priority.values.{class}");
            let n = c.number(&Some(v.clone()), &key, 0, 1_000_000, 0) as u32;
            (class.clone(), n, format!("endpoint {endpoint:?} {key}"))
        })
        .collect();
    EnginePriorityConfig { engine, values }
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
pub(super) fn check_reachable(c: &mut Checker, endpoints: &[Spanned<EndpointFile<Raw>>], listeners: &[ListenerConfig]) {
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
