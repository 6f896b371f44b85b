//! The bursty serving benchmark (run by bench/bursty-serving.sh, issue
//! #18): one bursty trace replayed through onepoold on a real cluster of
//! its own, three ways side by side:
//!
//! - reactive: replicas follow the load (the autoscaler alone);
//! - warm: the same, plus one warm replica on GPUs nobody waits for
//!   (`[endpoint.replicas.warm]`, lowest class) and the load's trend
//!   projected a model load ahead (`trend_horizon`);
//! - over-provisioned: every replica loaded all the time (a target load so
//!   low that the autoscaler always wants `max`);
//! - latency target: reactive, plus a p99 target for the time a request
//!   waits in the router's queue (`[endpoint.replicas.latency] queue_p99`,
//!   the scenario's 1 s) that adds replicas while it is missed and keeps
//!   them until it is known to hold with one fewer (issue #28).
//!
//! Replicas are the stand-in model server (exact timing: a request of N
//! tokens takes N x `PER_TOKEN` s, so the queueing delay is its latency
//! less that), 16 requests each at once, a 3 s model load, one whole
//! 4-GPU node each, up to 3; a flexible training job holds the fourth node.
//! Near the end of the trace, in a quiet gap, protected training asks for
//! two nodes: its time to capacity is measured with whatever each variant
//! holds in the way.
//!
//! Per variant: queueing delay p50/p99 (all requests, and those sent
//! during bursts), the p99 of bursts after the first (the first meets
//! only what the variant starts with), failed requests, GPU-minutes the endpoint's replicas
//! held (running jobs x 4 GPUs, sampled every 0.5 s), replica jobs
//! submitted, and the protected job's time to capacity.
//!
//! Each variant also goes through `onepool simulate`'s engine (a scenario
//! written from the same settings: the trace with each request's
//! max_tokens as its generated tokens at 1/`PER_TOKEN` tokens/s, the same
//! policy, fleet, training jobs and autoscaler settings, the replica's 3 s
//! load plus onepoold's 0.5 s health checks as a 4 s startup, onepoold's
//! 0.5 s poll as the tick), and its figures are printed under the cluster's,
//! so the simulator's model of warm headroom is checked against the run.
//!
//! Usage: bursty_bench [--simulate-only] CLUSTER_DIR TRACE.csv [SECONDS]
//! (SECONDS: replay only the trace's first SECONDS; --simulate-only: the
//! simulator's rows alone, no cluster.)

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::config::{LatencyFile, WarmFile};
use onepool_loadgen::{ChatShape, Load, Trace};
use onepool_simulator::compare::{self, Settings};
use onepool_simulator::input::OnBadRow;
use onepool_tests::elastic::{replica_view, runtime, serving, stand_in_config, stand_in_server, start_daemon, wait};
use onepool_tests::{build_dir, TestCluster};

const PER_TOKEN: f64 = 0.02;
const MODEL_LOAD_S: u32 = 3;
/// GeneratedTokens/4, 8 to 96 tokens: 0.16 to 1.92 s of service.
const SHAPE: ChatShape = ChatShape { prompt_div: 32, prompt_words: (8, 64), answer_div: 4, answer_tokens: (8, 96) };
/// A second of trace with more requests than this is a burst second.
const BURST_PER_S: usize = 10;
const ENDPOINT: &str = "chat";

#[derive(Clone, Copy)]
enum Variant {
    Reactive,
    Warm,
    Over,
    Latency,
    /// The two parts of `Warm` alone (simulated only, by default).
    ReactiveTrend,
    WarmNoTrend,
}

