//! onepoold's Slurm side for one endpoint with `[endpoint.replicas]`: every
//! poll it reads the jobs from Slurm, keeps only the replica jobs this
//! daemon owns, brings running ones into the router, feeds the router's
//! load to the autoscaler and carries out what
//! [`onepool_decisions::replicas::reconcile`] decides (submit, drain,
//! cancel).
//!
//! **Ownership.** A job is this endpoint's replica only when all hold: its
//! name is `onepool-<endpoint>-<port>` with the port in `port_range`, it
//! was submitted by the daemon's own uid, and job_submit/onepool's record
//! (in `admin_comment`, which users cannot set) names this endpoint and the
//! baseline or supplemental class. Nothing else is ever cancelled, drained
//! or routed to. The port in the name is how a restarted daemon finds the
//! replica's listener again, so restarts re-adopt replicas instead of
//! duplicating or orphaning them.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onepool_decisions::autoscale::{Autoscaler, ScalingPolicy};
use onepool_decisions::backoff::{BackoffPolicy, StartBackoff};
use onepool_decisions::replicas::Kind;
use onepool_launcher::conventions::port_from_name;
use onepool_router::endpoint::{Endpoint, EndpointSnapshot};
use onepool_router::metrics::Metrics;
use onepool_router::registry::ReplicaState;
use onepool_slurm_commands::adapter::{Slurm, SlurmError};
use tokio::sync::watch;

use crate::config::ReplicaSettings;
use crate::controller::tracked::{EndedJob, Seen, TakerSearch, TrackedJob};
use crate::round_error::RoundError;

mod act;
mod decisions;
mod ending;
mod failures;
mod observe;
mod reclaims;
mod sbatch;
mod tracked;
mod view;

pub use sbatch::{launcher_end, owned, sbatch_args};
pub use view::{
    ControllerView, FailedStartView, JobPhase, ReclaimMode, ReclaimView, ReplicaJob, ReplicaKind, StartFailures,
    RECENT_RECLAIMS,
};

/// The Slurm adapter the controllers share (called on blocking threads).
pub type SharedSlurm = Arc<dyn Slurm + Send + Sync>;

pub struct Controller {
    name: String,
    endpoint: Arc<Endpoint>,
    /// Replicas join as "starting" and wait for health checks when true.
    health_checked: bool,
    settings: ReplicaSettings,
    slurm: SharedSlurm,
    uid: u32,
    tracked: BTreeMap<u32, TrackedJob>,
    autoscaler: Autoscaler,
    /// With a `lower_workload`: the same rule fed the load of the
    /// endpoint's own class and those above it only, so that the replicas
    /// the lower classes' load alone asks for are theirs (issue #44).
    own_autoscaler: Option<Autoscaler>,
    started: Instant,
    /// Live replicas found at the first poll: kept until the scale-down
    /// delay has passed, so a restart does not shrink the endpoint.
    adopted: Option<u32>,
    /// Slots named by a job of onepoold's user in the last read of the
    /// queue, this endpoint's replica or not (a job submitted by hand, one
    /// of an older configuration): Slurm's singleton dependency would hold
    /// a new replica of that name behind it, so such a slot is not free.
    named_slots: std::collections::BTreeSet<u16>,
    submit_after: Option<Instant>,
    /// Requests served by all replicas at the last poll, and when.
    last_served: Option<(u64, Instant)>,
    /// Reads the replicas' own load metrics (endpoints with `load_metrics`).
    scraper: Option<crate::replica_metrics::Scraper>,
    view: Arc<Mutex<ControllerView>>,
    metrics: Arc<Metrics>,
    /// The admin comment of each job [`Controller::read_records`] read.
    records: HashMap<u32, String>,
    /// Why replica control stopped: a job this controller submitted came
    /// back without job_submit/onepool's record for this endpoint, so
    /// every poll would take it for a missing replica and submit another.
    halted: Option<String>,
    /// Failed starts and when the next submission may go.
    backoff: StartBackoff,
    /// Reclaimed replicas whose taker is being looked for.
    takers: Vec<TakerSearch>,
    /// Replica jobs that left the queue and whose record is still to be
    /// read (a failed read is tried again at the next poll).
    ended: Vec<EndedJob>,
    /// Per-node replicas whose step ended while their job runs on (job,
    /// slot): why is read from the launcher's note.
    step_ends: Vec<(u32, u16)>,
    /// Where each decision is written (`[decision_log]`).
    decision_log: Option<Arc<onepool_router::line_log::LineLog>>,
    /// Advisory mode: what was wanted at the last poll.
    advice: onepool_decisions::decision_log::Advice,
    /// What the last decision saw.
    seen: Seen,
    /// The count change the latency rule last asked for (ready, want), as
    /// logged.
    said_latency: Option<(u32, u32)>,
    /// Advisory mode: the router's replicas no job of ours holds, in the
    /// order [`Controller::untracked_replicas`] numbered them.
    untracked: Vec<SocketAddr>,
    /// Whether this onepoold acts on Slurm, asked before each command
    /// that changes a job ([`crate::leader`]; alone, it always does).
    leadership: Arc<crate::leader::Leadership>,
}

