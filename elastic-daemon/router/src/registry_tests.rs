use super::*;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn pool() -> Pool {
    Pool::new("chat", HealthThresholds { healthy_after: 2, unhealthy_after: 3 })
}

#[test]
fn a_spill_replica_takes_requests_only_when_the_others_are_full() {
    let mut p = pool();
    let warm = p.add(addr(1), 2, true).unwrap();
    let a = p.add(addr(2), 2, true).unwrap();
    p.set_spill(addr(1), true).unwrap();
    assert_eq!([p.choose(&[]), p.choose(&[])], [Some(a), Some(a)]);
    assert_eq!(p.choose(&[]), Some(warm), "the others are at their limit");
    p.release(a);
    assert_eq!(p.choose(&[]), Some(a), "room again elsewhere: the spill replica waits");
    // A request retried away from the others may still land on it.
    p.release(a);
    assert_eq!(p.choose(&[a]), Some(warm));
    assert!(p.set_spill(addr(9), true).is_err());
}

#[test]
fn choose_prefers_least_outstanding() {
    let mut p = pool();
    let a = p.add(addr(1), 4, true).unwrap();
    let b = p.add(addr(2), 4, true).unwrap();
    assert_eq!(p.choose(&[]), Some(a));
    assert_eq!(p.choose(&[]), Some(b));
    assert_eq!(p.choose(&[]), Some(a));
    p.release(a);
    p.release(a);
    // a has 0 in flight, b has 1.
    assert_eq!(p.choose(&[]), Some(a));
    assert_eq!(p.get(a).unwrap().peak_in_flight, 2);
    assert_eq!(p.get(a).unwrap().served, 3);
}

#[test]
fn ties_go_to_the_replica_that_served_fewer() {
    let mut p = pool();
    let a = p.add(addr(1), 4, true).unwrap();
    let b = p.add(addr(2), 4, true).unwrap();
    for _ in 0..10 {
        let id = p.choose(&[]).unwrap();
        p.release(id);
    }
    assert_eq!(p.get(a).unwrap().served, 5);
    assert_eq!(p.get(b).unwrap().served, 5);
}

#[test]
fn limit_is_respected_and_none_when_full() {
    let mut p = pool();
    let a = p.add(addr(1), 2, true).unwrap();
    assert_eq!(p.choose(&[]), Some(a));
    assert_eq!(p.choose(&[]), Some(a));
    assert_eq!(p.choose(&[]), None);
    p.release(a);
    assert_eq!(p.choose(&[]), Some(a));
}

#[test]
fn exclude_skips_replicas() {
    let mut p = pool();
    let a = p.add(addr(1), 2, true).unwrap();
    let b = p.add(addr(2), 2, true).unwrap();
    assert_eq!(p.choose(&[a]), Some(b));
    assert_eq!(p.choose(&[a, b]), None);
}

#[test]
fn only_ready_replicas_are_chosen() {
    let mut p = pool();
    let a = p.add(addr(1), 2, false).unwrap();
    assert_eq!(p.get(a).unwrap().state, ReplicaState::Starting);
    assert_eq!(p.choose(&[]), None);
}

#[test]
fn duplicate_and_zero_limit_are_refused() {
    let mut p = pool();
    p.add(addr(1), 2, true).unwrap();
    let e = p.add(addr(1), 2, true).unwrap_err();
    assert!(matches!(e, RegistryError::Duplicate { .. }));
    assert!(e.to_string().contains("remove it first"));
    assert!(matches!(p.add(addr(2), 0, true), Err(RegistryError::ZeroLimit { .. })));
}

#[test]
fn remove_unknown_is_an_error_naming_the_endpoint() {
    let mut p = pool();
    let e = p.remove(addr(9)).unwrap_err();
    assert!(e.to_string().contains("\"chat\""), "{e}");
}

#[test]
fn health_needs_consecutive_passes_to_go_in() {
    let mut p = pool();
    let a = p.add(addr(1), 2, false).unwrap();
    assert_eq!(p.health_result(a, true), None);
    assert_eq!(p.health_result(a, false), None);
    assert_eq!(p.health_result(a, true), None);
    let t = p.health_result(a, true).unwrap();
    assert_eq!((t.from, t.to), (ReplicaState::Starting, ReplicaState::Ready));
}

