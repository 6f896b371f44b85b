use super::*;
use crate::autoscale::{Autoscaler, Recommendation, ScalingPolicy};
use proptest::prelude::*;

fn targets(ttft_ms: Option<u64>, queue_ms: Option<u64>) -> LatencyTargets {
    LatencyTargets {
        ttft_p99: ttft_ms.map(Duration::from_millis),
        queue_p99: queue_ms.map(Duration::from_millis),
        ..LatencyTargets::default()
    }
}

fn ttft_rule() -> LatencyRule {
    LatencyRule::new(targets(Some(1000), None))
}

/// From `from` to `to`, once a second: `n` answers of `ttft` (no queueing), then a judgement.
fn judge(
    rule: &mut LatencyRule,
    (from, to): (u32, u32),
    ready: u32,
    load: f64,
    (n, ttft): (u32, f64),
) -> LatencyVerdict {
    let mut last = None;
    for t in from..to {
        for _ in 0..n {
            rule.record(f64::from(t), ttft, 0.0);
        }
        last = Some(rule.recommend(f64::from(t), ready, load));
    }
    last.unwrap()
}

fn fewer_ok(v: LatencyVerdict) -> bool {
    matches!(v, LatencyVerdict::Held { fewer_ok: true, .. })
}

#[test]
fn no_target_has_no_opinion() {
    let mut rule = LatencyRule::new(LatencyTargets::default());
    assert!(!LatencyTargets::default().is_set());
    let v = judge(&mut rule, (0, 30), 2, 50.0, (10, 9.0));
    assert_eq!((v, v.want()), (LatencyVerdict::NoTarget, None));
    assert!(rule.samples.is_empty(), "nothing is stored without a target");
}

#[test]
fn too_few_samples_gives_no_opinion() {
    let mut rule = ttft_rule();
    for t in 0..19 {
        rule.record(f64::from(t), 5.0, 0.0);
    }
    let v = rule.recommend(19.0, 2, 10.0);
    assert_eq!((v, v.want()), (LatencyVerdict::TooFewSamples { samples: 19 }, None));
    rule.record(19.0, 5.0, 0.0);
    assert_eq!(rule.recommend(19.0, 2, 10.0).want(), Some(3));
    // Requests older than the window no longer count.
    assert_eq!(rule.recommend(80.0, 2, 10.0), LatencyVerdict::TooFewSamples { samples: 0 });
}

#[test]
fn a_miss_adds_one_replica_and_waits_for_its_window() {
    let mut rule = ttft_rule();
    let v = judge(&mut rule, (0, 30), 2, 20.0, (1, 2.0));
    let missed = LatencyVerdict::Missed { ttft_p99: Some(2.0), queue_p99: None, samples: 30, ready: 2, want: 3 };
    assert_eq!(v, missed);
    // Still missed while the third replica starts: still 3, not 4.
    assert_eq!(judge(&mut rule, (30, 50), 2, 20.0, (1, 2.0)).want(), Some(3));
    // The third replica is ready: the misses from before say nothing of it.
    assert_eq!(rule.recommend(50.0, 3, 20.0), LatencyVerdict::TooFewSamples { samples: 0 });
    assert_eq!(judge(&mut rule, (51, 70), 3, 20.0, (1, 2.0)), LatencyVerdict::TooFewSamples { samples: 19 });
    assert_eq!(judge(&mut rule, (70, 71), 3, 20.0, (1, 2.0)).want(), Some(4));
    // With none ready, a miss (requests answered by a replica just gone) asks for one.
    assert_eq!(judge(&mut ttft_rule(), (0, 20), 0, 5.0, (1, 2.0)).want(), Some(1));
}

