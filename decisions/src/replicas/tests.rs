use super::*;
use proptest::prelude::*;

const S: Duration = Duration::from_secs(1);

fn t(min: u32, max: u32, desired: u32) -> EndpointTarget {
    EndpointTarget { min, max, desired, renew_before: 600 * S, startup_timeout: 300 * S, headroom: None, lower: 0 }
}

fn r(job: u32, kind: Kind, phase: Phase, in_flight: u32, age: u64) -> Replica {
    Replica {
        job,
        slot: 0,
        pinned: false,
        kind,
        phase,
        in_flight,
        age: Duration::from_secs(age),
        starting_for: Duration::from_secs(age),
        time_left: None,
        being_preempted: false,
    }
}

#[test]
fn from_nothing_baseline_then_supplemental() {
    let a = reconcile(&t(2, 6, 4), &[]);
    assert_eq!(
        a,
        [
            Action::Submit(Kind::Baseline),
            Action::Submit(Kind::Baseline),
            Action::Submit(Kind::Supplemental),
            Action::Submit(Kind::Supplemental)
        ]
    );
    // The autoscaler's count is clamped to [min, max].
    assert_eq!(
        reconcile(&t(1, 2, 9), &[r(1, Kind::Baseline, Phase::Serving, 0, 9)]),
        [Action::Submit(Kind::Supplemental)]
    );
}

#[test]
fn steady_state_does_nothing() {
    let rs = [r(1, Kind::Baseline, Phase::Serving, 3, 100), r(2, Kind::Supplemental, Phase::Serving, 1, 50)];
    assert!(reconcile(&t(1, 4, 2), &rs).is_empty());
}

#[test]
fn scale_down_drains_the_cheapest_supplemental_and_never_a_baseline() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Serving, 5, 300),
        r(3, Kind::Supplemental, Phase::Serving, 1, 200),
        r(4, Kind::Supplemental, Phase::Serving, 1, 100),
    ];
    // Want one supplemental fewer: the one with 1 in flight, youngest of those.
    assert_eq!(reconcile(&t(1, 4, 3), &rs), [Action::Drain { job: 4, slot: 0 }]);
    // Down to min: all supplementals go, baseline stays.
    let a = reconcile(&t(1, 4, 1), &rs);
    assert_eq!(a.len(), 3);
    assert!(!a.contains(&Action::Drain { job: 1, slot: 0 }));
}

#[test]
fn pending_surplus_is_cancelled_before_serving_replicas_are_drained() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Serving, 0, 300),
        r(3, Kind::Supplemental, Phase::Pending, 0, 0),
    ];
    assert_eq!(reconcile(&t(1, 4, 2), &rs), [Action::Release { job: 3, slot: 0 }]);
}

#[test]
fn a_preempted_replica_drains_at_once_and_is_replaced() {
    let mut victim = r(2, Kind::Supplemental, Phase::Serving, 4, 300);
    victim.being_preempted = true;
    let rs = [r(1, Kind::Baseline, Phase::Serving, 0, 900), victim];
    assert_eq!(reconcile(&t(1, 4, 2), &rs), [Action::Drain { job: 2, slot: 0 }, Action::Submit(Kind::Supplemental)]);
}

#[test]
fn a_drained_victim_of_preemption_is_left_to_its_launcher() {
    let mut victim = r(2, Kind::Supplemental, Phase::Draining, 0, 300);
    victim.being_preempted = true;
    let rs = [r(1, Kind::Baseline, Phase::Serving, 0, 900), victim.clone()];
    let a = reconcile(&t(1, 4, 2), &rs);
    assert!(!a.iter().any(|a| matches!(a, Action::Release { job: 2, .. })), "{a:?}");
    // The same replica drained by the daemon's own scale-down is released.
    victim.being_preempted = false;
    let a = reconcile(&t(1, 4, 1), &[r(1, Kind::Baseline, Phase::Serving, 0, 900), victim]);
    assert_eq!(a, [Action::Release { job: 2, slot: 0 }]);
}

#[test]
fn drained_and_stuck_replicas_are_cancelled() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Draining, 0, 300),
        r(3, Kind::Supplemental, Phase::Starting, 0, 301),
    ];
    assert_eq!(reconcile(&t(1, 2, 1), &rs), [Action::Release { job: 2, slot: 0 }, Action::Release { job: 3, slot: 0 }]);
}

