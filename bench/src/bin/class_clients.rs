//! The client side of bench/classes.sh (issue #44): live requests (one API
//! key) at a steady rate, alone and then beside an agents' flood (another
//! key, clients sending back to back), through the router at ADDRESS;
//! first the flood alone, for the capacity it gets with the replica to
//! itself. Each request is a streamed chat completion of TOKENS tokens on
//! a connection of its own. Prints one line of JSON per phase: requests,
//! refused (a status other than 200, 429s apart), cut (200 then no
//! `[DONE]`), time to first body byte (p50, p99), tokens read per second.
//!
//! Usage: class_clients ADDRESS LIVE_KEY AGENTS_KEY TOKENS LIVE_EVERY_MS AGENTS PHASE_SECS
//! (LIVE_EVERY_MS 0: live requests at half the requests per second the
//! flood alone was served).

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onepool_elastic_daemon::tokio;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How one request ended, as its client saw it.
#[derive(Clone, Copy)]
struct Seen {
    status: u16,
    ttfb: Duration,
    tokens: u64,
    done: bool,
}

struct Target {
    address: SocketAddr,
    tokens: u64,
}

async fn one(t: &Target, key: &str) -> Seen {
    let t0 = Instant::now();
    let failed = |status| Seen { status, ttfb: t0.elapsed(), tokens: 0, done: false };
    let Ok(mut s) = tokio::net::TcpStream::connect(t.address).await else { return failed(0) };
    let body = format!(
        r#"{{"model":"bench","messages":[{{"role":"user","content":"Tell me a long story about a shared GPU pool."}}],"max_tokens":{},"stream":true,"temperature":0}}"#,
        t.tokens
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        t.address,
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body.as_bytes()).await.is_err() {
        return failed(0);
    }
    const TOKEN: &[u8] = b"\"content\":\"";
    let mut buf = vec![0u8; 16 * 1024];
    let (mut all, mut head_end, mut ttfb) = (Vec::<u8>::new(), None, None);
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        if head_end.is_none() {
            head_end = memchr::memmem::find(&all, b"\r\n\r\n").map(|i| i + 4);
        }
        // The first body byte, not the head: the router answers the head
        // as soon as a replica does.
        if ttfb.is_none() && head_end.is_some_and(|h| all.len() > h) {
            ttfb = Some(t0.elapsed());
        }
    }
    let status = all.get(9..12).and_then(|s| std::str::from_utf8(s).ok()?.parse().ok()).unwrap_or(0);
    let body = &all[head_end.unwrap_or(all.len()).min(all.len())..];
    Seen {
        status,
        ttfb: ttfb.unwrap_or_else(|| t0.elapsed()),
        tokens: memchr::memmem::find_iter(body, TOKEN).count() as u64,
        done: memchr::memmem::find(body, b"data: [DONE]").is_some(),
    }
}

/// Requests every `every` until `stop`, each on its own task.
async fn steady(t: Arc<Target>, key: String, every: Duration, stop: Arc<AtomicBool>) -> Vec<Seen> {
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(every);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let (t, key) = (t.clone(), key.clone());
        tasks.push(tokio::spawn(async move { one(&t, &key).await }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.ok());
    }
    seen
}

/// `clients` sending back to back until `stop`.
async fn flood(t: Arc<Target>, key: String, clients: usize, stop: Arc<AtomicBool>) -> Vec<Seen> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (t, key, stop, seen) = (t.clone(), key.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let s = one(&t, &key).await;
                    if s.status != 200 {
                        // Shed or refused: a client backs off before the next.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    seen.lock().unwrap().push(s);
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    let v = seen.lock().unwrap().clone();
    v
}

/// The nearest-rank quantile; NaN (printed so) for no values.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    onepool_simulator::engine::quantile(&mut v, q)
}

fn line(phase: &str, who: &str, seen: &[Seen], secs: f64) -> String {
    let ok: Vec<&Seen> = seen.iter().filter(|s| s.status == 200).collect();
    let ttfb: Vec<f64> = ok.iter().map(|s| s.ttfb.as_secs_f64()).collect();
    let tokens: u64 = ok.iter().map(|s| s.tokens).sum();
    format!(
        "{{\"phase\":\"{phase}\",\"who\":\"{who}\",\"requests\":{},\"shed\":{},\"refused\":{},\"cut\":{},\"ttfb_p50\":{:.3},\"ttfb_p99\":{:.3},\"tokens_per_s\":{:.1}}}",
        seen.len(),
        seen.iter().filter(|s| s.status == 429).count(),
        seen.iter().filter(|s| s.status != 200 && s.status != 429).count(),
        ok.iter().filter(|s| !s.done).count(),
        quantile(ttfb.clone(), 0.5),
        quantile(ttfb, 0.99),
        tokens as f64 / secs
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 8 {
        eprintln!("usage: class_clients ADDRESS LIVE_KEY AGENTS_KEY TOKENS LIVE_EVERY_MS AGENTS PHASE_SECS");
        std::process::exit(2);
    }
    let address: SocketAddr = args[1].parse().expect("ADDRESS is IP:PORT");
    let (live_key, agents_key) = (args[2].clone(), args[3].clone());
    let tokens: u64 = args[4].parse().expect("TOKENS");
    let every_ms: u64 = args[5].parse().expect("LIVE_EVERY_MS");
    let agents: usize = args[6].parse().expect("AGENTS");
    let phase = Duration::from_secs(args[7].parse().expect("PHASE_SECS"));
    let t = Arc::new(Target { address, tokens });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    rt.block_on(async {
        let run = |live: bool, flooding: bool, every: Duration| {
            let (t, live_key, agents_key) = (t.clone(), live_key.clone(), agents_key.clone());
            async move {
                let stop = Arc::new(AtomicBool::new(false));
                let l = live.then(|| tokio::spawn(steady(t.clone(), live_key, every, stop.clone())));
                let f = flooding.then(|| tokio::spawn(flood(t.clone(), agents_key, agents, stop.clone())));
                tokio::time::sleep(phase).await;
                stop.store(true, Ordering::Relaxed);
                let live = match l {
                    Some(l) => l.await.unwrap_or_default(),
                    None => Vec::new(),
                };
                let flood = match f {
                    Some(f) => f.await.unwrap_or_default(),
                    None => Vec::new(),
                };
                (live, flood)
            }
        };
        let secs = phase.as_secs_f64();
        let (_, capacity) = run(false, true, Duration::ZERO).await;
        println!("{}", line("flood alone", "agents", &capacity, secs));
        // 0: live requests at half the capacity the flood measured.
        let every = match every_ms {
            0 => {
                let served = capacity.iter().filter(|s| s.status == 200).count().max(1) as f64;
                Duration::from_secs_f64(2.0 * secs / served)
            }
            ms => Duration::from_millis(ms),
        };
        println!("{{\"live_every_ms\":{}}}", every.as_millis());
        let (alone, _) = run(true, false, every).await;
        println!("{}", line("live alone", "live", &alone, secs));
        let (live, flood) = run(true, true, every).await;
        println!("{}", line("beside the flood", "live", &live, secs));
        println!("{}", line("beside the flood", "agents", &flood, secs));
    });
}
