//! Prefix-aware routing against least-outstanding (issue #28; run by
//! bench/prefix.sh): the Mooncake FAST'25 conversation trace
//! (data/NOTICE.md), its prompts rebuilt so that equal block hashes give
//! equal text ([`onepool_loadgen::mooncake`]), replayed through onepoold's
//! router (in-process) to three real llama-server replicas of SmolLM2, once
//! per variant, side by side in one run. Each variant starts on freshly
//! started servers: no prompt cache carries over.
//!
//! Per variant: requests served and failed, time to first token p50/p90/p99
//! (every request streams), answer latency p50, requests served per second
//! of the replay, and how the router routed (hits: to the replica that
//! held the prompt's longest known prefix).
//!
//! No Slurm here: the replicas are plain processes added to the router as
//! the control socket would; what is measured is routing and the servers'
//! prompt cache.
//!
//! Usage: prefix_bench TRACE FROM SECONDS SPEED ROUNDS

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use onepool_dev_cluster::model_server::{ModelServer, Slots, MODEL_NAME};
use onepool_elastic_daemon::daemon::Daemon;
use onepool_loadgen::mooncake::{self, MooncakeScale};
use onepool_loadgen::{Load, Prompted, Trace};
use onepool_router::prefix::PrefixSettings;

/// Two requests at once per replica, as many as its slots: requests wait in
/// the router's queue, where routing decides, not in a server.
const SLOTS: Slots = Slots { parallel: 2, context: 1024, threads: 1 };
const REPLICAS: usize = 3;
/// A 512-token block of the trace becomes 4 words (about 5 tokens): long
/// shared prefixes stay long relative to the rest, and three one-thread
/// replicas on 2 cores keep up with the trace at a quarter of its speed.
const SCALE: MooncakeScale = MooncakeScale { words_per_block: 4, ..MooncakeScale::CPU };

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Prefix,
    LeastOutstanding,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Prefix => "prefix-aware (24-byte blocks)",
            Variant::LeastOutstanding => "least-outstanding",
        }
    }
}

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Three fresh llama-server processes on `ports`, healthy.
fn servers(server: &ModelServer, ports: &[u16]) -> Servers {
    let children = ports
        .iter()
        .map(|p| {
            Command::new(server.binary())
                .args(server.args(&p.to_string(), SLOTS))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("llama-server starts")
        })
        .collect();
    let s = Servers(children);
    let client = onepool_client::blocking::Client::new(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(120);
    for p in ports {
        while !client.get(&format!("http://127.0.0.1:{p}/health"), 4096).is_ok_and(|a| a.status.is_success()) {
            assert!(Instant::now() < deadline, "llama-server on port {p} never became healthy");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    s
}

/// onepoold's router for one endpoint, routing by `v`.
async fn router(v: Variant, replicas: &[SocketAddr]) -> Daemon {
    let socket = std::env::temp_dir().join(format!("onepool-prefix-bench-{}.sock", std::process::id()));
    let src = format!(
        r#"control_socket = "{}"
shutdown_grace = "2s"

[[endpoint]]
name = "chat"
listen = "127.0.0.1:0"
replica_concurrency = {}
queue_size = 4096
queue_timeout = "600s"
request_timeout = "600s"
"#,
        socket.display(),
        SLOTS.parallel
    );
    let mut cfg = onepool_elastic_daemon::config::parse("prefix-bench.toml", &src).unwrap_or_else(|e| panic!("{e}"));
    if v == Variant::Prefix {
        // A block of about one trace block (4 words): the router tells
        // prompts apart at the grain the trace shares them.
        cfg.endpoints[0].proxy.prefix = Some(PrefixSettings { block_bytes: 24, ..PrefixSettings::default() });
    }
    let d = Daemon::start(cfg).await.unwrap_or_else(|e| panic!("{e}"));
    for r in replicas {
        d.endpoint("chat").unwrap().endpoint.add(*r, None, true).unwrap();
    }
    d
}

struct Outcome {
    served: u64,
    failed: u64,
    ttfts: Vec<f64>,
    latencies: Vec<f64>,
    seconds: f64,
    /// Hits, misses, over the bound, without a prefix.
    routed: Option<[u64; 4]>,
}

fn run(v: Variant, server: &ModelServer, (trace, prompts): (&Trace, &[Prompted]), speed: f64, base: u16) -> Outcome {
    let ports: Vec<u16> = (0..REPLICAS as u16).map(|i| base + i).collect();
    let _servers = servers(server, &ports);
    let replicas: Vec<SocketAddr> = ports.iter().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let d = rt.block_on(router(v, &replicas));
    let addr = d.endpoint("chat").unwrap().listen.unwrap();
    let t0 = Instant::now();
    let load = Load::start_prompted(rt.handle(), trace.clone(), prompts.to_vec(), addr, MODEL_NAME, t0);
    load.phase("replay", speed);
    let span = trace.rows.last().map_or(0.0, |r| r.0) / speed;
    // Stopped just before the replay would wrap around to its start.
    std::thread::sleep(Duration::from_secs_f64((span - 0.05).max(0.0)));
    load.pause();
    let deadline = Instant::now() + Duration::from_secs(600);
    while load.in_flight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let seconds = t0.elapsed().as_secs_f64();
    load.stop();
    let routed = d.endpoint("chat").unwrap().endpoint.prefix_counts();
    rt.block_on(d.shutdown());
    let phase = load.phases().remove(0);
    Outcome {
        served: phase.served,
        failed: phase.failed,
        ttfts: phase.ttfts,
        latencies: phase.latencies,
        seconds,
        routed,
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: prefix_bench TRACE FROM SECONDS SPEED ROUNDS";
    let path = PathBuf::from(args.next().expect(usage));
    let num = |a: Option<String>, d: f64| a.map_or(d, |s| s.parse().unwrap_or_else(|_| panic!("{usage}")));
    let (from, seconds, speed) = (num(args.next(), 0.0), num(args.next(), 240.0), num(args.next(), 0.5));
    let rounds = num(args.next(), 1.0) as usize;
    let server = ModelServer::locate().unwrap_or_else(|e| panic!("{e}"));
    let (trace, prompts) = mooncake::load(&path, SCALE).unwrap_or_else(|e| panic!("{e}"));
    let keep: Vec<usize> =
        (0..trace.rows.len()).filter(|i| trace.rows[*i].0 >= from && trace.rows[*i].0 < from + seconds).collect();
    let window =
        Trace { rows: keep.iter().map(|i| (trace.rows[*i].0 - from, trace.rows[*i].1, trace.rows[*i].2)).collect() };
    let prompts: Vec<Prompted> = keep.iter().map(|i| prompts[*i].clone()).collect();
    let words: Vec<f64> = window.rows.iter().map(|r| f64::from(r.1)).collect();
    println!(
        "prefix routing: {} requests ({} s of {} from {from} s) at {speed}x, prompts {:.0} words median \
         ({} words per 512-token block, at most {} blocks), {} llama-server replicas of {MODEL_NAME} \
         ({} slots, 1 thread each), every request streamed",
        window.rows.len(),
        seconds,
        path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        quantile(&words, 0.5),
        SCALE.words_per_block,
        SCALE.max_blocks,
        REPLICAS,
        SLOTS.parallel,
    );
    println!(
        "{:<28} {:>6} {:>6} {:>10} {:>10} {:>10} {:>12} {:>8} {:>24}",
        "variant",
        "served",
        "failed",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "latency p50",
        "req/s",
        "hit/miss/over-bound"
    );
    let mut port = 19500;
    for _ in 0..rounds {
        for v in [Variant::Prefix, Variant::LeastOutstanding] {
            let o = run(v, &server, (&window, &prompts), speed, port);
            port += 10;
            let routed = o.routed.map_or("-".to_string(), |[h, m, b, _]| format!("{h}/{m}/{b}"));
            println!(
                "{:<28} {:>6} {:>6} {:>9.3}s {:>9.3}s {:>9.3}s {:>11.3}s {:>8.2} {:>24}",
                v.name(),
                o.served,
                o.failed,
                quantile(&o.ttfts, 0.5),
                quantile(&o.ttfts, 0.9),
                quantile(&o.ttfts, 0.99),
                quantile(&o.latencies, 0.5),
                o.served as f64 / o.seconds,
                routed
            );
        }
    }
}