#[test]
fn a_replica_near_its_time_limit_gets_a_successor_first() {
    let mut old = r(1, Kind::Baseline, Phase::Serving, 2, 86_000);
    old.time_left = Some(300 * S);
    assert_eq!(reconcile(&t(1, 1, 1), std::slice::from_ref(&old)), [Action::Submit(Kind::Baseline)]);
    // Successor pending: nothing new.
    let pending = r(2, Kind::Baseline, Phase::Pending, 0, 0);
    assert!(reconcile(&t(1, 1, 1), &[old.clone(), pending]).is_empty());
    // Successor serving: the old one drains; the endpoint never drops below min.
    let serving = r(2, Kind::Baseline, Phase::Serving, 0, 60);
    assert_eq!(reconcile(&t(1, 1, 1), &[old, serving]), [Action::Drain { job: 1, slot: 0 }]);
}

#[test]
fn a_starter_is_released_for_how_long_it_has_been_starting_not_for_its_age() {
    // Adopted after a restart: running for 1000 s, starting for 1 s.
    let adopted = Replica { starting_for: S, ..r(1, Kind::Baseline, Phase::Starting, 0, 1000) };
    assert_eq!(reconcile(&t(1, 1, 1), std::slice::from_ref(&adopted)), Vec::<Action>::new());
    let stale = Replica { starting_for: 301 * S, ..adopted };
    assert_eq!(reconcile(&t(1, 1, 1), &[stale]), [Action::Release { job: 1, slot: 0 }, Action::Submit(Kind::Baseline)]);
}

fn warm_t(min: u32, max: u32, desired: u32, replicas: u32, gpus_wanted: bool) -> EndpointTarget {
    EndpointTarget { headroom: Some(Headroom { replicas, gpus_wanted }), ..t(min, max, desired) }
}

#[test]
fn warm_headroom_is_submitted_only_while_no_job_waits_for_gpus() {
    let rs = [r(1, Kind::Baseline, Phase::Serving, 3, 100)];
    assert_eq!(reconcile(&warm_t(1, 4, 1, 2, false), &rs), [Action::Submit(Kind::Warm), Action::Submit(Kind::Warm)]);
    assert!(reconcile(&warm_t(1, 4, 1, 2, true), &rs).is_empty());
    // Bounded by max with the rest.
    assert_eq!(
        reconcile(&warm_t(1, 3, 2, 5, false), &rs),
        [Action::Submit(Kind::Supplemental), Action::Submit(Kind::Warm)]
    );
}

#[test]
fn a_waiting_job_withdraws_pending_warm_replicas_and_leaves_running_ones_to_slurm() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Warm, Phase::Serving, 0, 300),
        r(3, Kind::Warm, Phase::Pending, 0, 0),
    ];
    assert!(reconcile(&warm_t(1, 4, 1, 2, false), &rs).is_empty());
    assert_eq!(reconcile(&warm_t(1, 4, 1, 2, true), &rs), [Action::Release { job: 3, slot: 0 }]);
    // Headroom lowered: the running one above it drains too.
    assert_eq!(
        reconcile(&warm_t(1, 4, 1, 0, true), &rs),
        [Action::Release { job: 3, slot: 0 }, Action::Drain { job: 2, slot: 0 }]
    );
}

#[test]
fn surplus_on_gpus_nobody_wants_stays_as_headroom_and_goes_when_a_job_waits() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Serving, 0, 300),
        r(3, Kind::Supplemental, Phase::Serving, 1, 200),
    ];
    // The load needs the baseline only; two supplementals stay, and with
    // a headroom of 2 no warm replica is added beside them.
    assert!(reconcile(&warm_t(1, 4, 1, 2, false), &rs).is_empty());
    assert_eq!(reconcile(&warm_t(1, 4, 1, 3, false), &rs), [Action::Submit(Kind::Warm)]);
    // A job waits: the surplus drains, cheapest first.
    assert_eq!(
        reconcile(&warm_t(1, 4, 1, 2, true), &rs),
        [Action::Drain { job: 2, slot: 0 }, Action::Drain { job: 3, slot: 0 }]
    );
    // Pending surplus never waits for GPUs on the headroom's account.
    let rs = [r(1, Kind::Baseline, Phase::Serving, 0, 900), r(4, Kind::Supplemental, Phase::Pending, 0, 0)];
    assert_eq!(reconcile(&warm_t(1, 4, 1, 0, false), &rs), [Action::Release { job: 4, slot: 0 }]);
}