#[test]
fn one_fewer_only_when_the_load_per_replica_is_known_to_hold() {
    let mut rule = ttft_rule();
    // 4 replicas carry 40 within target: 10 per replica is known to hold,
    // but 40 over 3 (13.3 each) is not.
    let v = judge(&mut rule, (0, 30), 4, 40.0, (1, 0.5));
    assert_eq!((v.want(), fewer_ok(v)), (Some(4), false));
    assert_eq!(rule.carried_per_replica(), Some(10.0));
    // 31 over 3 is 10.33 each: more than known, keep 4.
    let v = judge(&mut rule, (200, 230), 4, 31.0, (1, 0.5));
    assert_eq!((v.want(), fewer_ok(v)), (Some(4), false));
    assert_eq!(rule.carried_per_replica(), Some(10.0), "the highest load that held is kept");
    // 30 over 3 is 10 each: known to hold, one fewer.
    let v = judge(&mut rule, (400, 430), 4, 30.0, (1, 0.5));
    assert_eq!((v.want(), fewer_ok(v)), (Some(3), true));
    // One replica is never taken to zero by this rule, idle or not.
    let v = judge(&mut ttft_rule(), (0, 30), 1, 0.0, (1, 0.1));
    assert_eq!((v.want(), fewer_ok(v)), (Some(1), false));
}

#[test]
fn a_miss_within_the_carried_load_forgets_it() {
    let mut rule = ttft_rule();
    judge(&mut rule, (0, 30), 4, 40.0, (1, 0.5));
    assert_eq!(rule.carried_per_replica(), Some(10.0));
    // Requests got longer: 8 per replica misses now.
    let v = judge(&mut rule, (200, 230), 4, 32.0, (1, 3.0));
    assert_eq!(v.want(), Some(5));
    assert_eq!(rule.carried_per_replica(), None);
    // A miss above what is known to hold leaves it.
    let mut rule = ttft_rule();
    judge(&mut rule, (0, 30), 4, 40.0, (1, 0.5));
    judge(&mut rule, (200, 230), 4, 48.0, (1, 3.0));
    assert_eq!(rule.carried_per_replica(), Some(10.0));
}

#[test]
fn the_queue_target_is_judged_on_its_own() {
    let t = targets(Some(1000), Some(200));
    let mut rule = LatencyRule::new(t.clone());
    for _ in 0..20 {
        rule.record(0.0, 0.5, 0.5);
    }
    let v = rule.recommend(0.0, 2, 10.0);
    let missed = LatencyVerdict::Missed { ttft_p99: Some(0.5), queue_p99: Some(0.5), samples: 20, ready: 2, want: 3 };
    assert_eq!(v, missed);
    assert_eq!(v.reason(&t), "queue p99 500 ms > target 200 ms over 20 requests: 2 -> 3");
}

#[test]
fn p99_is_the_nearest_rank() {
    let upto = |n: u32| (1..=n).rev().map(f64::from).collect::<Vec<_>>();
    assert_eq!(p99(upto(100)), 99.0);
    assert_eq!(p99(upto(20)), 20.0, "below 100 values the p99 is the maximum");
    assert_eq!(p99(upto(200)), 198.0);
    assert_eq!(p99(upto(101)), 100.0);
    assert_eq!(p99(vec![3.5]), 3.5);
    assert_eq!(p99(Vec::new()), 0.0);
}

#[test]
fn stored_samples_are_bounded_newest_kept() {
    let mut rule = ttft_rule();
    for i in 0..25_000 {
        rule.record(0.0, if i < 15_000 { 9.0 } else { 0.1 }, 0.0);
    }
    assert_eq!(rule.samples.len(), MAX_SAMPLES);
    let v = rule.recommend(0.0, 2, 10.0);
    assert!(matches!(v, LatencyVerdict::Held { samples: 10_000, ttft_p99: Some(p), .. } if p == 0.1), "{v:?}");
}

