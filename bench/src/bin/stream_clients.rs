//! The client side of bench/resume.sh (issue #43): STREAMS streamed chat
//! completions of TOKENS tokens at once through the router at ADDRESS, each
//! on its connection, opened RAMP per 10 ms so that the listener's backlog
//! holds them; each read to its `[DONE]`. Prints one line of JSON: streams
//! whole, tokens read, seconds, the most open at once. `EXTRA_FIELDS`, a
//! JSON object's members, go into every request (issue #51: a tool list,
//! a JSON schema).
//!
//! Usage: stream_clients ADDRESS STREAMS TOKENS [RAMP]

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::tokio;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Default)]
struct Counts {
    /// No connection, or the request could not be written.
    unsent: AtomicU64,
    /// A status other than 200.
    refused: AtomicU64,
    /// 200, then an end before `[DONE]` or with tokens missing.
    short: AtomicU64,
    whole: AtomicU64,
    tokens: AtomicU64,
    open: AtomicU64,
    most_open: AtomicU64,
    /// `,` and `EXTRA_FIELDS`, or nothing.
    extra_fields: String,
}

async fn one(address: SocketAddr, tokens: u64, counts: Arc<Counts>) {
    let Ok(mut s) = tokio::net::TcpStream::connect(address).await else {
        counts.unsent.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let extra = &counts.extra_fields;
    let body = format!(
        r#"{{"model":"bench","messages":[{{"role":"user","content":"Tell me a story."}}],"max_tokens":{tokens},"stream":true,"temperature":0{extra}}}"#
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body.as_bytes()).await.is_err() {
        counts.unsent.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let now = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
    counts.most_open.fetch_max(now, Ordering::Relaxed);
    let mut buf = vec![0u8; 16 * 1024];
    const TOKEN: &[u8] = b"\"content\":\"";
    let (mut seen, mut tail, mut last) = (0u64, Vec::<u8>::new(), Vec::<u8>::new());
    let mut first = Vec::<u8>::new();
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
        // Token events across reads: a pattern cut by a read is found with
        // the bytes kept, none counted twice (fewer kept than its length).
        if first.len() < 400 {
            first.extend_from_slice(&buf[..n.min(400)]);
        }
        tail.extend_from_slice(&buf[..n]);
        seen += memchr::memmem::find_iter(&tail, TOKEN).count() as u64;
        tail.drain(..tail.len() - tail.len().min(TOKEN.len() - 1));
        last.extend_from_slice(&buf[..n]);
        last.drain(..last.len() - last.len().min(32));
    }
    let done = memchr::memmem::find(&last, b"data: [DONE]").is_some();
    counts.open.fetch_sub(1, Ordering::Relaxed);
    counts.tokens.fetch_add(seen, Ordering::Relaxed);
    if !first.starts_with(b"HTTP/1.1 200") {
        if counts.refused.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!("stream_clients: first refusal: {:?}", String::from_utf8_lossy(&first));
        }
    } else if done && seen == tokens {
        counts.whole.fetch_add(1, Ordering::Relaxed);
    } else {
        counts.short.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: stream_clients ADDRESS STREAMS TOKENS [RAMP]");
        std::process::exit(2);
    }
    let address: SocketAddr = args[1].parse().expect("ADDRESS is IP:PORT");
    let streams: u64 = args[2].parse().expect("STREAMS");
    let tokens: u64 = args[3].parse().expect("TOKENS");
    let ramp: u64 = args.get(4).and_then(|r| r.parse().ok()).unwrap_or(250);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let extra_fields = match std::env::var("EXTRA_FIELDS") {
        Ok(f) if !f.trim().is_empty() => format!(",{f}"),
        _ => String::new(),
    };
    let counts = Arc::new(Counts { extra_fields, ..Counts::default() });
    let t0 = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..streams {
            if i > 0 && i % ramp == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tasks.push(tokio::spawn(one(address, tokens, counts.clone())));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    println!(
        "{{\"streams\":{streams},\"unsent\":{},\"refused\":{},\"short\":{},\"whole\":{},\"tokens\":{},\"seconds\":{:.2},\"most_open\":{}}}",
        counts.unsent.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.short.load(Ordering::Relaxed),
        counts.whole.load(Ordering::Relaxed),
        counts.tokens.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
        counts.most_open.load(Ordering::Relaxed)
    );
}