#[test]
fn at_max_warm_replicas_carry_load_instead_of_being_replaced() {
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 8, 900),
        r(2, Kind::Warm, Phase::Serving, 8, 300),
        r(3, Kind::Warm, Phase::Serving, 8, 300),
    ];
    assert!(reconcile(&warm_t(1, 3, 3, 2, false), &rs).is_empty());
    // Slurm took one for other work: a supplemental takes its place.
    let taken = Replica { being_preempted: true, ..rs[2].clone() };
    let rs = [rs[0].clone(), rs[1].clone(), taken];
    assert_eq!(
        reconcile(&warm_t(1, 3, 3, 2, true), &rs),
        [Action::Drain { job: 3, slot: 0 }, Action::Submit(Kind::Supplemental)]
    );
}

#[test]
fn demand_only_lower_classes_bring_gets_lower_class_replicas_which_go_first() {
    let lower = |min, max, desired, lower| EndpointTarget { lower, ..t(min, max, desired) };
    // Wanted 4 with min 1: of the 3 above min, 2 only for lower classes.
    let a = reconcile(&lower(1, 6, 4, 2), &[r(1, Kind::Baseline, Phase::Serving, 0, 900)]);
    assert_eq!(a, [Action::Submit(Kind::Supplemental), Action::Submit(Kind::Lower), Action::Submit(Kind::Lower)]);
    // The endpoint's own class first: never more lower than above min.
    let a = reconcile(&lower(1, 6, 2, 5), &[r(1, Kind::Baseline, Phase::Serving, 0, 900)]);
    assert_eq!(a, [Action::Submit(Kind::Lower)]);
    // The endpoint's own class wants min only: its supplemental replica
    // serves on until the lower-class ones do...
    let rs = [r(1, Kind::Baseline, Phase::Serving, 0, 900), r(2, Kind::Supplemental, Phase::Serving, 3, 300)];
    assert_eq!(reconcile(&lower(1, 6, 3, 2), &rs), [Action::Submit(Kind::Lower), Action::Submit(Kind::Lower)]);
    let mut now = rs.to_vec();
    now.extend([r(3, Kind::Lower, Phase::Starting, 0, 10), r(4, Kind::Lower, Phase::Serving, 0, 10)]);
    assert!(reconcile(&lower(1, 6, 3, 2), &now).is_empty(), "one lower-class replica still loads");
    now[2].phase = Phase::Serving;
    assert_eq!(reconcile(&lower(1, 6, 3, 2), &now), [Action::Drain { job: 2, slot: 0 }]);
    // ...unless max needs its place.
    assert_eq!(reconcile(&lower(1, 3, 3, 2), &rs), [Action::Submit(Kind::Lower), Action::Drain { job: 2, slot: 0 }]);
    // The lower classes' demand gone: their replicas drain, the
    // endpoint's own stay.
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Serving, 3, 300),
        r(3, Kind::Lower, Phase::Serving, 1, 200),
        r(4, Kind::Lower, Phase::Pending, 0, 0),
    ];
    let a = reconcile(&lower(1, 6, 2, 0), &rs);
    assert_eq!(a, [Action::Release { job: 4, slot: 0 }, Action::Drain { job: 3, slot: 0 }]);
    // Own demand rises at max while lower demand holds its place: the
    // lower-class replica is the one that leaves.
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        r(2, Kind::Supplemental, Phase::Serving, 3, 300),
        r(3, Kind::Lower, Phase::Serving, 1, 200),
    ];
    assert_eq!(reconcile(&lower(1, 3, 3, 0), &rs), [Action::Drain { job: 3, slot: 0 }]);
    assert!(reconcile(&lower(1, 3, 3, 1), &rs).is_empty(), "steady");
    // With headroom and no job waiting, idle lower-class replicas stay
    // as headroom like supplemental ones.
    let warm = EndpointTarget { lower: 0, ..warm_t(1, 6, 2, 0, false) };
    assert_eq!(reconcile(&warm, &rs), []);
}

#[test]
fn warm_spec_asks_for_the_larger_of_its_count_and_fraction() {
    let w = WarmSpec { replicas: 1, fraction: 0.5 };
    assert_eq!([0, 1, 2, 3, 8].map(|d| w.replicas_above(d)), [1, 1, 1, 2, 4]);
    assert_eq!(WarmSpec::default().replicas_above(100), 0);
    assert_eq!(WarmSpec { replicas: 0, fraction: f64::INFINITY }.replicas_above(1), u32::MAX);
}

fn member(job: u32, slot: u16, pinned: bool, phase: Phase, in_flight: u32) -> Replica {
    Replica { slot, pinned, ..r(job, Kind::Supplemental, phase, in_flight, 100) }
}

