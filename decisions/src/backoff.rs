//! When an endpoint may submit replica jobs again after failed starts
//! (issue #24). A replica whose server dies before it serves — a model
//! server built for another CPU, a wrong model path, a missing library, a
//! port it could not bind — would otherwise be replaced at every poll:
//! 62 jobs in 92 s were measured on a fresh machine, each one through
//! slurmctld, prolog, epilog and accounting, for as long as it lasts.
//!
//! The shape is Kubernetes' CrashLoopBackOff: after the n-th failed start
//! in a row the endpoint waits `initial * 2^(n-1)`, at most `max`; after
//! the wait one job alone is submitted (a probe) and no other until it has
//! served or failed. A replica that serves ends the wait at once (the
//! endpoint scales as usual); the count of failures goes back to zero only
//! after a replica has served for `reset_after`, so a server that crashes
//! a minute into serving still backs off further each time. An admin who
//! fixed the cause ends the back-off at once ([`StartBackoff::clear`]).
//!
//! Times are durations from any fixed origin (the daemon's start), so the
//! logic is pure and tested without clocks.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// Serving this long makes the next failure a first one again.
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

/// One failed start, as shown to admins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedStart {
    pub job: u32,
    /// When it was noticed.
    pub at: Duration,
    /// "killed by SIGSEGV; last output: ...", "not healthy within 5m".
    pub cause: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartBackoff {
    policy: BackoffPolicy,
    /// Failed starts in a row.
    failures: u32,
    /// No submission before this.
    wait_until: Option<Duration>,
    /// A replica served since the last failure: submissions as usual.
    proven: bool,
    /// Since when a replica has served without a failure in between.
    serving_since: Option<Duration>,
    last: Option<FailedStart>,
    /// Every failed start since the daemon started.
    total: u64,
}

/// How many replica jobs may be submitted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowance {
    /// As many as the endpoint wants.
    Any,
    /// One probe.
    One,
    /// None until `until`, or until the probe in flight served or failed.
    None { until: Option<Duration> },
}

impl StartBackoff {
    pub fn new(policy: BackoffPolicy) -> StartBackoff {
        StartBackoff { policy, ..StartBackoff::default() }
    }

