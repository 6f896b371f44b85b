//! What onepoold decided for an endpoint's replicas and why (issue #28):
//! one JSON line per decision in the decision log, written by the daemon
//! and read back by `onepool report`.
//!
//! The same record serves both modes. Acting, onepoold writes what it did
//! (a submission sent, a drain begun, GPUs given back). In **advisory**
//! mode it acts on nothing and writes what it would have done, so an admin
//! trials the autoscaler on live traffic the way the policy's audit mode
//! trials the plugin. An advisory decision is written when it first
//! appears, not again every poll while it stays wanted ([`Advice`]): a
//! would-be submission that nobody carries out is otherwise wanted again
//! every two seconds, and the log would say nothing new a thousand times.
//!
//! [`explain`] gives the reason from what the decision saw: the pure
//! `reconcile` returns only what to do, and the reason is needed in the
//! log line, the metrics' labels stay few (action and mode).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::replicas::{Action, EndpointTarget, Kind, Phase, Replica};

/// Whether onepoold carried the decision out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionMode {
    Act,
    Advisory,
}

impl DecisionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionMode::Act => "act",
            DecisionMode::Advisory => "advisory",
        }
    }
}

/// What was decided, by its effect on Slurm or the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionAction {
    /// sbatch of a replica job.
    Submit,
    /// Out of the router, in-flight requests finish.
    Drain,
    /// The replica's GPUs back to Slurm (scancel, or a shrink).
    Release,
}

impl DecisionAction {
    pub const ALL: [DecisionAction; 3] = [DecisionAction::Submit, DecisionAction::Drain, DecisionAction::Release];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionAction::Submit => "submit",
            DecisionAction::Drain => "drain",
            DecisionAction::Release => "release",
        }
    }

    /// As a report says it was done.
    pub fn past(self) -> &'static str {
        match self {
            DecisionAction::Submit => "submitted",
            DecisionAction::Drain => "drained",
            DecisionAction::Release => "released",
        }
    }

    pub fn of(a: &Action) -> DecisionAction {
        match a {
            Action::Submit(_) => DecisionAction::Submit,
            Action::Drain { .. } => DecisionAction::Drain,
            Action::Release { .. } => DecisionAction::Release,
        }
    }
}

/// One line of the decision log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionEntry {
    /// When it was decided (UTC, [`crate::trace::format_time_ms`]).
    pub time: String,
    pub endpoint: String,
    pub mode: DecisionMode,
    pub action: DecisionAction,
    /// The replica class: "baseline", "supplemental" or "warm".
    pub kind: String,
    /// The replica it concerns (none for a submission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Where the replica serves, when the router has it (an advisory
    /// endpoint's replicas may be the admin's own, with no job of onepoold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Why, in words an admin reads.
    pub why: String,
    /// Replicas the autoscaler wanted, and those serving, at the time.
    pub desired: u32,
    pub serving: u32,
    /// In flight plus queued, as the autoscaler saw it.
    pub load: f64,
    /// The onepoold instance that decided (`[ha] instance`, the host name
    /// by default; absent in logs of onepoold before issue #37).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

pub fn kind_str(k: Kind) -> &'static str {
    match k {
        Kind::Baseline => "baseline",
        Kind::Supplemental => "supplemental",
        Kind::Warm => "warm",
        Kind::Lower => "lower-class",
    }
}

/// Why `reconcile` asked for `action`, from the replicas and target it saw.
pub fn explain(action: &Action, replicas: &[Replica], target: &EndpointTarget) -> String {
    let live = |k: Kind| replicas.iter().filter(|r| r.kind == k && r.phase != Phase::Draining).count();
    let serving = replicas.iter().filter(|r| r.phase == Phase::Serving).count();
    match *action {
        Action::Submit(Kind::Baseline) => {
            format!("min = {} baseline replicas, {} live", target.min, live(Kind::Baseline))
        }
        Action::Submit(Kind::Supplemental) => format!(
            "the load wants {} replicas, {} live ({} serving)",
            target.desired.clamp(target.min, target.max.max(target.min)),
            live(Kind::Baseline) + live(Kind::Supplemental),
            serving
        ),
        Action::Submit(Kind::Lower) => format!(
            "the load wants {} replicas, {} of them only for request classes below the endpoint's own; {} lower-class live",
            target.desired.clamp(target.min, target.max.max(target.min)),
            target.lower,
            live(Kind::Lower)
        ),
        Action::Submit(Kind::Warm) => match target.headroom {
            Some(h) => {
                format!("warm headroom of {} replicas above the load's, {} warm live", h.replicas, live(Kind::Warm))
            }
            None => "warm headroom".to_string(),
        },
        Action::Drain { job, slot } | Action::Release { job, slot } => {
            let Some(r) = replicas.iter().find(|r| (r.job, r.slot) == (job, slot)) else {
                return "a replica no longer seen".to_string();
            };
            replica_reason(action, r, replicas, target)
        }
    }
}

