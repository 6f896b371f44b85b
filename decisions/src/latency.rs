//! Latency targets for an inference endpoint: a p99 for time to first
//! token (the router's own measurement of the first byte of each answer)
//! and a p99 for queueing (how long a request waited in the router's queue
//! for a replica). The in-flight rule (`autoscale`) sizes an endpoint by
//! its load, which says nothing of how fast a replica answers; a long
//! prompt or a slow card misses a latency target at a load the in-flight
//! rule calls comfortable. This rule adds replicas while the target is
//! missed and removes one only when the target is known to hold with one
//! fewer. The autoscaler takes the higher of the two counts, so the
//! in-flight rule stays the floor.
//!
//! The rule judges the requests answered since the ready count last
//! changed (and within `window`), because requests answered under another
//! count say nothing about this one: the misses from before a replica was
//! added would otherwise add replica after replica while the new one is
//! still starting.
//!
//! With too few requests in a window the rule has no opinion and the
//! in-flight rule alone decides. Right after this rule added a replica,
//! the autoscaler's scale-down delay still remembers the count it asked
//! for, so the new replica keeps its window as long as the endpoint
//! answers `min_samples` requests within that delay; an endpoint too quiet
//! for that is sized by its load, as without targets (and an idle one can
//! still shrink).
//!
//! Time is passed in as seconds (`f64`), as in `autoscale`, so the live
//! daemon and the simulator drive the same code.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// At most this many answered requests are kept, the oldest dropped first,
/// so that memory stays bounded under heavy traffic. Above this many
/// requests per window the rule judges the newest `MAX_SAMPLES` (still an
/// exact p99 over them, and still within the window).
pub const MAX_SAMPLES: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub struct LatencyTargets {
    /// p99 of the time to first token the endpoint should keep.
    pub ttft_p99: Option<Duration>,
    /// p99 of the time a request waits in the router's queue for a replica.
    pub queue_p99: Option<Duration>,
    /// How far back answered requests are judged.
    pub window: Duration,
    /// Fewer answered requests than this in a window give no opinion: a
    /// p99 over a handful of requests is their maximum, and one slow
    /// request would add a replica.
    pub min_samples: u32,
}

impl Default for LatencyTargets {
    fn default() -> Self {
        LatencyTargets { ttft_p99: None, queue_p99: None, window: Duration::from_secs(60), min_samples: 20 }
    }
}

impl LatencyTargets {
    /// Whether any target is set (without one the rule has no opinion).
    pub fn is_set(&self) -> bool {
        self.ttft_p99.is_some() || self.queue_p99.is_some()
    }
}

/// What the latency rule makes of the requests answered since the ready
/// count last changed. The p99s are `None` for a target that is not set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyVerdict {
    /// No target is set.
    NoTarget,
    /// Too few requests answered since the count changed to judge.
    TooFewSamples { samples: u32 },
    /// A set target's p99 is above it: one more replica.
    Missed { ttft_p99: Option<f64>, queue_p99: Option<f64>, samples: u32, ready: u32, want: u32 },
    /// Every set target held; `fewer_ok` when it is known to hold with one
    /// replica fewer at the window's load.
    Held { ttft_p99: Option<f64>, queue_p99: Option<f64>, samples: u32, ready: u32, want: u32, fewer_ok: bool },
}

impl LatencyVerdict {
    /// The replica count this rule asks for (`None`: no opinion).
    pub fn want(&self) -> Option<u32> {
        match self {
            LatencyVerdict::NoTarget | LatencyVerdict::TooFewSamples { .. } => None,
            LatencyVerdict::Missed { want, .. } | LatencyVerdict::Held { want, .. } => Some(*want),
        }
    }

