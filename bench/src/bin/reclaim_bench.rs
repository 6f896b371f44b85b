//! The reclaim benchmark (run by bench/reclaim.sh): how fast protected work
//! gets a borrower's GPUs, and how many requests in flight the borrower
//! loses, side by side in one run on a real cluster:
//!
//! - onepool graceful: `onepool replica` under Slurm's notice
//!   (`--signal=B:USR1@N`, preempt_send_user_signal), GraceTime N;
//! - onepool immediate: the same replica in a class with GraceTime 0;
//! - Slurm native, GraceTime N, server (an srun step) that exits on SIGTERM;
//! - Slurm native, GraceTime N, server that finishes its requests on
//!   SIGTERM, then exits;
//! - Slurm native, GraceTime N, server that ignores SIGTERM (keeps serving
//!   until Slurm's kill).
//!
//! Then the autoscaler's reaction to a load step: onepoold (in-process)
//! with one baseline replica, and a step from no load to 20 clients.
//!
//! Usage: reclaim_bench CLUSTER_DIR ROUNDS

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::daemon::Daemon;
use onepool_router::registry::ReplicaState;
use onepool_tests::elastic::{completion_with, daemon_config, scratch, stand_in_server, wait, Load};
use onepool_tests::{build_dir, TestCluster, TEST_MIN_RUNTIME_SECS};

/// GraceTime of the graceful classes in the benchmark's policy (and the
/// replicas' drain timeout), as in the brief's measurement of native Slurm.
const GRACE_SECS: u64 = 10;
/// Every borrower has this many requests in flight, this long each, when
/// the protected job arrives.
const IN_FLIGHT: usize = 2;
const REQUEST_SECS: f64 = 5.0;

#[derive(Clone, Copy)]
enum Variant {
    OnepoolGraceful,
    OnepoolImmediate,
    NativeExit,
    NativeFinish,
    NativeIgnore,
}

impl Variant {
    const ALL: [Variant; 5] = [
        Variant::OnepoolGraceful,
        Variant::OnepoolImmediate,
        Variant::NativeExit,
        Variant::NativeFinish,
        Variant::NativeIgnore,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::OnepoolGraceful => "onepool graceful",
            Variant::OnepoolImmediate => "onepool immediate",
            Variant::NativeExit => "native GraceTime, server exits on SIGTERM",
            Variant::NativeFinish => "native GraceTime, server finishes requests",
            Variant::NativeIgnore => "native GraceTime, server ignores SIGTERM",
        }
    }

    /// sbatch arguments (before the script) and the batch script.
    fn job(self, port: u16) -> (Vec<String>, String) {
        let server = stand_in_server().display().to_string();
        let launcher = build_dir().join("onepool").display().to_string();
        let replica = format!(
            "export ONEPOOL_REPLICA_KEY={REPLICA_KEY}; exec {launcher} replica --listen 127.0.0.1:{port} --backend 127.0.0.1:{} --report none --drain-timeout {GRACE_SECS}s -- python3 {server}",
            port + 1
        );
        let native = |mode: &str| {
            format!("export ONEPOOL_BACKEND_PORT={port} ONEPOOL_STANDIN_ON_SIGTERM={mode}; srun python3 {server}")
        };
        let signal = format!("--signal=B:USR1@{GRACE_SECS}");
        match self {
            Variant::OnepoolGraceful => (vec!["--workload=inference".into(), signal], replica),
            Variant::OnepoolImmediate => (vec!["--workload=agents".into(), signal], replica),
            Variant::NativeExit => (vec!["--workload=inference".into()], native("exit")),
            Variant::NativeFinish => (vec!["--workload=inference".into()], native("finish")),
            Variant::NativeIgnore => (vec!["--workload=inference".into()], native("ignore")),
        }
    }
}

struct Round {
    took: Duration,
    lost: usize,
    sent: usize,
}

/// The replica key the bench hands its launchers (the bench is their onepoold).
const REPLICA_KEY: &str = "reclaim-bench-replica-key-0123456789";

/// A launcher answers with the key only; a native server ignores it.
const KEYED: &[(&str, &str)] = &[("x-onepool-replica-key", "reclaim-bench-replica-key-0123456789")];

fn health(port: u16) -> bool {
    onepool_tests::elastic::request_with(port, "GET", "/health", "", KEYED) == Some(200)
}

