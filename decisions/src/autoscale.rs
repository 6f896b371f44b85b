//! How many replicas an inference endpoint should have, from the router's
//! own signals (requests in flight plus requests queued), in the manner of
//! Knative's KPA: a long *stable* window smooths normal traffic, a short
//! *panic* window reacts to bursts, and while panicking the endpoint never
//! shrinks. Scale-down is further held back by a stabilization delay, so a
//! dip does not drain replicas that the next minute needs again (each
//! replica costs a model load to bring back).
//!
//! With a `trend_horizon`, the panic window also looks ahead: the load's
//! slope over that window (least squares) is projected the horizon ahead,
//! and a rising load asks for the replicas it will need then. Set it near
//! the model's load time, so that a replica asked for now is ready when
//! the load it was asked for arrives. By Little's law the load (in flight
//! plus queued) is the request rate times the time a request spends, so
//! its trend is the rate's trend at the endpoint's latency.
//!
//! With latency targets (`Autoscaler::with_latency`, see `latency`), the
//! count is also raised while a p99 target is missed and kept while the
//! target is not known to hold with one replica fewer; the in-flight rule
//! above stays the floor, and the scale-down delay and `[min, max]` apply
//! to the combined count as they do without targets.
//!
//! Time is passed in as seconds (`f64`), so the live daemon and the
//! simulator drive the same code with real or simulated clocks.

use std::collections::VecDeque;
use std::time::Duration;

use crate::latency::{LatencyRule, LatencyTargets, LatencyVerdict};

#[derive(Debug, Clone, PartialEq)]
pub struct ScalingPolicy {
    /// Concurrent requests (in flight + queued) one replica should carry.
    pub target_per_replica: f64,
    pub min: u32,
    pub max: u32,
    pub stable_window: Duration,
    pub panic_window: Duration,
    /// Panic when the panic window wants this many times the ready replicas.
    pub panic_threshold: f64,
    /// A lower count is only applied once it has been wanted this long.
    pub scale_down_delay: Duration,
    /// How far ahead a rising load is projected (zero: not at all).
    pub trend_horizon: Duration,
}

