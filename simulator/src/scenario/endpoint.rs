//! `[[endpoints]]`: an inference endpoint's trace, service model, replica
//! classes and autoscaling.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::autoscale::ScalingPolicy;
use onepool_decisions::classify::{classify, JobRequest, Verdict};
use onepool_decisions::duration::parse_seconds;
use onepool_decisions::latency::LatencyTargets;
use onepool_decisions::policy::Policy;
use onepool_decisions::replicas::WarmSpec;
use serde::Deserialize;

use crate::engine::{Endpoint, Req};
use crate::input::{azure, BadRow, OnBadRow};
use crate::scenario::reading::{read, take, Nobody, Placed, DAEMON};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    pub(super) name: String,
    trace: PathBuf,
    trace_endpoint: Option<String>,
    class: String,
    gpus_per_replica: u32,
    gpu_type: Option<String>,
    max_concurrent: u32,
    prefill_tokens_per_s: f64,
    pub(super) decode_tokens_per_s: f64,
    pub(super) startup: String,
    slo_p99: String,
    min_replicas: Option<u32>,
    max_replicas: Option<u32>,
    target_per_replica: Option<f64>,
    stable_window: Option<String>,
    panic_window: Option<String>,
    panic_threshold: Option<f64>,
    scale_down_delay: Option<String>,
    trend_horizon: Option<String>,
    latency_ttft_p99: Option<String>,
    latency_queue_p99: Option<String>,
    latency_window: Option<String>,
    latency_min_samples: Option<u32>,
    baseline_class: Option<String>,
    #[serde(default)]
    baseline_replicas: u32,
    warm_class: Option<String>,
    warm_replicas: Option<u32>,
    warm_fraction: Option<f64>,
    #[serde(default)]
    keep_times: bool,
}

/// An `[[endpoints]]` table's service model as the file writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointModel {
    pub name: String,
    /// As written (`"4s"`): the validation quotes it.
    pub startup: String,
    pub decode_tokens_per_s: f64,
}

