//! "What the pool saved" (issue #26, item 3): how many GPUs separate
//! islands would have needed for the period's jobs and requests, beside
//! the one shared pool, measured by the simulator on the period's own
//! records. The report writes those records as a scenario (the policy,
//! the jobs as sacct has them with the class the plugin gave each, each
//! endpoint's requests from onepoold's access log, its replica settings
//! from onepoold.toml) and runs it through the path `onepool simulate`
//! takes ([`crate::simulate::evaluate`]): `onepool simulate
//! DIR/scenario.toml` on a kept scenario (`--scenario DIR`) prints the same
//! numbers. What the records do not hold (a request's service time apart
//! from its queueing, a replica's model load, the targets) is estimated or
//! assumed, and every such choice is printed with the figure.

use std::collections::BTreeMap;

use onepool_decisions::policy::Policy;
use onepool_decisions::trace::{format_time, parse_time, AccessEntry};
use onepool_simulator::compare::{NoSaving, Unmet};
use onepool_simulator::report::Options;
use serde::Serialize;

use super::records::Run;
use super::replica_jobs::ReplicaJobs;

/// An endpoint whose replicas onepoold runs (`[endpoint.replicas]` in
/// onepoold.toml), as the simulator models it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointSettings {
    pub name: String,
    pub class: String,
    pub baseline_class: String,
    pub min: u32,
    pub max: u32,
    pub gpus: u32,
    /// Requests one replica serves at once (`replica_concurrency`).
    pub concurrency: u32,
    pub target_per_replica: f64,
    pub stable_window_s: f64,
    pub panic_window_s: f64,
    pub panic_threshold: f64,
    pub scale_down_delay_s: f64,
    pub trend_horizon_s: f64,
    /// Warm headroom: its class, replicas and fraction.
    pub warm: Option<(String, u32, f64)>,
    /// Latency targets (`[endpoint.replicas.latency]`).
    pub latency: Option<onepool_decisions::latency::LatencyTargets>,
}

/// What the report reads for the figure.
pub struct Inputs<'a> {
    pub runs: &'a [Run],
    /// Which runs are onepoold's replica jobs (the endpoints stand for
    /// them, and their launchers' notes time a replica's startup): the
    /// report's one rule, so a job a user merely names like a replica
    /// changes neither (issue #35).
    pub replicas: &'a ReplicaJobs,
    pub policy: &'a Policy,
    pub policy_text: &'a str,
    pub from: f64,
    pub to: f64,
    /// onepoold's endpoints; `None`: no onepoold.toml was read (why).
    pub endpoints: Result<Vec<EndpointSettings>, String>,
    /// The access log's lines (every file kept, any period); `Err`: why
    /// there are none.
    pub access: Result<Vec<AccessEntry>, String>,
    pub slo_p99_s: f64,
    pub max_p95_wait_s: f64,
    /// `--replica-startup`: instead of the estimate from the records.
    pub startup_s: Option<f64>,
    /// The cluster's clock minus UTC: sacct and the period are in the
    /// cluster's local time, the access log in UTC.
    pub utc_offset_s: f64,
}

/// The scenario's files and what went into them.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// (file name, text): `scenario.toml` first.
    pub files: Vec<(String, String)>,
    pub jobs: usize,
    pub requests: usize,
    pub endpoints: Vec<String>,
    pub assumptions: Vec<String>,
}

