//! The story's steps: someone else's job, onepoold starting, load light
//! then heavy, protected training arriving and ending, the load ending.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use onepool_dev_cluster::model_server::{ModelServer, MODEL_NAME};
use onepool_loadgen::{ChatShape, Load, Trace};

use crate::commands::{job_state, slurm};
use crate::config::config;
use crate::demo::{free_port, step, Demo};
use crate::settings::{
    Victim, ENDPOINT, GPUS, HEAVY, LIGHT, LIGHT_SECS, MIN_RUNTIME_SECS, OTHER_ACCOUNT, OTHER_JOB, OTHER_USER,
    SCALE_DOWN_DELAY_SECS, TRAINING_JOB, TRAINING_SECS,
};
use crate::users::{ensure_other_user, submit_as_other_user};
use crate::watch::{Kind, Timeline};

/// Phase 2: Someone else's job, which onepoold must leave alone.
pub(crate) fn someone_elses_job(d: &mut Demo, tl: &Timeline, slurm_conf: &str) -> anyhow::Result<u32> {
    step(&format!("{OTHER_USER} (account {OTHER_ACCOUNT}) runs a flexible training job on one node"));
    ensure_other_user()?;
    let other = submit_as_other_user(
        slurm_conf,
        &["--workload=training", "--gpus=4", "-N1", "-J", OTHER_JOB, "-o", "/dev/null", "--wrap", "sleep 1800"],
    )?;
    d.watch().follow(other, &format!("{OTHER_USER}'s training job {other}"), false);
    tl.note(format!("{OTHER_USER} submitted training job {other} (class training, 4 GPUs)"));
    d.wait(&format!("{OTHER_USER}'s job {other} to run"), Duration::from_secs(60), |_| {
        job_state(other).as_deref() == Some("RUNNING")
    })?;

    Ok(other)
}

/// Phase 3: onepoold starts with one baseline replica.
pub(crate) fn onepoold_starts(
    d: &mut Demo,
    tl: &Timeline,
    slurm_conf: &str,
    server: &ModelServer,
) -> anyhow::Result<SocketAddr> {
    // In the hosts mode the load comes from the client host, across the
    // bridge, to the service host's address.
    let ip = d.paths.service_host.as_ref().map_or(std::net::Ipv4Addr::LOCALHOST, |h| h.address);
    let listen = SocketAddr::from((ip, free_port()?));
    let mut file = config(&d.paths, listen, slurm_conf, server);
    // Across the bridge the front speaks TLS (issue #36): the load trusts
    // the certificate made for this run, and no prompt crosses in clear.
    let mut scheme = "http";
    if let Some(host) = &d.paths.service_host {
        let dir = d.paths.socket.parent().unwrap_or(&d.paths.root).to_path_buf();
        let front = crate::wire::front_certificate(&dir, host.address, d.service)?;
        file.endpoints[0].tls = Some(onepool_elastic_daemon::config::TlsFile {
            cert_file: front.cert_file.clone(),
            key_file: front.key_file.clone(),
        });
        onepool_loadgen::use_https(front.pem.as_bytes())?;
        scheme = "https";
    }
    file.write(&d.paths.config).with_context(|| format!("writing {}", d.paths.config.display()))?;
    step(&format!(
        "onepoold starts: endpoint {ENDPOINT:?} at {scheme}://{listen}, 1 baseline replica (protected, reserved GPUs), up to 2 supplemental (flexible, idle GPUs), {GPUS} GPUs each"
    ));
    println!(
        "config {}; log {}; replicas' logs {}/replica-JOB.out",
        d.paths.config.display(),
        d.paths.onepoold_log.display(),
        d.paths.log.display()
    );
    d.start_onepoold()?;
    tl.note(format!("onepoold started (pid {})", d.onepoold.as_ref().map(|c| c.id()).unwrap_or(0)));
    d.wait("the baseline replica to serve", Duration::from_secs(90), |d| {
        !d.watch().seen().serving(Kind::Baseline).is_empty()
    })?;

    Ok(listen)
}

/// The wall-clock pace the story needs in its heavy minute: what the
/// shipped conversation trace brings from its start at 1x (3.7 requests/s,
/// checked by a test); a trace whose first minute brings less is replayed
/// from its busiest minute, sped up to this (issue #24: a lighter public
/// trace timed out waiting for two supplemental replicas).
pub(crate) const HEAVY_RATE: f64 = 3.7;
/// The fastest a trace is replayed: beyond it the recorded pattern would
/// be a different trace, and the demo refuses it instead.
pub(crate) const MAX_SPEED: f64 = 20.0;