    /// The wait after the `n`-th failure in a row.
    pub fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(30);
        self.policy.initial.saturating_mul(1u32 << doublings).min(self.policy.max)
    }

    pub fn failed(&mut self, now: Duration, failure: FailedStart) {
        self.failures += 1;
        self.total += 1;
        self.proven = false;
        self.serving_since = None;
        self.wait_until = Some(now + self.delay(self.failures));
        self.last = Some(failure);
    }

    /// Called at every poll with whether a replica serves now.
    pub fn observe(&mut self, now: Duration, serving: bool) {
        if !serving {
            self.serving_since = None;
            return;
        }
        self.proven = true;
        let since = *self.serving_since.get_or_insert(now);
        if now.saturating_sub(since) >= self.policy.reset_after {
            self.failures = 0;
            self.wait_until = None;
        }
    }

    /// An admin fixed the cause: submit as usual now.
    pub fn clear(&mut self) {
        self.failures = 0;
        self.wait_until = None;
        self.proven = false;
    }

    /// What may be submitted at `now`, with `unproven` replica jobs alive
    /// that have not served yet.
    pub fn allowance(&self, now: Duration, unproven: usize) -> Allowance {
        if self.failures == 0 || self.proven {
            return Allowance::Any;
        }
        match self.wait_until {
            Some(t) if now < t => Allowance::None { until: Some(t) },
            _ if unproven > 0 => Allowance::None { until: None },
            _ => Allowance::One,
        }
    }

    /// Failed starts in a row (0: not backing off).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn last(&self) -> Option<&FailedStart> {
        self.last.as_ref()
    }

    /// When the next submission may go, while backing off.
    pub fn next_attempt(&self) -> Option<Duration> {
        (self.failures > 0 && !self.proven).then_some(self.wait_until).flatten()
    }

    /// Backing off: failures in a row and no replica has served since.
    pub fn active(&self) -> bool {
        self.failures > 0 && !self.proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn fail(b: &mut StartBackoff, at: Duration) {
        b.failed(at, FailedStart { job: 1, at, cause: "killed by SIGSEGV".into() });
    }

    #[test]
    fn waits_double_up_to_the_cap() {
        let b = StartBackoff::new(BackoffPolicy::default());
        let d: Vec<u64> = (1..=8).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(d, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.delay(1000), 300 * S);
    }

    /// A server that dies 2 s after each start, replaced as soon as
    /// allowed: at most a handful of jobs in the first five minutes, and
    /// one submission every five minutes after that.
    #[test]
    fn a_crash_loop_submits_a_handful_of_jobs_in_five_minutes() {
        let mut b = StartBackoff::new(BackoffPolicy::default());
        let mut submitted = Vec::new();
        let mut alive: Option<Duration> = None;
        let mut t = Duration::ZERO;
        while t < 3600 * S {
            if let Some(started) = alive {
                if t >= started + 2 * S {
                    fail(&mut b, t);
                    alive = None;
                }
            }
            b.observe(t, false);
            match b.allowance(t, alive.iter().count()) {
                Allowance::Any | Allowance::One if alive.is_none() => {
                    submitted.push(t.as_secs());
                    alive = Some(t);
                }
                _ => {}
            }
            t += S;
        }
        let first_five = submitted.iter().filter(|s| **s < 300).count();
        assert!(first_five <= 6, "{submitted:?}");
        let last_hour = submitted.iter().filter(|s| **s >= 600).count();
        assert!(last_hour <= 3000 / 300 + 1, "{submitted:?}");
        assert_eq!(b.total(), (submitted.len() - usize::from(alive.is_some())) as u64);
    }

    #[test]
    fn a_probe_at_a_time_and_serving_ends_the_wait_but_not_the_count() {
        let mut b = StartBackoff::new(BackoffPolicy::default());
        assert_eq!(b.allowance(Duration::ZERO, 0), Allowance::Any);
        fail(&mut b, 100 * S);
        fail(&mut b, 101 * S);
        assert_eq!(b.failures(), 2);
        assert_eq!(b.allowance(110 * S, 0), Allowance::None { until: Some(121 * S) });
        assert_eq!(b.next_attempt(), Some(121 * S));
        assert_eq!(b.allowance(121 * S, 0), Allowance::One);
        assert_eq!(b.allowance(121 * S, 1), Allowance::None { until: None }, "the probe is in flight");
        // The probe serves: scale as usual, but the failures stay counted...
        b.observe(130 * S, true);
        assert_eq!(b.allowance(130 * S, 1), Allowance::Any);
        assert!(!b.active());
        // ...so a crash a minute in backs off further (the third wait: 40 s).
        fail(&mut b, 190 * S);
        assert_eq!(b.allowance(200 * S, 0), Allowance::None { until: Some(230 * S) });
        // Serving for reset_after forgets them.
        b.observe(240 * S, true);
        b.observe(840 * S, true);
        assert_eq!(b.failures(), 0);
        fail(&mut b, 900 * S);
        assert_eq!(b.next_attempt(), Some(910 * S));
        assert_eq!(b.last().unwrap().cause, "killed by SIGSEGV");
    }

    #[test]
    fn an_admin_ends_it_at_once() {
        let mut b = StartBackoff::new(BackoffPolicy::default());
        for i in 0..6 {
            fail(&mut b, i * S);
        }
        assert!(matches!(b.allowance(10 * S, 0), Allowance::None { .. }));
        b.clear();
        assert_eq!(b.allowance(10 * S, 0), Allowance::Any);
        assert_eq!(b.total(), 6);
        assert_eq!(b.last().unwrap().job, 1, "the last cause stays for status");
    }
}
