//! The demo's clients: the Azure LLM conversation trace (real arrival
//! times and output sizes) replayed against the endpoint's stable address,
//! each row one `POST /v1/completions` with `{"max_tokens": GeneratedTokens}`.
//! The replay speed (trace seconds per wall second) can be changed while it
//! runs, which is how the demo ramps from light to heavy load; every request
//! is counted in the phase it was sent in.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use onepool_decisions::trace::read_azure;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

/// The trace as (seconds since its first request, generated tokens).
pub struct Trace {
    pub rows: Vec<(f64, u32)>,
}

impl Trace {
    pub fn load(path: &Path) -> anyhow::Result<Trace> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the trace {}", path.display()))?;
        let at = |line: usize, what: &str| anyhow::anyhow!("{}:{line}: {what}", path.display());
        let mut rows = Vec::new();
        for (line, row) in read_azure(&text).map_err(|e| at(e.line, &e.what))? {
            let r = row.map_err(|e| at(line, &e))?;
            rows.push((r.t, r.generated_tokens));
        }
        let Some(first) = rows.iter().map(|r| r.0).reduce(f64::min) else {
            bail!("{}: no requests in the trace", path.display());
        };
        for r in &mut rows {
            r.0 -= first;
        }
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Trace { rows })
    }

    /// Requests per second of trace time between `from` and `to`.
    pub fn rate(&self, from: f64, to: f64) -> f64 {
        let n = self.rows.iter().filter(|r| r.0 >= from && r.0 < to).count();
        n as f64 / (to - from).max(1e-9)
    }
}

/// Counts of one load phase.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: String,
    pub speed: f64,
    /// Seconds on the demo's clock.
    pub start: f64,
    pub end: Option<f64>,
    pub sent: u64,
    pub served: u64,
    pub failed: u64,
    /// Seconds, of the requests answered 2xx.
    pub latencies: Vec<f64>,
}

impl Phase {
    /// The `q` quantile (0..=1) of the served requests' latency.
    pub fn latency(&self, q: f64) -> Option<f64> {
        let mut v = self.latencies.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        Some(v[i])
    }
}

pub struct Load {
    target: SocketAddr,
    t0: Instant,
    /// Trace seconds per wall second, as f64 bits; 0 pauses the replay.
    speed: AtomicU64,
    stop: AtomicBool,
    in_flight: AtomicU64,
    phases: Mutex<Vec<Phase>>,
    /// Why requests failed, as (status or error, count).
    failures: Mutex<Vec<(String, u64)>>,
}

impl Load {
    /// Starts the replay paused; [`Load::phase`] sets it going.
    pub fn start(rt: &Handle, trace: Trace, target: SocketAddr, t0: Instant) -> Arc<Load> {
        let load = Arc::new(Load {
            target,
            t0,
            speed: AtomicU64::new(0f64.to_bits()),
            stop: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            phases: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
        });
        let l = load.clone();
        rt.spawn(async move { l.replay(trace).await });
        load
    }

    fn lock_phases(&self) -> std::sync::MutexGuard<'_, Vec<Phase>> {
        self.phases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins a phase: from now on the trace is replayed `speed` times faster
    /// than it was recorded (0: no new requests).
    pub fn phase(&self, name: &str, speed: f64) {
        let now = self.t0.elapsed().as_secs_f64();
        let mut p = self.lock_phases();
        if let Some(last) = p.last_mut() {
            last.end.get_or_insert(now);
        }
        p.push(Phase { name: name.to_string(), speed, start: now, ..Phase::default() });
        self.speed.store(speed.to_bits(), Ordering::SeqCst);
    }

    /// No new requests; the phase being replayed ends.
    pub fn pause(&self) {
        self.speed.store(0f64.to_bits(), Ordering::SeqCst);
        let now = self.t0.elapsed().as_secs_f64();
        if let Some(last) = self.lock_phases().last_mut() {
            last.end.get_or_insert(now);
        }
    }

