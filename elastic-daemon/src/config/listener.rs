//! `[[listener]]` tables: shared listeners and their routes to the
//! endpoints.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use onepool_decisions::policy::Diagnostic;
use onepool_router::settings::{PathRoute, Routes};
use toml::Spanned;

use super::check::Checker;
use super::conn::conn_settings;
use super::file::ListenerFile;
use super::form::Raw;
use crate::config::settings::ListenerConfig;

/// Checks `[[listener]]` tables; endpoint names must be known already.
pub(super) fn listeners(
    c: &mut Checker,
    raw: &[Spanned<ListenerFile<Raw>>],
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
    l: &Spanned<ListenerFile<Raw>>,
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
fn route_key(c: &mut Checker, by: &str, key: &Spanned<String>) -> String {
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

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| !l.is_empty() && l.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-'))
}