/// The figure as the report prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saved {
    /// GPUs the separate islands need in all (each class alone on its
    /// smallest island meeting its target); `None`: unmet.
    pub separate_islands_gpus: Option<u64>,
    /// The smallest shared pool meeting every target; `None`: not searched
    /// (too costly) or unmet, `shared_pool_unmet` says which.
    pub shared_pool_gpus: Option<u64>,
    /// Why `separate_islands_gpus` is `None` (which class missed which
    /// target at which sizes), as `onepool simulate --json`'s
    /// `separate_unmet`.
    pub separate_islands_unmet: Option<Unmet>,
    /// Why `shared_pool_gpus` is `None`.
    pub shared_pool_unmet: Option<Unmet>,
    /// The islands needed no more GPUs than one pool: what the runs show
    /// about why.
    pub no_saving: Option<NoSaving>,
    /// The figures in words: the GPUs-needed line, then why a figure is
    /// not a number and why there was no saving, as the text, the chart
    /// and the demo say them ([`onepool_simulator::report::reasons`]).
    pub reading: Vec<String>,
    /// What the two figures measured, as `onepool simulate` words it.
    pub measured: String,
    /// The pool's GPUs (the policy's `total_gpus`).
    pub pool_gpus: u64,
    /// Each class's own island.
    pub islands: BTreeMap<String, Option<u64>>,
    pub jobs: usize,
    pub requests: usize,
    pub endpoints: Vec<String>,
    pub assumptions: Vec<String>,
    /// Records the simulator left out, by reason.
    pub left_out: Vec<(String, usize)>,
    /// Where the scenario was kept (`--scenario`).
    pub scenario: Option<String>,
    /// What this pool (of `pool_gpus`) achieved in the simulation: the
    /// highest p99 queueing delay of any class's requests, and the highest
    /// p95 wait of any class's batch jobs (`None`: no such work).
    pub pool_p99_queue_delay_s: Option<f64>,
    pub pool_p95_wait_s: Option<f64>,
}

/// Targets the pool's own service meets: what it achieved, 10 % looser and
/// rounded up (a p99 to 0.1 s, a p95 wait to the second), so that the
/// question becomes "what would separate islands need for the same
/// service" (`--targets-from-pool`: the demo asks it, since on a slow
/// machine the default 2 s target may be one no pool size meets).
pub fn targets_from_pool(s: &Saved) -> Option<(f64, f64)> {
    if s.pool_p99_queue_delay_s.is_none() && s.pool_p95_wait_s.is_none() {
        return None;
    }
    let p99 = s.pool_p99_queue_delay_s.map_or(0.1, |v| ((v * 1.1) * 10.0).ceil() / 10.0).max(0.1);
    let wait = s.pool_p95_wait_s.map_or(1.0, |v| (v * 1.1).ceil()).max(1.0);
    Some((p99, wait))
}

/// What changes the figure's targets and assumptions: the report's own
/// flags (the figure not being a number names them).
pub const OPTIONS: Options = Options {
    slo_p99: "--slo-p99",
    max_p95_wait: "--max-p95-wait",
    startup: "--replica-startup",
    max_replicas: "max in onepoold.toml's [endpoint.replicas]",
    search: "onepool simulate --search on the scenario --scenario keeps",
};

/// Writes the period's records as a scenario.
pub fn scenario(inp: &Inputs) -> Written {
    let mut assumptions = Vec::new();
    let (nodes, gpn) = fleet(inp.policy, &mut assumptions);
    let (endpoints, access) = modelled(inp, &mut assumptions);
    let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
    let (csv, jobs) = jobs_csv(inp, &names, &mut assumptions);
    assumptions.push(format!(
        "targets: batch classes' p95 wait at most {}, endpoints' p99 queueing delay at most {} (--max-p95-wait, --slo-p99)",
        seconds(inp.max_p95_wait_s),
        seconds(inp.slo_p99_s)
    ));

    let mut scen = scenario_table(inp, nodes, gpn);
    let (lines, requests, eps) = endpoint_requests(&endpoints, &access, inp.slo_p99_s);
    if !eps.is_empty() {
        scen.insert("endpoints".into(), toml::Value::Array(eps));
    }
    let header = format!(
        "# Written by onepool report for {} to {}: the period's records as a scenario.\n\
         # onepool simulate on this file prints the report's \"what the pool saved\".\n",
        format_time(inp.from),
        format_time(inp.to)
    );
    let mut files = vec![
        ("scenario.toml".to_string(), header + &toml::to_string(&scen).expect("a scenario table serializes")),
        ("policy.toml".to_string(), inp.policy_text.to_string()),
        ("jobs.csv".to_string(), csv),
    ];
    if !endpoints.is_empty() {
        files.push(("access.jsonl".to_string(), lines));
    }
    Written { files, jobs, requests, endpoints: names.iter().map(|s| s.to_string()).collect(), assumptions }
}

