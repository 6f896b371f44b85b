//! Replays the start of the real Azure LLM conversation trace (CC-BY, see
//! data/NOTICE.md) through the router, 100x faster than it happened, with
//! backends whose latency follows each request's GeneratedTokens, and holds
//! the router's counters against what the backends counted.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use http::StatusCode;
use onepool_elastic_daemon::trace;

const REQUESTS: usize = 2000;
const SPEEDUP: u32 = 100;
const LIMIT: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_trace_replay_answers_every_request_and_counters_match() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/azure-llm-inference-2023-conv.csv");
    let requests = trace::load(&path, REQUESTS).unwrap();
    assert_eq!(requests.len(), REQUESTS);
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(backend(Mode::Normal).await);
    }
    let addrs: Vec<_> = backends.iter().map(|b| b.addr).collect();
    let h = Harness::new(endpoint_config(LIMIT, REQUESTS, Duration::from_secs(20)), &addrs).await;
    let c = client();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(REQUESTS);
    for r in requests {
        let (c, url) = (c.clone(), format!("{}/tokens/{}", h.url, r.generated_tokens));
        let at = start + r.at / SPEEDUP;
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            get(&c, &url).await.0
        }));
    }
    let mut ok = 0;
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
        ok += 1;
    }
    assert_eq!(ok, REQUESTS);
    let snap = h.snapshot();
    assert_eq!(snap.queued, 0, "the queue is empty again");
    for (b, r) in backends.iter().zip(&snap.replicas) {
        assert_eq!(r.address, b.addr);
        assert_eq!(r.served, b.stats.served(), "router and backend {} disagree on requests served", b.addr);
        assert_eq!(r.in_flight, 0);
        assert!(r.peak_in_flight <= LIMIT, "router peak {} > limit", r.peak_in_flight);
        assert!(b.stats.peak() <= LIMIT, "backend {} saw {} at once", b.addr, b.stats.peak());
    }
    assert_eq!(backends.iter().map(|b| b.stats.served()).sum::<u64>(), REQUESTS as u64);
    let metrics = h.daemon.metrics.encode();
    assert!(metrics.contains("onepool_router_queue_depth{endpoint=\"chat\"} 0"), "{metrics}");
    h.daemon.shutdown().await;
}