#[test]
fn reasons_read_as_sentences() {
    let t = targets(Some(1000), Some(500));
    let missed = LatencyVerdict::Missed { ttft_p99: Some(1.8), queue_p99: Some(0.2), samples: 43, ready: 3, want: 4 };
    assert_eq!(missed.reason(&t), "ttft p99 1.8 s > target 1.0 s over 43 requests: 3 -> 4");
    let held = |fewer_ok, ready, want| LatencyVerdict::Held {
        ttft_p99: Some(0.6),
        queue_p99: Some(0.05),
        samples: 120,
        ready,
        want,
        fewer_ok,
    };
    let both = "ttft p99 600 ms <= target 1.0 s, queue p99 50 ms <= target 500 ms over 120 requests";
    assert_eq!(held(true, 4, 3).reason(&t), format!("{both}: 4 -> 3 (holds with one fewer)"));
    assert_eq!(held(false, 4, 4).reason(&t), format!("{both}: keep 4 (not known to hold with one fewer)"));
    assert_eq!(held(false, 1, 1).reason(&t), format!("{both}: keep 1"));
    assert_eq!(
        LatencyVerdict::TooFewSamples { samples: 7 }.reason(&t),
        "latency not judged: 7 requests since the replica count changed, 20 needed"
    );
    assert_eq!(LatencyVerdict::NoTarget.reason(&t), "no latency target");
    assert_eq!(t.to_string(), "ttft p99 <= 1.0 s, queue p99 <= 500 ms over 60 s (at least 20 requests)");
    assert_eq!(LatencyTargets::default().to_string(), "no latency target");
}

fn policy() -> ScalingPolicy {
    crate::autoscale::tests::test_policy()
}

#[test]
fn a_target_not_known_to_hold_with_fewer_keeps_the_count() {
    // 15 in flight over 3 replicas: the in-flight rule wants 2 (10 each),
    // the target holds at 5 each but nothing says it holds at 7.5.
    let (mut plain, mut with) = (Autoscaler::new(policy()), Autoscaler::with_latency(policy(), ttft_targets()));
    let (mut rp, mut rw) = (3, 3);
    let mut last = None;
    for t in 0..300 {
        let t = f64::from(t);
        for a in [&mut plain, &mut with] {
            a.record(t, 15.0);
            // Enough answers to judge from the first second: with too few,
            // the rule has no opinion and the in-flight rule alone decides.
            for _ in 0..20 {
                a.record_latency(t, 0.5, 0.0);
            }
        }
        rp = plain.recommend(t, rp).replicas;
        let r = with.recommend(t, rw);
        rw = r.replicas;
        last = Some(r);
    }
    assert_eq!((rp, rw), (2, 3));
    let held = last.unwrap().latency.unwrap();
    assert!(matches!(held, LatencyVerdict::Held { want: 3, fewer_ok: false, .. }), "{held:?}");
}

fn ttft_targets() -> LatencyTargets {
    targets(Some(1000), None)
}

/// A toy endpoint: `load` requests in flight, spread evenly, 20 answers a
/// second whose time to first token is 0.5 s up to a knee of 5 in flight
/// per replica and grows by 1 s per request above it (queueing), with
/// ±10 % jitter. A replica asked for is ready 10 s later.
struct Toy {
    scaler: Autoscaler,
    ready: u32,
    starting: u32,
    ready_at: f64,
    rng: u64,
    /// The most replicas asked for above those ready.
    max_step: u32,
}

impl Toy {
    fn new() -> Toy {
        let scaler = Autoscaler::with_latency(policy(), ttft_targets());
        Toy { scaler, ready: 3, starting: 0, ready_at: 0.0, rng: 0x2545_f491_4f6c_dd1d, max_step: 0 }
    }