#[test]
fn health_needs_consecutive_failures_to_go_out_and_back() {
    let mut p = pool();
    let a = p.add(addr(1), 2, true).unwrap();
    assert_eq!(p.health_result(a, false), None);
    assert_eq!(p.health_result(a, false), None);
    assert_eq!(p.health_result(a, true), None);
    assert_eq!(p.health_result(a, false), None);
    assert_eq!(p.health_result(a, false), None);
    let t = p.health_result(a, false).unwrap();
    assert_eq!(t.to, ReplicaState::Out);
    assert_eq!(p.choose(&[]), None);
    p.health_result(a, true);
    assert_eq!(p.health_result(a, true).unwrap().to, ReplicaState::Ready);
    assert_eq!(p.choose(&[]), Some(a));
}

#[test]
fn draining_stops_new_requests_and_ignores_health() {
    let mut p = pool();
    let a = p.add(addr(1), 4, true).unwrap();
    let b = p.add(addr(2), 4, true).unwrap();
    assert_eq!(p.choose(&[]), Some(a));
    let t = p.begin_drain(a, Instant::now()).unwrap();
    assert_eq!(t.from, ReplicaState::Ready);
    assert_eq!(p.begin_drain(a, Instant::now()), None);
    for _ in 0..3 {
        assert_eq!(p.choose(&[]), Some(b));
    }
    for _ in 0..5 {
        assert_eq!(p.health_result(a, true), None);
    }
    assert_eq!(p.get(a).unwrap().state, ReplicaState::Draining);
    assert!(p.release(a), "last request out drains the replica");
    assert!(!p.release(b));
}

#[test]
fn release_of_removed_replica_is_ignored() {
    let mut p = pool();
    let a = p.add(addr(1), 4, true).unwrap();
    p.choose(&[]);
    p.remove(addr(1)).unwrap();
    assert!(!p.release(a));
    assert_eq!(p.total_in_flight(), 0);
}

#[test]
fn the_pool_s_count_of_requests_outlives_the_replicas_that_served_them() {
    let mut p = pool();
    p.add(addr(1), 4, true).unwrap();
    let b = p.add(addr(2), 4, true).unwrap();
    for _ in 0..3 {
        p.choose(&[]);
    }
    assert_eq!(p.served_total(), 3);
    p.remove(addr(1)).unwrap();
    assert_eq!(p.served_total(), 3, "a replica that leaves keeps its requests in the endpoint's count");
    assert_eq!(p.choose(&[]), Some(b));
    assert_eq!(p.served_total(), 4);
}

#[test]
fn a_failed_exchange_ejects_a_ready_replica_until_one_health_check_passes() {
    let mut p = pool();
    let a = p.add(addr(1), 4, true).unwrap();
    let b = p.add(addr(2), 4, true).unwrap();
    let t = p.eject(a).unwrap();
    assert_eq!((t.from, t.to), (ReplicaState::Ready, ReplicaState::Out));
    assert_eq!(p.eject(a), None, "already out");
    for _ in 0..3 {
        assert_eq!(p.choose(&[]), Some(b));
    }
    // A dead replica fails its checks and stays out.
    assert_eq!(p.health_result(a, false), None);
    assert_eq!(p.health_result(a, false), None);
    // One pass is enough to come back (healthy_after is 2).
    let t = p.health_result(a, true).unwrap();
    assert_eq!((t.from, t.to), (ReplicaState::Out, ReplicaState::Ready));
    // Out through its health checks, it again needs healthy_after passes.
    for _ in 0..3 {
        p.health_result(a, false);
    }
    assert_eq!(p.get(a).unwrap().state, ReplicaState::Out);
    assert_eq!(p.health_result(a, true), None);
    assert_eq!(p.health_result(a, true).unwrap().to, ReplicaState::Ready);
}

#[test]
fn ejection_leaves_starting_and_draining_replicas_alone() {
    let mut p = pool();
    let s = p.add(addr(1), 4, false).unwrap();
    let d = p.add(addr(2), 4, true).unwrap();
    p.begin_drain(d, Instant::now());
    assert_eq!(p.eject(s), None);
    assert_eq!(p.eject(d), None);
    assert_eq!(p.get(s).unwrap().state, ReplicaState::Starting);
    assert_eq!(p.get(d).unwrap().state, ReplicaState::Draining);
}

mod prefix_routing {
    use super::*;
    use crate::prefix::{Affine, Affinity, PrefixSettings};

    fn affinity() -> Affinity {
        Affinity::new(PrefixSettings { load_bound: 1.5, ..PrefixSettings::default() })
    }