/// Runs one Slurm call on a blocking thread (the commands wait for
/// slurmctld) and counts its outcome for `endpoint` as `call`.
async fn blocking<T: Send + 'static>(
    metrics: &Metrics,
    endpoint: &str,
    call: &str,
    f: impl FnOnce() -> Result<T, SlurmError> + Send + 'static,
) -> Result<T, RoundError> {
    let (r, outcome) = match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => (Ok(v), "ok"),
        Ok(Err(e)) => {
            let outcome = if e.is_retryable() { "retryable" } else { "failed" };
            (Err(RoundError::Slurm { context: None, source: e }), outcome)
        }
        Err(e) => (Err(RoundError::Call { context: None, source: e }), "failed"),
    };
    metrics.count_slurm_call(endpoint, call, outcome);
    r
}

/// Requests wait and no replica can take them: the endpoint is starting
/// from zero (or every replica it had is gone).
fn cold_waiting(snap: &EndpointSnapshot) -> bool {
    snap.queued > 0 && !snap.replicas.iter().any(|r| r.state == ReplicaState::Ready)
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn kind_name(k: Kind) -> ReplicaKind {
    match k {
        Kind::Baseline => ReplicaKind::Baseline,
        Kind::Supplemental => ReplicaKind::Supplemental,
        Kind::Warm => ReplicaKind::Warm,
        Kind::Lower => ReplicaKind::Lower,
    }
}

/// Which port each node's replica listens on: `known` (the steps' names,
/// then what was seen before) says it; a node never seen with a port gets
/// the one the launcher gives the node at that position in the job's
/// first node list, unless another replica of the job has it.
pub fn member_ports(base: u16, nodes: &[String], known: &[(String, u16)]) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = Vec::new();
    let mut taken: Vec<u16> = known.iter().filter(|(n, _)| nodes.contains(n)).map(|(_, p)| *p).collect();
    for (i, node) in nodes.iter().enumerate() {
        if let Some((_, p)) = known.iter().find(|(n, _)| n == node) {
            out.push((node.clone(), *p));
            continue;
        }
        let port = (i..i + nodes.len() + 1)
            .chain(0..i)
            .filter_map(|k| onepool_launcher::replica_group::port_of(base, k))
            .find(|p| !taken.contains(p));
        if let Some(p) = port {
            taken.push(p);
            out.push((node.clone(), p));
        }
    }
    out
}