    /// A short sentence for an admin reading the log, e.g. "ttft p99 1.8 s
    /// > target 1.0 s over 43 requests: 3 -> 4".
    pub fn reason(&self, targets: &LatencyTargets) -> String {
        match *self {
            LatencyVerdict::NoTarget => "no latency target".to_string(),
            LatencyVerdict::TooFewSamples { samples } => format!(
                "latency not judged: {samples} requests since the replica count changed, {} needed",
                targets.min_samples.max(1)
            ),
            LatencyVerdict::Missed { ttft_p99, queue_p99, samples, ready, want } => {
                let parts = compared(targets, ttft_p99, queue_p99, true);
                format!("{parts} over {samples} requests: {ready} -> {want}")
            }
            LatencyVerdict::Held { ttft_p99, queue_p99, samples, ready, want, fewer_ok } => {
                let parts = compared(targets, ttft_p99, queue_p99, false);
                let outcome = if fewer_ok {
                    format!("{ready} -> {want} (holds with one fewer)")
                } else if ready > 1 {
                    format!("keep {ready} (not known to hold with one fewer)")
                } else {
                    format!("keep {ready}")
                };
                format!("{parts} over {samples} requests: {outcome}")
            }
        }
    }
}

/// "ttft p99 1.8 s > target 1.0 s, queue p99 ...": when `only_missed`, the
/// targets that were missed, else every set target.
fn compared(targets: &LatencyTargets, ttft: Option<f64>, queue: Option<f64>, only_missed: bool) -> String {
    let pairs = [("ttft", ttft, targets.ttft_p99), ("queue", queue, targets.queue_p99)];
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(name, p99, target)| {
            let (p99, target) = (p99.as_ref()?, target.as_ref()?.as_secs_f64());
            let over = *p99 > target;
            (over || !only_missed).then(|| {
                let op = if over { ">" } else { "<=" };
                format!("{name} p99 {} {op} target {}", secs(*p99), secs(target))
            })
        })
        .collect();
    parts.join(", ")
}

/// Seconds as an admin reads them: "1.8 s", or "450 ms" below a second.
fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

impl fmt::Display for LatencyTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs = [("ttft", self.ttft_p99), ("queue", self.queue_p99)];
        let set: Vec<String> =
            pairs.iter().filter_map(|(n, t)| t.map(|t| format!("{n} p99 <= {}", secs(t.as_secs_f64())))).collect();
        if set.is_empty() {
            return f.write_str("no latency target");
        }
        write!(f, "{} over {} s (at least {} requests)", set.join(", "), self.window.as_secs_f64(), self.min_samples)
    }
}

/// Exact p99 by nearest rank: the smallest value that at least 99 % of
/// the values are at or below (the `ceil(0.99 n)`-th smallest). Exact
/// rather than a sketch because the window holds at most `MAX_SAMPLES`
/// values, and a selection over them is linear. 0 when there are none.
fn p99(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    // Integer arithmetic: 0.99 * n in floating point rounds 100 up to 99.00000000000001.
    let rank = (values.len() * 99).div_ceil(100);
    let (_, v, _) = values.select_nth_unstable_by(rank - 1, f64::total_cmp);
    *v
}

/// The latency rule: answered requests and per-round loads since the ready
/// count last changed, and what load per replica the endpoint is known to
/// carry within target.
#[derive(Debug, Clone)]
pub struct LatencyRule {
    targets: LatencyTargets,
    /// `(t, ttft, queued)` of each answered request, in seconds.
    samples: VecDeque<(f64, f64, f64)>,
    /// `(t, load)` at each judgement, to know the load a window carried.
    loads: VecDeque<(f64, f64)>,
    /// The ready count the samples were taken under (`None` before the first judgement).
    ready: Option<u32>,
    /// The highest load per replica over a judged window in which every
    /// target held: the load the endpoint is known to carry within target.
    carried: Option<f64>,
}

impl LatencyRule {
    pub fn new(targets: LatencyTargets) -> LatencyRule {
        LatencyRule { targets, samples: VecDeque::new(), loads: VecDeque::new(), ready: None, carried: None }
    }

    pub fn targets(&self) -> &LatencyTargets {
        &self.targets
    }

    /// The load per replica the endpoint is known to carry within target.
    pub fn carried_per_replica(&self) -> Option<f64> {
        self.carried
    }