/// The simulated fleet (nodes, GPUs per node): the pool as the policy
/// states it, one node when it does not say how the GPUs are spread.
fn fleet(policy: &Policy, assumptions: &mut Vec<String>) -> (u32, u32) {
    let gpn = policy.pool.gpus_per_node.unwrap_or(policy.pool.total_gpus).max(1);
    let nodes = policy.pool.total_gpus.div_ceil(gpn);
    assumptions.push(format!(
        "the pool as the policy states it: {nodes} node(s) x {gpn} GPUs (pool.total_gpus {}, pool.gpus_per_node {})",
        policy.pool.total_gpus,
        policy.pool.gpus_per_node.map_or("unset: one node".to_string(), |g| g.to_string())
    ));
    (nodes, gpn)
}

/// The period's GPU runs as the scenario's jobs.csv, and how many. The
/// modelled endpoints' replica jobs are left out: the simulator starts
/// their replicas itself.
fn jobs_csv(inp: &Inputs, endpoints: &[&str], assumptions: &mut Vec<String>) -> (String, usize) {
    let mut csv = String::from("submit,duration,gpus,gpus_per_node,class,qos\n");
    let (mut jobs, mut carried) = (0usize, 0usize);
    for r in inp.runs {
        if r.gpus == 0 || !r.start.is_finite() || r.start <= 0.0 || r.start >= inp.to || r.end <= inp.from {
            continue;
        }
        if inp.replicas.endpoint_of(r).is_some_and(|e| endpoints.contains(&e)) {
            continue;
        }
        let end = r.end.min(inp.to);
        let (submit, start) = if r.start < inp.from {
            carried += 1;
            (inp.from, inp.from)
        } else {
            (r.submit.max(inp.from), r.start)
        };
        let per_node = if r.nodes.is_empty() { r.gpus } else { r.gpus / r.nodes.len() as u32 };
        csv.push_str(&format!(
            "{submit:.3},{:.3},{},{},,{}\n",
            (end - start).max(0.001),
            r.gpus,
            per_node.max(1),
            csv_cell(&r.qos)
        ));
        jobs += 1;
    }
    assumptions.push(format!(
        "jobs: the period's {jobs} runs holding GPUs, each as long as it ran, in the class whose QOS it ran under; \
         a reclaimed run counts as the run it was, its rerun as a job of its own"
    ));
    if carried > 0 {
        assumptions.push(format!(
            "{carried} run(s) already running at the period's start enter it submitted then, with the time they had left"
        ));
    }
    (csv, jobs)
}

/// scenario.toml but its endpoints: the policy, the fleet, the batch
/// target and the jobs file, whose times and classes are kept as recorded.
fn scenario_table(inp: &Inputs, nodes: u32, gpn: u32) -> toml::Table {
    let mut scen = toml::Table::new();
    scen.insert("policy".into(), "policy.toml".into());
    let mut fleet = toml::Table::new();
    fleet.insert("nodes".into(), i64::from(nodes).into());
    fleet.insert("gpus_per_node".into(), i64::from(gpn).into());
    scen.insert("fleet".into(), fleet.into());
    let mut targets = toml::Table::new();
    targets.insert("max_p95_wait".into(), format!("{}", inp.max_p95_wait_s).into());
    scen.insert("targets".into(), targets.into());
    let mut job_file = toml::Table::new();
    job_file.insert("file".into(), "jobs.csv".into());
    job_file.insert("format".into(), "csv".into());
    job_file.insert("keep_times".into(), true.into());
    job_file.insert("classified".into(), true.into());
    scen.insert("jobs".into(), toml::Value::Array(vec![job_file.into()]));
    scen
}