/// Where in the trace and how fast the demo replays it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pace {
    /// Trace seconds skipped (the light phase ends where the heavy minute starts).
    pub(crate) offset: f64,
    pub(crate) light: f64,
    pub(crate) heavy: f64,
    /// Why the trace is not replayed from its start at the usual speeds.
    pub(crate) fitted: Option<String>,
}

impl Pace {
    pub(crate) fn fit(trace: &Trace) -> anyhow::Result<Pace> {
        let light_end = LIGHT_SECS as f64 * LIGHT;
        let own = trace.rate(light_end, light_end + 60.0 * HEAVY) * HEAVY;
        if own >= 0.8 * HEAVY_RATE {
            return Ok(Pace { offset: 0.0, light: LIGHT, heavy: HEAVY, fitted: None });
        }
        let (start, n) = trace.busiest(60.0);
        let busiest = n as f64 / 60.0;
        let heavy = HEAVY_RATE / busiest.max(1e-9);
        if heavy > MAX_SPEED {
            bail!(
                "the trace brings at most {n} requests in any minute ({busiest:.2} requests/s); the demo needs about {HEAVY_RATE} requests/s in its heavy minute, which would mean replaying it {heavy:.0}x faster than recorded (at most {MAX_SPEED}x): give a trace with at least {} requests in some minute",
                (HEAVY_RATE * 60.0 / MAX_SPEED).ceil()
            );
        }
        let light = heavy * LIGHT / HEAVY;
        let offset = (start - LIGHT_SECS as f64 * light).max(0.0);
        let fitted = format!(
            "the trace's first minute brings {own:.1} requests/s, less than the {HEAVY_RATE} the demo needs: replayed from {offset:.0} s, its busiest minute ({n} requests from {start:.0} s) at {heavy:.2}x, the light phase before it at {light:.2}x"
        );
        Ok(Pace { offset, light, heavy, fitted: Some(fitted) })
    }
}

/// Phase 4: Load: light, then heavy, until two supplemental replicas serve and
/// may be reclaimed.
pub(crate) fn load_light_then_heavy(
    d: &mut Demo,
    tl: &Timeline,
    trace: Trace,
    trace_name: &str,
    listen: SocketAddr,
) -> anyhow::Result<Arc<Load>> {
    step(&format!("Load: {trace_name} replayed as chat completions"));
    let shape = ChatShape::DEMO;
    println!(
        "each row is a chat completion for {MODEL_NAME} on llama-server, every other one streamed: ContextTokens/{} prompt words \
         ({}-{}), max_tokens GeneratedTokens/{} ({}-{}), scaled down for a few CPU cores; \
         onepoold asks for one replica per 3 requests the servers process or defer",
        shape.prompt_div, shape.prompt_words.0, shape.prompt_words.1, shape.answer_div, shape.answer_tokens.0, shape.answer_tokens.1
    );
    let pace = Pace::fit(&trace)?;
    if let Some(why) = &pace.fitted {
        println!("{why}");
    }
    let trace = trace.from(pace.offset);
    let (light, heavy) = (pace.light, pace.heavy);
    let light_end = LIGHT_SECS as f64 * light;
    let light_rate = trace.rate(0.0, light_end) * light;
    let heavy_rate = trace.rate(light_end, light_end + 60.0 * heavy) * heavy;
    let load = Load::start(d.rt.handle(), trace, listen, MODEL_NAME, shape, tl.t0);
    d.load = Some(load.clone());
    load.phase("light", light);
    tl.note(format!("load: light, the trace at {light:.2}x (~{light_rate:.1} requests/s): the baseline replica copes"));
    d.sleep("the light phase", LIGHT_SECS as f64)?;
    load.phase("heavy", heavy);
    tl.note(format!("load: heavy, the trace at {heavy:.2}x (~{heavy_rate:.0} requests/s)"));
    d.wait("two supplemental replicas to serve", Duration::from_secs(90), |d| {
        d.watch().seen().serving(Kind::Supplemental).len() >= 2
    })?;
    // Past the policy's minimum run time, a supplemental replica may be reclaimed.
    let reclaimable_at = {
        let s = d.watch().seen();
        s.serving(Kind::Supplemental).iter().filter_map(|j| j.running).fold(0.0, f64::max) + MIN_RUNTIME_SECS + 1.0
    };
    let until = (reclaimable_at - tl.now()).max(2.0);
    d.sleep("the replicas' minimum run time", until)?;
    println!();
    d.show_queue();
    println!();
    d.show_status();

    Ok(load)
}

