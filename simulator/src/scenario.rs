//! The scenario file (TOML): the policy, the fleet, the job histories and
//! the inference endpoints with their service models. Paths are relative
//! to the scenario file.
//!
//! ```toml
//! policy = "../etc/onepool.toml"
//!
//! [fleet]                       # or: groups = [{ count = 4, gpus_per_node = 8, gpu_type = "a100" }, ...]
//! nodes = 4
//! gpus_per_node = 4
//!
//! [targets]
//! max_p95_wait = "1h"           # batch classes: p95 wait to meet (default 1h)
//!
//! [[jobs]]
//! file = "jobs.csv"             # formats: csv (see input::jobs), sacct (sacct -P), sacct-json
//! format = "csv"
//! keep_times = false            # false: shift so the first submission is at t=0
//! classified = false            # true: each row's class (csv) or QOS (sacct) is the class
//!                               #   onepool's plugin gave the job (records of a cluster that
//!                               #   runs onepool, as `onepool report` writes them): taken as
//!                               #   is, not classified again
//!
//! [[endpoints]]
//! name = "chat"
//! trace = "../data/azure-llm-inference-2023-conv.csv"  # or onepoold's access log
//! trace_endpoint = "chat"       # an access log's lines of this endpoint (default: name)
//! class = "inference"           # --workload of its replicas
//! gpus_per_replica = 1
//! gpu_type = "a100"             # optional
//! max_concurrent = 16           # requests one replica serves at once
//! prefill_tokens_per_s = 8000   # per request: context/prefill + generated/decode seconds
//! decode_tokens_per_s = 40
//! startup = "2m"                # GPUs held to ready
//! slo_p99 = "2s"                # p99 queueing delay to meet
//! min_replicas = 1              # optional; max_replicas too (default: what the GPUs hold)
//! target_per_replica = 11.2     # autoscaler target load (default 0.7 x max_concurrent)
//! stable_window = "60s"         # optional, as onepoold's [endpoint.replicas] (defaults
//! panic_window = "6s"           #   as there: 60s, 6s, 2, 2m)
//! panic_threshold = 2.0
//! scale_down_delay = "2m"
//! trend_horizon = "0s"          # optional: a rising load projected this far ahead
//! baseline_class = "inference-baseline"  # optional: in the shared pool the first
//! baseline_replicas = 2         #   replicas run in this (protected) class
//! warm_class = "inference-warm" # optional: warm headroom (onepoold's [endpoint.replicas.warm]):
//! warm_replicas = 1             #   in the shared pool, while no job waits for GPUs, this many
//! warm_fraction = 0.0           #   (or this fraction of the load's replicas, the larger) more
//!                               #   replicas stay loaded in this class, the lowest-ranked
//! keep_times = false
//!
//! [victims]                     # optional: what reclaimed batch jobs do (model inputs)
//! cancelled = "resubmit"        # a batch job reclaimed and not requeued (immediate, or
//!                               #   graceful after its drain): "resubmit" (default) = its
//!                               #   owner submits it again at once, from the beginning;
//!                               #   "drop" = it ends, as Slurm leaves it (PREEMPTED)
//! release_after = "20s"         # graceful/requeue batch victims give their GPUs back this
//!                               #   long after the notice (default: at their drain timeout)
//! [victims.class.agents]        # per class, overriding the two above
//! cancelled = "drop"
//! ```
//!
//! `cancelled = "resubmit"` keeps the comparison like for like (the islands
//! do all the work; so does the shared pool, plus the work it lost);
//! `"drop"` replays what Slurm alone does (bench/validate-simulator.sh) and
//! flatters the shared pool, since dropped work is never done. Either way
//! the report gives each class's lost GPU-hours and dropped jobs.
//!
//! Batch jobs are classified by onepool's classifier as an unprivileged
//! user with the job's account (so protected classes need an entitled
//! account); replicas as root, as the daemon submits them. Refused jobs
//! and jobs outside the pool are counted and reported, never simulated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use onepool_decisions::annotation::Annotation;
use onepool_decisions::autoscale::ScalingPolicy;
use onepool_decisions::classify::{classify, Directory, JobRequest, Submitter, Verdict};
use onepool_decisions::duration::parse_seconds;
use onepool_decisions::policy::{self, Policy, Tier};
use onepool_decisions::replicas::WarmSpec;
use serde::Deserialize;
use toml::Spanned;