/// The modelled endpoints' requests as access.jsonl, how many, and each
/// endpoint's scenario table.
fn endpoint_requests(
    endpoints: &[EndpointSettings],
    access: &[Model],
    slo_p99_s: f64,
) -> (String, usize, Vec<toml::Value>) {
    let mut lines = String::new();
    let mut requests = 0;
    let mut eps = Vec::new();
    for (e, model) in endpoints.iter().zip(access) {
        for a in &model.requests {
            lines.push_str(&serde_json::to_string(a).expect("an access entry serializes"));
            lines.push('\n');
        }
        requests += model.requests.len();
        eps.push(toml::Value::Table(endpoint_table(e, model, slo_p99_s)));
    }
    (lines, requests, eps)
}

/// One endpoint's requests in the period and its estimated service.
struct Model {
    requests: Vec<AccessEntry>,
    prefill: f64,
    decode: f64,
    startup_s: f64,
}

/// The endpoints that can be modelled (onepoold runs their replicas and
/// the access log has their requests), with the reasons for the others.
fn modelled(inp: &Inputs, assumptions: &mut Vec<String>) -> (Vec<EndpointSettings>, Vec<Model>) {
    let endpoints = match &inp.endpoints {
        Ok(e) => e.clone(),
        Err(why) => {
            assumptions.push(format!("no endpoints: {why}; replica jobs count as the jobs they were"));
            return (Vec::new(), Vec::new());
        }
    };
    let entries = match &inp.access {
        Ok(a) => a,
        Err(why) => {
            if !endpoints.is_empty() {
                assumptions.push(format!(
                    "no requests: {why}; the endpoints' replica jobs count as the jobs they were, not as serving"
                ));
            }
            return (Vec::new(), Vec::new());
        }
    };
    let mut out = (Vec::new(), Vec::new());
    for e in endpoints {
        let mut requests = Vec::new();
        let mut router_answers = 0;
        for a in entries.iter().filter(|a| a.endpoint == e.name) {
            let Some(t) = parse_time(&a.time) else { continue };
            // In the records' clock from here on, the scenario's too.
            let t = t + inp.utc_offset_s;
            if t < inp.from || t > inp.to {
                continue;
            }
            if a.prompt_tokens.is_some() && a.completion_tokens.is_some() {
                requests.push(AccessEntry { time: onepool_decisions::trace::format_time_ms(t), ..a.clone() });
            } else {
                router_answers += 1;
            }
        }
        let (prefill, decode, how) = fit_service(&requests);
        assumptions.push(format!(
            "endpoint {}: {} request(s) with the server's token counts; {how}",
            e.name,
            requests.len()
        ));
        if router_answers > 0 {
            assumptions.push(format!(
                "endpoint {}: {router_answers} answer(s) without token counts (the router's own 503s, streams the \
                 server counted nothing for) are not simulated",
                e.name
            ));
        }
        let startup_s = match inp.startup_s {
            Some(s) => {
                assumptions.push(format!("endpoint {}: replica startup {} (--replica-startup)", e.name, seconds(s)));
                s
            }
            None => {
                let (s, how) = startup(inp.runs, inp.replicas, &e.name, &requests);
                assumptions.push(format!("endpoint {}: replica startup {}: {how}", e.name, seconds(s)));
                s
            }
        };
        let (requests, lower) = split_lower_classes(inp.policy, &e, requests);
        out.0.push(e.clone());
        out.1.push(Model { requests, prefill, decode, startup_s });
        for (class, reqs) in lower {
            let name = format!("{}:{class}", e.name);
            assumptions.push(format!(
                "endpoint {}: its {} request(s) of class {class} (below its own, {}) as an endpoint of their own, {name}: \
                 replicas in class {class}, none of them baseline, as onepoold's lower_workload submits them \
                 (the router's serving by class on shared replicas is not modelled)",
                e.name,
                reqs.len(),
                e.class
            ));
            let split = EndpointSettings { name, class, min: 0, warm: None, latency: None, ..e.clone() };
            out.0.push(split);
            out.1.push(Model { requests: reqs, prefill, decode, startup_s });
        }
    }
    out
}