    /// One answered request: its time to first byte and its time queued,
    /// in seconds (negative or NaN count as 0).
    pub fn record(&mut self, now: f64, ttft: f64, queued: f64) {
        if !self.targets.is_set() {
            return;
        }
        self.samples.push_back((now, ttft.max(0.0), queued.max(0.0)));
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
    }

    fn prune(&mut self, now: f64) {
        let oldest = now - self.targets.window.as_secs_f64();
        while self.samples.front().is_some_and(|(t, _, _)| *t < oldest) {
            self.samples.pop_front();
        }
        while self.loads.front().is_some_and(|(t, _)| *t < oldest) {
            self.loads.pop_front();
        }
    }

    /// The judgement now, with `ready` replicas carrying `load` (in flight
    /// plus queued, as the autoscaler sees it).
    pub fn recommend(&mut self, now: f64, ready: u32, load: f64) -> LatencyVerdict {
        if !self.targets.is_set() {
            return LatencyVerdict::NoTarget;
        }
        if self.ready.is_some_and(|r| r != ready) {
            // Requests answered under another count say nothing of this
            // one: a replica just added needs its own window.
            self.samples.clear();
            self.loads.clear();
        }
        self.ready = Some(ready);
        self.loads.push_back((now, load.max(0.0)));
        self.prune(now);
        let samples = u32::try_from(self.samples.len()).unwrap_or(u32::MAX);
        if samples < self.targets.min_samples.max(1) {
            return LatencyVerdict::TooFewSamples { samples };
        }
        let ttft_p99 = self.targets.ttft_p99.map(|_| p99(self.samples.iter().map(|s| s.1).collect()));
        let queue_p99 = self.targets.queue_p99.map(|_| p99(self.samples.iter().map(|s| s.2).collect()));
        let over =
            |p99: Option<f64>, target: Option<Duration>| p99.zip(target).is_some_and(|(p, t)| p > t.as_secs_f64());
        // The load the window carried: the mean of the rounds' loads, as
        // the p99 is over the whole window's requests.
        let window_load = self.loads.iter().map(|(_, l)| l).sum::<f64>() / self.loads.len() as f64;
        if over(ttft_p99, self.targets.ttft_p99) || over(queue_p99, self.targets.queue_p99) {
            self.missed_at(window_load, ready);
            // One step per judgement: the next judgement waits for the new
            // replica's own window, so a miss never adds more than one.
            let want = ready.saturating_add(1);
            return LatencyVerdict::Missed { ttft_p99, queue_p99, samples, ready, want };
        }
        let fewer_ok = self.held_at(window_load, ready);
        let want = if fewer_ok { ready - 1 } else { ready };
        LatencyVerdict::Held { ttft_p99, queue_p99, samples, ready, want, fewer_ok }
    }

    /// A miss at a load per replica the endpoint was thought to carry means
    /// that knowledge is stale (longer prompts, a slower card): forget it
    /// and learn again, rather than shrink into the miss again later.
    fn missed_at(&mut self, load: f64, ready: u32) {
        if ready > 0 && self.carried.is_some_and(|c| c >= load / f64::from(ready)) {
            self.carried = None;
        }
    }

    /// Remembers the load per replica carried within target, and says
    /// whether the target is known to hold with one replica fewer: the
    /// window's load spread over `ready - 1` replicas is no more per
    /// replica than a load that held. This assumes replicas share load
    /// evenly and are alike; it never lowers the count below 1 (scaling to
    /// zero, min and max are the in-flight rule's business).
    fn held_at(&mut self, load: f64, ready: u32) -> bool {
        if ready == 0 {
            return false;
        }
        let per_replica = load / f64::from(ready);
        let carried = self.carried.map_or(per_replica, |c| c.max(per_replica));
        self.carried = Some(carried);
        ready > 1 && load / f64::from(ready - 1) <= carried
    }
}

#[cfg(test)]
#[path = "latency_tests.rs"]
mod tests;