impl Variant {
    /// The endpoint's keys in the simulator's scenario, beyond what all share.
    fn scenario_keys(self) -> String {
        match self {
            Variant::Reactive => "target_per_replica = 6\n".into(),
            Variant::Warm => format!(
                "target_per_replica = 6\nwarm_class = \"inference-warm\"\nwarm_replicas = 1\ntrend_horizon = \"{MODEL_LOAD_S}s\"\n"
            ),
            Variant::Over => "target_per_replica = 0.001\n".into(),
            Variant::Latency => {
                "target_per_replica = 6\nlatency_queue_p99 = \"1s\"\nlatency_window = \"30s\"\nlatency_min_samples = 20\n"
                    .into()
            }
            Variant::ReactiveTrend => format!("target_per_replica = 6\ntrend_horizon = \"{MODEL_LOAD_S}s\"\n"),
            Variant::WarmNoTrend => {
                "target_per_replica = 6\nwarm_class = \"inference-warm\"\nwarm_replicas = 1\n".into()
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Reactive => "reactive",
            Variant::Warm => "warm headroom + trend",
            Variant::Over => "over-provisioned",
            Variant::Latency => "latency target (queue p99 1 s)",
            Variant::ReactiveTrend => "reactive+trend (trend alone)",
            Variant::WarmNoTrend => "warm-no-trend (headroom alone)",
        }
    }
}

struct Outcome {
    delays: Vec<f64>,
    burst_delays: Vec<f64>,
    /// Those of bursts after the first: what replicas kept from an earlier
    /// burst (or warm ones) can do, where the first burst met only `min`.
    later_burst_delays: Vec<f64>,
    failed: usize,
    sent: usize,
    gpu_minutes: f64,
    submitted: usize,
    ttc: f64,
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Whether a time of the trace falls in a burst second (more than
/// `BURST_PER_S` requests in that second of the trace).
fn burst_seconds(trace: &Trace) -> impl Fn(f64) -> bool {
    let span = trace.rows.last().map(|r| r.0).unwrap_or(0.0);
    let mut per_s = vec![0usize; span as usize + 1];
    for r in &trace.rows {
        per_s[r.0 as usize] += 1;
    }
    move |t: f64| per_s.get(t as usize).is_some_and(|&n| n > BURST_PER_S)
}

/// When the trace's first burst ends: the end of its first run of burst
/// seconds (a quiet second inside a burst does not end it).
fn first_burst_end(trace: &Trace) -> f64 {
    let in_burst = burst_seconds(trace);
    let span = trace.rows.last().map(|r| r.0).unwrap_or(0.0) as usize;
    let Some(start) = (0..=span).find(|s| in_burst(*s as f64)) else { return f64::INFINITY };
    let mut end = start;
    while end <= span && (in_burst(end as f64) || in_burst(end as f64 + 1.0)) {
        end += 1;
    }
    end as f64
}

/// The trace, cut to its first `limit` seconds.
fn load_trace(path: &std::path::Path, limit: f64) -> Trace {
    let mut t = Trace::load(path).unwrap_or_else(|e| panic!("{e}"));
    t.rows.retain(|r| r.0 < limit);
    t
}

/// onepoold's configuration for variant `v`, written in `dir`.
fn write_config(c: &TestCluster, v: Variant, policy: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
    let slurm_conf = c.cluster.env().into_iter().find(|(k, _)| k == "SLURM_CONF").expect("SLURM_CONF").1;
    let command = format!(
        "env ONEPOOL_MODEL_LOAD_SECONDS={MODEL_LOAD_S} ONEPOOL_SECONDS_PER_TOKEN={PER_TOKEN} python3 {}",
        stand_in_server().display()
    );
    let mut config = stand_in_config(dir, &slurm_conf, &build_dir().join("onepool"), ENDPOINT, |r| {
        r.command = command;
        r.gpus = Some(4);
        r.min = Some(1);
        r.max = Some(3);
        r.target_per_replica = Some(6.0);
        r.stable_window = Some(Duration::from_secs(10));
        r.panic_window = Some(Duration::from_secs(2));
        r.scale_down_delay = Some(Duration::from_secs(20));
        r.drain_timeout = Some(Duration::from_secs(20));
        match v {
            Variant::Reactive => {}
            Variant::Warm => {
                r.warm = Some(WarmFile { workload: Some("inference-warm".into()), replicas: Some(1), fraction: None });
                r.trend_horizon = Some(Duration::from_secs(u64::from(MODEL_LOAD_S)));
            }
            Variant::Over => r.target_per_replica = Some(0.001),
            Variant::Latency => {
                r.latency = Some(LatencyFile {
                    queue_p99: Some(Duration::from_secs(1)),
                    window: Some(Duration::from_secs(30)),
                    min_samples: Some(20),
                    ..LatencyFile::default()
                })
            }
            Variant::ReactiveTrend => r.trend_horizon = Some(Duration::from_secs(u64::from(MODEL_LOAD_S))),
            Variant::WarmNoTrend => {
                r.warm = Some(WarmFile { workload: Some("inference-warm".into()), replicas: Some(1), fraction: None })
            }
        }
    });
    config.policy = Some(policy.to_path_buf());
    config.endpoints[0].replica_concurrency = Some(16);
    let path = dir.join("onepoold.toml");
    config.write(&path).unwrap();
    path
}

fn run(c: &TestCluster, v: Variant, trace: Trace, policy: &std::path::Path, dir: &std::path::Path) -> Outcome {
    c.cancel_all();
    let fill = c.sbatch(&["--workload=training", "-N1", "--gpus-per-node=4", "--time=60", "--wrap", "sleep 3600"]);
    c.wait_state(fill, "RUNNING", Duration::from_secs(30));
    let path = write_config(c, v, policy, dir);
    let rt = runtime();
    let d = start_daemon(&rt, &path);
    let ready = match v {
        Variant::Warm | Variant::WarmNoTrend => 2,
        Variant::Reactive | Variant::Over | Variant::Latency | Variant::ReactiveTrend => 1,
    };
    wait("the variant's replicas serving", Duration::from_secs(120), || {
        ["baseline", "supplemental", "warm"].iter().map(|k| serving(&d, ENDPOINT, k).len()).sum::<usize>() >= ready
    });
    if let Variant::Over = v {
        // Loaded from the start: the autoscaler wants max at any load.
        let load = onepool_tests::elastic::Load::start(d.endpoint(ENDPOINT).unwrap().listen.unwrap().port(), 1, 0.2);
        wait("every replica loaded", Duration::from_secs(120), || {
            ["baseline", "supplemental"].iter().map(|k| serving(&d, ENDPOINT, k).len()).sum::<usize>() == 3
        });
        load.finish();
    }
    let span = trace.rows.last().map(|r| r.0).unwrap_or(0.0);
    let in_burst_second = burst_seconds(&trace);
    let later = first_burst_end(&trace);
    let addr = d.endpoint(ENDPOINT).unwrap().listen.unwrap();
    let submitted_before = replica_view(&d, ENDPOINT).submitted.len();
    let t0 = Instant::now();
    let load = Load::start(rt.handle(), trace, addr, "stand-in", SHAPE, t0);
    load.phase("trace", 1.0);
    // Protected training for two nodes, 10 s before the trace ends; its
    // state polled every 50 ms on a thread of its own.
    let protected_at = t0 + Duration::from_secs_f64((span - 10.0).max(0.0));
    let mut gpu_seconds = 0.0;
    let tick = Duration::from_millis(500);
    let ttc = std::thread::scope(|s| {
        let protected = s.spawn(|| {
            std::thread::sleep(protected_at.saturating_duration_since(Instant::now()));
            let at = Instant::now();
            let id = c.sbatch(&[
                "--workload=critical-training",
                "--time=10:00",
                "-N2",
                "--gpus-per-node=4",
                "--wrap",
                "sleep 600",
            ]);
            while c.state(id).as_deref() != Some("RUNNING") {
                assert!(at.elapsed() < Duration::from_secs(180), "protected job {id} never ran");
                std::thread::sleep(Duration::from_millis(50));
            }
            at.elapsed().as_secs_f64()
        });
        while t0.elapsed().as_secs_f64() < span {
            std::thread::sleep(tick);
            let holding = replica_view(&d, ENDPOINT).jobs.iter().filter(|j| j.phase.as_str() != "pending").count();
            gpu_seconds += holding as f64 * 4.0 * tick.as_secs_f64();
        }
        load.pause();
        protected.join().expect("the protected job's thread")
    });
    wait("the replay's requests answered", Duration::from_secs(120), || load.in_flight() == 0);
    load.stop();
    let submitted = replica_view(&d, ENDPOINT).submitted.len() - submitted_before;
    rt.block_on(d.shutdown());
    c.cancel_all();
    let reqs = load.requests();
    let ok: Vec<_> = reqs.iter().filter(|r| r.failure.is_none()).collect();
    let delay = |r: &&onepool_loadgen::Request| ((r.ended - r.sent) - f64::from(r.max_tokens) * PER_TOKEN).max(0.0);
    let in_burst = |r: &&&onepool_loadgen::Request| in_burst_second(r.sent);
    Outcome {
        delays: ok.iter().map(delay).collect(),
        burst_delays: ok.iter().filter(in_burst).map(delay).collect(),
        later_burst_delays: ok.iter().filter(in_burst).filter(|r| r.sent >= later).map(delay).collect(),
        failed: reqs.len() - ok.len(),
        sent: reqs.len(),
        gpu_minutes: gpu_seconds / 60.0,
        submitted,
        ttc,
    }
}

/// The variant through the simulator (see the module's notes).
fn simulate(v: Variant, trace: &Trace, policy: &std::path::Path, dir: &std::path::Path) -> Outcome {
    std::fs::create_dir_all(dir).unwrap();
    let span = trace.rows.last().map(|r| r.0).unwrap_or(0.0);
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for &(t, context, generated) in &trace.rows {
        csv.push_str(&format!("{t:.3},0,{}\n", SHAPE.of(context, generated).1));
    }
    std::fs::write(dir.join("trace.csv"), csv).unwrap();
    // The flexible training on the fourth node from the start; protected
    // training for two nodes 10 s before the end (as root on the cluster:
    // here an entitled account).
    let jobs = format!(
        "submit,duration,gpus,gpus_per_node,class,account\n0,1h,4,4,training,\n{:.3},600,8,4,critical-training,core-ml\n",
        (span - 10.0).max(0.0)
    );
    std::fs::write(dir.join("jobs.csv"), jobs).unwrap();
    let scenario = format!(
        "policy = {policy:?}\n[fleet]\nnodes = 4\ngpus_per_node = 4\n[[jobs]]\nfile = \"jobs.csv\"\nkeep_times = true\n\
         [[endpoints]]\nname = \"{ENDPOINT}\"\ntrace = \"trace.csv\"\nkeep_times = true\nclass = \"inference\"\n\
         baseline_class = \"inference-baseline\"\nbaseline_replicas = 1\ngpus_per_replica = 4\nmax_concurrent = 16\n\
         prefill_tokens_per_s = 1e12\ndecode_tokens_per_s = {}\nstartup = \"{}s\"\nslo_p99 = \"1s\"\n\
         min_replicas = 1\nmax_replicas = 3\nstable_window = \"10s\"\npanic_window = \"2s\"\nscale_down_delay = \"20s\"\n{}",
        1.0 / PER_TOKEN,
        MODEL_LOAD_S + 1,
        v.scenario_keys()
    );
    let path = dir.join("scenario.toml");
    std::fs::write(&path, scenario).unwrap();
    let sc = onepool_simulator::scenario::load(&path, OnBadRow::Abort).unwrap_or_else(|e| panic!("{e}"));
    let s = Settings { tick_s: 0.5, job_log: true, separate: false, ..Settings::default() };
    let r = compare::run_shared(&sc.workload, &sc.policy, &sc.fleet, &s);
    let class = |name: &str| sc.policy.classes.iter().position(|c| c.name == name).expect("class in the policy");
    let replica_classes = [class("inference-baseline"), class("inference"), class("inference-warm")];
    let gpu_seconds: f64 = r
        .job_log
        .iter()
        .filter(|e| replica_classes.contains(&e.class))
        .map(|e| 4.0 * (e.end.min(span) - e.start.max(0.0)).max(0.0))
        .sum();
    let in_burst_second = burst_seconds(trace);
    let delays: Vec<f64> = r.request_log.iter().map(|x| f64::from(x.2)).collect();
    let burst_delays =
        r.request_log.iter().filter(|x| in_burst_second(f64::from(x.1))).map(|x| f64::from(x.2)).collect();
    let later = first_burst_end(trace);
    let later_burst_delays = r
        .request_log
        .iter()
        .filter(|x| in_burst_second(f64::from(x.1)) && f64::from(x.1) >= later)
        .map(|x| f64::from(x.2))
        .collect();
    let sent = trace.rows.len();
    let failed: u64 = replica_classes.iter().map(|&c| r.classes[c].failed_requests + r.classes[c].unserved).sum();
    Outcome {
        delays,
        burst_delays,
        later_burst_delays,
        failed: failed as usize,
        sent,
        gpu_minutes: gpu_seconds / 60.0,
        submitted: r.replicas_submitted.first().copied().unwrap_or(0) as usize,
        ttc: r.classes[class("critical-training")].waits.first().copied().unwrap_or(f64::NAN),
    }
}

fn print_row(what: &str, o: &Outcome) {
    println!(
        "{:<30} {:>9.3}s {:>9.3}s {:>13.3}s {:>13.3}s {:>15.3}s {:>9} {:>11.1} {:>10} {:>9.2}",
        what,
        quantile(&o.delays, 0.5),
        quantile(&o.delays, 0.99),
        quantile(&o.burst_delays, 0.5),
        quantile(&o.burst_delays, 0.99),
        quantile(&o.later_burst_delays, 0.99),
        format!("{}/{}", o.failed, o.sent),
        o.gpu_minutes,
        o.submitted,
        o.ttc
    );
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let simulate_only = args.first().is_some_and(|a| a == "--simulate-only");
    if simulate_only {
        args.remove(0);
    }
    let mut args = args.into_iter();
    let usage = "usage: bursty_bench [--simulate-only] CLUSTER_DIR TRACE.csv [SECONDS]";
    let dir = std::path::absolute(args.next().expect(usage)).expect("the cluster directory");
    let trace = PathBuf::from(args.next().expect(usage));
    let limit: f64 = args.next().map(|s| s.parse().expect(usage)).unwrap_or(f64::INFINITY);
    let policy = dir.with_extension("policy.toml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&policy, onepool_tests::warm_policy_text()).unwrap();
    let c = (!simulate_only).then(|| onepool_tests::bench_cluster(&dir, policy.clone()));
    let t = load_trace(&trace, limit);
    let span = t.rows.last().map(|r| r.0).unwrap_or(0.0);
    println!(
        "bursty serving: {} ({} requests over {span:.0} s, mean {:.1}/s); stand-in replicas of 16 at once, {PER_TOKEN} s/token, \
         {MODEL_LOAD_S} s model load, 4 GPUs each, min 1, max 3, target 6, windows 10 s / 2 s, scale-down delay 20 s; \
         flexible training on the 4th node; protected training for 2 nodes 10 s before the end",
        trace.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        t.rows.len(),
        t.rows.len() as f64 / span.max(1.0),
    );
    println!(
        "{:<30} {:>10} {:>10} {:>14} {:>14} {:>16} {:>9} {:>11} {:>10} {:>9}",
        "variant",
        "delay p50",
        "delay p99",
        "burst p50",
        "burst p99",
        "later bursts p99",
        "failed",
        "GPU-min",
        "submitted",
        "TTC s"
    );
    // Each part of warm headroom + trend alone: simulated only, unless asked
    // for on the cluster too (ONEPOOL_BENCH_PARTS=1, 26 more minutes).
    let mut variants = vec![Variant::Reactive, Variant::Warm, Variant::Over, Variant::Latency];
    // ONEPOOL_BENCH_VARIANTS=reactive,latency: only those (by the first word of their names).
    if let Ok(only) = std::env::var("ONEPOOL_BENCH_VARIANTS") {
        variants.retain(|v| only.split(',').any(|w| v.name().split(' ').next() == Some(w)));
    }
    if simulate_only || std::env::var_os("ONEPOOL_BENCH_PARTS").is_some() {
        variants.extend([Variant::ReactiveTrend, Variant::WarmNoTrend]);
    }
    for v in variants {
        let scratch = dir.join(format!("bursty-{}", v.name().split(' ').next().unwrap()));
        std::fs::create_dir_all(&scratch).unwrap();
        if let Some(c) = &c {
            let o = run(c, v, load_trace(&trace, limit), &policy, &scratch);
            print_row(v.name(), &o);
        }
        let o = simulate(v, &load_trace(&trace, limit), &policy, &scratch.join("simulated"));
        print_row(&format!("  simulated: {}", v.name().split(' ').next().unwrap()), &o);
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
