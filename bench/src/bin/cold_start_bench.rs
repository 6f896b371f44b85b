//! Cold start from zero (issue #28; run by bench/cold-start.sh): an
//! endpoint with `min = 0` whose replica is a real llama-server (SmolLM2)
//! in a Slurm job on the dev cluster, woken by one streamed chat request
//! per round, then left idle until onepoold has given the GPUs back.
//!
//! Each round splits the request's time to first token where it went:
//!
//! - to Slurm: the request's arrival to slurmctld's receipt of the replica
//!   job (`_slurm_rpc_submit_batch_job` in slurmctld's log): onepoold's
//!   wake and decision, and sbatch;
//! - scheduling: receipt to allocation (`sched: Allocate` / `backfill:
//!   Started`, by the main scheduler or backfill);
//! - load: allocation to the replica ready in the router (the launcher,
//!   llama-server's model load, the first health check, onepoold seeing
//!   the job running);
//! - first token: ready to the first generated text at the client.
//!
//! Beside it, a warm request's time to first token on the replica that
//! now serves: what the cold start adds.
//!
//! Usage: cold_start_bench CLUSTER_DIR ROUNDS

// No FFI here (issue #27).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onepool_decisions::trace::parse_time;
use onepool_dev_cluster::model_server::{Slots, MODEL_NAME};
use onepool_elastic_daemon::daemon::Daemon;
use onepool_router::registry::ReplicaState;
use onepool_tests::elastic::{daemon_config, llama_replicas, replica_view, runtime, start_daemon, wait};
use onepool_tests::TestCluster;

const ENDPOINT: &str = "chat";
/// As `llama_replicas` starts them (512 tokens of context, 1 thread).
const SLOTS: Slots = Slots { parallel: 2, context: 512, threads: 1 };

/// One round's moments, in Unix seconds.
#[derive(Debug, Default, Clone, Copy)]
struct Moments {
    arrival: f64,
    received: f64,
    allocated: f64,
    ready: f64,
    first_token: f64,
    /// A warm request's time to first token right after.
    warm_ttft: f64,
}

impl Moments {
    fn parts(&self) -> [f64; 5] {
        [
            self.received - self.arrival,
            self.allocated - self.received,
            self.ready - self.allocated,
            self.first_token - self.ready,
            self.first_token - self.arrival,
        ]
    }
}

const PARTS: [&str; 5] = ["to Slurm", "scheduling", "load", "first token", "cold TTFT"];

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The machine's local clock minus UTC (slurmctld logs local time).
fn utc_offset() -> f64 {
    let out = std::process::Command::new("date").arg("+%z").output().expect("date");
    let z = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let sign = if z.starts_with('-') { -1.0 } else { 1.0 };
    let digits = z.trim_start_matches(['+', '-']);
    let (h, m): (f64, f64) = (digits[..2].parse().unwrap_or(0.0), digits[2..].parse().unwrap_or(0.0));
    sign * (h * 3600.0 + m * 60.0)
}

/// When slurmctld's log first says `what` of `job`: `[TIME] ...what JobId=N ...`.
fn logged(log: &Path, job: u32, whats: &[&str], offset: f64) -> Option<f64> {
    let text = std::fs::read_to_string(log).ok()?;
    let id = format!("JobId={job} ");
    text.lines().find(|l| whats.iter().any(|w| l.contains(w)) && l.contains(&id)).and_then(|l| {
        let time = l.strip_prefix('[')?.split(']').next()?;
        parse_time(time).map(|t| t - offset)
    })
}

fn chat_body(n: usize) -> String {
    serde_json::json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": format!("Round {n}: say hello to the pool in five words.")}],
        "max_tokens": 16,
        "stream": true,
    })
    .to_string()
}

/// One streamed chat: seconds from now to its first token.
fn ttft(rt: &onepool_elastic_daemon::tokio::runtime::Runtime, target: SocketAddr, body: &str) -> (f64, f64) {
    let (t0, sent) = (Instant::now(), unix(SystemTime::now()));
    let first = rt
        .block_on(onepool_loadgen::chat_once(target, body, true))
        .unwrap_or_else(|e| panic!("the request failed: {e}"));
    let first = first.expect("a streamed answer has a first token");
    (sent, sent + first.duration_since(t0).as_secs_f64())
}

