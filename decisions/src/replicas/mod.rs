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
//!
//! **Warm headroom** ([`Headroom`], issue #18). A model loads in tens of
//! seconds to minutes, so replicas submitted when a burst begins arrive
//! after it. An endpoint with headroom keeps extra replicas loaded on pool
//! GPUs nobody else is waiting for, in the lowest-ranked (warm) class, so
//! that a burst lands on replicas already serving. Slurm's preemption, not
//! onepoold, takes those GPUs back: every other class outranks the warm
//! one, and an idle replica drains at once. Scale-down then depends on
//! whether any job waits for GPUs: while none does, supplemental replicas
//! the load no longer needs stay (and count as headroom); once one waits,
//! they are drained as without headroom. At `max`, warm replicas carry load
//! instead of being replaced (a replacement would cost a model load while
//! the warm one serves); if Slurm takes one, a supplemental one follows.
//!
//! A replica is one server on one node. A job may host several, one per
//! node (`replicas_per_job`): [`reconcile`] decides per replica, and
//! [`plan_releases`] turns the replicas to release into what Slurm is told
//! (scancel the job once none of its replicas is left, else shrink it to
//! the nodes still serving). Slurm refuses to release a job's batch host
//! ("Invalid node name specified"), so the replica there is `pinned`: it
//! is scaled down last in its job.

use std::time::Duration;

mod jobs;

pub use jobs::{pack_submissions, plan_releases, JobLayout, Release};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Counts toward `min`; protected class.
    Baseline,
    /// Above `min`; flexible class, reclaimable.
    Supplemental,
    /// Headroom above the load's need; lowest-ranked flexible class, taken
    /// by Slurm for any other work.
    Warm,
    /// Above `min`, for the demand only request classes below the
    /// endpoint's own bring (issue #44): in such a class (agents, say), so
    /// that the capacity their requests ask for is reclaimed as theirs,
    /// first, and never borrows the endpoint's own class's place.
    Lower,
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
    /// Which of the job's replicas (unique within the endpoint: the
    /// daemon uses the replica's port).
    pub slot: u16,
    /// Runs on its job's batch host while the job has other live replicas:
    /// it can only go with the whole job.
    pub pinned: bool,
    pub kind: Kind,
    pub phase: Phase,
    pub in_flight: u32,
    /// Seconds since it started running (0 while pending): younger
    /// replicas go first on scale-down.
    pub age: Duration,
    /// How long it has been starting as far as the daemon knows: since it
    /// started running, or since the daemon first saw it running if that is
    /// later (a restarted daemon re-checks the health of replicas whose
    /// model loaded long ago).
    pub starting_for: Duration,
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
    /// Warm headroom; `None`: surplus replicas are drained as soon as the
    /// autoscaler no longer wants them.
    pub headroom: Option<Headroom>,
    /// Of `desired`, the replicas only lower request classes' demand asks
    /// for ([`Kind::Lower`]; 0 without such classes). The endpoint's own
    /// class's replicas come first: at most `desired - min` are lower.
    pub lower: u32,
}

/// An endpoint's warm headroom this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    /// Replicas wanted above `desired` ([`WarmSpec::replicas_above`]);
    /// `max` bounds them with the rest.
    pub replicas: u32,
    /// A pending job other than a warm replica waits for the pool's GPUs:
    /// no warm replica is submitted, pending ones are withdrawn, and
    /// surplus replicas are drained.
    pub gpus_wanted: bool,
}

/// How much warm headroom an endpoint asks for: at least `replicas` idle
/// replicas, and at least `fraction` of the replicas its load needs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WarmSpec {
    pub replicas: u32,
    pub fraction: f64,
}