/// Long answers (generated tokens) that keep a busy victim busy: the
/// trace's are a second or two here, and one in flight at the look may end
/// before Slurm's notice (seen on 22.05: the victim had nothing in flight).
const BUSY_TOKENS: u32 = 150;

/// Shapes the victim's load before the training is submitted; returns the
/// load's speed to resume at once Slurm has picked its victim.
fn prepare_victim(d: &mut Demo, tl: &Timeline, victim: Victim, listen: SocketAddr) -> anyhow::Result<Option<f64>> {
    match victim {
        Victim::Any => Ok(None),
        Victim::Idle => {
            let speed = d.load().phases().last().map_or(1.0, |p| p.speed);
            d.load().pause();
            tl.note("load: paused until every request is answered, so that the victim is idle at Slurm's pick");
            d.wait("the requests in flight", Duration::from_secs(150), |d| d.load().in_flight() == 0)?;
            Ok(Some(speed))
        }
        Victim::Busy => {
            // Two long streams for each replica beside the trace's load:
            // least-outstanding routing spreads them over the replicas.
            let body = serde_json::json!({"model": MODEL_NAME, "max_tokens": BUSY_TOKENS, "ignore_eos": true,
                "stream": true, "messages": [{"role": "user", "content": "Tell a long story about a shared GPU pool."}]})
            .to_string();
            for _ in 0..6 {
                let body = body.clone();
                d.rt.spawn(async move { onepool_loadgen::chat_once(listen, &body, true).await });
            }
            d.wait("long requests in flight on every supplemental replica", Duration::from_secs(60), |d| {
                let s = d.watch().seen();
                let serving = s.serving(Kind::Supplemental);
                !serving.is_empty() && serving.iter().all(|j| j.in_flight >= 2)
            })?;
            tl.note(format!(
                "load: every supplemental replica has requests in flight, answers of {BUSY_TOKENS} tokens among them"
            ));
            Ok(None)
        }
    }
}

/// Phase 5: Protected training arrives; Slurm preempts a supplemental replica,
/// which drains. Returns the training job and its time to capacity.
pub(crate) fn protected_training_arrives(
    d: &mut Demo,
    tl: &Timeline,
    victim: Victim,
    listen: SocketAddr,
) -> anyhow::Result<(u32, f64)> {
    step("Critical training (protected, 4 GPUs) arrives; every GPU is taken");
    let resume = prepare_victim(d, tl, victim, listen)?;
    let t_submit = Instant::now();
    let training = slurm(
        "sbatch",
        &[
            "--parsable",
            "--workload=critical-training",
            "--time=10",
            "--gpus=4",
            "-N1",
            "-J",
            TRAINING_JOB,
            "-o",
            "/dev/null",
            "--wrap",
            &format!("sleep {TRAINING_SECS}"),
        ],
    )?
    .trim()
    .split(';')
    .next()
    .and_then(|s| s.parse::<u32>().ok())
    .context("sbatch printed no job id")?;
    d.watch().follow(training, &format!("critical training job {training}"), true);
    tl.note(format!("critical training job {training} submitted ({GPUS} GPUs, class critical-training)"));
    d.wait("the training job to run", Duration::from_secs(90), |_| job_state(training).as_deref() == Some("RUNNING"))?;
    let time_to_capacity = t_submit.elapsed().as_secs_f64();
    let node = slurm("squeue", &["-h", "-j", &training.to_string(), "-o", "%N"]).unwrap_or_default();
    tl.note(format!(
        "critical training job {training} RUNNING on {} {time_to_capacity:.1} s after submission",
        node.trim()
    ));
    let preempted = |d: &Demo| -> Vec<(u32, Kind, String)> {
        let s = d.watch().seen();
        s.jobs.values().filter(|j| j.preempted.is_some()).map(|j| (j.id, j.kind, j.label.clone())).collect()
    };
    d.wait("the victim Slurm preempted", Duration::from_secs(10), |d| !preempted(d).is_empty())
        .context("the training job runs, but no job was seen being preempted (were GPUs free?)")?;
    let (victim, victim_kind, victim_label) = preempted(d)[0].clone();
    if let Some(speed) = resume {
        d.load().phase("heavy", speed);
        tl.note(format!("load: resumed at {speed:.2}x"));
    }
    println!();
    d.show_status();
    if victim_kind != Kind::Supplemental {
        bail!("Slurm preempted {victim_label}, not a supplemental replica");
    }
    d.wait(&format!("{victim_label} to end"), Duration::from_secs(45), |d| {
        d.watch().seen().job(victim).is_some_and(|j| j.ended.is_some())
    })?;
    let victim_log = d.paths.log.join(format!("replica-{victim}.out"));
    println!("{victim_label}'s launcher ({}):", victim_log.display());
    for line in fs::read_to_string(&victim_log).unwrap_or_default().lines() {
        // Without the timestamp: the timeline has the times.
        let line = match line.split_once("Z ") {
            Some((stamp, rest)) if stamp.len() < 40 && stamp.starts_with("20") => rest.trim_start(),
            _ => line,
        };
        println!("    {line}");
    }
    // What onepoold decided about the victim, beside what its launcher did.
    let ours = format!("job={victim}");
    let decided: Vec<String> = fs::read_to_string(&d.paths.onepoold_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == ours))
        .map(|l| l.split_once("Z ").map_or(l, |(_, rest)| rest.trim_start()).to_string())
        .collect();
    println!("onepoold about job {victim} ({}):", d.paths.onepoold_log.display());
    for line in decided {
        println!("    {line}");
    }

    Ok((training, time_to_capacity))
}