fn replica_reason(action: &Action, r: &Replica, replicas: &[Replica], target: &EndpointTarget) -> String {
    let draining = matches!(action, Action::Drain { .. });
    if r.being_preempted {
        return "Slurm is preempting its job for higher-priority work".to_string();
    }
    if r.phase == Phase::Draining && !draining {
        return format!("drained ({} requests in flight)", r.in_flight);
    }
    if r.phase == Phase::Starting && r.starting_for > target.startup_timeout {
        return format!(
            "not healthy after {} s (startup_timeout {} s)",
            r.starting_for.as_secs(),
            target.startup_timeout.as_secs()
        );
    }
    if r.time_left.is_some_and(|t| t <= target.renew_before) {
        let left = r.time_left.map_or(0, |t| t.as_secs());
        return format!("{left} s to its time limit; a successor takes over");
    }
    if r.kind == Kind::Warm && target.headroom.is_some_and(|h| h.gpus_wanted) {
        return "warm headroom yields: a job waits for the pool's GPUs".to_string();
    }
    let pending = if r.phase == Phase::Pending { " (pending)" } else { "" };
    if r.kind == Kind::Lower {
        let live = replicas.iter().filter(|x| x.phase != Phase::Draining && x.kind == Kind::Lower).count();
        return format!(
            "scale-down{pending}: request classes below the endpoint's own want {} of its replicas, {live} lower-class live",
            target.lower
        );
    }
    let live = replicas.iter().filter(|x| x.phase != Phase::Draining && x.kind != Kind::Warm).count();
    format!(
        "scale-down{pending}: the load wants {} replicas, {live} live",
        target.desired.clamp(target.min, target.max.max(target.min))
    )
}

/// An advisory endpoint's decisions from one poll to the next: which are
/// new (to be written) and how many of each action are wanted now (the
/// gauge). A decision is the same while its action, class and replica are.
#[derive(Debug, Default)]
pub struct Advice {
    wanted: BTreeMap<AdviceKey, u32>,
}

