//! The serving reclaim benchmark (run by bench/serving-reclaim.sh): a
//! protected training job takes one of three llama-server replicas' GPUs
//! while the Azure conversation trace is replayed against them as chat
//! completions (every other one streamed), side by side in one run:
//!
//! - onepool: the replicas run under `onepool replica` with Slurm's notice
//!   (`--signal=B:USR1@N`, preempt_send_user_signal) behind onepoold's
//!   router (health checks on): the victim stops taking requests, the
//!   router sends new ones elsewhere, its streams finish, then the GPUs go;
//! - native: the same llama-server replicas as plain srun steps behind an
//!   nginx round-robin upstream (`proxy_next_upstream error timeout
//!   http_502 http_503`), reclaimed by Slurm's GraceTime alone: the steps
//!   get SIGTERM at once.
//!
//! Per round: the time to capacity (protected job submitted -> RUNNING),
//! the requests that failed among those in flight when it was submitted
//! and among those that arrived while it waited (the drain), and the
//! longest a request in flight at the submission still ran (the goal for
//! onepool: time to capacity within that + 1.5 s).
//!
//! Usage: serving_reclaim_bench CLUSTER_DIR TRACE ROUNDS

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use onepool_dev_cluster::model_server::{ModelServer, Slots, MODEL_NAME};
use onepool_elastic_daemon::config::{ConfigFile, EndpointFile, HealthFile, RetryFile};
use onepool_elastic_daemon::daemon::Daemon;
use onepool_loadgen::{closed_loop, Capacity, ChatShape, Load, Request, Trace};
use onepool_router::registry::ReplicaState;
use onepool_tests::{build_dir, TestCluster, TEST_MIN_RUNTIME_SECS};

/// The replicas' drain timeout (onepool) within the inference class's
/// GraceTime (60 s in etc/onepool.toml).
const DRAIN_SECS: u64 = 30;
/// How long the trace runs before the protected job comes and after it
/// runs. Its speed is the LOAD argument: `3x` (the trace 3 times faster
/// than recorded, the figure RESULTS.md kept before issue #24), or a share
/// of the capacity the two replicas left after the reclaim have, measured
/// at the start (`0.8`, the default): the same relative load on any
/// machine, so that figures compare across machines.
/// Longer answers than the demo's, so that streams are in flight when the
/// protected job comes: GeneratedTokens/4, 8 to 96 tokens.
const SHAPE: ChatShape = ChatShape { prompt_div: 32, prompt_words: (8, 64), answer_div: 4, answer_tokens: (8, 96) };
const BEFORE: Duration = Duration::from_secs(10);
const AFTER: Duration = Duration::from_secs(10);
const SLOTS: Slots = Slots { parallel: 4, context: 256, threads: 1 };
/// Requests in flight (all replicas) when the protected job is submitted.
const IN_FLIGHT_AT_RECLAIM: u64 = 6;
/// How long one replica's capacity is measured.
const CAPACITY_RUN: Duration = Duration::from_secs(20);
// (256 per slot holds a 64-word prompt and 96 tokens.)

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Onepool,
    Native,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Onepool => "onepool graceful (router + launcher)",
            Variant::Native => "native GraceTime behind nginx",
        }
    }

    /// sbatch arguments and the batch script of a replica on `port`.
    fn job(self, server: &ModelServer, port: u16) -> Vec<String> {
        let mut args = vec!["--workload=inference".to_string(), "--gpus=4".into(), "-N1".into()];
        let script = match self {
            Variant::Onepool => {
                args.push(format!("--signal=B:USR1@{DRAIN_SECS}"));
                // The bench is its own onepoold: it hands the launcher the
                // replica key the router sends (here in the batch script,
                // which only the job's user and root can read).
                format!(
                    "export ONEPOOL_REPLICA_KEY={REPLICA_KEY}; exec {} replica --listen 127.0.0.1:{port} --backend 127.0.0.1:{} --report none --drain-timeout {DRAIN_SECS}s -- {}",
                    build_dir().join("onepool").display(),
                    port + 1,
                    server.replica_command(SLOTS)
                )
            }
            Variant::Native => {
                format!("export ONEPOOL_BACKEND_PORT={port}; exec srun {}", server.replica_command(SLOTS))
            }
        };
        args.extend(["--wrap".into(), script]);
        args
    }
}