/// Issue #44: an endpoint's requests of request classes ranked below its
/// own class, by class (each renamed to its own endpoint, `NAME:CLASS`),
/// apart from the rest. Capacity follows the class that asks for it, so
/// in the pool their replicas are that class's work, and separate islands
/// serve them on that class's island.
fn split_lower_classes(
    policy: &Policy,
    e: &EndpointSettings,
    requests: Vec<AccessEntry>,
) -> (Vec<AccessEntry>, BTreeMap<String, Vec<AccessEntry>>) {
    let rank = |class: &str| policy.class(class).and_then(|c| c.rank());
    let own = rank(&e.class);
    let mut lower: BTreeMap<String, Vec<AccessEntry>> = BTreeMap::new();
    let mut rest = Vec::new();
    for a in requests {
        match a.class.as_deref() {
            Some(c) if own.is_some_and(|own| rank(c).is_some_and(|r| r > own)) => {
                let name = format!("{}:{c}", e.name);
                lower.entry(c.to_string()).or_default().push(AccessEntry { endpoint: name, ..a });
            }
            _ => rest.push(a),
        }
    }
    (rest, lower)
}

/// Tokens per second of prompt and of answer, fitted by least squares on
/// `latency = prompt / P + completion / D` over the answered requests.
/// The router's latency includes any queueing, so the fit errs slow: the
/// same for the islands and the pool.
fn fit_service(reqs: &[AccessEntry]) -> (f64, f64, String) {
    let pts: Vec<(f64, f64, f64)> = reqs
        .iter()
        .filter(|a| a.status == 200 && a.complete && a.latency_s > 0.0)
        .filter_map(|a| Some((a.prompt_tokens? as f64, a.completion_tokens? as f64, a.latency_s)))
        .collect();
    if pts.is_empty() {
        return (1.0, 1.0, "no answered request to fit a service time on (none to serve either)".into());
    }
    let (mut spp, mut spc, mut scc, mut spl, mut scl, mut sl) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for &(p, c, l) in &pts {
        spp += p * p;
        spc += p * c;
        scc += c * c;
        spl += p * l;
        scl += c * l;
        sl += l;
    }
    let det = spp * scc - spc * spc;
    let (a, b) = if det.abs() > 1e-9 * spp.max(1.0) * scc.max(1.0) {
        ((spl * scc - scl * spc) / det, (scl * spp - spl * spc) / det)
    } else {
        (f64::NAN, f64::NAN)
    };
    let n = pts.len();
    let mean = sl / n as f64;
    if a > 0.0 && b > 0.0 {
        return (
            1.0 / a,
            1.0 / b,
            format!(
                "service time fitted on {n} answered request(s) as prompt/{:.0} + answer/{:.1} tokens per second \
                 (the router's latency, queueing included; mean {})",
                1.0 / a,
                1.0 / b,
                seconds(mean)
            ),
        );
    }
    // One of the two is not measurable (all prompts alike, say): the
    // time is put on the answer tokens alone, or on the prompt's when
    // there are none.
    let (sp, sc) = pts.iter().fold((0.0, 0.0), |(p, c), x| (p + x.0, c + x.1));
    if sc > 0.0 {
        let d = sc / sl;
        (1e9, d, format!("service time from {n} answered request(s) as answer/{d:.1} tokens per second (prompt cost not separable; mean {})", seconds(mean)))
    } else {
        let p = sp.max(1.0) / sl;
        (p, 1e9, format!("service time from {n} answered request(s) as prompt/{p:.0} tokens per second (no answer tokens; mean {})", seconds(mean)))
    }
}