/// A decision's identity: action, class (submissions) and replica (job, slot).
type AdviceKey = (DecisionAction, &'static str, Option<(u32, u16)>);

impl Advice {
    /// Takes this poll's actions; returns those not wanted at the last
    /// poll (a second submission of a class counts as new).
    pub fn update<'a>(&mut self, actions: &'a [Action]) -> Vec<&'a Action> {
        let mut now: BTreeMap<_, u32> = BTreeMap::new();
        let mut new = Vec::new();
        for a in actions {
            let key = Self::key(a);
            let n = now.entry(key).or_default();
            *n += 1;
            if *n > self.wanted.get(&key).copied().unwrap_or(0) {
                new.push(a);
            }
        }
        self.wanted = now;
        new
    }

    /// How many actions of each kind are wanted now.
    pub fn counts(&self) -> BTreeMap<DecisionAction, u32> {
        let mut out: BTreeMap<DecisionAction, u32> = DecisionAction::ALL.iter().map(|a| (*a, 0)).collect();
        for ((a, _, _), n) in &self.wanted {
            *out.entry(*a).or_default() += n;
        }
        out
    }

    fn key(a: &Action) -> AdviceKey {
        match *a {
            Action::Submit(k) => (DecisionAction::Submit, kind_str(k), None),
            Action::Drain { job, slot } => (DecisionAction::Drain, "", Some((job, slot))),
            Action::Release { job, slot } => (DecisionAction::Release, "", Some((job, slot))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicas::{reconcile, Headroom};
    use std::time::Duration;

    fn replica(job: u32, kind: Kind, phase: Phase) -> Replica {
        Replica {
            job,
            slot: 18000,
            pinned: false,
            kind,
            phase,
            in_flight: 0,
            age: Duration::from_secs(100),
            starting_for: Duration::ZERO,
            time_left: None,
            being_preempted: false,
        }
    }

    fn target(min: u32, desired: u32) -> EndpointTarget {
        EndpointTarget {
            min,
            max: 4,
            desired,
            renew_before: Duration::from_secs(120),
            startup_timeout: Duration::from_secs(60),
            headroom: None,
            lower: 0,
        }
    }

    #[test]
    fn reasons_name_what_the_decision_saw() {
        let rs = vec![replica(1, Kind::Baseline, Phase::Serving), replica(2, Kind::Supplemental, Phase::Serving)];
        let t = target(1, 3);
        let actions = reconcile(&t, &rs);
        assert_eq!(actions, vec![Action::Submit(Kind::Supplemental)]);
        assert_eq!(explain(&actions[0], &rs, &t), "the load wants 3 replicas, 2 live (2 serving)");

        let t = target(1, 1);
        let actions = reconcile(&t, &rs);
        assert_eq!(actions, vec![Action::Drain { job: 2, slot: 18000 }]);
        assert_eq!(explain(&actions[0], &rs, &t), "scale-down: the load wants 1 replicas, 2 live");

        let mut preempted = rs.clone();
        preempted[1].being_preempted = true;
        let a = Action::Drain { job: 2, slot: 18000 };
        assert_eq!(explain(&a, &preempted, &t), "Slurm is preempting its job for higher-priority work");

        let mut stuck = rs.clone();
        stuck[1].phase = Phase::Starting;
        stuck[1].starting_for = Duration::from_secs(75);
        let a = Action::Release { job: 2, slot: 18000 };
        assert_eq!(explain(&a, &stuck, &t), "not healthy after 75 s (startup_timeout 60 s)");

        let none: Vec<Replica> = Vec::new();
        assert_eq!(explain(&Action::Submit(Kind::Baseline), &none, &target(1, 1)), "min = 1 baseline replicas, 0 live");
        let mut warm = target(1, 1);
        warm.headroom = Some(Headroom { replicas: 1, gpus_wanted: true });
        let w = vec![replica(3, Kind::Warm, Phase::Serving)];
        let a = Action::Drain { job: 3, slot: 18000 };
        assert_eq!(explain(&a, &w, &warm), "warm headroom yields: a job waits for the pool's GPUs");
    }

    #[test]
    fn advice_writes_a_decision_once_while_it_stays_wanted() {
        let mut a = Advice::default();
        let two = [Action::Submit(Kind::Supplemental), Action::Submit(Kind::Supplemental)];
        assert_eq!(a.update(&two).len(), 2, "both are new");
        assert_eq!(a.update(&two).len(), 0, "the same two again: nothing new");
        let three = [
            Action::Submit(Kind::Supplemental),
            Action::Submit(Kind::Supplemental),
            Action::Submit(Kind::Supplemental),
        ];
        assert_eq!(a.update(&three).len(), 1, "a third is new");
        assert_eq!(a.counts()[&DecisionAction::Submit], 3);
        assert_eq!(a.update(&[]).len(), 0);
        assert_eq!(a.counts()[&DecisionAction::Submit], 0, "nothing wanted: the gauge reads 0");
        let drain = [Action::Drain { job: 7, slot: 1 }];
        assert_eq!(a.update(&drain).len(), 1);
        assert_eq!(a.update(&[Action::Drain { job: 8, slot: 1 }]).len(), 1, "another replica is another decision");
    }

    #[test]
    fn an_entry_keeps_its_wire_names() {
        let e = DecisionEntry {
            time: "2026-12-05T10:00:00.000Z".into(),
            endpoint: "chat".into(),
            mode: DecisionMode::Advisory,
            action: DecisionAction::Submit,
            kind: "supplemental".into(),
            job: None,
            port: None,
            replica: None,
            why: "the load wants 3 replicas, 2 live (2 serving)".into(),
            desired: 3,
            serving: 2,
            load: 21.5,
            instance: Some("svc-a".into()),
        };
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.contains(r#""instance":"svc-a""#), "the instance that decided: {line}");
        assert!(line.contains(r#""mode":"advisory""#) && line.contains(r#""action":"submit""#), "{line}");
        assert!(!line.contains("job"), "no replica for a submission: {line}");
        assert_eq!(serde_json::from_str::<DecisionEntry>(&line).unwrap(), e);
        assert!(serde_json::from_str::<DecisionEntry>(&line.replace("\"why\"", "\"reason\"")).is_err());
    }
}
