use super::*;
use std::net::SocketAddr;

use crate::registry::ReplicaState;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn endpoint(limit: u32, queue: usize, timeout_ms: u64) -> Arc<Endpoint> {
    Endpoint::new(
        "chat",
        limit,
        QueueSettings { size: queue, timeout: Duration::from_millis(timeout_ms) },
        HealthThresholds::default(),
        Arc::new(Metrics::new()),
    )
}

#[tokio::test]
async fn full_queue_is_refused_at_once() {
    let e = endpoint(1, 1, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let e2 = e.clone();
    let waiting = tokio::spawn(async move { e2.acquire(&[]).await.map(|l| l.address()) });
    while e.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(e.acquire(&[]).await.err(), Some(AcquireError::QueueFull));
    drop(held);
    assert_eq!(waiting.await.unwrap(), Ok(addr(1)));
    assert_eq!(e.snapshot().queued, 0);
    assert_eq!(e.snapshot().peak_queued, 1);
}

#[tokio::test]
async fn waiting_too_long_times_out_and_leaves_the_queue() {
    let e = endpoint(1, 4, 50);
    e.add(addr(1), None, true).unwrap();
    let _held = e.acquire(&[]).await.unwrap();
    assert_eq!(e.acquire(&[]).await.err(), Some(AcquireError::TimedOut));
    assert_eq!(e.snapshot().queued, 0);
}

#[tokio::test]
async fn waiters_are_served_in_order() {
    let e = endpoint(1, 8, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4 {
        let e2 = e.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let l = e2.acquire(&[]).await.unwrap();
            tx.send(i).unwrap();
            drop(l);
        });
        while e.snapshot().queued != i + 1 {
            tokio::task::yield_now().await;
        }
    }
    drop(held);
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, vec![0, 1, 2, 3]);
}

#[tokio::test]
async fn replica_becoming_ready_serves_the_queue() {
    let e = endpoint(1, 4, 5_000);
    let id = e.add(addr(1), None, false).unwrap();
    let e2 = e.clone();
    let waiting = tokio::spawn(async move { e2.acquire(&[]).await.map(|l| l.id()) });
    while e.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    e.health_result(id, true);
    e.health_result(id, true);
    assert_eq!(waiting.await.unwrap(), Ok(id));
}