/// A replica's time from its job's start to serving: the shortest, over
/// the endpoint's replica jobs, from the job's start to the first byte of
/// the first answer its launcher's port gave (an upper bound: the first
/// request may have come later). 60 s where no job can be matched.
fn startup(runs: &[Run], replicas: &ReplicaJobs, endpoint: &str, reqs: &[AccessEntry]) -> (f64, String) {
    let mut best: Option<f64> = None;
    let mut matched = 0;
    for r in runs.iter().filter(|r| replicas.endpoint_of(r) == Some(endpoint) && r.start.is_finite() && r.start > 0.0) {
        let Some(note) = &r.note else { continue };
        let ports: Vec<String> = note.listening.iter().map(|(_, p)| format!(":{p}")).collect();
        let first = reqs
            .iter()
            .filter(|a| a.replica.as_deref().is_some_and(|x| ports.iter().any(|p| x.ends_with(p.as_str()))))
            .filter_map(|a| Some(parse_time(&a.time)? + a.ttfb_s.unwrap_or(a.latency_s)))
            .filter(|&t| t >= r.start && t <= r.end)
            .fold(f64::INFINITY, f64::min);
        if first.is_finite() {
            matched += 1;
            best = Some(best.map_or(first - r.start, |b: f64| b.min(first - r.start)));
        }
    }
    match best {
        Some(s) => (
            s,
            format!("the quickest of {matched} replica job(s) from its start to its first answer's first byte (at most its model load)"),
        ),
        None => (60.0, "no replica job matched to its answers by port; assumed (--replica-startup sets it)".into()),
    }
}

fn endpoint_table(e: &EndpointSettings, m: &Model, slo_p99_s: f64) -> toml::Table {
    let mut t = toml::Table::new();
    let mut put = |k: &str, v: toml::Value| {
        t.insert(k.into(), v);
    };
    put("name", e.name.clone().into());
    put("trace", "access.jsonl".into());
    put("keep_times", true.into());
    put("class", e.class.clone().into());
    put("gpus_per_replica", i64::from(e.gpus).into());
    put("max_concurrent", i64::from(e.concurrency).into());
    put("prefill_tokens_per_s", m.prefill.into());
    put("decode_tokens_per_s", m.decode.into());
    put("startup", format!("{:.3}", m.startup_s).into());
    put("slo_p99", format!("{slo_p99_s}").into());
    put("min_replicas", i64::from(e.min).into());
    put("max_replicas", i64::from(e.max).into());
    put("target_per_replica", e.target_per_replica.into());
    put("stable_window", format!("{}", e.stable_window_s).into());
    put("panic_window", format!("{}", e.panic_window_s).into());
    put("panic_threshold", e.panic_threshold.into());
    put("scale_down_delay", format!("{}", e.scale_down_delay_s).into());
    put("trend_horizon", format!("{}", e.trend_horizon_s).into());
    if e.min > 0 {
        put("baseline_class", e.baseline_class.clone().into());
        put("baseline_replicas", i64::from(e.min).into());
    }
    if let Some((class, replicas, fraction)) = &e.warm {
        put("warm_class", class.clone().into());
        put("warm_replicas", i64::from(*replicas).into());
        put("warm_fraction", (*fraction).into());
    }
    if let Some(l) = &e.latency {
        if let Some(d) = l.ttft_p99 {
            put("latency_ttft_p99", format!("{}", d.as_secs_f64()).into());
        }
        if let Some(d) = l.queue_p99 {
            put("latency_queue_p99", format!("{}", d.as_secs_f64()).into());
        }
        put("latency_window", format!("{}", l.window.as_secs_f64()).into());
        put("latency_min_samples", i64::from(l.min_samples).into());
    }
    t
}

/// A QOS name as one CSV cell (a name cannot hold a comma in Slurm, but
/// the report does not rely on it).
fn csv_cell(s: &str) -> String {
    s.chars().filter(|c| *c != ',' && *c != '\n' && *c != '"').collect()
}

fn seconds(s: f64) -> String {
    if s >= 3600.0 && s % 3600.0 == 0.0 {
        format!("{} h", s / 3600.0)
    } else {
        format!("{s:.1} s")
    }
}