impl Controller {
    pub fn new(
        name: &str,
        endpoint: Arc<Endpoint>,
        health_checked: bool,
        settings: ReplicaSettings,
        slurm: SharedSlurm,
    ) -> (Controller, Arc<Mutex<ControllerView>>) {
        let view = Arc::new(Mutex::new(ControllerView::default()));
        let settings_has_metrics = !settings.load_metrics.is_empty();
        // A scrape never holds a poll up for longer than about a poll.
        let scrape_timeout = settings.poll_interval.clamp(Duration::from_millis(200), Duration::from_secs(2));
        let policy = ScalingPolicy {
            target_per_replica: settings.target_per_replica,
            min: settings.min,
            max: settings.max,
            stable_window: settings.stable_window,
            panic_window: settings.panic_window,
            panic_threshold: settings.panic_threshold,
            scale_down_delay: settings.scale_down_delay,
            trend_horizon: settings.trend_horizon,
        };
        let own_autoscaler = settings.lower_workload.is_some().then(|| Autoscaler::new(policy.clone()));
        let autoscaler = match &settings.latency {
            Some(targets) => {
                endpoint.sample_latencies();
                Autoscaler::with_latency(policy, targets.clone())
            }
            None => Autoscaler::new(policy),
        };
        let metrics = endpoint.metrics().clone();
        let scraper =
            settings_has_metrics.then(|| crate::replica_metrics::client(scrape_timeout, endpoint.replica_key()));
        let c = Controller {
            name: name.to_string(),
            endpoint,
            health_checked,
            settings,
            slurm,
            uid: onepool_os::getuid(),
            tracked: BTreeMap::new(),
            autoscaler,
            own_autoscaler,
            started: Instant::now(),
            adopted: None,
            named_slots: std::collections::BTreeSet::new(),
            submit_after: None,
            last_served: None,
            scraper,
            view: view.clone(),
            metrics,
            records: HashMap::new(),
            halted: None,
            backoff: StartBackoff::new(BackoffPolicy::default()),
            takers: Vec::new(),
            ended: Vec::new(),
            step_ends: Vec::new(),
            decision_log: None,
            advice: Default::default(),
            seen: Seen::default(),
            untracked: Vec::new(),
            said_latency: None,
            leadership: crate::leader::Leadership::single(name, None),
        };
        c.view.lock().unwrap_or_else(|e| e.into_inner()).advisory = c.settings.advisory;
        (c, view)
    }

    /// Acts on Slurm only while `leadership` says this instance may.
    pub fn set_leadership(&mut self, leadership: Arc<crate::leader::Leadership>) {
        self.leadership = leadership;
    }

    /// Writes every decision to `log` too.
    pub fn set_decision_log(&mut self, log: Arc<onepool_router::line_log::LineLog>) {
        self.decision_log = Some(log);
    }

    fn per_node(&self) -> bool {
        self.settings.replicas_per_job > 1
    }