fn round(
    c: &TestCluster,
    d: &Daemon,
    rt: &onepool_elastic_daemon::tokio::runtime::Runtime,
    n: usize,
    slurmctld: &Path,
) -> Moments {
    let gone = || c.ok("squeue", &["-h", "-o", "%j"]).lines().all(|j| !j.starts_with("onepool-chat-"));
    wait("the endpoint at zero", Duration::from_secs(120), || gone() && replica_view(d, ENDPOINT).jobs.is_empty());
    let ep = d.endpoint(ENDPOINT).unwrap();
    let target = SocketAddr::from(([127, 0, 0, 1], ep.listen.unwrap().port()));
    let endpoint = ep.endpoint.clone();
    // The router's moment of readiness, seen every 5 ms.
    let watcher = std::thread::spawn(move || loop {
        if endpoint.snapshot().replicas.iter().any(|r| r.state == ReplicaState::Ready) {
            return unix(SystemTime::now());
        }
        std::thread::sleep(Duration::from_millis(5));
    });
    let (arrival, first_token) = ttft(rt, target, &chat_body(n));
    let ready = watcher.join().unwrap();
    let (warm_sent, warm_first) = ttft(rt, target, &chat_body(n + 1000));
    let job = *replica_view(d, ENDPOINT).submitted.last().expect("a replica job was submitted");
    let offset = utc_offset();
    Moments {
        arrival,
        received: logged(slurmctld, job, &["_slurm_rpc_submit_batch_job:"], offset)
            .expect("the submission in slurmctld's log"),
        allocated: logged(slurmctld, job, &["sched: Allocate JobId=", "Started JobId="], offset)
            .expect("the allocation in slurmctld's log"),
        ready,
        first_token,
        warm_ttft: warm_first - warm_sent,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cold_start_bench CLUSTER_DIR [ROUNDS]";
    let dir = PathBuf::from(args.next().expect(usage));
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    let c = onepool_tests::bench_cluster(&dir, onepool_tests::test_policy());
    let work = dir.join("cold-start");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let file = daemon_config(&c, &work, ENDPOINT, |r| {
        llama_replicas(r, SLOTS.parallel);
        r.min = Some(0);
        r.max = Some(1);
        r.poll_interval = Some(Duration::from_secs(2));
        r.stable_window = Some(Duration::from_secs(3));
        r.panic_window = Some(Duration::from_secs(1));
        r.scale_down_delay = Some(Duration::from_secs(5));
    });
    let config = work.join("onepoold.toml");
    file.write(&config).unwrap();
    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let slurmctld = c.cluster.layout.log_file("slurmctld");
    println!(
        "cold start from zero: llama-server ({MODEL_NAME}, {} slots, 1 thread) in a Slurm job on the dev cluster, \
         onepoold poll interval 2 s, health checks every 0.5 s; {rounds} rounds",
        SLOTS.parallel
    );
    println!(
        "{:>5} {:>9} {:>11} {:>8} {:>12} {:>10} {:>10}",
        "round", "to Slurm", "scheduling", "load", "first token", "cold TTFT", "warm TTFT"
    );
    let mut all = Vec::new();
    for n in 0..rounds {
        let m = round(&c, &d, &rt, n, &slurmctld);
        let p = m.parts();
        println!(
            "{n:>5} {:>8.2}s {:>10.2}s {:>7.2}s {:>11.2}s {:>9.2}s {:>9.2}s",
            p[0], p[1], p[2], p[3], p[4], m.warm_ttft
        );
        all.push(m);
    }
    let med = |i: usize| median(all.iter().map(|m| m.parts()[i]).collect());
    let parts: Vec<String> = (0..PARTS.len()).map(|i| format!("{} {:.2} s", PARTS[i], med(i))).collect();
    println!("median: {}; warm TTFT {:.2} s", parts.join(", "), median(all.iter().map(|m| m.warm_ttft).collect()));
    rt.block_on(d.shutdown());
    c.cancel_all();
}