/// Phase 6: Training ends; the replicas expand again.
pub(crate) fn training_ends(d: &mut Demo, tl: &Timeline, training: u32) -> anyhow::Result<()> {
    step(&format!(
        "Training runs {TRAINING_SECS} s and ends; onepoold's pending supplemental replica takes the GPUs back"
    ));
    d.wait("the training job to end", Duration::from_secs(TRAINING_SECS + 60), |d| {
        d.watch().seen().job(training).is_some_and(|j| j.ended.is_some())
    })?;
    d.wait("two supplemental replicas to serve again", Duration::from_secs(90), |d| {
        d.watch().seen().serving(Kind::Supplemental).len() >= 2
    })?;
    let s = d.watch().seen();
    let ended = s.job(training).and_then(|j| j.ended).unwrap_or(0.0);
    let successors: Vec<(f64, f64, String)> = s
        .replicas()
        .filter(|j| j.kind == Kind::Supplemental && j.running.is_some_and(|r| r >= ended))
        .map(|j| (j.running.unwrap_or(0.0), j.seen, j.label.clone()))
        .collect();
    drop(s);
    if let Some(untold) = taken_back(ended, &successors) {
        tl.note(format!("not as told: {untold}"));
        d.untold.push(untold);
    }
    d.sleep("the load on three replicas", 5.0)?;

    Ok(())
}

/// Whether a supplemental replica that was already pending when the
/// training ended (at `ended`) got its GPUs back; otherwise what happened
/// instead. `successors`: (running since, submitted, label) of the
/// supplemental replicas that started after it ended.
pub(crate) fn taken_back(ended: f64, successors: &[(f64, f64, String)]) -> Option<String> {
    let first = successors.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
    if first.1 < ended {
        return None;
    }
    Some(format!(
        "no pending replica took the GPUs back when the training ended at {ended:.1}s: {} was submitted {:.1} s after it and ran at {:.1}s",
        first.2,
        first.1 - ended,
        first.0
    ))
}

/// The heading's name of the replayed trace: the shipped one by its
/// source, any other by its path.
pub(crate) fn trace_name(path: &Path) -> String {
    match path.file_name().and_then(|f| f.to_str()) {
        Some("azure-llm-inference-2023-conv.csv") => {
            "the Azure LLM conversation trace (2023, CC-BY 4.0, see data/NOTICE.md)".to_string()
        }
        _ => format!("the trace {}", path.display()),
    }
}

/// Phase 7: The load ends; onepoold scales back to the baseline.
pub(crate) fn load_ends(d: &mut Demo, tl: &Timeline, load: &Load) -> anyhow::Result<()> {
    step(&format!(
        "The load ends; {SCALE_DOWN_DELAY_SECS} s later (scale_down_delay) onepoold drains the supplemental replicas"
    ));
    load.pause();
    tl.note("load: stopped; waiting for the requests in flight");
    d.wait("the requests in flight", Duration::from_secs(150), |d| d.load().in_flight() == 0)?;
    tl.note("load: every request answered");
    d.wait("onepoold to scale back to the baseline", Duration::from_secs(SCALE_DOWN_DELAY_SECS + 60), |d| {
        let s = d.watch().seen();
        let scaled_back = s.replicas().all(|j| j.kind == Kind::Baseline || j.ended.is_some());
        scaled_back
    })?;
    Ok(())
}