impl WarmSpec {
    /// Warm replicas wanted when the load needs `desired`.
    pub fn replicas_above(&self, desired: u32) -> u32 {
        let by_fraction = (self.fraction.max(0.0) * f64::from(desired)).ceil();
        let by_fraction = if by_fraction >= f64::from(u32::MAX) { u32::MAX } else { by_fraction as u32 };
        self.replicas.max(by_fraction)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Submit(Kind),
    /// Take out of the router and let in-flight requests finish.
    Drain {
        job: u32,
        slot: u16,
    },
    /// Give the replica's GPUs back (after its drain, or one that never
    /// served): see [`plan_releases`].
    Release {
        job: u32,
        slot: u16,
    },
}

/// Live means it serves now or will: pending, starting or serving.
fn live(r: &Replica) -> bool {
    r.phase != Phase::Draining && !r.being_preempted
}

/// What leaves before anything is counted: Slurm's victims drain, model
/// loads that never finished and drains that have are released.
fn leaving_first(target: &EndpointTarget, replicas: &[Replica]) -> Vec<Action> {
    let mut actions = Vec::new();
    for r in replicas {
        if r.being_preempted && r.phase != Phase::Draining {
            actions.push(Action::Drain { job: r.job, slot: r.slot });
        } else if (r.phase == Phase::Starting && r.starting_for > target.startup_timeout)
            || (r.phase == Phase::Draining && r.in_flight == 0 && !r.being_preempted)
        {
            // A victim of Slurm's preemption is never cancelled here: its
            // launcher got the notice, counts what it still serves (the
            // router's count is only what the router sent it) and ends the
            // job when that is done, and GraceTime bounds the wait; a
            // scancel would cut whatever the router's count missed.
            actions.push(Action::Release { job: r.job, slot: r.slot });
        }
    }
    actions
}

pub fn reconcile(target: &EndpointTarget, replicas: &[Replica]) -> Vec<Action> {
    let desired = target.desired.clamp(target.min, target.max.max(target.min));
    let mut actions = leaving_first(target, replicas);
    let gone = |r: &Replica| {
        actions.iter().any(
            |a| matches!(a, Action::Release { job, slot } | Action::Drain { job, slot } if (*job, *slot) == (r.job, r.slot)),
        )
    };
    let alive: Vec<&Replica> = replicas.iter().filter(|r| live(r) && !gone(r)).collect();
    // Replicas near their time limit get a successor; once every successor
    // serves, the old one drains.
    let expiring: Vec<&Replica> = alive
        .iter()
        .copied()
        .filter(|r| r.phase == Phase::Serving && r.time_left.is_some_and(|t| t <= target.renew_before))
        .collect();
    let is_expiring = |r: &Replica| expiring.iter().any(|e| (e.job, e.slot) == (r.job, r.slot));
    let lasting =
        |kind: Kind| -> Vec<&Replica> { alive.iter().copied().filter(|r| r.kind == kind && !is_expiring(r)).collect() };
    let (base_lasting, supp, lower, warm) =
        (lasting(Kind::Baseline).len() as u32, lasting(Kind::Supplemental), lasting(Kind::Lower), lasting(Kind::Warm));
    let (supp_lasting, lower_lasting, warm_lasting) = (supp.len() as u32, lower.len() as u32, warm.len() as u32);
    let want_lower = target.lower.min(desired - target.min);
    let want_supp = desired - target.min - want_lower;
    let max = target.max.max(target.min);
    // Without headroom, GPUs count as wanted: surplus goes as it always did.
    let (want_warm, keep_idle, gpus_wanted) = match target.headroom {
        Some(h) => (h.replicas.min(max - desired), true, h.gpus_wanted),
        None => (0, false, true),
    };
    actions.extend((base_lasting..target.min).map(|_| Action::Submit(Kind::Baseline)));
    // Warm replicas hold their places within `max` (see the module's notes).
    let room = max.saturating_sub(target.min + supp_lasting + lower_lasting + warm_lasting);
    let supp_to_add = want_supp.saturating_sub(supp_lasting).min(room);
    actions.extend((0..supp_to_add).map(|_| Action::Submit(Kind::Supplemental)));
    let lower_to_add = want_lower.saturating_sub(lower_lasting).min(room - supp_to_add);
    actions.extend((0..lower_to_add).map(|_| Action::Submit(Kind::Lower)));
    // Expiring replicas whose successors already serve can go.
    let serving_lasting = |kind: Kind| {
        alive.iter().filter(|r| r.kind == kind && r.phase == Phase::Serving && !is_expiring(r)).count() as u32
    };
    let wanted = |kind: Kind| match kind {
        Kind::Baseline => target.min,
        Kind::Supplemental => want_supp,
        Kind::Lower => want_lower,
        Kind::Warm => want_warm,
    };
    let renewed = expiring.iter().filter(|e| serving_lasting(e.kind) >= wanted(e.kind));
    actions.extend(renewed.map(|e| Action::Drain { job: e.job, slot: e.slot }));
    // Scale down: release pending surplus first, then drain the cheapest.
    // A pinned replica's GPUs come back only with its whole job: last.
    // Surplus that already holds GPUs nobody waits for stays, as headroom.
    // Supplemental and lower-class replicas alike.
    let (mut kept_idle, mut above_leaving) = (0, 0);
    let idle_room = max.saturating_sub(base_lasting.max(target.min) + want_supp + want_lower);
    let above = |lasting, want, adding, kind| AboveMin { lasting, want, adding, serving: serving_lasting(kind) };
    let all = base_lasting.max(target.min) + supp_lasting + lower_lasting + supp_to_add + lower_to_add;
    let leaving = above_min_surplus(
        above(supp, want_supp, supp_to_add, Kind::Supplemental),
        above(lower, want_lower, lower_to_add, Kind::Lower),
        all > max,
    );
    for r in leaving {
        if r.phase != Phase::Pending && keep_idle && !gpus_wanted && kept_idle < idle_room {
            kept_idle += 1;
            continue;
        }
        above_leaving += 1;
        actions.push(let_go(r));
    }
    // Warm replicas: within max with the rest; while a job waits for GPUs,
    // only those the headroom or the load (at max) asks for, and none
    // pending (Slurm takes the running ones when it needs them).
    let others = all - above_leaving;
    let mut keep_warm = warm_lasting.min(max.saturating_sub(others));
    let warm = cheapest_first(warm);
    let mut leaving = warm_lasting - keep_warm;
    if gpus_wanted {
        let short = want_supp.saturating_sub(supp_lasting) + want_lower.saturating_sub(lower_lasting);
        keep_warm = keep_warm.min(want_warm + short);
        let pending = warm.iter().filter(|r| r.phase == Phase::Pending).count() as u32;
        leaving = pending.max(warm_lasting - keep_warm);
    }
    for r in warm.into_iter().take(leaving as usize) {
        actions.push(let_go(r));
    }
    if !gpus_wanted {
        let room = max.saturating_sub(others + warm_lasting);
        let n = want_warm.saturating_sub(warm_lasting + kept_idle).min(room);
        actions.extend((0..n).map(|_| Action::Submit(Kind::Warm)));
    }
    actions
}

/// One of the two kinds above min (supplemental, lower-class) this round.
struct AboveMin<'a> {
    lasting: Vec<&'a Replica>,
    want: u32,
    /// Submitted this round.
    adding: u32,
    /// Of `lasting`, those serving.
    serving: u32,
}