use crate::engine::{Cancelled, Endpoint, Job, Req, VictimModel, Workload};
use crate::fleet::{Fleet, NodeGroup};
use crate::input::{azure, jobs, BadRow, OnBadRow, Rows};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    policy: PathBuf,
    fleet: RawFleet,
    #[serde(default)]
    targets: RawTargets,
    #[serde(default)]
    jobs: Vec<RawJobs>,
    #[serde(default)]
    endpoints: Vec<RawEndpoint>,
    #[serde(default)]
    victims: RawVictims,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawVictims {
    cancelled: Option<Spanned<String>>,
    release_after: Option<Spanned<String>>,
    #[serde(default)]
    class: BTreeMap<Spanned<String>, RawVictimClass>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawVictimClass {
    cancelled: Option<Spanned<String>>,
    release_after: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    nodes: Option<u32>,
    gpus_per_node: Option<u32>,
    gpu_type: Option<String>,
    groups: Option<Vec<NodeGroup>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTargets {
    max_p95_wait: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobs {
    file: PathBuf,
    #[serde(default = "csv")]
    format: String,
    #[serde(default)]
    keep_times: bool,
    #[serde(default)]
    classified: bool,
}

fn csv() -> String {
    "csv".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    name: String,
    trace: PathBuf,
    trace_endpoint: Option<String>,
    class: String,
    gpus_per_replica: u32,
    gpu_type: Option<String>,
    max_concurrent: u32,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    startup: String,
    slo_p99: String,
    min_replicas: Option<u32>,
    max_replicas: Option<u32>,
    target_per_replica: Option<f64>,
    stable_window: Option<String>,
    panic_window: Option<String>,
    panic_threshold: Option<f64>,
    scale_down_delay: Option<String>,
    trend_horizon: Option<String>,
    baseline_class: Option<String>,
    #[serde(default)]
    baseline_replicas: u32,
    warm_class: Option<String>,
    warm_replicas: Option<u32>,
    warm_fraction: Option<f64>,
    #[serde(default)]
    keep_times: bool,
}

/// A loaded scenario: the workload, classified, and what was left out.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub policy: Policy,
    pub fleet: Fleet,
    pub workload: Workload,
    pub max_p95_wait_s: f64,
    /// Malformed rows, in file order.
    pub bad_rows: Vec<BadRow>,
    /// Rows not simulated, by reason (`refused: ...`, `outside the pool`, `job steps`, ...).
    pub ignored: Vec<(String, usize)>,
}

struct Nobody;
impl Directory for Nobody {
    fn user_name(&self, _: u32) -> Option<&str> {
        None
    }
    fn in_group(&self, _: u32, _: u32, _: &str) -> bool {
        false
    }
}
const USER: Submitter = Submitter { uid: 65_534, gid: 65_534 };
const DAEMON: Submitter = Submitter { uid: 0, gid: 0 };

fn count(ignored: &mut Vec<(String, usize)>, why: String, n: usize) {
    match ignored.iter_mut().find(|(w, _)| *w == why) {
        Some((_, k)) => *k += n,
        None => ignored.push((why, n)),
    }
}

fn take<T>(
    r: Result<Rows<T>, BadRow>,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<T>, String> {
    let r = r.map_err(|b| format!("{b} (stopping: --on-bad-row=abort)"))?;
    bad_rows.extend(r.skipped);
    for (w, n) in r.ignored {
        count(ignored, w, n);
    }
    Ok(r.rows)
}

fn read(base: &Path, p: &Path) -> Result<(String, String), String> {
    let path = base.join(p);
    let shown = path.display().to_string();
    std::fs::read_to_string(&path).map(|t| (shown.clone(), t)).map_err(|e| format!("{shown}: {e}"))
}

/// `file:line` of a span of the scenario's text (the file alone without one).
fn at(path: &Path, text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => format!("{}:{}", path.display(), text[..r.start.min(text.len())].matches('\n').count() + 1),
        None => path.display().to_string(),
    }
}

/// The scenario file's own tables, not yet what they name.
fn read_raw(path: &Path) -> Result<(Raw, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let raw = toml::from_str(&text)
        .map_err(|e: toml::de::Error| format!("{}: {}", at(path, &text, e.span()), e.message()))?;
    Ok((raw, text))
}

/// An `[[endpoints]]` table's service model as the file writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointModel {
    pub name: String,
    /// As written (`"4s"`): the validation quotes it.
    pub startup: String,
    pub decode_tokens_per_s: f64,
}

/// The scenario's `[[endpoints]]` as written, without reading the traces
/// or the policy they name (bench/validate-simulator.sh sets the real
/// endpoint's numbers beside them).
pub fn endpoint_models(path: &Path) -> Result<Vec<EndpointModel>, String> {
    let (raw, _) = read_raw(path)?;
    Ok(raw
        .endpoints
        .into_iter()
        .map(|e| EndpointModel { name: e.name, startup: e.startup, decode_tokens_per_s: e.decode_tokens_per_s })
        .collect())
}

/// Reads a scenario file and everything it names.
pub fn load(path: &Path, on_bad: OnBadRow) -> Result<Scenario, String> {
    let (raw, text) = read_raw(path)?;
    let at = |span| at(path, &text, span);
    let base = path.parent().unwrap_or(Path::new("."));
    let (pfile, ptext) = read(base, &raw.policy)?;
    let loaded = policy::load(&ptext);
    let Some(policy) = loaded.policy.clone() else {
        return Err(format!("the policy has errors:\n{}", loaded.render(&pfile, &ptext).join("\n")));
    };
    let fleet = fleet(raw.fleet)?;
    let max_wait = match raw.targets.max_p95_wait {
        Some(s) => parse_seconds(&s).ok_or_else(|| format!("targets.max_p95_wait {s:?} is not a duration"))?,
        None => 3600.0,
    };
    let mut bad_rows = Vec::new();
    let mut ignored = Vec::new();
    let rows = job_rows(base, &raw.jobs, on_bad, &mut bad_rows, &mut ignored)?;
    let work_jobs = classify_jobs(&policy, rows, &mut ignored)?;
    let mut endpoints = Vec::new();
    for e in raw.endpoints {
        endpoints.push(endpoint(base, &policy, e, on_bad, &mut bad_rows, &mut ignored)?);
    }
    let mut workload = build_workload(&policy, work_jobs, endpoints);
    workload.victims = victims(&policy, &raw.victims).map_err(|(span, e)| format!("{}: {e}", at(span)))?;
    Ok(Scenario { policy, fleet, workload, max_p95_wait_s: max_wait, bad_rows, ignored })
}

/// `[fleet]`: node groups, or one group given by nodes and GPUs per node.
fn fleet(raw: RawFleet) -> Result<Fleet, String> {
    let fleet = match (raw.groups, raw.nodes, raw.gpus_per_node) {
        (Some(g), None, None) => Fleet { groups: g },
        (None, Some(n), Some(g)) => {
            Fleet { groups: vec![NodeGroup { count: n, gpus_per_node: g, gpu_type: raw.gpu_type }] }
        }
        _ => return Err("[fleet] needs either groups = [...] or nodes and gpus_per_node".into()),
    };
    fleet.check()?;
    Ok(fleet)
}

/// Every `[[jobs]]` file's rows, their times from 0 unless kept.
fn job_rows(
    base: &Path,
    raw: &[RawJobs],
    on_bad: OnBadRow,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<(jobs::JobRow, bool)>, String> {
    let mut rows = Vec::new();
    for j in raw {
        let (f, t) = read(base, &j.file)?;
        let r = match j.format.as_str() {
            "csv" => jobs::read_csv(&f, &t, on_bad),
            "sacct" => jobs::read_sacct(&f, &t, on_bad),
            "sacct-json" => jobs::read_sacct_json(&f, &t, on_bad),
            other => return Err(format!("jobs format {other:?}: use csv, sacct or sacct-json")),
        };
        let mut got = take(r, bad_rows, ignored)?;
        if !j.keep_times {
            let first = got.iter().map(|r| r.submit).fold(f64::INFINITY, f64::min);
            got.iter_mut().for_each(|r| r.submit -= first);
        }
        rows.extend(got.into_iter().map(|r| (r, j.classified)));
    }
    Ok(rows)
}

/// The rows the policy accepts, as jobs of their classes in submission
/// order; the others counted in `ignored` with the reason. Rows of a
/// `classified` file keep the class the plugin gave them.
fn classify_jobs(
    policy: &Policy,
    rows: Vec<(jobs::JobRow, bool)>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<Job>, String> {
    let class_idx = |name: &str| policy.classes.iter().position(|c| c.name == name);
    let mut work_jobs = Vec::new();
    for (r, classified) in rows {
        let placed = if classified {
            match already_classified(policy, &r) {
                Some(placed) => placed,
                None => {
                    count(ignored, "outside the pool (its class or QOS is no class of the policy)".into(), 1);
                    continue;
                }
            }
        } else {
            match classify(policy, &Nobody, USER, &job_request(&r)) {
                Verdict::Accept(p) => {
                    let c = class_idx(&p.class).ok_or("classifier returned an unknown class")?;
                    (c, p.record.reclaim, p.record.drain_timeout)
                }
                Verdict::Outside => {
                    count(ignored, "outside the pool (partition or GPU type)".into(), 1);
                    continue;
                }
                Verdict::Refuse(f) => {
                    count(ignored, format!("refused by the policy: {}", f.message), 1);
                    continue;
                }
            }
        };
        let (c, reclaim, drain) = placed;
        work_jobs.push(Job {
            submit: r.submit,
            duration: r.duration,
            gpus: r.gpus,
            per_node: r.gpus_per_node.unwrap_or(r.gpus),
            gpu_type: r.gpu_type,
            class: c,
            island: c,
            reclaim,
            drain,
        });
    }
    work_jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    Ok(work_jobs)
}

type Placed = (usize, Option<onepool_decisions::annotation::ReclaimMode>, Option<Duration>);

/// A record's class as the plugin gave it (the class name, else the
/// class whose QOS it ran under), with that class's reclaim behaviour.
fn already_classified(policy: &Policy, r: &jobs::JobRow) -> Option<Placed> {
    let class = match &r.class {
        Some(name) => policy.class(name)?,
        None => policy.class_by_qos(r.qos.as_deref()?)?,
    };
    let i = policy.classes.iter().position(|k| k.name == class.name)?;
    Some(match class.tier {
        Tier::Protected { .. } => (i, None, None),
        Tier::Flexible { reclaim, drain_timeout, .. } => (i, Some(reclaim), Some(drain_timeout)),
    })
}

/// What the plugin would have been asked at submission.
fn job_request(r: &jobs::JobRow) -> JobRequest {
    JobRequest {
        account: r.account.clone(),
        partition: r.partition.clone(),
        qos: r.qos.clone(),
        annotation: Annotation { workload: r.class.clone(), ..Annotation::default() },
        gpus: u64::from(r.gpus),
        gpu_type: r.gpu_type.clone(),
        time_limit: Some(Duration::from_secs_f64(r.duration.ceil().max(1.0))),
        // The records hold what the jobs held: counted as they ran.
        exclusive: false,
        nodes: 1,
    }
}

/// One `[[endpoints]]`: its trace as requests with service times, its
/// replicas' class (and the baseline's) as the policy places them, its
/// autoscaling.
#[allow(
    clippy::too_many_lines,
    reason = "one [[endpoint]] table read key by key in the file's order, each key's message beside its check"
)]
fn endpoint(
    base: &Path,
    policy: &Policy,
    e: RawEndpoint,
    on_bad: OnBadRow,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Endpoint, String> {
    let class_idx = |name: &str| policy.classes.iter().position(|c| c.name == name);
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
    let c = class_idx(&p.class).ok_or("classifier returned an unknown class")?;
    let baseline = match &e.baseline_class {
        Some(b) => {
            let breq = JobRequest {
                annotation: Annotation { workload: Some(b.clone()), ..req.annotation.clone() },
                ..req.clone()
            };
            match classify(policy, &Nobody, DAEMON, &breq) {
                Verdict::Accept(bp) => {
                    Some((class_idx(&bp.class).ok_or("classifier returned an unknown class")?, e.baseline_replicas))
                }
                Verdict::Outside => return Err(format!("endpoint {}: baseline replicas are outside the pool", e.name)),
                Verdict::Refuse(r) => return Err(format!("endpoint {} baseline: {}", e.name, r.message)),
            }
        }
        None => None,
    };
    let warm = warm(policy, &e)?;
    let dur = |s: &str, what: &str| {
        parse_seconds(s).ok_or_else(|| format!("endpoint {}: {what} {s:?} is not a duration", e.name))
    };
    let (pre, dec) = (e.prefill_tokens_per_s, e.decode_tokens_per_s);
    let requests: Arc<[Req]> = reqs
        .iter()
        .map(|r| Req {
            t: r.t,
            service: (f64::from(r.context_tokens) / pre + f64::from(r.generated_tokens) / dec) as f32,
        })
        .collect();
    Ok(Endpoint {
        name: e.name.clone(),
        class: c,
        island: c,
        gpus_per_replica: e.gpus_per_replica.max(1),
        gpu_type: e.gpu_type,
        max_concurrent: e.max_concurrent,
        startup_s: dur(&e.startup, "startup")?,
        slo_p99_s: dur(&e.slo_p99, "slo_p99")?,
        scaling: {
            let d = ScalingPolicy::default();
            let window = |v: &Option<String>, what: &str, default: Duration| {
                v.as_deref().map_or(Ok(default), |s| dur(s, what).map(Duration::from_secs_f64))
            };
            if e.panic_threshold.is_some_and(|t| !(t > 0.0 && t.is_finite())) {
                return Err(format!("endpoint {}: panic_threshold must be a positive number", e.name));
            }
            ScalingPolicy {
                target_per_replica: e.target_per_replica.unwrap_or(0.7 * f64::from(e.max_concurrent)),
                min: e.min_replicas.unwrap_or(1),
                max: e.max_replicas.unwrap_or(u32::MAX),
                stable_window: window(&e.stable_window, "stable_window", d.stable_window)?,
                panic_window: window(&e.panic_window, "panic_window", d.panic_window)?,
                panic_threshold: e.panic_threshold.unwrap_or(d.panic_threshold),
                scale_down_delay: window(&e.scale_down_delay, "scale_down_delay", d.scale_down_delay)?,
                trend_horizon: window(&e.trend_horizon, "trend_horizon", d.trend_horizon)?,
            }
        },
        reclaim: p.record.reclaim,
        drain: p.record.drain_timeout,
        baseline,
        warm,
        requests,
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

type SpanErr = (Option<std::ops::Range<usize>>, String);

/// The `[victims]` table, per class of the policy.
fn victims(policy: &Policy, raw: &RawVictims) -> Result<Vec<VictimModel>, SpanErr> {
    let cancelled = |v: &Spanned<String>, key: &str| {
        Cancelled::parse(v.get_ref())
            .ok_or_else(|| (Some(v.span()), format!("{key} {:?}: use \"resubmit\" or \"drop\"", v.get_ref())))
    };
    let duration = |v: &Spanned<String>, key: &str| {
        parse_seconds(v.get_ref()).ok_or_else(|| {
            (Some(v.span()), format!("{key} {:?} is not a duration (e.g. \"30s\", \"2m\")", v.get_ref()))
        })
    };
    let all = VictimModel {
        cancelled: raw.cancelled.as_ref().map(|v| cancelled(v, "victims.cancelled")).transpose()?.unwrap_or_default(),
        release_after_s: raw.release_after.as_ref().map(|v| duration(v, "victims.release_after")).transpose()?,
    };
    let mut out = vec![all; policy.classes.len()];
    for (name, c) in &raw.class {
        let key = format!("victims.class.{}", name.get_ref());
        let Some(i) = policy.classes.iter().position(|k| k.name == *name.get_ref()) else {
            return Err((Some(name.span()), format!("{key}: the policy has no class {:?}", name.get_ref())));
        };
        let (mode, drain) = match policy.classes[i].tier {
            Tier::Protected { .. } => {
                return Err((Some(name.span()), format!("{key}: a protected class is never reclaimed")));
            }
            Tier::Flexible { reclaim, drain_timeout, .. } => (reclaim, drain_timeout),
        };
        if let Some(v) = &c.cancelled {
            if mode == onepool_decisions::annotation::ReclaimMode::Requeue {
                return Err((
                    Some(v.span()),
                    format!("{key}.cancelled: its jobs are requeued when reclaimed, never cancelled"),
                ));
            }
            out[i].cancelled = cancelled(v, &format!("{key}.cancelled"))?;
        }
        if let Some(v) = &c.release_after {
            if mode == onepool_decisions::annotation::ReclaimMode::Immediate {
                return Err((
                    Some(v.span()),
                    format!("{key}.release_after: its jobs are reclaimed immediately (no notice to act on)"),
                ));
            }
            let d = duration(v, &format!("{key}.release_after"))?;
            if d > drain.as_secs_f64() {
                return Err((
                    Some(v.span()),
                    format!(
                        "{key}.release_after {:?} is longer than the class's drain timeout ({} s): Slurm ends the job then",
                        v.get_ref(),
                        drain.as_secs()
                    ),
                ));
            }
            out[i].release_after_s = Some(d);
        }
    }
    Ok(out)
}

/// Puts classified work together and sets the reporting window.
pub fn build_workload(policy: &Policy, jobs: Vec<Job>, endpoints: Vec<Endpoint>) -> Workload {
    let classes: Vec<String> = policy.classes.iter().map(|c| c.name.clone()).collect();
    let mut t0 = f64::INFINITY;
    let mut t1 = f64::NEG_INFINITY;
    for j in &jobs {
        t0 = t0.min(j.submit);
        t1 = t1.max(j.submit + j.duration);
    }
    for e in &endpoints {
        for r in e.requests.iter() {
            t0 = t0.min(r.t);
            t1 = t1.max(r.t + f64::from(r.service));
        }
    }
    if !t0.is_finite() {
        (t0, t1) = (0.0, 0.0);
    }
    let victims = vec![VictimModel::default(); classes.len()];
    Workload { islands: classes.clone(), classes, jobs, endpoints, victims, t0, t1 }
}