    /// Polls until `shutdown` turns true. Stopping leaves every replica job
    /// running: the next start re-adopts them.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        // A fixed beat from the daemon's start, not a pause after each poll:
        // controllers with the same interval stay in step and share their
        // reads of Slurm (adapter::Coalesced).
        let mut beat = tokio::time::interval(self.settings.poll_interval.max(Duration::from_millis(1)));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let endpoint = self.endpoint.clone();
        // Scale from zero: while requests wait and no replica is ready,
        // every step of the first replica's start is waited on by a
        // client, so polls come this often (bounded: 0.1-1 s) instead of
        // once a poll interval, and the first comes as the request does.
        let cold_gap = (self.settings.poll_interval / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut last_round = Instant::now();
        loop {
            let cold = cold_waiting(&endpoint.snapshot());
            tokio::select! {
                _ = beat.tick() => {}
                _ = endpoint.cold_request(), if !cold => {
                    tracing::debug!(endpoint = %self.name, "a request waits and no replica is ready: polling now");
                    if let Some(left) = cold_gap.checked_sub(last_round.elapsed()) {
                        tokio::time::sleep(left).await;
                    }
                }
                _ = tokio::time::sleep(cold_gap.saturating_sub(last_round.elapsed())), if cold => {}
                _ = onepool_router::shutdown::stopped(&mut shutdown) => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let error = self.round().await.err();
            last_round = Instant::now();
            if let Some(e) = &error {
                tracing::warn!(endpoint = %self.name, retryable = e.is_retryable(), "replica controller: {e}");
            }
            {
                let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
                v.rounds += 1;
                v.last_error = error.map(|e| e.to_string());
                v.start_failures = self.start_failures_view();
                v.jobs = self.jobs_view();
                v.min = self.settings.min;
                v.max = self.settings.max;
                self.export(&v);
            }
        }
    }

    fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.started)
    }

    /// A moment as Unix seconds (the back-off counts from the daemon's start).
    fn unix_at(&self, since_start: Duration) -> u64 {
        let now = self.since_start(Instant::now());
        match since_start.checked_sub(now) {
            Some(ahead) => unix_now() + ahead.as_secs(),
            None => unix_now().saturating_sub((now - since_start).as_secs()),
        }
    }

    /// One poll: read, adopt, route, decide, act.
    async fn round(&mut self) -> Result<(), RoundError> {
        let retry = std::mem::take(&mut self.view.lock().unwrap_or_else(|e| e.into_inner()).retry_requested);
        if retry && self.backoff.failures() > 0 {
            tracing::info!(endpoint = %self.name, "start back-off ended by request; submitting as usual");
            self.backoff.clear();
        }
        let jobs = self.read().await?;
        self.named_slots =
            jobs.iter().filter(|j| j.user_id == self.uid).filter_map(|j| port_from_name(&self.name, &j.name)).collect();
        // The poll's time: when Slurm's answer came.
        let now = Instant::now();
        let seen = self.adopt(jobs).await?;
        if !self.takers.is_empty() {
            self.find_takers().await;
        }
        self.read_notes().await?;
        if !self.step_ends.is_empty() {
            self.settle_step_ends().await?;
        }
        self.route_running().await?;
        if self.adopted.is_none() {
            // Warm replicas are headroom, not load: counting them would
            // have a restart submit supplementals to match.
            // Nor do jobs about to be cancelled for another's slot.
            let surplus = self.surplus_in_slots();
            let load_bearing =
                self.tracked.iter().filter(|(id, t)| t.kind != Kind::Warm && !surplus.contains(id)).map(|(_, t)| t);
            let n = load_bearing.flat_map(|t| t.members.values()).filter(|m| !m.released && !m.draining());
            self.adopted = Some(n.count() as u32);
        }
        let snap = self.endpoint.snapshot();
        self.note_serving(&snap, now);
        let mut replicas = self.replicas(&seen, &snap, now);
        if self.settings.advisory {
            replicas.extend(self.untracked_replicas(&snap));
        }
        let desired = self.decide(&snap, &replicas, now).await;
        if !self.settings.advisory && !self.leadership.may_act() {
            // A follower routes to what Slurm's records show and leaves
            // Slurm to the acting instance; at a takeover it acts on the
            // state it has kept up to date.
            return Ok(());
        }
        self.act(desired, &replicas).await
    }

    /// Marks the jobs whose replicas serve (the router has them in), and
    /// tells the back-off whether any does.
    fn note_serving(&mut self, snap: &EndpointSnapshot, now: Instant) {
        let serving_at = |a: SocketAddr| {
            snap.replicas.iter().any(|r| r.address == a && matches!(r.state, ReplicaState::Ready | ReplicaState::Out))
        };
        let mut any = false;
        for t in self.tracked.values_mut() {
            if t.members.values().any(|m| m.address.is_some_and(serving_at)) {
                t.served_at.get_or_insert(now);
                any = true;
            }
        }
        let at = self.since_start(now);
        self.backoff.observe(at, any);
    }
}

#[cfg(test)]
#[path = "../controller_tests.rs"]
mod tests;

#[cfg(test)]
mod leader_tests;