/// Writes the scenario (into `keep`, else a folder of its own that is
/// removed after) and simulates it as `onepool simulate` would.
pub fn evaluate(w: &Written, keep: Option<&std::path::Path>, pool_gpus: u64) -> anyhow::Result<Saved> {
    use anyhow::Context;
    let dir = match keep {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.to_path_buf()
        }
        None => {
            // create_dir fails on an existing path: nobody can have
            // planted a link where the files go.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let d = std::env::temp_dir().join(format!("onepool-report-{}-{}", std::process::id(), nanos.as_nanos()));
            std::fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
    };
    for (name, text) in &w.files {
        std::fs::write(dir.join(name), text).with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    let outcome = crate::simulate::evaluate(
        &dir.join("scenario.toml"),
        onepool_simulator::input::OnBadRow::Abort,
        None,
        onepool_simulator::compare::Settings::default(),
        onepool_simulator::compare::Search::Auto,
        None,
    );
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let r = outcome.context("simulating the period's records")?.report;
    let c = &r.comparison;
    let reading = std::iter::once(onepool_simulator::report::gpus_needed_line(c))
        .chain(onepool_simulator::report::reasons(c, &OPTIONS).lines())
        .collect();
    Ok(Saved {
        separate_islands_gpus: c.separate_gpus,
        shared_pool_gpus: c.shared_gpus_needed,
        separate_islands_unmet: c.separate_unmet.clone(),
        shared_pool_unmet: c.shared_unmet.clone(),
        no_saving: c.no_saving.clone(),
        reading,
        measured: onepool_simulator::report::headline(c, &OPTIONS),
        pool_gpus,
        islands: c
            .classes
            .iter()
            .filter(|row| row.own_island)
            .map(|row| (row.shared.class.clone(), row.separate_gpus_needed))
            .collect(),
        jobs: w.jobs,
        requests: w.requests,
        endpoints: w.endpoints.clone(),
        assumptions: w.assumptions.clone(),
        left_out: r.ignored.clone(),
        scenario: keep.map(|d| d.join("scenario.toml").display().to_string()),
        pool_p99_queue_delay_s: c
            .classes
            .iter()
            .filter(|row| row.shared.requests > 0)
            .map(|row| row.shared.p99_queue_delay_s)
            .reduce(f64::max),
        pool_p95_wait_s: c
            .classes
            .iter()
            .filter(|row| row.shared.jobs_started > 0)
            .map(|row| row.shared.wait_p95_s)
            .reduce(f64::max),
    })
}

/// `--targets-from-pool`: first what this pool achieves on the period's
/// records, then the figure with targets from that ([`targets_from_pool`]):
/// what separate islands need for the same service. The kept scenario
/// (`keep`) is the second, so `onepool simulate` on it agrees.
pub fn for_the_pool_s_service(
    inputs: Inputs<'_>,
    keep: Option<&std::path::Path>,
    pool_gpus: u64,
) -> anyhow::Result<Saved> {
    let first = evaluate(&scenario(&inputs), None, pool_gpus)?;
    let Some((slo_p99_s, max_p95_wait_s)) = targets_from_pool(&first) else {
        anyhow::bail!("--targets-from-pool: the period has no request and no batch job to take targets from");
    };
    let inputs = Inputs { slo_p99_s, max_p95_wait_s, ..inputs };
    let mut written = scenario(&inputs);
    written.assumptions.push(format!(
        "targets from this pool's own service in the simulation (--targets-from-pool): p99 queueing delay {}, \
         batch p95 wait {}, each 10 % looser and rounded up",
        first.pool_p99_queue_delay_s.map_or("none".to_string(), |v| format!("{v:.2}s")),
        first.pool_p95_wait_s.map_or("none".to_string(), |v| format!("{v:.0}s")),
    ));
    evaluate(&written, keep, pool_gpus)
}

#[cfg(test)]
#[path = "saved_tests.rs"]
mod tests;