    pub fn stop(&self) {
        self.pause();
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn phases(&self) -> Vec<Phase> {
        self.lock_phases().clone()
    }

    pub fn failures(&self) -> Vec<(String, u64)> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// (sent, served, failed) over every phase.
    pub fn totals(&self) -> (u64, u64, u64) {
        self.lock_phases().iter().fold((0, 0, 0), |(s, o, f), p| (s + p.sent, o + p.served, f + p.failed))
    }

    async fn replay(self: Arc<Self>, trace: Trace) {
        let mut i = 0usize;
        // Trace time replayed so far; restarts from the top at the end.
        let mut at = 0.0f64;
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let now = Instant::now();
            let speed = f64::from_bits(self.speed.load(Ordering::SeqCst));
            at += now.duration_since(last).as_secs_f64() * speed;
            last = now;
            if speed <= 0.0 {
                continue;
            }
            while i < trace.rows.len() && trace.rows[i].0 <= at {
                self.send(trace.rows[i].1);
                i += 1;
            }
            if i == trace.rows.len() {
                at -= trace.rows.last().map(|r| r.0).unwrap_or(0.0);
                i = 0;
            }
        }
    }

    fn send(self: &Arc<Self>, tokens: u32) {
        let phase = {
            let mut p = self.lock_phases();
            let Some(cur) = p.last_mut() else { return };
            cur.sent += 1;
            p.len() - 1
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let r = post(me.target, tokens).await;
            let took = start.elapsed().as_secs_f64();
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
            let failure = match r {
                Ok(s) if (200..300).contains(&s) => None,
                Ok(s) => Some(format!("HTTP {s}")),
                Err(e) => Some(e),
            };
            {
                let mut p = me.lock_phases();
                let cur = &mut p[phase];
                match failure {
                    None => {
                        cur.served += 1;
                        cur.latencies.push(took);
                    }
                    Some(_) => cur.failed += 1,
                }
            }
            if let Some(f) = failure {
                let mut fs = me.failures.lock().unwrap_or_else(|e| e.into_inner());
                match fs.iter_mut().find(|(k, _)| *k == f) {
                    Some((_, n)) => *n += 1,
                    None => fs.push((f, 1)),
                }
            }
        });
    }
}

/// One request over its own connection; the status, or what went wrong.
async fn post(target: SocketAddr, tokens: u32) -> Result<u16, String> {
    let body = format!("{{\"max_tokens\": {tokens}}}");
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: chat\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut s = TcpStream::connect(target).await.map_err(|e| format!("connect: {e}"))?;
        s.write_all(request.as_bytes()).await.map_err(|e| format!("sending: {e}"))?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.map_err(|e| format!("reading the answer: {e}"))?;
        let head = String::from_utf8_lossy(&answer[..answer.len().min(64)]).to_string();
        head.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("no HTTP status in the answer {head:?}"))
    };
    match tokio::time::timeout(Duration::from_secs(120), exchange).await {
        Ok(r) => r,
        Err(_) => Err("no answer within 120 s".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(name: &str, text: &str) -> anyhow::Result<Trace> {
        let path = std::env::temp_dir().join(format!("onepool-demo-trace-{}-{name}.csv", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let r =
            Trace::load(&path).map_err(|e| anyhow::anyhow!("{}", e.to_string().replace(&*path.to_string_lossy(), "T")));
        std::fs::remove_file(&path).unwrap();
        r
    }

    #[test]
    fn rows_are_seconds_after_the_first_request_sorted() {
        let t = load("ok", "TIMESTAMP,ContextTokens,GeneratedTokens\n12.5,1,30\n\n10,2,20\n11,3,10\n").unwrap();
        assert_eq!(t.rows, vec![(0.0, 20), (1.0, 10), (2.5, 30)]);
        assert_eq!(t.rate(0.0, 2.0), 1.0);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = |name, text| load(name, text).err().unwrap().to_string();
        assert_eq!(
            e("header", "a,b\n1,2,3\n"),
            "T:1: header is \"a,b\"; expected \"TIMESTAMP,ContextTokens,GeneratedTokens\""
        );
        assert_eq!(
            e("row", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2\n"),
            "T:2: 2 fields; expected 3 (TIMESTAMP,ContextTokens,GeneratedTokens)"
        );
        assert_eq!(e("none", "TIMESTAMP,ContextTokens,GeneratedTokens\n"), "T: no requests in the trace");
        assert_eq!(e("empty", ""), "T: no requests in the trace");
    }
}