    fn jitter(&mut self) -> f64 {
        self.rng = self.rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        0.9 + 0.2 * ((self.rng >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// One second; returns the ready count after it.
    fn second(&mut self, t: u32, load: f64) -> Recommendation {
        let now = f64::from(t);
        if self.starting > 0 && now >= self.ready_at {
            self.ready += self.starting;
            self.starting = 0;
        }
        self.scaler.record(now, load);
        let per_replica = load / f64::from(self.ready.max(1));
        for _ in 0..20 {
            let ttft = (0.5 + (per_replica - 5.0).max(0.0)) * self.jitter();
            self.scaler.record_latency(now, ttft, 0.0);
        }
        let r = self.scaler.recommend(now, self.ready);
        self.max_step = self.max_step.max(r.replicas.saturating_sub(self.ready));
        if r.replicas > self.ready + self.starting {
            self.starting = r.replicas - self.ready;
            self.ready_at = now + 10.0;
        } else if r.replicas < self.ready {
            self.ready = r.replicas;
            self.starting = 0;
        }
        r
    }
}

#[test]
fn a_toy_endpoint_converges_to_a_count_that_holds_and_stays() {
    let mut toy = Toy::new();
    let mut history = vec![toy.ready];
    let mut last = None;
    for t in 0..900 {
        // 30 in flight (the in-flight rule wants 3), then 15 (it wants 2).
        let r = toy.second(t, if t < 300 { 30.0 } else { 15.0 });
        if history.last() != Some(&toy.ready) {
            history.push(toy.ready);
        }
        if t == 299 {
            assert_eq!(toy.ready, 6, "5 per replica is the most that holds");
        }
        last = Some(r);
    }
    // Up one at a time to 6, down one at a time to 3 (15 at 5 each), and
    // no oscillation on the way or after.
    assert_eq!(history, [3, 4, 5, 6, 5, 4, 3]);
    assert_eq!(toy.max_step, 1, "never more than one replica asked for at a time");
    let v = last.unwrap().latency.unwrap();
    assert!(matches!(v, LatencyVerdict::Held { ready: 3, want: 3, fewer_ok: false, .. }), "{v:?}");
}

proptest! {
    /// Without a target, `with_latency` recommends exactly what `new` does,
    /// whatever latencies are recorded.
    #[test]
    fn no_target_changes_nothing(steps in proptest::collection::vec((0.0f64..500.0, 0u8..4, 0.0f64..10.0), 1..200)) {
        let (mut a, mut b) = (Autoscaler::new(policy()), Autoscaler::with_latency(policy(), LatencyTargets::default()));
        prop_assert!(b.latency_targets().is_none());
        let (mut ra, mut rb) = (1, 1);
        for (t, (load, answers, ttft)) in steps.iter().enumerate() {
            let t = t as f64;
            a.record(t, *load);
            b.record(t, *load);
            for _ in 0..*answers {
                b.record_latency(t, *ttft, *ttft);
            }
            let (x, y) = (a.recommend(t, ra), b.recommend(t, rb));
            prop_assert_eq!(x, y);
            prop_assert_eq!(y.latency, None);
            ra = x.replicas;
            rb = y.replicas;
        }
    }

    /// The rule moves by one replica at most, never below 1 from 1 or
    /// more, and only shrinks when the target held.
    #[test]
    fn the_rule_moves_one_step_at_most(
        steps in proptest::collection::vec((0u32..6, 0.0f64..100.0, 0u8..30, 0.0f64..2.0), 1..200),
    ) {
        let mut rule = ttft_rule();
        for (t, (ready, load, answers, ttft)) in steps.iter().enumerate() {
            for _ in 0..*answers {
                rule.record(t as f64, *ttft, 0.0);
            }
            match rule.recommend(t as f64, *ready, *load) {
                LatencyVerdict::Missed { want, .. } => prop_assert_eq!(want, ready + 1),
                LatencyVerdict::Held { want, fewer_ok, .. } => {
                    prop_assert_eq!(want, if fewer_ok { ready - 1 } else { *ready });
                    prop_assert!(want >= 1 || *ready == 0);
                }
                LatencyVerdict::TooFewSamples { samples } => prop_assert!(samples < 20),
                LatencyVerdict::NoTarget => prop_assert!(false, "a target is set"),
            }
        }
    }
}
