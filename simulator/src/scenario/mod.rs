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
//! latency_queue_p99 = "1s"      # optional: latency targets (onepoold's [endpoint.replicas.latency]):
//! latency_ttft_p99 = "2s"       #   queue wait, and first byte (the whole answer's here: no
//! latency_window = "60s"        #   separate prefill time), p99 over the requests since the
//! latency_min_samples = 20      #   replica count changed
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

mod endpoint;
mod history;
mod reading;
mod victims;

use std::path::{Path, PathBuf};

use onepool_decisions::duration::parse_seconds;
use onepool_decisions::policy::{self, Policy};
use serde::Deserialize;

use crate::engine::{Endpoint, Job, VictimModel, Workload};
use crate::fleet::{Fleet, NodeGroup};
use crate::input::{BadRow, OnBadRow};
use crate::scenario::endpoint::{endpoint, RawEndpoint};
use crate::scenario::history::{classify_jobs, job_rows, RawJobs};
use crate::scenario::reading::{at, read};
use crate::scenario::victims::{victims, RawVictims};

pub use endpoint::EndpointModel;

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

/// The scenario file's own tables, not yet what they name.
fn read_raw(path: &Path) -> Result<(Raw, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let raw = toml::from_str(&text)
        .map_err(|e: toml::de::Error| format!("{}: {}", at(path, &text, e.span()), e.message()))?;
    Ok((raw, text))
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