impl Default for ScalingPolicy {
    fn default() -> Self {
        ScalingPolicy {
            target_per_replica: 8.0,
            min: 1,
            max: 8,
            stable_window: Duration::from_secs(60),
            panic_window: Duration::from_secs(6),
            panic_threshold: 2.0,
            scale_down_delay: Duration::from_secs(120),
            trend_horizon: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Stable,
    Panic,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recommendation {
    pub replicas: u32,
    pub mode: Mode,
    pub stable_load: f64,
    pub panic_load: f64,
    /// The panic window's load projected `trend_horizon` ahead (the panic
    /// load when it is not rising).
    pub projected_load: f64,
    /// The latency rule's verdict (`None` when no latency target is set).
    pub latency: Option<LatencyVerdict>,
}

#[derive(Debug, Clone)]
pub struct Autoscaler {
    policy: ScalingPolicy,
    samples: VecDeque<(f64, f64)>,
    panic_until: Option<f64>,
    panic_floor: u32,
    wanted: VecDeque<(f64, u32)>,
    /// Present only when a latency target is set, so that an endpoint
    /// without one scales exactly as it did before targets existed.
    latency: Option<LatencyRule>,
}

/// Least-squares slope of the samples since `since`, per second.
fn slope_since(samples: &VecDeque<(f64, f64)>, since: f64) -> f64 {
    let recent = || samples.iter().filter(|(t, _)| *t >= since);
    let n = recent().count() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mt, mv) = recent().fold((0.0, 0.0), |(a, b), (t, v)| (a + t / n, b + v / n));
    let (cov, var) = recent().fold((0.0, 0.0), |(c, w), (t, v)| (c + (t - mt) * (v - mv), w + (t - mt) * (t - mt)));
    if var > 0.0 {
        cov / var
    } else {
        0.0
    }
}

fn mean_since(samples: &VecDeque<(f64, f64)>, since: f64) -> f64 {
    let (sum, n) = samples.iter().filter(|(t, _)| *t >= since).fold((0.0, 0u32), |(s, n), (_, v)| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / f64::from(n)
    }
}

impl Autoscaler {
    pub fn new(policy: ScalingPolicy) -> Autoscaler {
        Autoscaler {
            policy,
            samples: VecDeque::new(),
            panic_until: None,
            panic_floor: 0,
            wanted: VecDeque::new(),
            latency: None,
        }
    }

    /// An autoscaler that also keeps latency targets (the same as `new`
    /// when `targets` sets none). A separate constructor rather than a
    /// field of `ScalingPolicy`, which other crates build as literals.
    pub fn with_latency(policy: ScalingPolicy, targets: LatencyTargets) -> Autoscaler {
        let mut a = Autoscaler::new(policy);
        a.latency = targets.is_set().then(|| LatencyRule::new(targets));
        a
    }

    /// The latency targets kept (`None` when none is set).
    pub fn latency_targets(&self) -> Option<&LatencyTargets> {
        self.latency.as_ref().map(LatencyRule::targets)
    }

    /// One answered request: its time to first byte and its time queued
    /// in the router, in seconds (ignored when no latency target is set).
    pub fn record_latency(&mut self, now: f64, ttft: f64, queued: f64) {
        if let Some(rule) = self.latency.as_mut() {
            rule.record(now, ttft, queued);
        }
    }

    pub fn policy(&self) -> &ScalingPolicy {
        &self.policy
    }

    /// One observation of the endpoint's load (in flight + queued).
    pub fn record(&mut self, now: f64, load: f64) {
        self.samples.push_back((now, load.max(0.0)));
        let oldest = now - self.policy.stable_window.as_secs_f64();
        while self.samples.front().is_some_and(|(t, _)| *t < oldest) {
            self.samples.pop_front();
        }
    }

    fn replicas_for(&self, load: f64) -> u32 {
        let r = (load / self.policy.target_per_replica.max(f64::MIN_POSITIVE)).ceil();
        if r >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            r as u32
        }
    }

    /// The replica count to aim for now, given how many are ready.
    pub fn recommend(&mut self, now: f64, ready: u32) -> Recommendation {
        let p = &self.policy;
        let stable_load = mean_since(&self.samples, now - p.stable_window.as_secs_f64());
        let panic_load = mean_since(&self.samples, now - p.panic_window.as_secs_f64());
        let want_stable = self.replicas_for(stable_load);
        let horizon = p.trend_horizon.as_secs_f64();
        let projected_load = if horizon > 0.0 {
            let slope = slope_since(&self.samples, now - p.panic_window.as_secs_f64());
            panic_load + (slope * horizon).max(0.0)
        } else {
            panic_load
        };
        let want_panic = self.replicas_for(projected_load);
        let bursting = if ready == 0 {
            want_panic > 0
        } else {
            f64::from(want_panic) / f64::from(ready) >= self.policy.panic_threshold
        };
        if bursting {
            if self.panic_until.is_none() {
                self.panic_floor = ready;
            }
            self.panic_until = Some(now + self.policy.stable_window.as_secs_f64());
        }
        let panicking = self.panic_until.is_some_and(|until| now < until);
        let (replicas, mode) = if panicking {
            // Never shrink while panicking: the burst may still be arriving.
            self.panic_floor = self.panic_floor.max(want_panic).max(want_stable);
            (self.panic_floor, Mode::Panic)
        } else {
            self.panic_until = None;
            self.panic_floor = 0;
            (want_stable, Mode::Stable)
        };
        // The in-flight count is the floor; the latency rule raises it
        // while a target is missed, and keeps the count while the target
        // is not known to hold with one fewer (its want is then `ready`).
        let load = self.samples.back().map_or(0.0, |(_, l)| *l);
        let latency = self.latency.as_mut().map(|rule| rule.recommend(now, ready, load));
        let replicas = replicas.max(latency.and_then(|v| v.want()).unwrap_or(0));
        let replicas = self.stabilize_down(now, replicas);
        Recommendation {
            replicas: replicas.clamp(self.policy.min, self.policy.max.max(self.policy.min)),
            mode,
            stable_load,
            panic_load,
            projected_load,
            latency,
        }
    }

    /// The highest count wanted within the scale-down delay: a lower one
    /// takes effect only after it has been wanted for the whole delay.
    fn stabilize_down(&mut self, now: f64, wanted: u32) -> u32 {
        self.wanted.push_back((now, wanted));
        let oldest = now - self.policy.scale_down_delay.as_secs_f64();
        while self.wanted.front().is_some_and(|(t, _)| *t < oldest) {
            self.wanted.pop_front();
        }
        self.wanted.iter().map(|(_, w)| *w).max().unwrap_or(wanted)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The policy the autoscaler's tests and the latency rule's share.
    pub(crate) fn test_policy() -> ScalingPolicy {
        ScalingPolicy {
            target_per_replica: 10.0,
            min: 1,
            max: 20,
            stable_window: Duration::from_secs(60),
            panic_window: Duration::from_secs(6),
            panic_threshold: 2.0,
            scale_down_delay: Duration::from_secs(30),
            trend_horizon: Duration::ZERO,
        }
    }

    fn scaler() -> Autoscaler {
        Autoscaler::new(test_policy())
    }

    /// Feeds `load` once a second from `from` to `to` and returns the last recommendation.
    fn run(a: &mut Autoscaler, from: u32, to: u32, load: f64, ready: &mut u32) -> Recommendation {
        let mut last = None;
        for t in from..to {
            a.record(f64::from(t), load);
            let r = a.recommend(f64::from(t), *ready);
            *ready = r.replicas;
            last = Some(r);
        }
        last.unwrap()
    }

    #[test]
    fn steady_load_gets_load_over_target() {
        let mut a = scaler();
        let mut ready = 4;
        let r = run(&mut a, 0, 120, 40.0, &mut ready);
        assert_eq!((r.replicas, r.mode), (4, Mode::Stable));
    }

    #[test]
    fn a_burst_panics_and_scales_at_once_then_holds() {
        let mut a = scaler();
        let mut ready = 2;
        run(&mut a, 0, 120, 20.0, &mut ready);
        assert_eq!(ready, 2);
        // Load jumps 5x: within the panic window the count follows it.
        let r = run(&mut a, 120, 126, 100.0, &mut ready);
        assert_eq!(r.mode, Mode::Panic);
        assert!(r.replicas >= 8, "{r:?}");
        // The burst ends: no shrinking while panicking...
        let peak = ready;
        let r = run(&mut a, 126, 150, 10.0, &mut ready);
        assert_eq!((r.mode, r.replicas), (Mode::Panic, peak));
        // ...and after the panic and the scale-down delay, back to the load.
        let r = run(&mut a, 150, 400, 10.0, &mut ready);
        assert_eq!((r.mode, r.replicas), (Mode::Stable, 1));
    }

    #[test]
    fn scale_down_waits_for_the_delay() {
        let mut a = scaler();
        let mut ready = 5;
        run(&mut a, 0, 120, 50.0, &mut ready);
        assert_eq!(ready, 5);
        // Load halves: the stable average drifts down, but no lower count
        // applies before it has been wanted for 30 s.
        let mut first_drop = None;
        for t in 120..300 {
            a.record(f64::from(t), 25.0);
            let r = a.recommend(f64::from(t), ready);
            if r.replicas < 5 && first_drop.is_none() {
                first_drop = Some(t);
            }
            ready = r.replicas;
        }
        assert!(first_drop.unwrap() >= 120 + 30, "{first_drop:?}");
        assert_eq!(ready, 3);
    }

    #[test]
    fn a_rising_load_asks_for_the_replicas_it_will_need_a_horizon_ahead() {
        let with_trend = |h: u64| {
            let mut a = scaler();
            a.policy.trend_horizon = Duration::from_secs(h);
            a
        };
        let (mut flat, mut ahead) = (with_trend(0), with_trend(10));
        let (mut rf, mut ra) = (1, 1);
        run(&mut flat, 0, 60, 5.0, &mut rf);
        run(&mut ahead, 0, 60, 5.0, &mut ra);
        assert_eq!((rf, ra), (1, 1), "a steady load projects to itself");
        // The load climbs 3 a second for 4 s: now 17 (2 replicas at 10
        // each), and at that pace 47 in 10 s. The 6 s window still holds two
        // flat seconds, so the fitted slope is below 3: about 30 projected.
        let (mut last_f, mut last_a) = (None, None);
        for (i, t) in (60..64).enumerate() {
            let load = 8.0 + 3.0 * i as f64;
            flat.record(f64::from(t), load);
            ahead.record(f64::from(t), load);
            last_f = Some(flat.recommend(f64::from(t), rf));
            last_a = Some(ahead.recommend(f64::from(t), ra));
        }
        let (f, a) = (last_f.unwrap(), last_a.unwrap());
        assert!(f.replicas <= 2, "{f:?}");
        assert!(a.replicas >= 4 && a.projected_load > 25.0, "{a:?}");
        // A falling load is not projected down.
        let mut falling = with_trend(10);
        for t in 0..6 {
            falling.record(f64::from(t), 60.0 - 10.0 * f64::from(t));
        }
        let r = falling.recommend(5.0, 6);
        assert_eq!(r.projected_load, r.panic_load);
    }

    #[test]
    fn bounds_hold() {
        let mut a = scaler();
        let mut ready = 1;
        assert_eq!(run(&mut a, 0, 100, 0.0, &mut ready).replicas, 1, "min");
        assert_eq!(run(&mut a, 100, 200, 10_000.0, &mut ready).replicas, 20, "max");
    }

    proptest! {
        /// Whatever the load, the recommendation stays within [min, max].
        #[test]
        fn always_within_bounds(loads in proptest::collection::vec(0.0f64..1e6, 1..200)) {
            let mut a = scaler();
            let mut ready = 1;
            for (t, l) in loads.iter().enumerate() {
                a.record(t as f64, *l);
                let r = a.recommend(t as f64, ready);
                prop_assert!((1..=20).contains(&r.replicas));
                ready = r.replicas;
            }
        }

        /// More steady load never asks for fewer replicas.
        #[test]
        fn monotone_in_steady_load(l1 in 0.0f64..500.0, extra in 0.0f64..500.0) {
            let (mut a, mut b) = (scaler(), scaler());
            let (mut ra, mut rb) = (1, 1);
            let x = run(&mut a, 0, 200, l1, &mut ra);
            let y = run(&mut b, 0, 200, l1 + extra, &mut rb);
            prop_assert!(y.replicas >= x.replicas);
        }
    }
}