/// One `[[endpoints]]`: its trace as requests with service times, its
/// replicas' class (and the baseline's) as the policy places them, its
/// autoscaling. Checked in the table's order, so the first message is
/// about the first key that is wrong.
pub(super) fn endpoint(
    base: &Path,
    policy: &Policy,
    e: RawEndpoint,
    on_bad: OnBadRow,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Endpoint, String> {
    let (f, t) = read(base, &e.trace)?;
    let only = e.trace_endpoint.as_deref().unwrap_or(&e.name);
    let mut reqs = take(azure::read(&f, &t, Some(only), on_bad), bad_rows, ignored)?;
    if !e.keep_times {
        let first = reqs.first().map(|r| r.t).unwrap_or(0.0);
        reqs.iter_mut().for_each(|r| r.t -= first);
    }
    if e.prefill_tokens_per_s <= 0.0 || e.decode_tokens_per_s <= 0.0 || e.max_concurrent == 0 {
        return Err(format!("endpoint {}: token rates and max_concurrent must be positive", e.name));
    }
    let ((c, reclaim, drain), baseline) = replica_classes(policy, &e)?;
    let warm = warm(policy, &e)?;
    let (pre, dec) = (e.prefill_tokens_per_s, e.decode_tokens_per_s);
    let requests: Arc<[Req]> = reqs
        .iter()
        .map(|r| Req {
            t: r.t,
            service: (f64::from(r.context_tokens) / pre + f64::from(r.generated_tokens) / dec) as f32,
        })
        .collect();
    let startup_s = seconds(&e, &e.startup, "startup")?;
    let slo_p99_s = seconds(&e, &e.slo_p99, "slo_p99")?;
    let scaling = scaling(&e)?;
    let latency = latency(&e)?;
    Ok(Endpoint {
        name: e.name.clone(),
        class: c,
        island: c,
        gpus_per_replica: e.gpus_per_replica.max(1),
        gpu_type: e.gpu_type,
        max_concurrent: e.max_concurrent,
        startup_s,
        slo_p99_s,
        scaling,
        reclaim,
        drain,
        baseline,
        warm,
        latency,
        requests,
    })
}

/// Latency targets, as onepoold's `[endpoint.replicas.latency]`: at least
/// one target when any of the keys is given.
fn latency(e: &RawEndpoint) -> Result<Option<LatencyTargets>, String> {
    let d = LatencyTargets::default();
    let duration = |v: &Option<String>, what: &str| {
        v.as_deref().map(|s| seconds(e, s, what).map(Duration::from_secs_f64)).transpose()
    };
    let t = LatencyTargets {
        ttft_p99: duration(&e.latency_ttft_p99, "latency_ttft_p99")?,
        queue_p99: duration(&e.latency_queue_p99, "latency_queue_p99")?,
        window: duration(&e.latency_window, "latency_window")?.unwrap_or(d.window),
        min_samples: e.latency_min_samples.unwrap_or(d.min_samples).max(1),
    };
    if t.is_set() {
        return Ok(Some(t));
    }
    if e.latency_window.is_some() || e.latency_min_samples.is_some() {
        return Err(format!(
            "endpoint {}: latency_window and latency_min_samples need latency_ttft_p99 or latency_queue_p99",
            e.name
        ));
    }
    Ok(None)
}

/// A duration key of the table, in seconds.
fn seconds(e: &RawEndpoint, s: &str, what: &str) -> Result<f64, String> {
    parse_seconds(s).ok_or_else(|| format!("endpoint {}: {what} {s:?} is not a duration", e.name))
}

/// The class the policy puts the endpoint's replicas in, as onepoold
/// submits them, and its baseline replicas' class and count.
fn replica_classes(policy: &Policy, e: &RawEndpoint) -> Result<(Placed, Option<(usize, u32)>), String> {
    let class_idx =
        |name: &str| policy.classes.iter().position(|c| c.name == name).ok_or("classifier returned an unknown class");
    let req = JobRequest {
        annotation: Annotation {
            workload: Some(e.class.clone()),
            endpoint: Some(e.name.clone()),
            ..Annotation::default()
        },
        gpus: u64::from(e.gpus_per_replica),
        gpu_type: e.gpu_type.clone(),
        ..JobRequest::default()
    };
    let p = match classify(policy, &Nobody, DAEMON, &req) {
        Verdict::Accept(p) => p,
        Verdict::Outside => return Err(format!("endpoint {}: its replicas are outside the pool", e.name)),
        Verdict::Refuse(r) => return Err(format!("endpoint {}: {}", e.name, r.message)),
    };
    let placed = (class_idx(&p.class)?, p.record.reclaim, p.record.drain_timeout);
    let Some(b) = &e.baseline_class else { return Ok((placed, None)) };
    let breq =
        JobRequest { annotation: Annotation { workload: Some(b.clone()), ..req.annotation.clone() }, ..req.clone() };
    match classify(policy, &Nobody, DAEMON, &breq) {
        Verdict::Accept(bp) => Ok((placed, Some((class_idx(&bp.class)?, e.baseline_replicas)))),
        Verdict::Outside => Err(format!("endpoint {}: baseline replicas are outside the pool", e.name)),
        Verdict::Refuse(r) => Err(format!("endpoint {} baseline: {}", e.name, r.message)),
    }
}

/// The autoscaler's settings: onepoold's `[endpoint.replicas]` defaults
/// for what the table leaves out.
fn scaling(e: &RawEndpoint) -> Result<ScalingPolicy, String> {
    let d = ScalingPolicy::default();
    let window = |v: &Option<String>, what: &str, default: Duration| {
        v.as_deref().map_or(Ok(default), |s| seconds(e, s, what).map(Duration::from_secs_f64))
    };
    if e.panic_threshold.is_some_and(|t| !(t > 0.0 && t.is_finite())) {
        return Err(format!("endpoint {}: panic_threshold must be a positive number", e.name));
    }
    Ok(ScalingPolicy {
        target_per_replica: e.target_per_replica.unwrap_or(0.7 * f64::from(e.max_concurrent)),
        min: e.min_replicas.unwrap_or(1),
        max: e.max_replicas.unwrap_or(u32::MAX),
        stable_window: window(&e.stable_window, "stable_window", d.stable_window)?,
        panic_window: window(&e.panic_window, "panic_window", d.panic_window)?,
        panic_threshold: e.panic_threshold.unwrap_or(d.panic_threshold),
        scale_down_delay: window(&e.scale_down_delay, "scale_down_delay", d.scale_down_delay)?,
        trend_horizon: window(&e.trend_horizon, "trend_horizon", d.trend_horizon)?,
    })
}

/// An endpoint's warm headroom: its class as onepoold requires it, and
/// how much it asks for.
fn warm(policy: &Policy, e: &RawEndpoint) -> Result<Option<(usize, WarmSpec)>, String> {
    let Some(name) = &e.warm_class else {
        if e.warm_replicas.is_some() || e.warm_fraction.is_some() {
            return Err(format!("endpoint {}: warm_replicas and warm_fraction need warm_class", e.name));
        }
        return Ok(None);
    };
    let c = policy.warm_class(name).map_err(|m| format!("endpoint {}: warm_class = {m}", e.name))?;
    if Some(name) == e.baseline_class.as_ref() || *name == e.class {
        return Err(format!(
            "endpoint {}: warm_class = {name:?} is also the endpoint's class or baseline class; give warm replicas a class of their own",
            e.name
        ));
    }
    let fraction = e.warm_fraction.unwrap_or(0.0);
    if !(fraction.is_finite() && fraction >= 0.0) {
        return Err(format!("endpoint {}: warm_fraction = {fraction} must be a number of 0 or more", e.name));
    }
    let spec = WarmSpec { replicas: e.warm_replicas.unwrap_or(0), fraction };
    if spec.replicas == 0 && spec.fraction == 0.0 {
        return Err(format!(
            "endpoint {}: warm_class is set but warm_replicas and warm_fraction ask for no headroom",
            e.name
        ));
    }
    if let Some(max) = e.max_replicas.filter(|&m| spec.replicas >= m) {
        return Err(format!(
            "endpoint {}: warm_replicas = {} leaves no room for the load's replicas under max_replicas = {max}",
            e.name, spec.replicas
        ));
    }
    let i = policy.classes.iter().position(|k| k.name == c.name).ok_or("the policy lost a class")?;
    Ok(Some((i, spec)))
}
