//! `[endpoint.replicas]` and its `warm` table: how onepoold runs an
//! endpoint's replicas as Slurm jobs.

use std::time::Duration;

use onepool_decisions::latency::LatencyTargets;
use toml::Spanned;

use super::check::{positive, workload, Checker};
use super::file::{LatencyFile, ReplicasFile, WarmFile};
use super::form::{self, Raw};
use crate::config::settings::{PoolScope, ReplicaSettings, ReplicaTransport, WarmSettings};

/// The paths a replica's launcher passes on: the OpenAI-compatible API and
/// what onepoold reads (its health checks, its metrics reads); every other
/// path, a model server's administrative ones among them, is refused.
pub(super) fn serve_paths(health: Option<&str>, metrics: &str) -> Vec<String> {
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
pub(super) fn replica_settings(c: &mut Checker, r: &Spanned<ReplicasFile<Raw>>) -> ReplicaSettings {
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
    let port_range = port_range(c, &r.port_range, max);
    let launcher = r.launcher.as_ref().map(|l| l.get_ref().clone()).unwrap_or_else(|| "onepool".into());
    if let (Some(l), true) = (&r.launcher, launcher.is_empty()) {
        c.error(l.span(), "replicas.launcher is empty; give the path of the onepool binary".into());
    }
    let output = r.output.as_ref().map(|o| o.get_ref().clone()).unwrap_or_else(|| "/dev/null".into());
    if let (Some(o), true) = (&r.output, output.is_empty()) {
        c.error(o.span(), "replicas.output is empty; give an sbatch -o path (default /dev/null)".into());
    }
    let load_metrics = load_metrics(c, &r.load_metrics);
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
        lower_workload: r
            .lower_workload
            .as_ref()
            .map(|_| workload(c, &r.lower_workload, "replicas.lower_workload", "")),
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
        advisory: r.advisory.as_ref().is_some_and(|a| *a.get_ref()),
        latency: r.latency.as_ref().map(|l| latency_targets(c, l)),
        immediate_classes: Vec::new(),
        transport: transport(c, &r.transport),
    }
}

/// `transport`: "tls" (the default) or "plain".
fn transport(c: &mut Checker, v: &Option<Spanned<String>>) -> ReplicaTransport {
    let Some(t) = v else { return ReplicaTransport::default() };
    match t.get_ref().as_str() {
        "tls" => ReplicaTransport::Tls,
        "plain" => ReplicaTransport::Plain,
        other => {
            c.error(
                t.span(),
                format!(
                    "replicas.transport = {other:?}: give \"tls\" (each launcher's certificate pinned by the router) or \"plain\" (the replica key and prompts in clear on the network)"
                ),
            );
            ReplicaTransport::default()
        }
    }
}

/// `[endpoint.replicas.latency]`: at least one target.
fn latency_targets(c: &mut Checker, l: &Spanned<LatencyFile<Raw>>) -> LatencyTargets {
    let span = l.span();
    let l = l.get_ref();
    let d = LatencyTargets::default();
    // Durations of zero are refused by `duration` itself.
    let target = |c: &mut Checker, v: &Option<Spanned<String>>, key: &str| {
        v.as_ref().map(|_| c.duration(v, key, Duration::ZERO))
    };
    let targets = LatencyTargets {
        ttft_p99: target(c, &l.ttft_p99, "replicas.latency.ttft_p99"),
        queue_p99: target(c, &l.queue_p99, "replicas.latency.queue_p99"),
        window: c.duration(&l.window, "replicas.latency.window", d.window),
        min_samples: c.number(&l.min_samples, "replicas.latency.min_samples", 1, 100_000, i64::from(d.min_samples))
            as u32,
    };
    if !targets.is_set() {
        c.error(span, "[endpoint.replicas.latency] sets no target: give ttft_p99 (time to first byte) or queue_p99 (time in the queue), e.g. ttft_p99 = \"2s\"".into());
    }
    targets
}

/// `port_range`: "FIRST-LAST", two ports for each of `max` replicas.
fn port_range(c: &mut Checker, v: &Option<Spanned<String>>, max: u32) -> (u16, u16) {
    let Some(p) = v else { return (18000, 18999) };
    match form::parse_ports(p.get_ref()) {
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
    }
}

/// `load_metrics`: Prometheus metric names, or "auto" for the load gauges
/// of the model servers onepool knows.
fn load_metrics(c: &mut Checker, v: &Option<Spanned<toml::Value>>) -> Vec<String> {
    let names = |list: &[toml::Value]| list.iter().map(|n| n.as_str().map(str::to_string)).collect::<Option<Vec<_>>>();
    let load_metrics = match v.as_ref().map(|m| (m.get_ref(), m.span())) {
        None => Vec::new(),
        Some((toml::Value::String(p), _)) if p == "auto" => crate::replica_metrics::known_load_metrics(),
        Some((toml::Value::Array(list), _)) if names(list).is_some() => names(list).unwrap_or_default(),
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
    if let Some(m) = v {
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
    load_metrics
}

/// `[endpoint.replicas.warm]`: headroom under `max`, asked for by a count,
/// a fraction or both.
fn warm_settings(c: &mut Checker, w: &Spanned<WarmFile<Raw>>, max: u32) -> WarmSettings {
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