/// What one round measured.
struct Round {
    failures: Vec<String>,
    /// Requests per second the replay sent (the offered load).
    offered: f64,
    /// onepoold's 503s by reason (`onepool_router_unavailable_total`).
    router_503: Vec<String>,
    ttc: f64,
    in_flight: (usize, usize),
    during: (usize, usize),
    total: (usize, usize),
    longest: f64,
}

/// The replica key of the bench's router and launchers.
const REPLICA_KEY: &str = "serving-reclaim-bench-replica-key-0123456789";

/// The launcher answers onepoold's key only; nginx goes to the server itself.
fn healthy(v: Variant, port: u16) -> bool {
    let key: &[(&str, &str)] = match v {
        Variant::Onepool => &[(onepool_tests::elastic::REPLICA_KEY_FIELD, REPLICA_KEY)],
        Variant::Native => &[],
    };
    onepool_tests::elastic::request_with(port, "GET", "/health", "", key) == Some(200)
}

/// The front of the variant: onepoold's router in-process, or nginx.
enum Front {
    Onepool { rt: onepool_elastic_daemon::tokio::runtime::Runtime, daemon: Daemon },
    Nginx(Child),
}

impl Front {
    fn start(v: Variant, dir: &Path, ports: &[u16]) -> (Front, SocketAddr) {
        match v {
            Variant::Onepool => {
                let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                // A router only: the bench submits the replicas itself.
                let config = ConfigFile {
                    endpoints: vec![EndpointFile {
                        listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                        replica_concurrency: Some(SLOTS.parallel),
                        queue_size: Some(2000),
                        queue_timeout: Some(Duration::from_secs(60)),
                        request_timeout: Some(Duration::from_secs(120)),
                        retry: Some(RetryFile { attempts: Some(2), ..RetryFile::default() }),
                        health: Some(HealthFile {
                            interval: Some(Duration::from_millis(500)),
                            timeout: Some(Duration::from_secs(1)),
                            healthy_after: Some(1),
                            unhealthy_after: Some(3),
                            ..HealthFile::new("/health")
                        }),
                        ..EndpointFile::new("chat")
                    }],
                    ..ConfigFile::new(dir.join("onepoold.sock"))
                }
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
                let daemon = rt.block_on(Daemon::start(config)).expect("the router starts");
                let ep = daemon.endpoint("chat").unwrap();
                ep.endpoint.set_replica_key(http::HeaderValue::from_static(REPLICA_KEY));
                for p in ports {
                    ep.endpoint.add(SocketAddr::from(([127, 0, 0, 1], *p)), None, false).unwrap();
                }
                let addr = ep.listen.unwrap();
                let front = Front::Onepool { rt, daemon };
                let ready = || match &front {
                    Front::Onepool { daemon, .. } => {
                        let snap = daemon.endpoint("chat").unwrap().endpoint.snapshot();
                        snap.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count() == ports.len()
                    }
                    Front::Nginx(_) => true,
                };
                onepool_tests::elastic::wait("every replica in the router", Duration::from_secs(60), ready);
                (front, addr)
            }
            Variant::Native => {
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                let servers: String = ports.iter().map(|p| format!("    server 127.0.0.1:{p};\n")).collect();
                let conf = format!(
                    "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
                     events {{ worker_connections 4096; }}\n\
                     http {{\n  access_log off;\n  client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n\
                     upstream llama {{\n{servers}  }}\n\
                     server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://llama;\n\
                     proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
                     proxy_read_timeout 300s;\n      proxy_next_upstream error timeout http_502 http_503;\n    }}\n  }}\n}}\n",
                    d = dir.display()
                );
                std::fs::create_dir_all(dir.join("tmp")).unwrap();
                let path = dir.join("nginx.conf");
                std::fs::write(&path, conf).unwrap();
                let child = Command::new("nginx")
                    .args(["-e", &dir.join("nginx-error.log").display().to_string(), "-p"])
                    .arg(dir)
                    .arg("-c")
                    .arg(&path)
                    .spawn()
                    .expect("nginx (apt-get install nginx-light)");
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                onepool_tests::elastic::wait("nginx", Duration::from_secs(10), || {
                    std::net::TcpStream::connect(addr).is_ok()
                });
                (Front::Nginx(child), addr)
            }
        }
    }

    /// The router's 503s by reason, from its own metrics.
    fn unavailable(&self) -> Vec<String> {
        let Front::Onepool { daemon, .. } = self else { return Vec::new() };
        daemon
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("onepool_router_unavailable_total{"))
            .filter_map(|l| {
                let reason = l.split("reason=\"").nth(1)?.split('"').next()?;
                Some(format!("{} x {reason}", l.rsplit(' ').next()?))
            })
            .collect()
    }

    fn stop(self) {
        match self {
            Front::Onepool { rt, daemon } => rt.block_on(daemon.shutdown()),
            Front::Nginx(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The replay speed that offers `rate` requests per second over the
/// stretch of the trace a round replays (about 25 s of wall time).
fn speed_for(trace: &Trace, rate: f64) -> f64 {
    // The offered rate grows with the speed (a longer stretch of the trace
    // at a faster pace), though not smoothly: bisection.
    let offered = |speed: f64| trace.rate(0.0, 25.0 * speed) * speed;
    let (mut lo, mut hi) = (0.01, 100.0);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if offered(mid) < rate {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Why requests failed, and when relative to the protected job's
/// submission and its start: "N x why (when)", in the order of their text.
fn failures_by_cause(requests: &[Request], submitted: f64, capacity: f64) -> Vec<String> {
    let in_flight_at = |r: &Request| r.sent < submitted && r.ended > submitted;
    let mut failures: Vec<String> = Vec::new();
    for r in requests.iter().filter(|r| r.failure.is_some()) {
        let when = if in_flight_at(r) {
            "in flight"
        } else if r.sent >= submitted && r.sent < capacity {
            "during the wait"
        } else if r.sent >= capacity {
            "after"
        } else {
            "before"
        };
        failures.push(format!("{} ({when})", r.failure.as_deref().unwrap_or_default()));
    }
    failures.sort();
    let mut counted: Vec<(String, usize)> = Vec::new();
    for f in failures {
        match counted.last_mut() {
            Some((g, n)) if *g == f => *n += 1,
            _ => counted.push((f, 1)),
        }
    }
    counted.iter().map(|(f, n)| format!("{n} x {f}")).collect()
}

fn round(
    c: &TestCluster,
    v: Variant,
    server: &ModelServer,
    (trace, speed): (&Path, f64),
    base: u16,
    dir: &Path,
) -> Round {
    let ports: Vec<u16> = (0..3).map(|i| base + 2 * i).collect();
    let jobs: Vec<u32> = ports
        .iter()
        .map(|p| {
            let args = v.job(server, *p);
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            c.sbatch(&a)
        })
        .collect();
    for (job, port) in jobs.iter().zip(&ports) {
        c.wait_state(*job, "RUNNING", Duration::from_secs(60));
        c.wait_until("the replica's server", Duration::from_secs(120), || healthy(v, *port));
    }
    let (front, addr) = Front::start(v, dir, &ports);
    let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let load = Load::start(rt.handle(), Trace::load(trace).unwrap(), addr, MODEL_NAME, SHAPE, t0);
    load.phase("replay", speed);
    // Past the minimum run time, every replica may be reclaimed.
    std::thread::sleep(BEFORE.max(Duration::from_secs(TEST_MIN_RUNTIME_SECS + 1)));
    // The reclaim is measured with streams in flight: at a load the
    // replicas keep up with, a moment with none is common (up to 20 s).
    let busy_by = Instant::now() + Duration::from_secs(20);
    while load.in_flight() < IN_FLIGHT_AT_RECLAIM && Instant::now() < busy_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    let submitted = t0.elapsed().as_secs_f64();
    let started = Instant::now();
    let owner = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=8", "-N2", "--wrap", "sleep 300"]);
    c.wait_until("the protected job to run", Duration::from_secs(180), || c.state(owner).as_deref() == Some("RUNNING"));
    let ttc = started.elapsed().as_secs_f64();
    let capacity = submitted + ttc;
    std::thread::sleep(AFTER);
    load.stop();
    let wait_end = Instant::now() + Duration::from_secs(200);
    while load.in_flight() > 0 && Instant::now() < wait_end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let requests = load.requests();
    drop(rt);
    let router_503 = front.unavailable();
    front.stop();
    c.cancel_all();
    let count = |f: &dyn Fn(&Request) -> bool| {
        let rs: Vec<&Request> = requests.iter().filter(|r| f(r)).collect();
        (rs.iter().filter(|r| r.failure.is_some()).count(), rs.len())
    };
    let in_flight_at = |r: &Request| r.sent < submitted && r.ended > submitted;
    let longest = requests
        .iter()
        .filter(|r| in_flight_at(r) && r.failure.is_none())
        .map(|r| r.ended - submitted)
        .fold(0.0, f64::max);
    let sent = || requests.iter().map(|r| r.sent);
    let span = sent().fold(f64::MIN, f64::max) - sent().fold(f64::MAX, f64::min);
    Round {
        failures: failures_by_cause(&requests, submitted, capacity),
        offered: requests.len() as f64 / span.max(1e-9),
        router_503,
        ttc,
        in_flight: count(&in_flight_at),
        during: count(&|r: &Request| r.sent >= submitted && r.sent < capacity),
        total: count(&|_| true),
        longest,
    }
}

/// One replica's capacity for the bench's request mix: a replica job
/// alone, the trace's requests sent to its server with every slot busy.
fn capacity(c: &TestCluster, server: &ModelServer, trace: &Path, port: u16) -> Capacity {
    let args = Variant::Native.job(server, port);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = c.sbatch(&a);
    c.wait_state(job, "RUNNING", Duration::from_secs(60));
    c.wait_until("the replica's server", Duration::from_secs(120), || healthy(Variant::Native, port));
    let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let trace = Trace::load(trace).unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let cap = rt.block_on(closed_loop(addr, MODEL_NAME, SHAPE, &trace, SLOTS.parallel as usize, CAPACITY_RUN));
    c.cancel_all();
    cap
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: serving_reclaim_bench CLUSTER_DIR TRACE ROUNDS [LOAD: 3x, or 0.8 of the capacity left]";
    let dir = PathBuf::from(args.next().expect(usage));
    let trace = PathBuf::from(args.next().expect(usage));
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    let load = args.next().unwrap_or_else(|| "0.8".to_string());
    let server = ModelServer::locate().unwrap_or_else(|e| panic!("{e}"));
    let c = onepool_tests::bench_cluster(&dir, onepool_tests::test_policy());
    let cap = capacity(&c, &server, &trace, 19290);
    let per_replica = cap.requests_per_second();
    println!(
        "capacity: one replica serves {per_replica:.2} req/s of this mix ({} served, {} failed in {:.1} s with {} \
         in flight; {:.0} answer tokens/s asked); 3 replicas {:.2} req/s, 2 after the reclaim {:.2} req/s",
        cap.served,
        cap.failed,
        cap.seconds,
        SLOTS.parallel,
        cap.answer_tokens as f64 / cap.seconds.max(1e-9),
        3.0 * per_replica,
        2.0 * per_replica
    );
    let replay = Trace::load(&trace).unwrap();
    let speed = match load.strip_suffix('x') {
        Some(x) => x.parse::<f64>().unwrap_or_else(|_| panic!("{usage}")),
        None => speed_for(&replay, load.parse::<f64>().unwrap_or_else(|_| panic!("{usage}")) * 2.0 * per_replica),
    };
    println!(
        "serving reclaim: 3 llama-server replicas ({MODEL_NAME}, {} slots, 1 thread) x 4 GPUs; the trace {} at {speed:.2}x \
         (load {load}: {:.2} req/s over the replayed stretch) as chat completions (every other one streamed); protected \
         job for 8 GPUs; onepool's drain timeout {DRAIN_SECS} s; {rounds} rounds, variants interleaved",
        SLOTS.parallel,
        trace.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        replay.rate(0.0, 25.0 * speed) * speed,
    );
    let variants = [Variant::Onepool, Variant::Native];
    let mut results: Vec<Vec<Round>> = variants.iter().map(|_| Vec::new()).collect();
    let scratch = dir.join("bench-fronts");
    let mut port = 19300;
    for r in 0..rounds {
        for (i, v) in variants.iter().enumerate() {
            let front_dir = scratch.join(format!("{r}-{i}"));
            std::fs::create_dir_all(&front_dir).unwrap();
            let res = round(&c, *v, &server, (&trace, speed), port, &front_dir);
            port += 10;
            print_round(r, *v, &res, per_replica);
            results[i].push(res);
        }
    }
    print_summary(&variants, &results);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// One round's line, and its offered load against the capacity left.
fn print_round(r: usize, v: Variant, res: &Round, per_replica: f64) {
    println!(
        "  round {} {:<38} time to capacity {:>5.2} s (longest in flight {:>5.2} s); failed: in flight {}/{}, \
         arrived during the wait {}/{}, all {}/{}",
        r + 1,
        v.name(),
        res.ttc,
        res.longest,
        res.in_flight.0,
        res.in_flight.1,
        res.during.0,
        res.during.1,
        res.total.0,
        res.total.1
    );
    println!(
        "      offered {:.2} req/s: {:.0}% of 3 replicas' capacity, {:.0}% of the 2 left after the reclaim",
        res.offered,
        100.0 * res.offered / (3.0 * per_replica).max(1e-9),
        100.0 * res.offered / (2.0 * per_replica).max(1e-9)
    );
    if !res.failures.is_empty() {
        println!("      failed: {}", res.failures.join("; "));
    }
    if !res.router_503.is_empty() {
        println!("      onepoold's 503s by reason: {}", res.router_503.join(", "));
    }
}

/// Each variant's medians and losses over every round.
fn print_summary(variants: &[Variant], results: &[Vec<Round>]) {
    println!();
    println!(
        "{:<38} {:>14} {:>18} {:>16} {:>18} {:>12}",
        "variant", "median TTC s", "median longest s", "lost in flight", "lost during wait", "lost of all"
    );
    for (v, rs) in variants.iter().zip(results) {
        let sum = |f: &dyn Fn(&Round) -> (usize, usize)| rs.iter().map(f).fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
        let (fl, dw, all) = (sum(&|r| r.in_flight), sum(&|r| r.during), sum(&|r| r.total));
        println!(
            "{:<38} {:>14.2} {:>18.2} {:>16} {:>18} {:>12}",
            v.name(),
            median(rs.iter().map(|r| r.ttc).collect()),
            median(rs.iter().map(|r| r.longest).collect()),
            format!("{}/{}", fl.0, fl.1),
            format!("{}/{}", dw.0, dw.1),
            format!("{}/{}", all.0, all.1)
        );
    }
}