#[test]
fn scale_down_takes_replicas_off_a_job_s_other_nodes_before_its_batch_host() {
    // Job 7 hosts three replicas (its batch host's is pinned, and idle).
    let rs = [
        r(1, Kind::Baseline, Phase::Serving, 0, 900),
        member(7, 18500, true, Phase::Serving, 0),
        member(7, 18502, false, Phase::Serving, 2),
        member(7, 18504, false, Phase::Serving, 1),
    ];
    assert_eq!(reconcile(&t(1, 4, 3), &rs), [Action::Drain { job: 7, slot: 18504 }]);
    assert_eq!(
        reconcile(&t(1, 4, 2), &rs),
        [Action::Drain { job: 7, slot: 18504 }, Action::Drain { job: 7, slot: 18502 }]
    );
    // A preempted job drains every replica it hosts.
    let preempted: Vec<Replica> = rs.into_iter().map(|x| Replica { being_preempted: x.job == 7, ..x }).collect();
    let a = reconcile(&t(1, 1, 1), &preempted);
    assert_eq!(a.iter().filter(|a| matches!(a, Action::Drain { job: 7, .. })).count(), 3, "{a:?}");
}

#[test]
fn submissions_are_packed_into_jobs_of_up_to_replicas_per_job() {
    let a = [
        Action::Submit(Kind::Baseline),
        Action::Submit(Kind::Supplemental),
        Action::Drain { job: 3, slot: 0 },
        Action::Submit(Kind::Supplemental),
        Action::Submit(Kind::Supplemental),
    ];
    assert_eq!(pack_submissions(&a, 2), [(Kind::Baseline, 1), (Kind::Supplemental, 2), (Kind::Supplemental, 1)]);
    assert_eq!(pack_submissions(&a, 1).len(), 4);
    assert_eq!(pack_submissions(&a, 0).len(), 4, "0 counts as 1");
    assert!(pack_submissions(&[Action::Release { job: 1, slot: 0 }], 4).is_empty());
}

fn layout(job: u32, nodes: &[&str]) -> JobLayout {
    JobLayout {
        job,
        pending: false,
        batch_host: nodes.first().map(|n| n.to_string()),
        replicas: nodes.iter().enumerate().map(|(i, n)| (18500 + 2 * i as u16, Some(n.to_string()))).collect(),
    }
}

#[test]
fn releases_shrink_a_job_to_the_rest_and_cancel_it_when_none_is_left() {
    let jobs = [layout(7, &["node1", "node2", "node3"]), layout(8, &["node4"])];
    assert_eq!(
        plan_releases(&jobs, &[(7, 18502), (8, 18500)]),
        [
            Release::Shrink { job: 7, keep: vec!["node1".into(), "node3".into()], released: vec![18502] },
            Release::Cancel { job: 8 }
        ]
    );
    assert_eq!(plan_releases(&jobs, &[(7, 18500), (7, 18502), (7, 18504)]), [Release::Cancel { job: 7 }]);
    // Nothing asked of a job: nothing done; slots of other jobs do not count.
    assert!(plan_releases(&jobs, &[(9, 18500)]).is_empty());
}

#[test]
fn the_batch_host_s_replica_is_held_until_its_job_has_no_other() {
    let jobs = [layout(7, &["node1", "node2", "node3"])];
    assert_eq!(
        plan_releases(&jobs, &[(7, 18500), (7, 18504)]),
        [
            Release::Held { job: 7, slot: 18500 },
            Release::Shrink { job: 7, keep: vec!["node1".into(), "node2".into()], released: vec![18504] }
        ]
    );
    assert_eq!(plan_releases(&jobs, &[(7, 18500)]), [Release::Held { job: 7, slot: 18500 }]);
}

#[test]
fn a_pending_job_asks_for_fewer_nodes() {
    let pending = JobLayout {
        job: 9,
        pending: true,
        batch_host: None,
        replicas: vec![(18500, None), (18502, None), (18504, None)],
    };
    assert_eq!(
        plan_releases(std::slice::from_ref(&pending), &[(9, 18504)]),
        [Release::Resize { job: 9, nodes: 2, released: vec![18504] }]
    );
    assert_eq!(plan_releases(&[pending], &[(9, 18500), (9, 18502), (9, 18504)]), [Release::Cancel { job: 9 }]);
}

fn arb_layout() -> impl Strategy<Value = (JobLayout, Vec<(u32, u16)>)> {
    (1usize..6, proptest::collection::vec(any::<bool>(), 6)).prop_map(|(n, picks)| {
        let names: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let l = layout(3, &refs);
        let release = l.replicas.iter().zip(&picks).filter(|(_, p)| **p).map(|((s, _), _)| (3, *s)).collect();
        (l, release)
    })
}