fn round(c: &TestCluster, v: Variant, base_port: u16) -> Round {
    let mut borrowers = Vec::new();
    for i in 0..3u16 {
        let port = base_port + 2 * i;
        let (mut args, script) = v.job(port);
        args.extend(["--gpus=4".into(), "-N1".into(), "--wrap".into(), script]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        borrowers.push((c.sbatch(&a), port));
    }
    for (job, port) in &borrowers {
        c.wait_state(*job, "RUNNING", Duration::from_secs(60));
        c.wait_until("the borrower's server", Duration::from_secs(60), || health(*port));
    }
    // Past the minimum run time, every borrower may be reclaimed.
    std::thread::sleep(Duration::from_secs(TEST_MIN_RUNTIME_SECS + 1));
    let requests: Vec<(u32, JoinHandle<Option<u16>>)> = borrowers
        .iter()
        .flat_map(|(job, port)| {
            (0..IN_FLIGHT).map(move |_| {
                let p = *port;
                (*job, std::thread::spawn(move || completion_with(p, REQUEST_SECS, KEYED)))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let owner = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=8", "-N2", "--wrap", "sleep 300"]);
    c.wait_until("the protected job to run", Duration::from_secs(180), || c.state(owner).as_deref() == Some("RUNNING"));
    let took = t0.elapsed();
    let victims: Vec<u32> =
        borrowers.iter().map(|(j, _)| *j).filter(|j| c.state(*j).as_deref() != Some("RUNNING")).collect();
    let (mut lost, mut sent) = (0, 0);
    for (job, h) in requests {
        let answer = h.join().unwrap();
        if victims.contains(&job) {
            sent += 1;
            lost += usize::from(answer != Some(200));
        }
    }
    c.cancel_all();
    Round { took, lost, sent }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The load step: seconds from the step to a supplemental replica
/// submitted, running, and serving in the router.
fn autoscale_round(c: &TestCluster, dir: &Path) -> [f64; 3] {
    let config = dir.join("onepoold.toml");
    daemon_config(c, dir, "chat", |_| {}).write(&config).unwrap();
    let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let cfg = onepool_elastic_daemon::config::load(&config).unwrap_or_else(|e| panic!("{e}"));
    let d = rt.block_on(Daemon::start(cfg)).expect("onepoold starts");
    let port = d.endpoint("chat").unwrap().listen.unwrap().port();
    let ready = |d: &Daemon| {
        let snap = d.endpoint("chat").unwrap().endpoint.snapshot();
        snap.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count()
    };
    wait("the baseline replica", Duration::from_secs(60), || ready(&d) == 1);
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    let load = Load::start(port, 20, 1.5);
    let view = || d.replica_view("chat").unwrap();
    wait("a supplemental replica job", Duration::from_secs(60), || view().submitted.len() > 1);
    let submitted = t0.elapsed().as_secs_f64();
    let job = view().submitted[1];
    c.wait_state(job, "RUNNING", Duration::from_secs(60));
    let running = t0.elapsed().as_secs_f64();
    wait("the supplemental replica to serve", Duration::from_secs(60), || ready(&d) >= 2);
    let serving = t0.elapsed().as_secs_f64();
    let _ = load.finish();
    rt.block_on(d.shutdown());
    c.cancel_all();
    [submitted, running, serving]
}

fn bench_policy(dir: &Path) -> PathBuf {
    let text = onepool_tests::test_policy_text();
    let from = "reclaim = \"graceful\"\ndrain_timeout = \"60s\"";
    assert!(text.contains(from), "etc/onepool.toml's inference class changed; update the benchmark");
    let text = text.replace(from, &format!("reclaim = \"graceful\"\ndrain_timeout = \"{GRACE_SECS}s\""));
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("bench-policy.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("usage: reclaim_bench CLUSTER_DIR ROUNDS"));
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    let c = onepool_tests::bench_cluster(&dir, bench_policy(&dir.join("bench")));
    println!(
        "reclaim: 3 borrowers x 4 GPUs, {IN_FLIGHT} requests of {REQUEST_SECS} s in flight on each; protected job for 8 GPUs (one free node + one borrower's); GraceTime {GRACE_SECS} s; {rounds} rounds, variants interleaved"
    );
    let mut results: Vec<Vec<Round>> = Variant::ALL.iter().map(|_| Vec::new()).collect();
    let mut port = 19100;
    for r in 0..rounds {
        for (i, v) in Variant::ALL.iter().enumerate() {
            let res = round(&c, *v, port);
            port += 10;
            println!(
                "  round {} {:<44} time to capacity {:>6.2} s, victim's requests lost {}/{}",
                r + 1,
                v.name(),
                res.took.as_secs_f64(),
                res.lost,
                res.sent
            );
            results[i].push(res);
        }
    }
    println!();
    println!(
        "{:<44} {:>14} {:>16} {:>12} {:>14}",
        "variant", "median TTC s", "min-max s", "vs graceful", "lost/in flight"
    );
    let base = median(results[0].iter().map(|r| r.took.as_secs_f64()).collect());
    for (v, rs) in Variant::ALL.iter().zip(&results) {
        let t: Vec<f64> = rs.iter().map(|r| r.took.as_secs_f64()).collect();
        let (lo, hi) = (t.iter().cloned().fold(f64::MAX, f64::min), t.iter().cloned().fold(0.0, f64::max));
        let m = median(t);
        let lost: usize = rs.iter().map(|r| r.lost).sum();
        let sent: usize = rs.iter().map(|r| r.sent).sum();
        println!(
            "{:<44} {:>14.2} {:>16} {:>11.2}x {:>14}",
            v.name(),
            m,
            format!("{lo:.2}-{hi:.2}"),
            m / base,
            format!("{lost}/{sent}")
        );
    }
    println!();
    println!(
        "autoscaler: load step 0 -> 20 clients (1.5 s requests, target 4 per replica), poll 500 ms, panic window 2 s"
    );
    let scratch_dir = scratch("reclaim-bench-autoscale");
    let mut steps = Vec::new();
    for r in 0..rounds {
        let s = autoscale_round(&c, &scratch_dir);
        println!(
            "  round {}: replica submitted {:.2} s, running {:.2} s, serving {:.2} s after the step",
            r + 1,
            s[0],
            s[1],
            s[2]
        );
        steps.push(s);
    }
    let col = |i: usize| median(steps.iter().map(|s| s[i]).collect());
    println!("  median: submitted {:.2} s, running {:.2} s, serving {:.2} s", col(0), col(1), col(2));
    let _ = std::fs::remove_dir_all(&scratch_dir);
}