impl AboveMin<'_> {
    /// `max` left no room for all it wants.
    fn short_of_room(&self) -> bool {
        self.adding < self.want.saturating_sub(self.lasting.len() as u32)
    }
}

/// The replicas above min the load no longer wants, cheapest first: the
/// lower-class ones first (the endpoint's own class keeps what it asked
/// for). Handover: a replica of one kind serves on until the other kind's
/// new ones do, unless its place is needed within max (`over_max`: the
/// replicas kept and added pass it).
fn above_min_surplus<'a>(supp: AboveMin<'a>, lower: AboveMin<'a>, over_max: bool) -> Vec<&'a Replica> {
    let loading = |k: &AboveMin| if over_max || k.short_of_room() { 0 } else { k.want.saturating_sub(k.serving) };
    let (keep_supp, keep_lower) = (loading(&lower), loading(&supp));
    let mut out = surplus(lower.lasting, lower.want + keep_lower);
    out.extend(surplus(supp.lasting, supp.want + keep_supp));
    out
}

/// How a surplus replica leaves: one not yet serving has nothing in flight
/// to finish, so its GPUs come back at once; one serving drains first.
fn let_go(r: &Replica) -> Action {
    match r.phase {
        Phase::Pending | Phase::Starting => Action::Release { job: r.job, slot: r.slot },
        _ => Action::Drain { job: r.job, slot: r.slot },
    }
}

/// The `len - want` cheapest of `rs` (none when `want` covers them).
fn surplus(rs: Vec<&Replica>, want: u32) -> Vec<&Replica> {
    let n = (rs.len() as u32).saturating_sub(want) as usize;
    cheapest_first(rs).into_iter().take(n).collect()
}

/// Scale-down order: pending, then starting, then serving; a pinned one
/// last; the fewest requests in flight, then the youngest.
fn cheapest_first(mut rs: Vec<&Replica>) -> Vec<&Replica> {
    rs.sort_by_key(|r| (r.phase != Phase::Pending, r.phase == Phase::Serving, r.pinned, r.in_flight, r.age));
    rs
}

#[cfg(test)]
mod tests;