fn arb_replica() -> impl Strategy<Value = Replica> {
    (
        (1u32..6, 0u16..4, any::<bool>()),
        0usize..4,
        0usize..4,
        0u32..10,
        0u64..1000,
        any::<bool>(),
        proptest::option::of(0u64..2000),
    )
        .prop_map(|((job, slot, pinned), kind, phase, in_flight, age, pre, left)| Replica {
            job,
            slot,
            pinned,
            kind: [Kind::Baseline, Kind::Supplemental, Kind::Warm, Kind::Lower][kind],
            phase: [Phase::Pending, Phase::Starting, Phase::Serving, Phase::Draining][phase],
            in_flight,
            age: Duration::from_secs(age),
            starting_for: Duration::from_secs(age),
            time_left: left.map(Duration::from_secs),
            being_preempted: pre,
        })
}

proptest! {

    /// A shrink always keeps the batch host and exactly the nodes whose
    /// replicas stay; a job is cancelled only when all of them go.
    #[test]
    fn releases_keep_the_batch_host_and_the_replicas_not_released((l, release) in arb_layout()) {
        let plan = plan_releases(std::slice::from_ref(&l), &release);
        let all = release.len() == l.replicas.len();
        prop_assert_eq!(plan.contains(&Release::Cancel { job: 3 }), all && !release.is_empty());
        for p in &plan {
            if let Release::Shrink { keep, released, .. } = p {
                prop_assert!(keep.contains(l.batch_host.as_ref().unwrap()));
                for (slot, node) in &l.replicas {
                    let node = node.as_ref().unwrap();
                    prop_assert_eq!(keep.contains(node), !released.contains(slot));
                    prop_assert!(!released.contains(slot) || release.contains(&(3, *slot)));
                }
            }
        }
    }
    /// Actions only ever name jobs that were passed in (owned ones), and
    /// a baseline replica is never drained or cancelled while it serves
    /// without a reason (preemption, time limit).
    #[test]
    fn actions_touch_only_given_jobs_and_spare_healthy_baselines(
        rs in proptest::collection::vec(arb_replica(), 0..8), min in 0u32..4, extra in 0u32..4, desired in 0u32..10,
        lower in 0u32..6,
    ) {
        let mut seen = std::collections::HashSet::new();
        let rs: Vec<Replica> = rs.into_iter().filter(|r| seen.insert((r.job, r.slot))).collect();
        let target = EndpointTarget { lower, ..t(min, min + extra, desired) };
        for a in reconcile(&target, &rs) {
            if let Action::Drain { job, slot } | Action::Release { job, slot } = a {
                let r = rs.iter().find(|r| (r.job, r.slot) == (job, slot));
                prop_assert!(r.is_some(), "action on a job not given: {job}");
                let r = r.unwrap();
                if r.kind == Kind::Baseline && r.phase == Phase::Serving && !r.being_preempted {
                    prop_assert!(r.time_left.is_some_and(|t| t <= target.renew_before), "{r:?}");
                }
            }
        }
    }

    /// With headroom, the endpoint never asks for more than `max`
    /// replicas: those it keeps plus those it submits.
    #[test]
    fn headroom_stays_within_max(
        rs in proptest::collection::vec(arb_replica(), 0..8), min in 0u32..4, extra in 0u32..4,
        desired in 0u32..10, warm in 0u32..6, wanted in any::<bool>(), lower in 0u32..6,
    ) {
        let mut seen = std::collections::HashSet::new();
        let rs: Vec<Replica> = rs.into_iter().filter(|r| seen.insert((r.job, r.slot))).collect();
        let target = EndpointTarget { lower, ..warm_t(min, min + extra, desired, warm, wanted) };
        let a = reconcile(&target, &rs);
        let leaving = |r: &Replica| a.iter().any(|a| matches!(a, Action::Drain { job, slot } | Action::Release { job, slot } if (*job, *slot) == (r.job, r.slot)));
        let kept = rs.iter().filter(|r| live(r) && !leaving(r)).count() as u32;
        let added = a.iter().filter(|a| matches!(a, Action::Submit(_))).count() as u32;
        // Expiring replicas get successors beside them for a while, and
        // baselines above min or replicas above max are not the headroom's doing.
        let within = rs.iter().filter(|r| live(r)).count() as u32 <= min + extra
            && rs.iter().filter(|r| live(r) && r.kind == Kind::Baseline).count() as u32 <= min
            && !rs.iter().any(|r| r.time_left.is_some_and(|t| t <= target.renew_before));
        if within {
            prop_assert!(kept + added <= min + extra, "{a:?}");
        }
        if wanted {
            prop_assert!(!a.contains(&Action::Submit(Kind::Warm)));
        }
    }
}