#[tokio::test]
async fn dropped_waiter_leaves_the_queue() {
    let e = endpoint(1, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let e2 = e.clone();
    let waiting = tokio::spawn(async move { e2.acquire(&[]).await.map(|l| l.id()) });
    while e.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(e.snapshot().queued, 0);
    drop(held);
    assert_eq!(e.snapshot().replicas[0].in_flight, 0);
}

#[tokio::test]
async fn drain_waits_for_in_flight_then_reports_drained() {
    let e = endpoint(4, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    e.add(addr(2), None, true).unwrap();
    let a = e.acquire(&[]).await.unwrap();
    assert_eq!(a.address(), addr(1));
    let e2 = e.clone();
    let drain = tokio::spawn(async move { e2.drain(addr(1), Duration::from_secs(5)).await });
    while e.snapshot().replicas[0].state != ReplicaState::Draining {
        tokio::task::yield_now().await;
    }
    for _ in 0..3 {
        assert_eq!(e.acquire(&[]).await.unwrap().address(), addr(2));
    }
    drop(a);
    assert!(matches!(drain.await.unwrap().unwrap(), DrainOutcome::Drained { .. }));
}

#[tokio::test]
async fn drain_times_out_with_what_was_in_flight() {
    let e = endpoint(4, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    let _a = e.acquire(&[]).await.unwrap();
    let _b = e.acquire(&[]).await.unwrap();
    let out = e.drain(addr(1), Duration::from_millis(30)).await.unwrap();
    assert_eq!(out, DrainOutcome::TimedOut { in_flight: 2 });
}

#[tokio::test]
async fn drain_of_idle_replica_is_immediate_and_unknown_is_an_error() {
    let e = endpoint(4, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    assert!(matches!(e.drain(addr(1), Duration::ZERO).await.unwrap(), DrainOutcome::Drained { .. }));
    assert!(e.drain(addr(2), Duration::ZERO).await.is_err());
}

#[tokio::test]
async fn retry_excluding_the_failed_replica_waits_for_another() {
    let e = endpoint(1, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    e.add(addr(2), None, true).unwrap();
    let a = e.acquire(&[]).await.unwrap();
    let b = e.acquire(&[]).await.unwrap();
    let (aid, bid) = (a.id(), b.id());
    let e2 = e.clone();
    let retry = tokio::spawn(async move { e2.acquire(&[bid]).await.map(|l| l.id()) });
    while e.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    // b frees first, but the waiter excludes it.
    drop(b);
    tokio::task::yield_now().await;
    assert_eq!(e.snapshot().queued, 1);
    drop(a);
    assert_eq!(retry.await.unwrap(), Ok(aid));
}

#[tokio::test]
async fn a_request_queued_with_no_replica_ready_wakes_the_controller_and_one_queued_behind_a_busy_one_does_not() {
    let woken = |e: &Arc<Endpoint>| {
        let e = e.clone();
        async move { tokio::time::timeout(Duration::from_millis(20), e.cold_request()).await.is_ok() }
    };
    // Zero replicas: the request waits, and the controller hears of it.
    let cold = endpoint(1, 4, 5_000);
    let c2 = cold.clone();
    let waiting = tokio::spawn(async move { c2.acquire(&[]).await.map(|l| l.address()) });
    while cold.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    assert!(woken(&cold).await, "a request waits at zero replicas");
    assert!(!woken(&cold).await, "one notice per queued request, kept once");
    // The first replica comes: the request is answered.
    cold.add(addr(1), None, true).unwrap();
    assert_eq!(waiting.await.unwrap(), Ok(addr(1)));

    // A ready replica that is busy: queueing is ordinary, nobody is woken.
    let warm = endpoint(1, 4, 5_000);
    warm.add(addr(2), None, true).unwrap();
    let held = warm.acquire(&[]).await.unwrap();
    let w2 = warm.clone();
    let behind = tokio::spawn(async move { w2.acquire(&[]).await.map(|l| l.address()) });
    while warm.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    assert!(!woken(&warm).await);
    drop(held);
    assert_eq!(behind.await.unwrap(), Ok(addr(2)));
}

#[tokio::test]
async fn latency_samples_are_kept_only_when_asked_and_carry_the_queue_wait() {
    let e = endpoint(1, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    let l = e.acquire(&[]).await.unwrap();
    l.first_byte(Duration::from_millis(30));
    assert!(e.take_latencies().is_empty(), "off by default");
    e.sample_latencies();
    l.first_byte(Duration::from_millis(30));
    let s = e.take_latencies();
    assert_eq!((s.len(), s[0].ttfb, s[0].queued), (1, 0.03, 0.0));
    assert!(e.take_latencies().is_empty(), "taken once");
    // A second request waits for the first to end: its wait is its own.
    let e2 = e.clone();
    let waiting = tokio::spawn(async move {
        let l = e2.acquire(&[]).await.unwrap();
        l.first_byte(Duration::from_millis(100));
    });
    while e.snapshot().queued == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(l);
    waiting.await.unwrap();
    let s = e.take_latencies();
    assert_eq!(s.len(), 1);
    assert!(s[0].queued >= 0.05 && s[0].queued < 1.0, "{s:?}");
}

/// Issue #44: the queue serves by rank (moved answers first within one),
/// each rank has its own bound, and a waiting request asks the newest
/// stream of the lowest class below it to yield its slot.
#[tokio::test]
async fn the_queue_serves_by_rank_with_a_bound_per_rank_and_asks_a_lower_stream_to_yield() {
    let e = endpoint(1, 2, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let low = Want { rank: Rank(3), lower: true, ..Want::default() };
    let ticket = e.yieldable(&held, Rank(3));
    let order = Arc::new(Mutex::new(Vec::new()));
    let wait = |want: Want<'static>, name: &'static str| {
        let (e, order) = (e.clone(), order.clone());
        tokio::spawn(async move {
            let lease = e.acquire_want(want).await;
            order.lock().unwrap().push(name);
            // Each holds its slot a moment, then hands it on.
            tokio::time::sleep(Duration::from_millis(5)).await;
            lease.map(|_| ())
        })
    };
    let queued = |n: usize| {
        let e = e.clone();
        async move {
            while e.snapshot().queued < n {
                tokio::task::yield_now().await;
            }
        }
    };
    let a1 = wait(low, "agents 1");
    queued(1).await;
    let a2 = wait(low, "agents 2");
    queued(2).await;
    // The agents' bound is full; theirs alone.
    assert_eq!(e.acquire_want(low).await.err(), Some(AcquireError::ClassFull));
    assert!(!ticket.signal.asked(), "no higher class waits yet");
    let live = wait(Want { rank: Rank(2), ..Want::default() }, "live");
    queued(3).await;
    assert!(ticket.signal.asked(), "the agents' stream is asked to give its slot to the live request");
    let moved = wait(Want { rank: Rank(3), ahead: true, ..Want::default() }, "agents moved");
    queued(4).await;
    drop((held, ticket));
    for t in [a1, a2, live, moved] {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(*order.lock().unwrap(), ["live", "agents moved", "agents 1", "agents 2"]);
}

/// Issue #44: each class's requests on replicas are counted while their
/// leases live (what the replica controller splits demand by), and a
/// lower class's request goes to a lent replica first.
#[tokio::test]
async fn in_flight_is_counted_by_class_and_lower_requests_take_lent_replicas() {
    let e = endpoint(2, 4, 1_000);
    let ranks = [("inference".to_string(), 2), ("agents".to_string(), 3)];
    e.set_classes(Arc::new(crate::classes::RequestClasses::new("inference", ranks).unwrap()));
    e.add(addr(1), None, true).unwrap();
    e.add(addr(2), None, true).unwrap();
    e.set_lent(addr(2), true).unwrap();
    let low = Want { rank: Rank(3), lower: true, ..Want::default() };
    let a = e.acquire_want(low).await.unwrap();
    let b = e.acquire_want(low).await.unwrap();
    assert_eq!((a.address(), b.address()), (addr(2), addr(2)));
    let own = e.acquire_want(Want { rank: Rank(2), ..Want::default() }).await.unwrap();
    assert_eq!(own.address(), addr(1));
    let counts = |e: &Arc<Endpoint>| e.snapshot().classes.iter().map(|c| (c.in_flight, c.lower)).collect::<Vec<_>>();
    assert_eq!(counts(&e), [(1, false), (2, true)]);
    drop(a);
    assert_eq!(counts(&e), [(1, false), (1, true)]);
    drop((b, own));
    assert_eq!(counts(&e), [(0, false), (0, true)]);
    assert!(e.snapshot().replicas.iter().any(|r| r.lent && r.address == addr(2)));
}

/// Issue #44: within a class, API keys take turns: a key that queued
/// first and most does not keep another key of its class behind all of it.
#[tokio::test]
async fn keys_of_one_class_take_turns_in_the_queue() {
    let e = endpoint(1, 100, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (key, name) in [(1, "a1"), (1, "a2"), (1, "a3"), (2, "b1"), (2, "b2")] {
        queue_in_order(&e, &order, &mut tasks, key, name).await;
    }
    drop(held);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(*order.lock().unwrap(), ["a1", "b1", "a2", "b2", "a3"]);
    assert_eq!(e.lock().fair.tracked(), 0, "nothing kept of keys no longer waiting");
}

/// Issue #51: a key that fills its class's queue gets no more places
/// while another key of the class waits, and the other key is still
/// admitted (up to its share, past the class's bound) and served in turn;
/// requests without a key keep the class's bound as it is.
#[tokio::test]
async fn a_key_that_fills_its_class_s_queue_does_not_shut_another_key_out() {
    let e = endpoint(1, 4, 5_000);
    e.add(addr(1), None, true).unwrap();
    let held = e.acquire(&[]).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let want = |key| Want { rank: Rank(3), lower: true, key, ..Want::default() };
    let mut tasks = Vec::new();
    for name in ["a1", "a2", "a3", "a4"] {
        queue_in_order(&e, &order, &mut tasks, 1, name).await;
    }
    // Key 1 alone holds the whole bound; its next is refused, as one
    // without a key would be.
    assert_eq!(e.acquire_want(want(1)).await.err(), Some(AcquireError::KeyFull));
    assert_eq!(e.acquire_want(want(0)).await.err(), Some(AcquireError::ClassFull));
    // Key 2 is admitted past the bound, to its share (4 / 2 keys)...
    for name in ["b1", "b2"] {
        queue_in_order(&e, &order, &mut tasks, 2, name).await;
    }
    assert_eq!(e.acquire_want(want(2)).await.err(), Some(AcquireError::KeyFull));
    assert_eq!(e.acquire_want(want(1)).await.err(), Some(AcquireError::KeyFull));
    assert!(e.expected_wait(Rank(3), 1) >= Duration::from_secs(1));
    // ...and served in turn.
    drop(held);
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(*order.lock().unwrap(), ["a1", "b1", "a2", "b2", "a3", "a4"]);
    // The class's pace is known now: a refusal's wait is its key's turns.
    assert!(e.lock().fair.expected_wait(Rank(3), 1).is_some());
}

/// Queues a lower class's request of `key`, which notes `name` in `order`
/// once served, and waits until it is in the queue (queued in this order).
async fn queue_in_order(
    e: &Arc<Endpoint>,
    order: &Arc<Mutex<Vec<&'static str>>>,
    tasks: &mut Vec<tokio::task::JoinHandle<Result<(), AcquireError>>>,
    key: u32,
    name: &'static str,
) {
    let (ep, order) = (e.clone(), order.clone());
    tasks.push(tokio::spawn(async move {
        let lease = ep.acquire_want(Want { rank: Rank(3), lower: true, key, ..Want::default() }).await;
        order.lock().unwrap().push(name);
        tokio::time::sleep(Duration::from_millis(5)).await;
        lease.map(|_| ())
    }));
    let n = tasks.len();
    while e.snapshot().queued < n {
        tokio::task::yield_now().await;
    }
}
