//! What onepoold does to an endpoint's replica jobs each round: the
//! difference between the replicas it wants (baseline `min` in the
//! protected class, supplemental up to the autoscaler's count in the
//! flexible class) and the jobs it owns in Slurm. Pure: the daemon feeds
//! it what squeue and the router say, and carries out the actions.
//!
//! Rules: never touch a job onepoold did not create (the caller passes
//! only owned jobs, and every action names one of them); baseline replicas
//! are never scaled down; a scale-down drains the supplemental replica that
//! is cheapest to drain (fewest requests in flight, then the youngest);
//! a replica near its time limit gets a successor first and is drained once
//! the successor serves; a job Slurm is preempting is drained at once.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Counts toward `min`; protected class.
    Baseline,
    /// Above `min`; flexible class, reclaimable.
    Supplemental,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Submitted, waiting for GPUs.
    Pending,
    /// Running, model still loading (not yet in the router).
    Starting,
    /// In the router, taking requests.
    Serving,
    /// Taken out of the router; finishing what is in flight.
    Draining,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub job: u32,
    pub kind: Kind,
    pub phase: Phase,
    pub in_flight: u32,
    /// Seconds since it started running (0 while pending).
    pub age: Duration,
    /// Time left before Slurm's time limit ends it.
    pub time_left: Option<Duration>,
    /// Slurm picked it as a preemption victim.
    pub being_preempted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointTarget {
    pub min: u32,
    pub max: u32,
    /// What the autoscaler recommends now (clamped to [min, max] here).
    pub desired: u32,
    /// Start a successor this long before a replica's time limit.
    pub renew_before: Duration,
    /// Longest model load; a replica starting for longer is replaced.
    pub startup_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Submit(Kind),
    /// Take out of the router and let in-flight requests finish.
    Drain {
        job: u32,
    },
    /// Release the job's GPUs (after its drain, or a job that never served).
    Cancel {
        job: u32,
    },
}

/// Live means it serves now or will: pending, starting or serving.
fn live(r: &Replica) -> bool {
    r.phase != Phase::Draining && !r.being_preempted
}