    #[test]
    fn a_prompt_goes_back_to_its_holder_while_within_the_bound() {
        let mut p = pool();
        let mut aff = affinity();
        let (a, b, c) = (p.add(addr(1), 8, true).unwrap(), p.add(addr(2), 8, true).unwrap(), p.add(addr(3), 8, true));
        let c = c.unwrap();
        let conv = [11, 12, 13];
        let (first, how) = p.choose_for(&[], &conv, &mut aff).unwrap();
        assert_eq!(how, Affine::Miss);
        // The next turn shares the first two blocks: the same replica,
        // although another is now less loaded.
        let (second, how) = p.choose_for(&[], &[11, 12, 99], &mut aff).unwrap();
        assert_eq!((second, how), (first, Affine::Hit { blocks: 2 }));
        // 2 in flight on the holder, 0 elsewhere: fair share (2+1)/3 = 1,
        // bound 1.5 -> 2, the least loaded + 2 -> 2; a third on it would
        // be 3: least outstanding.
        let (third, how) = p.choose_for(&[], &conv, &mut aff).unwrap();
        assert_eq!(how, Affine::OverBound);
        assert_ne!(third, first);
        // The prompt's holder is now the replica that took it.
        assert_eq!(aff.lookup(&conv, |_| true), Some((third, 3)));
        let others: Vec<_> = [a, b, c].into_iter().filter(|x| *x != first && *x != third).collect();
        assert_eq!(others.len(), 1);
    }

    #[test]
    fn a_draining_or_full_holder_is_passed_over_and_a_new_replica_gets_new_prompts() {
        let mut p = pool();
        let mut aff = affinity();
        let a = p.add(addr(1), 1, true).unwrap();
        let (id, _) = p.choose_for(&[], &[1, 2], &mut aff).unwrap();
        assert_eq!(id, a);
        let b = p.add(addr(2), 1, true).unwrap();
        // a is full (limit 1): its prompt goes elsewhere, as a miss.
        assert_eq!(p.choose_for(&[], &[1, 2], &mut aff), Some((b, Affine::Miss)));
        p.release(a);
        p.release(b);
        p.begin_drain(b, std::time::Instant::now());
        // b, the latest holder, drains: a takes it (its own older entry
        // was overwritten, so this is a miss too).
        assert_eq!(p.choose_for(&[], &[1, 2], &mut aff), Some((a, Affine::Miss)));
        p.release(a);
        let c = p.add(addr(3), 1, true).unwrap();
        // A prompt nobody holds goes least outstanding, tie broken by
        // fewer served: the new replica.
        assert_eq!(p.choose_for(&[], &[7, 8], &mut aff), Some((c, Affine::Miss)));
        assert_eq!(p.choose_for(&[], &[], &mut aff), Some((a, Affine::NoKey)));
    }

    #[test]
    fn a_retried_request_does_not_go_back_to_the_holder_it_failed_on() {
        let mut p = pool();
        let mut aff = affinity();
        let a = p.add(addr(1), 4, true).unwrap();
        let b = p.add(addr(2), 4, true).unwrap();
        let (first, _) = p.choose_for(&[], &[5], &mut aff).unwrap();
        p.release(first);
        let other = if first == a { b } else { a };
        assert_eq!(p.choose_for(&[first], &[5], &mut aff), Some((other, Affine::Miss)));
    }
}

/// Issue #44: a replica lent to the lower classes takes their requests
/// first and the endpoint's own class's only when no other has room, and
/// the other way round.
#[test]
fn lent_replicas_take_lower_classes_first_and_the_own_class_last() {
    let mut p = pool();
    let own = p.add(addr(1), 2, true).unwrap();
    let lent = p.add(addr(2), 2, true).unwrap();
    p.set_lent(addr(2), true).unwrap();
    assert_eq!(p.choose_as(&[], true), Some(lent));
    assert_eq!(p.choose_as(&[], true), Some(lent), "even with more in flight than the other");
    assert_eq!(p.choose_as(&[], true), Some(own), "full: the lower class spills onto the others");
    assert_eq!(p.choose(&[]), Some(own));
    p.release(lent);
    assert_eq!(p.choose(&[]), Some(lent), "the others full: the own class may use a lent one");
    assert!(p.set_lent(addr(9), true).is_err());
    assert!(p.get(lent).unwrap().view().lent);
}
