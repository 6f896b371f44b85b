//! Prefix-aware routing end to end, in-process (issue #28): the router in
//! front of real HTTP backends, requests over real connections.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use onepool_router::prefix::PrefixSettings;

/// A chat request whose messages are `turns` (user and assistant in turn).
fn conversation(turns: &[String]) -> String {
    let messages: Vec<_> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": t}))
        .collect();
    serde_json::json!({"model": "m", "messages": messages}).to_string()
}

/// Which backend answered (the test backends answer with their address).
async fn served_by(c: &onepool_client::Caller, url: &str, body: &str) -> SocketAddr {
    let a = c.post_json(&format!("{url}/v1/chat/completions"), body, 1 << 16).await.unwrap();
    assert!(a.status.is_success(), "{}: {}", a.status, a.text());
    a.text().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_stays_on_its_replica_until_that_replica_drains() {
    let backends = [backend(Mode::Normal).await, backend(Mode::Normal).await, backend(Mode::Normal).await];
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(5));
    cfg.proxy.prefix = Some(PrefixSettings { block_bytes: 32, ..PrefixSettings::default() });
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let h = Harness::new(cfg, &addrs).await;
    let c = onepool_client::Caller::tcp(Duration::from_secs(5));

    // Twenty conversations, each five turns long, taken in turn: each
    // stays where its first turn went.
    let mut homes = Vec::new();
    let mut chats: Vec<Vec<String>> =
        (0..20).map(|i| vec![format!("conversation {i}: tell me about the shared GPU pool, at length")]).collect();
    for round in 0..5 {
        for (i, turns) in chats.iter_mut().enumerate() {
            let by = served_by(&c, &h.url, &conversation(turns)).await;
            if round == 0 {
                homes.push(by);
            } else {
                assert_eq!(by, homes[i], "conversation {i}, turn {round}");
            }
            turns.push(format!("answer {round} to conversation {i}"));
            turns.push(format!("and what about turn {round} of it?"));
        }
    }
    // New conversations went least outstanding: every replica has some.
    for a in &addrs {
        assert!(homes.iter().filter(|h| *h == a).count() >= 4, "{a}: {homes:?}");
    }
    let [hits, misses, over, no_key] = h.daemon.endpoint("chat").unwrap().endpoint.prefix_counts().unwrap();
    assert_eq!((hits, misses, over, no_key), (80, 20, 0, 0));

    // The first conversation's replica drains: its next turn goes
    // elsewhere, and stays there.
    let drained = homes[0];
    let ep = h.daemon.endpoint("chat").unwrap().endpoint.clone();
    let outcome = ep.drain(drained, Duration::from_secs(1)).await.unwrap();
    assert!(matches!(outcome, onepool_control::api::DrainOutcome::Drained { .. }), "{outcome:?}");
    let moved = served_by(&c, &h.url, &conversation(&chats[0])).await;
    assert_ne!(moved, drained);
    chats[0].push("one more".into());
    chats[0].push("and the last?".into());
    assert_eq!(served_by(&c, &h.url, &conversation(&chats[0])).await, moved);
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popular_prompt_spreads_once_its_holder_is_above_the_bound() {
    let backends = [backend(Mode::Normal).await, backend(Mode::Normal).await];
    let mut cfg = endpoint_config(8, 16, Duration::from_secs(5));
    cfg.proxy.prefix = Some(PrefixSettings { block_bytes: 32, load_bound: 1.0, ..PrefixSettings::default() });
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let h = Harness::new(cfg, &addrs).await;
    let c = onepool_client::Caller::tcp(Duration::from_secs(5));
    // The same long prompt, 8 at once, each answered after 300 ms: the
    // holder takes its share and one more, the rest go to the other.
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "the same system prompt ".repeat(20)}]})
        .to_string();
    let url = format!("{}/sleep/300", h.url);
    let asks: Vec<_> = (0..8)
        .map(|_| {
            let (c, url, body) = (c.clone(), url.clone(), body.clone());
            tokio::spawn(async move { c.post_json(&url, &body, 1 << 16).await.unwrap().status })
        })
        .collect();
    for a in asks {
        assert!(a.await.unwrap().is_success());
    }
    let served: Vec<u64> = backends.iter().map(|b| b.stats.served()).collect();
    assert_eq!(served.iter().sum::<u64>(), 8);
    assert!(served.iter().all(|s| *s >= 3), "the bound spread the pile-up: {served:?}");
    let [hits, misses, over, _] = h.daemon.endpoint("chat").unwrap().endpoint.prefix_counts().unwrap();
    assert_eq!(hits + misses + over, 8);
    assert!(over >= 1, "some went elsewhere for the bound: {hits} {misses} {over}");
    h.daemon.shutdown().await;
}