pub fn reconcile(target: &EndpointTarget, replicas: &[Replica]) -> Vec<Action> {
    let mut actions = Vec::new();
    let desired = target.desired.clamp(target.min, target.max.max(target.min));
    // Victims and stale starters leave first.
    for r in replicas {
        if r.being_preempted && r.phase != Phase::Draining {
            actions.push(Action::Drain { job: r.job });
        } else if (r.phase == Phase::Starting && r.age > target.startup_timeout)
            || (r.phase == Phase::Draining && r.in_flight == 0)
        {
            // A model load that never finished, or a drain that has.
            actions.push(Action::Cancel { job: r.job });
        }
    }
    let gone = |r: &Replica| {
        actions.iter().any(|a| matches!(a, Action::Cancel { job } | Action::Drain { job } if *job == r.job))
    };
    let alive: Vec<&Replica> = replicas.iter().filter(|r| live(r) && !gone(r)).collect();
    // Replicas near their time limit get a successor; once every successor
    // serves, the old one drains.
    let expiring: Vec<&Replica> = alive
        .iter()
        .copied()
        .filter(|r| r.phase == Phase::Serving && r.time_left.is_some_and(|t| t <= target.renew_before))
        .collect();
    let count_lasting =
        |kind: Kind| alive.iter().filter(|r| r.kind == kind && !expiring.iter().any(|e| e.job == r.job)).count() as u32;
    let (base_lasting, supp_lasting) = (count_lasting(Kind::Baseline), count_lasting(Kind::Supplemental));
    let want_supp = desired - target.min;
    for _ in base_lasting..target.min {
        actions.push(Action::Submit(Kind::Baseline));
    }
    let supp_to_add = want_supp.saturating_sub(supp_lasting);
    for _ in 0..supp_to_add {
        actions.push(Action::Submit(Kind::Supplemental));
    }
    // Expiring replicas whose successors already serve can go.
    let serving_lasting = |kind: Kind| {
        alive
            .iter()
            .filter(|r| r.kind == kind && r.phase == Phase::Serving && !expiring.iter().any(|e| e.job == r.job))
            .count() as u32
    };
    for e in &expiring {
        let enough = match e.kind {
            Kind::Baseline => serving_lasting(Kind::Baseline) >= target.min,
            Kind::Supplemental => serving_lasting(Kind::Supplemental) >= want_supp,
        };
        if enough {
            actions.push(Action::Drain { job: e.job });
        }
    }
    // Scale down: cancel pending surplus first, then drain the cheapest.
    let surplus = supp_lasting.saturating_sub(want_supp);
    if surplus > 0 {
        let mut candidates: Vec<&Replica> = alive
            .iter()
            .copied()
            .filter(|r| r.kind == Kind::Supplemental && !expiring.iter().any(|e| e.job == r.job))
            .collect();
        candidates.sort_by_key(|r| (r.phase != Phase::Pending, r.phase == Phase::Serving, r.in_flight, r.age));
        for r in candidates.into_iter().take(surplus as usize) {
            actions.push(match r.phase {
                Phase::Pending | Phase::Starting => Action::Cancel { job: r.job },
                _ => Action::Drain { job: r.job },
            });
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    fn t(min: u32, max: u32, desired: u32) -> EndpointTarget {
        EndpointTarget { min, max, desired, renew_before: 600 * S, startup_timeout: 300 * S }
    }

    fn r(job: u32, kind: Kind, phase: Phase, in_flight: u32, age: u64) -> Replica {
        Replica { job, kind, phase, in_flight, age: Duration::from_secs(age), time_left: None, being_preempted: false }
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
        assert_eq!(reconcile(&t(1, 4, 3), &rs), [Action::Drain { job: 4 }]);
        // Down to min: all supplementals go, baseline stays.
        let a = reconcile(&t(1, 4, 1), &rs);
        assert_eq!(a.len(), 3);
        assert!(!a.contains(&Action::Drain { job: 1 }));
    }

    #[test]
    fn pending_surplus_is_cancelled_before_serving_replicas_are_drained() {
        let rs = [
            r(1, Kind::Baseline, Phase::Serving, 0, 900),
            r(2, Kind::Supplemental, Phase::Serving, 0, 300),
            r(3, Kind::Supplemental, Phase::Pending, 0, 0),
        ];
        assert_eq!(reconcile(&t(1, 4, 2), &rs), [Action::Cancel { job: 3 }]);
    }

    #[test]
    fn a_preempted_replica_drains_at_once_and_is_replaced() {
        let mut victim = r(2, Kind::Supplemental, Phase::Serving, 4, 300);
        victim.being_preempted = true;
        let rs = [r(1, Kind::Baseline, Phase::Serving, 0, 900), victim];
        assert_eq!(reconcile(&t(1, 4, 2), &rs), [Action::Drain { job: 2 }, Action::Submit(Kind::Supplemental)]);
    }

    #[test]
    fn drained_and_stuck_replicas_are_cancelled() {
        let rs = [
            r(1, Kind::Baseline, Phase::Serving, 0, 900),
            r(2, Kind::Supplemental, Phase::Draining, 0, 300),
            r(3, Kind::Supplemental, Phase::Starting, 0, 301),
        ];
        assert_eq!(reconcile(&t(1, 2, 1), &rs), [Action::Cancel { job: 2 }, Action::Cancel { job: 3 }]);
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
        assert_eq!(reconcile(&t(1, 1, 1), &[old, serving]), [Action::Drain { job: 1 }]);
    }

    fn arb_replica() -> impl Strategy<Value = Replica> {
        (1u32..1000, any::<bool>(), 0usize..4, 0u32..10, 0u64..1000, any::<bool>(), proptest::option::of(0u64..2000))
            .prop_map(|(job, base, phase, in_flight, age, pre, left)| Replica {
                job,
                kind: if base { Kind::Baseline } else { Kind::Supplemental },
                phase: [Phase::Pending, Phase::Starting, Phase::Serving, Phase::Draining][phase],
                in_flight,
                age: Duration::from_secs(age),
                time_left: left.map(Duration::from_secs),
                being_preempted: pre,
            })
    }

    proptest! {
        /// Actions only ever name jobs that were passed in (owned ones), and
        /// a baseline replica is never drained or cancelled while it serves
        /// without a reason (preemption, time limit).
        #[test]
        fn actions_touch_only_given_jobs_and_spare_healthy_baselines(
            rs in proptest::collection::vec(arb_replica(), 0..8), min in 0u32..4, extra in 0u32..4, desired in 0u32..10,
        ) {
            let mut seen = std::collections::HashSet::new();
            let rs: Vec<Replica> = rs.into_iter().filter(|r| seen.insert(r.job)).collect();
            let target = t(min, min + extra, desired);
            for a in reconcile(&target, &rs) {
                if let Action::Drain { job } | Action::Cancel { job } = a {
                    let r = rs.iter().find(|r| r.job == job);
                    prop_assert!(r.is_some(), "action on a job not given: {job}");
                    let r = r.unwrap();
                    if r.kind == Kind::Baseline && r.phase == Phase::Serving && !r.being_preempted {
                        prop_assert!(r.time_left.is_some_and(|t| t <= target.renew_before), "{r:?}");
                    }
                }
            }
        }
    }
}
