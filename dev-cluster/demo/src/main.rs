//! `onepool-demo`: the scenario behind `scripts/demo.sh`, on a dev cluster
//! that is up. onepoold runs one inference endpoint and keeps its replicas
//! as Slurm jobs itself: a baseline replica in the protected class, and
//! supplemental ones in the flexible class when the load (the Azure LLM
//! conversation trace, replayed) asks for them. A protected training job
//! then needs GPUs a supplemental replica holds: Slurm preempts it, its
//! launcher drains, the training starts; when the training ends, onepoold's
//! pending replica takes the GPUs back. The demo prints a timeline and the
//! requests sent, served and failed, and fails loudly (non-zero exit) when
//! a step does not happen or a request is lost. onepoold is stopped and the
//! demo's jobs are cancelled on every way out; the cluster keeps running.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use clap::Parser;

use crate::checks::{onepoold_names_the_taker, the_report_agrees};
use crate::commands::job_state;
use crate::demo::{step, Demo};
use crate::scenario::{
    load_ends, load_light_then_heavy, onepoold_starts, protected_training_arrives, someone_elses_job, trace_name,
    training_ends,
};
use crate::settings::{Args, ABORT, ENDPOINT, OTHER_USER};
use crate::setup::{clear_the_pool, setup, show_the_pool, Setup};
use crate::summary::summary;

mod checks;
mod commands;
mod config;
mod demo;
mod scenario;
mod settings;
mod setup;
mod summary;
#[cfg(test)]
mod tests;
mod users;
mod watch;
mod wire;

use watch::{Target, Timeline, Watch};

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nonepool-demo: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let Setup { cluster, spec, slurm_conf, trace, service, uid, server, paths } = setup(args)?;
    // The period `onepool report` reads at the end, in the cluster's clock.
    let report_from = onepool_decisions::trace::format_time(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()) - 1.0,
    );
    let root = cluster.layout.root.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        ABORT.store(true, Ordering::SeqCst);
    });
    clear_the_pool(&paths, uid, service)?;
    let tl = Arc::new(Timeline::new());
    let mut d =
        Demo { paths, rt, onepoold: None, watch: None, load: None, uid, service, cleaned: false, untold: Vec::new() };
    let watch = Watch::start(
        tl.clone(),
        Target {
            endpoint: ENDPOINT.to_string(),
            socket: d.paths.socket.clone(),
            slurm_conf: slurm_conf.clone(),
            uid: service.0,
        },
        d.rt.handle().clone(),
    );
    d.watch = Some(watch);

    show_the_pool(&cluster, &spec)?;
    // From before onepoold's first sbatch: its RPCs are the capture's
    // proof that it sees clear text.
    let capture = wire::start_capture(&d.paths, &root.join("demo"))?;
    let other = someone_elses_job(&mut d, &tl, &slurm_conf)?;
    let listen = onepoold_starts(&mut d, &tl, &slurm_conf, &server)?;
    let trace_name = trace_name(&args.trace);
    let load = load_light_then_heavy(&mut d, &tl, trace, &trace_name, listen)?;
    let (training, time_to_capacity) = protected_training_arrives(&mut d, &tl, args.victim, listen)?;
    training_ends(&mut d, &tl, training)?;
    load_ends(&mut d, &tl, &load)?;
    let other_state = job_state(other);
    let onepoold_saw = onepoold_names_the_taker(&d, training, time_to_capacity);
    summary(&d, &tl, &load, training, time_to_capacity, other, other_state.as_deref());
    let (sent, served, failed) = load.totals();

    step("Cleaning up: onepoold stops (SIGTERM), the demo's jobs are cancelled; the cluster keeps running");
    d.cleanup(true);
    let dc = d.paths.bin.join("onepool-devcluster");
    println!(
        "cluster: {}   (eval \"$({} --dir {} env)\" to use it; '{} --dir {} down' to stop it)",
        root.display(),
        dc.display(),
        root.display(),
        dc.display(),
        root.display()
    );
    let mut problems = std::mem::take(&mut d.untold);
    problems.extend(onepoold_saw.err());
    if let (Some(capture), Some(bridge)) = (capture, &d.paths.bridge) {
        if let Err(e) = wire::what_crossed(capture, bridge, &d.paths.socket.with_file_name("replica.key")) {
            problems.push(format!("the bridge: {e:#}"));
        }
    }
    step("What Slurm's records say: onepool report over the demo's period");
    if let Err(e) = the_report_agrees(&cluster, &d.paths, &report_from, training, time_to_capacity, args.victim) {
        problems.push(format!("onepool report: {e:#}"));
    }
    println!("demo wall time {:.0} s", started.elapsed().as_secs_f64());
    verdict(problems, (sent, served, failed), other, other_state.as_deref())
}

/// The demo passes when nothing above found a problem, every request was
/// served and the other user's job still runs.
fn verdict(
    mut problems: Vec<String>,
    (sent, served, failed): (u64, u64, u64),
    other: u32,
    other_state: Option<&str>,
) -> anyhow::Result<()> {
    if failed > 0 {
        problems.push(format!("{failed} request(s) failed; under graceful reclaim none may"));
    }
    if sent == 0 || served + failed != sent {
        problems.push(format!("{sent} sent but {served} served and {failed} failed"));
    }
    if other_state != Some("RUNNING") {
        problems.push(format!("{OTHER_USER}'s job {other} is {other_state:?}, not RUNNING: it must be left alone"));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}
