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
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onepool_decisions::autoscale::{Autoscaler, ScalingPolicy};
use onepool_decisions::backoff::{Allowance, BackoffPolicy, FailedStart, StartBackoff};
use onepool_decisions::replicas::{
    pack_submissions, plan_releases, reconcile, Action, EndpointTarget, Headroom, JobLayout, Kind, Phase, Release,
    Replica,
};
use onepool_launcher::conventions::{job_name, port_from_name, ReplicaNote};
use onepool_launcher::replica_group::port_from_step_name;
use onepool_router::endpoint::{Endpoint, EndpointSnapshot};
use onepool_router::metrics::{EndpointLabels, Metrics, ReclaimLabels, ReplicaJobLabels};
use onepool_router::registry::{RegistryError, ReplicaState};
use onepool_slurm_commands::adapter::{Slurm, SlurmError};
use onepool_slurm_commands::state::JobInfo;
use serde::Serialize;
use tokio::sync::watch;

use crate::config::ReplicaSettings;
use crate::round_error::RoundError;

/// The Slurm adapter the controllers share (called on blocking threads).
pub type SharedSlurm = Arc<dyn Slurm + Send + Sync>;

/// The job's port and kind when the job is one of this endpoint's replicas
/// submitted by `uid`; `None` for every job onepoold must leave alone.
pub fn owned(job: &JobInfo, endpoint: &str, uid: u32, s: &ReplicaSettings) -> Option<(u16, Kind)> {
    if job.user_id != uid {
        return None;
    }
    let port = port_from_name(endpoint, &job.name)?;
    if port < s.port_range.0 || port >= s.port_range.1 {
        return None;
    }
    let record = job.record()?;
    if record.endpoint.as_deref() != Some(endpoint) {
        return None;
    }
    if record.class == s.baseline_workload {
        Some((port, Kind::Baseline))
    } else if record.class == s.supplemental_workload {
        Some((port, Kind::Supplemental))
    } else if s.warm.as_ref().is_some_and(|w| record.class == w.workload) {
        Some((port, Kind::Warm))
    } else {
        None
    }
}

fn quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// sbatch's arguments (after `--parsable`) for a job of `replicas`
/// replicas from `port` on: one replica on one node, or with
/// `replicas_per_job` above 1 one per node, each an srun step
/// ([`onepool_launcher::replica_group`]) on `port + 2i`.
pub fn sbatch_args(endpoint: &str, s: &ReplicaSettings, kind: Kind, port: u16, replicas: u32) -> Vec<String> {
    let class = match kind {
        Kind::Baseline => &s.baseline_workload,
        Kind::Supplemental => &s.supplemental_workload,
        Kind::Warm => s.warm.as_ref().map_or(&s.supplemental_workload, |w| &w.workload),
    };
    let drain_secs = s.drain_timeout.as_secs_f64().ceil().max(1.0) as u64;
    let drain = onepool_decisions::duration::format(Duration::from_secs(drain_secs));
    let launcher = quote(&s.launcher);
    // The slot names the job; the port is the kernel's choice on the node
    // (issue #25: a port from a known range could be taken first).
    let mut common = format!("--listen 0.0.0.0:0 --slot {port} --drain-timeout {drain}");
    if !s.serve_paths.is_empty() && s.serve_paths.iter().map(String::as_str).ne(onepool_launcher::access::DEFAULT_PATHS)
    {
        for p in &s.serve_paths {
            common.push_str(&format!(" --allow-path {}", quote(p)));
        }
    }
    let mut args = vec![
        "-J".to_string(),
        job_name(endpoint, port),
        format!("--workload={class}"),
        format!("--endpoint={endpoint}"),
    ];
    let script = if s.replicas_per_job > 1 {
        args.extend([
            format!("-N{}", replicas.max(1)),
            "--ntasks-per-node=1".to_string(),
            format!("--gpus-per-node={}", s.gpus),
            // A failed node leaves the job; the replicas on the others serve on.
            "--no-kill".to_string(),
        ]);
        format!("exec {launcher} replica --per-node {common} -- {}", s.command)
    } else {
        args.extend([format!("--gpus={}", s.gpus), "-N1".to_string()]);
        format!("exec {launcher} replica {common} -- {}", s.command)
    };
    // Slurm's preemption notice reaches a per-node job's steps too, and
    // with them the model servers: SIGURG, which they ignore by default
    // (SIGUSR1 killed them with their requests in flight, measured).
    let notice = if s.replicas_per_job > 1 { "URG" } else { "USR1" };
    args.extend([
        // A replica lost with its node is replaced at once by a new job; a
        // requeued one would wait Slurm's BeginTime (~2 minutes) first.
        "--no-requeue".to_string(),
        format!("--signal=B:{notice}@{drain_secs}"),
    ]);
    if let Some(t) = s.time_limit {
        args.push(format!("--time={}", t.as_secs().div_ceil(60).max(1)));
    }
    args.extend(["-o".to_string(), s.output.clone(), "--wrap".to_string(), script]);
    args
}

/// What the launcher's note says of a replica job that ended: its server's
/// end (`server`, from the note), or that the launcher never started;
/// empty when it listened and its server did not end by itself. Shared by
/// the controller's failed starts and the preflight.
pub fn launcher_end(note: &ReplicaNote, server: Option<&str>) -> String {
    match server {
        Some(server) => format!("; the model server {server}"),
        None if note.listening.is_empty() => {
            "; its launcher never reported a port (it did not start: see the job's output file)".to_string()
        }
        None => String::new(),
    }
}

/// Every [`ReplicaJob::kind`].
const KINDS: [&str; 3] = ["baseline", "supplemental", "warm"];

/// Every [`ReplicaJob::phase`].
const PHASES: [&str; 5] = ["pending", "starting", "serving", "draining", "cancelled"];

/// One replica as the controller sees it (for tests and status); a job
/// hosting several shows as several, with the same `job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaJob {
    pub job: u32,
    pub port: u16,
    /// "baseline", "supplemental" or "warm".
    pub kind: &'static str,
    /// "pending", "starting", "serving" or "draining"; "cancelled" once
    /// scancel (or a shrink releasing its node) was sent and Slurm has not
    /// let go of it yet.
    pub phase: &'static str,
    /// Where the router reaches it, once it runs.
    pub address: Option<SocketAddr>,
    /// The node it runs on.
    pub node: Option<String>,
    /// Slurm picked its job as a preemption victim (its grace time runs).
    pub preempted: bool,
    /// While draining: when it is released at the latest (Unix seconds),
    /// the earlier of onepoold's drain timeout and Slurm's preemption end.
    pub drain_deadline: Option<u64>,
}

/// What the controller did so far; updated after every poll.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ControllerView {
    /// Polls done (successful or not).
    pub rounds: u64,
    pub jobs: Vec<ReplicaJob>,
    pub min: u32,
    pub max: u32,
    /// Replicas the autoscaler wants now (baseline included).
    pub desired: u32,
    /// With warm headroom: the warm replicas wanted above `desired`, and
    /// whether a job waited for the pool's GPUs at the last poll (then no
    /// warm replica is added and surplus ones go).
    pub headroom: Option<u32>,
    pub gpus_wanted: Option<bool>,
    /// In flight plus queued, as the autoscaler saw it last.
    pub load: f64,
    /// Requests answered per second over the last poll.
    pub rate: f64,
    /// With `load_metrics`: replicas whose own metrics were read at the
    /// last poll, of those serving (the rest counted with the router's).
    pub scraped: Option<(usize, usize)>,
    /// Replica jobs submitted by this controller since it started.
    pub submitted: Vec<u32>,
    /// Nodes released from running jobs by shrinking them, as (job, node).
    pub shrunk: Vec<(u32, String)>,
    /// The last failed Slurm call, if the last poll had one.
    pub last_error: Option<String>,
    /// Replica jobs that failed to start, and the back-off they caused.
    pub start_failures: StartFailures,
    /// The last reclaims of this endpoint's replicas (at most
    /// [`RECENT_RECLAIMS`], newest last).
    pub reclaims: Vec<ReclaimView>,
    /// Set by the control socket (`onepool retry ENDPOINT`): the next poll
    /// ends the back-off. The view is the one thing both share.
    #[serde(skip)]
    pub retry_requested: bool,
}

/// How many reclaims the view keeps.
pub const RECENT_RECLAIMS: usize = 5;

/// A replica job Slurm took back for other work, as onepoold saw it
/// (issue #26): from the poll that first found it being preempted to the
/// poll that found it gone. The taker and its time to capacity are
/// `onepool report`'s (slurmctld's log has them; onepoold only watches
/// its own jobs).
#[derive(Clone, Debug, Serialize)]
pub struct ReclaimView {
    pub job: u32,
    pub kind: &'static str,
    /// "graceful" (a grace time to drain in) or "immediate" (none).
    pub mode: &'static str,
    /// Unix seconds when onepoold saw Slurm's pick.
    pub at: u64,
    /// Seconds from that poll to the poll that found the job gone: its
    /// GPUs were free by then (poll-interval resolution).
    pub released_after_s: f64,
    /// The job that took its GPUs: the first another user started on its
    /// nodes after Slurm's pick (found in the polls after its release).
    pub taker: Option<u32>,
    /// The taker's submission to its start, in whole seconds (squeue's);
    /// `onepool report` has it to the millisecond from slurmctld's log.
    pub time_to_capacity_s: Option<u64>,
}

/// A reclaimed replica whose taker is still to be found.
#[derive(Clone, Debug)]
struct TakerSearch {
    job: u32,
    nodes: String,
    mode: &'static str,
    /// Unix seconds when Slurm's pick was seen: the taker starts after.
    picked_at: u64,
    /// Given up (no other job started on its nodes) after this.
    until: Instant,
}

/// How long after a release onepoold looks for the job that took the GPUs.
const TAKER_SEARCH: Duration = Duration::from_secs(30);

/// What `onepool status` shows of failed starts (issue #24).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StartFailures {
    /// Failed starts in a row; 0 when the endpoint is not backing off.
    pub in_a_row: u32,
    /// Every failed start since onepoold started.
    pub total: u64,
    /// No replica job is submitted until `next_attempt` (or, once it
    /// passed, until the one probe job served or failed).
    pub backing_off: bool,
    /// Unix seconds.
    pub next_attempt: Option<u64>,
    pub last: Option<FailedStartView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedStartView {
    pub job: u32,
    /// Unix seconds.
    pub at: u64,
    /// Slurm's end of the job, the server's signal or exit code, its last
    /// output lines; or why onepoold gave up on it.
    pub cause: String,
}

/// One replica: a job's only one, or one of a job's per-node ones.
#[derive(Default)]
struct Member {
    /// Where it runs; `None` while its job is pending.
    node: Option<String>,
    /// In the router at this address.
    address: Option<SocketAddr>,
    drain_started: Option<Instant>,
    /// The same moment in Unix seconds, for status.
    drain_started_unix: Option<u64>,
    /// scancel or a shrink was sent for it: never back into the router.
    released: bool,
    /// Its srun step was seen (per-node jobs): once gone, the replica ended.
    step_seen: bool,
    /// Its step ended while the node stayed in the job.
    ended: bool,
}

impl Member {
    fn draining(&self) -> bool {
        self.drain_started.is_some() || self.ended
    }
}

struct TrackedJob {
    /// The port in its name; its replicas use `base_port + 2i`.
    base_port: u16,
    kind: Kind,
    /// Replicas it was seen to host at most (ports reserved for it).
    width: u16,
    running: bool,
    /// When this controller first saw the job running: a replica adopted
    /// after a restart has its model loaded long ago, but its health is
    /// being checked anew, and its startup time counts from here.
    seen_running: Option<Instant>,
    batch_host: Option<String>,
    /// Slurm's preemption deadline (Unix seconds), once it picked this job.
    preempt_end: Option<u64>,
    /// When a poll first saw Slurm's pick, and the mode it implies.
    preempt_seen: Option<(Instant, u64, &'static str)>,
    /// By slot.
    members: BTreeMap<u16, Member>,
    /// Where its replicas listen, from the job's comment.
    note: Option<ReplicaNote>,
    /// When one of its replicas first served.
    served_at: Option<Instant>,
    /// onepoold counted it as a failed start already (it gave up on it).
    failure_counted: bool,
    /// Its nodes (a host list), once it ran.
    nodes: String,
}

impl TrackedJob {
    fn new(base_port: u16, kind: Kind, width: u16) -> TrackedJob {
        TrackedJob {
            base_port,
            kind,
            width: width.max(1),
            running: false,
            seen_running: None,
            batch_host: None,
            preempt_end: None,
            preempt_seen: None,
            members: BTreeMap::new(),
            note: None,
            served_at: None,
            failure_counted: false,
            nodes: String::new(),
        }
    }

    /// Ports this job holds or may hold (each replica takes a pair).
    fn uses(&self, port: u16) -> bool {
        let top = u32::from(self.base_port) + 2 * u32::from(self.width);
        (u32::from(port) >= u32::from(self.base_port) && u32::from(port) < top)
            || self.members.keys().any(|p| port == *p || port == p + 1)
    }
}

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
    started: Instant,
    /// Live replicas found at the first poll: kept until the scale-down
    /// delay has passed, so a restart does not shrink the endpoint.
    adopted: Option<u32>,
    next_pair: u32,
    submit_after: Option<Instant>,
    /// Requests served by all replicas at the last poll, and when.
    last_served: Option<(u64, Instant)>,
    /// Reads the replicas' own load metrics (endpoints with `load_metrics`).
    scraper: Option<reqwest::Client>,
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
}

/// A replica job that ends this soon after it first served counts as a
/// failed start too: a server that crashes under its first requests loops
/// as surely as one that never loads.
const FAILED_START_WINDOW: Duration = Duration::from_secs(120);

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

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Baseline => "baseline",
        Kind::Supplemental => "supplemental",
        Kind::Warm => "warm",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Live {
    Pending,
    Running,
}

fn live(job: &JobInfo) -> Option<Live> {
    match job.job_state.as_str() {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" => Some(Live::Pending),
        "RUNNING" | "SUSPENDED" => Some(Live::Running),
        // Completing, completed, cancelled, failed, preempted...: gone.
        _ => None,
    }
}

/// The nodes a running job holds, in Slurm's order (the order in which
/// `onepool replica --per-node` numbered its replicas at the start; a
/// shrink or a failed node takes nodes out of it, so positions after one
/// are only a guess).
fn job_nodes(job: &JobInfo) -> Vec<String> {
    match onepool_decisions::hostlist::expand(&job.nodes) {
        Ok(nodes) if !nodes.is_empty() => nodes,
        _ => Some(job.batch_host.clone()).filter(|b| !b.is_empty()).into_iter().collect(),
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
        let autoscaler = Autoscaler::new(ScalingPolicy {
            target_per_replica: settings.target_per_replica,
            min: settings.min,
            max: settings.max,
            stable_window: settings.stable_window,
            panic_window: settings.panic_window,
            panic_threshold: settings.panic_threshold,
            scale_down_delay: settings.scale_down_delay,
            trend_horizon: settings.trend_horizon,
        });
        let metrics = endpoint.metrics().clone();
        let scraper =
            settings_has_metrics.then(|| crate::replica_metrics::client(scrape_timeout, endpoint.replica_key()));
        let c = Controller {
            name: name.to_string(),
            endpoint,
            health_checked,
            settings,
            slurm,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            tracked: BTreeMap::new(),
            autoscaler,
            started: Instant::now(),
            adopted: None,
            next_pair: 0,
            submit_after: None,
            last_served: None,
            scraper,
            view: view.clone(),
            metrics,
            records: HashMap::new(),
            halted: None,
            backoff: StartBackoff::new(BackoffPolicy::default()),
            takers: Vec::new(),
        };
        (c, view)
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
        loop {
            tokio::select! {
                _ = beat.tick() => {}
                _ = onepool_router::shutdown::stopped(&mut shutdown) => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let error = self.round().await.err();
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

    /// A preempted replica job is gone: counted, timed, kept for status.
    fn reclaimed(&mut self, job: u32, t: &TrackedJob, seen: Instant, at: u64, mode: &'static str) {
        let released = seen.elapsed().as_secs_f64();
        tracing::info!(endpoint = %self.name, job, mode, "reclaimed replica job released its GPUs {released:.1} s after Slurm's pick was seen");
        let labels = ReclaimLabels { endpoint: self.name.clone(), mode: mode.to_string() };
        self.metrics.reclaims.get_or_create(&labels).inc();
        self.metrics.reclaim_release_seconds.get_or_create(&labels).observe(released);
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.reclaims.push(ReclaimView {
            job,
            kind: kind_name(t.kind),
            mode,
            at,
            released_after_s: released,
            taker: None,
            time_to_capacity_s: None,
        });
        let extra = v.reclaims.len().saturating_sub(RECENT_RECLAIMS);
        v.reclaims.drain(..extra);
        if !t.nodes.is_empty() {
            self.takers.push(TakerSearch {
                job,
                nodes: t.nodes.clone(),
                mode,
                picked_at: at,
                until: Instant::now() + TAKER_SEARCH,
            });
        }
    }

    /// Looks for the jobs that took reclaimed replicas' GPUs: on the
    /// victim's nodes, another user's, started at or after Slurm's pick;
    /// the first to start is the taker. One squeue per victim and poll,
    /// until found or [`TAKER_SEARCH`] after the release.
    /// A failed squeue is logged and tried again at the next poll (the
    /// taker is a figure for the admin, not a reason to stop a round).
    async fn find_takers(&mut self) {
        let now = Instant::now();
        for s in std::mem::take(&mut self.takers) {
            let slurm = self.slurm.clone();
            let nodes = s.nodes.clone();
            let running = blocking(&self.metrics, &self.name, "squeue_running_on", move || slurm.running_on(&nodes));
            let running = match running.await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(endpoint = %self.name, job = s.job, "looking for the reclaimed replica's taker: {e}");
                    if now < s.until {
                        self.takers.push(s);
                    }
                    continue;
                }
            };
            let taker = running
                .iter()
                .filter(|j| j.user_id != self.uid && j.start_time >= s.picked_at && j.submit_time > 0)
                .min_by_key(|j| (j.start_time, j.job_id));
            match taker {
                Some(j) => self.took(&s, j.job_id, j.start_time.saturating_sub(j.submit_time)),
                None if now < s.until => self.takers.push(s),
                None => tracing::info!(
                    endpoint = %self.name,
                    job = s.job,
                    "no other job started on the reclaimed replica's nodes ({}) within {} s of its release",
                    s.nodes,
                    TAKER_SEARCH.as_secs()
                ),
            }
        }
    }

    fn took(&mut self, s: &TakerSearch, taker: u32, ttc: u64) {
        tracing::info!(
            endpoint = %self.name,
            job = s.job,
            taker,
            mode = s.mode,
            "job {taker} took the reclaimed replica's GPUs {ttc} s after its submission"
        );
        let labels = ReclaimLabels { endpoint: self.name.clone(), mode: s.mode.to_string() };
        self.metrics.reclaim_time_to_capacity_seconds.get_or_create(&labels).observe(ttc as f64);
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = v.reclaims.iter_mut().rev().find(|r| r.job == s.job) {
            r.taker = Some(taker);
            r.time_to_capacity_s = Some(ttc);
        }
    }

    fn start_failures_view(&self) -> StartFailures {
        let b = &self.backoff;
        StartFailures {
            in_a_row: b.failures(),
            total: b.total(),
            backing_off: b.active(),
            next_attempt: b.next_attempt().map(|t| self.unix_at(t)),
            last: b.last().map(|f| FailedStartView { job: f.job, at: self.unix_at(f.at), cause: f.cause.clone() }),
        }
    }

    /// Counts a failed start and says so where an admin looks.
    fn failed_start(&mut self, job: u32, cause: String) {
        let now = self.since_start(Instant::now());
        self.backoff.failed(now, FailedStart { job, at: now, cause: cause.clone() });
        let labels = EndpointLabels { endpoint: self.name.clone() };
        self.metrics.failed_starts.get_or_create(&labels).inc();
        let wait = self.backoff.next_attempt().map(|t| t.saturating_sub(now).as_secs()).unwrap_or(0);
        tracing::error!(
            endpoint = %self.name,
            job,
            in_a_row = self.backoff.failures(),
            "replica job failed to start: {cause}; no replica job is submitted for {wait} s"
        );
    }

    /// `onepool_replica_jobs` and `onepool_replica_desired` from the view
    /// just made (every kind and phase, so one that emptied reads 0).
    fn export(&self, v: &ControllerView) {
        for kind in KINDS {
            for phase in PHASES {
                let n = v.jobs.iter().filter(|j| j.kind == kind && j.phase == phase).count();
                let labels =
                    ReplicaJobLabels { endpoint: self.name.clone(), kind: kind.to_string(), phase: phase.to_string() };
                self.metrics.replicas.get_or_create(&labels).set(n as i64);
            }
        }
        let labels = EndpointLabels { endpoint: self.name.clone() };
        self.metrics.desired.get_or_create(&labels).set(i64::from(v.desired));
        let f = &v.start_failures;
        self.metrics.backoff_failures.get_or_create(&labels).set(i64::from(f.in_a_row));
        let left = f.next_attempt.filter(|_| f.backing_off).map_or(0, |t| t.saturating_sub(unix_now()));
        self.metrics.backoff_seconds.get_or_create(&labels).set(left as i64);
    }

    fn jobs_view(&self) -> Vec<ReplicaJob> {
        let snap = self.endpoint.snapshot();
        let mut out = Vec::new();
        for (job, t) in &self.tracked {
            for (port, m) in &t.members {
                let state = m.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a)).map(|r| r.state);
                out.push(ReplicaJob {
                    job: *job,
                    port: *port,
                    kind: kind_name(t.kind),
                    phase: if m.released {
                        "cancelled"
                    } else if m.draining() || state == Some(ReplicaState::Draining) {
                        "draining"
                    } else {
                        match state {
                            Some(ReplicaState::Ready | ReplicaState::Out) => "serving",
                            Some(ReplicaState::Starting) => "starting",
                            _ if m.address.is_some() || t.running => "starting",
                            _ => "pending",
                        }
                    },
                    address: m.address,
                    node: m.node.clone(),
                    preempted: t.preempt_end.is_some(),
                    drain_deadline: match (m.drain_started_unix, t.preempt_end) {
                        (Some(d), p) => {
                            let ours = d + self.settings.drain_timeout.as_secs();
                            Some(p.map_or(ours, |p| p.min(ours)))
                        }
                        (None, p) => p,
                    },
                });
            }
        }
        out
    }

    fn unroute(endpoint: &Endpoint, m: &mut Member) {
        if let Some(a) = m.address.take() {
            let _ = endpoint.remove(a);
        }
    }

    /// Brings one owned, live job's replicas up to date with what Slurm
    /// says: placeholders while it pends, one replica per node once it runs.
    fn observe(&mut self, j: &JobInfo, l: Live, base: u16, kind: Kind, steps: &[(String, u16)]) {
        let per_node = self.per_node();
        let (name, endpoint) = (&self.name, &self.endpoint);
        let preemptions = self.metrics.preemptions.get_or_create(&EndpointLabels { endpoint: name.clone() }).clone();
        let t = self.tracked.entry(j.job_id).or_insert_with(|| {
            tracing::info!(endpoint = %name, job = j.job_id, port = base, ?kind, state = %j.job_state, "adopted a replica job");
            TrackedJob::new(base, kind, j.node_count.clamp(1, 256) as u16)
        });
        t.width = t.width.max(j.node_count.clamp(1, 256) as u16);
        if !j.nodes.is_empty() {
            t.nodes.clone_from(&j.nodes);
        }
        // Slurm's kill comes at end_time once it preempts the job.
        let preempt_end = j.is_being_preempted().then_some(j.end_time).filter(|e| *e > 0);
        if let (None, Some(end)) = (t.preempt_end, preempt_end) {
            let now = unix_now();
            let left = end.saturating_sub(now);
            tracing::info!(endpoint = %name, job = j.job_id, ?kind, "Slurm is preempting the replica job; it ends within {left} s");
            preemptions.inc();
            // GraceTime 0 ends the job at once: no time to drain in.
            let mode = if left > 1 { "graceful" } else { "immediate" };
            t.preempt_seen.get_or_insert((Instant::now(), now, mode));
        }
        t.preempt_end = preempt_end;
        let wanted: Vec<(Option<String>, u16)> = match l {
            Live::Pending => {
                if t.running {
                    // Back in the queue (requeued by an admin or after a node
                    // failure): it runs elsewhere next time.
                    tracing::info!(endpoint = %name, job = j.job_id, "replica job is pending again; out of the router");
                }
                let n = if per_node { j.node_count.max(1) as usize } else { 1 };
                (0..n).filter_map(|i| onepool_launcher::replica_group::port_of(base, i)).map(|p| (None, p)).collect()
            }
            Live::Running if j.nodes.is_empty() => return,
            Live::Running if !per_node => {
                let host = if j.batch_host.is_empty() { j.nodes.clone() } else { j.batch_host.clone() };
                vec![(Some(host), base)]
            }
            Live::Running => {
                // Where a step is gone (its server crashed) the replica's
                // port is still the one it had: after a shrink a node's
                // position in the job no longer says which port the
                // launcher gave it.
                let mut known = steps.to_vec();
                for (p, m) in &t.members {
                    if let Some(n) = m.node.as_ref().filter(|n| !known.iter().any(|(k, _)| k == *n)) {
                        known.push((n.clone(), *p));
                    }
                }
                member_ports(base, &job_nodes(j), &known).into_iter().map(|(n, p)| (Some(n), p)).collect()
            }
        };
        t.running = l == Live::Running;
        if !t.running {
            t.seen_running = None;
        } else if t.seen_running.is_none() {
            t.seen_running = Some(Instant::now());
        }
        t.batch_host = Some(j.batch_host.clone()).filter(|b| t.running && !b.is_empty());
        // Replicas whose node left the job (shrink, node failure) or that
        // were placeholders of a pending job go; the rest are kept.
        t.members.retain(|port, m| {
            let keep = wanted.iter().any(|(n, p)| p == port && *n == m.node);
            if !keep {
                Self::unroute(endpoint, m);
            }
            keep
        });
        for (node, port) in wanted {
            let m = t.members.entry(port).or_insert_with(|| Member { node: node.clone(), ..Member::default() });
            if per_node && t.running {
                let has_step = steps.iter().any(|(n, p)| Some(n) == node.as_ref() && *p == port);
                if has_step {
                    m.step_seen = true;
                } else if m.step_seen && !m.ended {
                    m.ended = true;
                    tracing::warn!(endpoint = %name, job = j.job_id, port, node = ?node, "replica step ended; out of the router");
                    Self::unroute(endpoint, m);
                }
            }
        }
    }

    /// Fills in job_submit/onepool's record of each job that may be one of
    /// this endpoint's replicas (its uid and name), read from Slurm once
    /// per job: the poll's squeue does not print it, and users cannot
    /// change it afterwards.
    async fn read_records(&mut self, jobs: &mut [JobInfo]) -> Result<(), RoundError> {
        self.records.retain(|id, _| jobs.iter().any(|j| j.job_id == *id));
        for j in jobs.iter_mut() {
            if j.user_id != self.uid || port_from_name(&self.name, &j.name).is_none() {
                continue;
            }
            if let Some(c) = self.records.get(&j.job_id) {
                j.admin_comment = c.clone();
                continue;
            }
            let (slurm, id) = (self.slurm.clone(), j.job_id);
            let c = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.admin_comment(id)).await?;
            j.admin_comment = c.unwrap_or_default();
            self.records.insert(j.job_id, j.admin_comment.clone());
        }
        Ok(())
    }

    /// One poll: read, adopt, route, decide, act.
    async fn round(&mut self) -> Result<(), RoundError> {
        let retry = std::mem::take(&mut self.view.lock().unwrap_or_else(|e| e.into_inner()).retry_requested);
        if retry && self.backoff.failures() > 0 {
            tracing::info!(endpoint = %self.name, "start back-off ended by request; submitting as usual");
            self.backoff.clear();
        }
        let jobs = self.read().await?;
        // The poll's time: when Slurm's answer came.
        let now = Instant::now();
        let seen = self.adopt(jobs).await?;
        if !self.takers.is_empty() {
            self.find_takers().await;
        }
        self.read_notes().await?;
        self.route_running().await?;
        if self.adopted.is_none() {
            // Warm replicas are headroom, not load: counting them would
            // have a restart submit supplementals to match.
            let load_bearing = self.tracked.values().filter(|t| t.kind != Kind::Warm);
            let n = load_bearing.flat_map(|t| t.members.values()).filter(|m| !m.released && !m.draining());
            self.adopted = Some(n.count() as u32);
        }
        let snap = self.endpoint.snapshot();
        self.note_serving(&snap, now);
        let replicas = self.replicas(&seen, &snap, now);
        let desired = self.decide(&snap, &replicas, now).await;
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

    /// Reads the comment of running jobs whose replicas' ports are not
    /// known yet: each replica's launcher writes where it listens there
    /// once it has bound its port.
    async fn read_notes(&mut self) -> Result<(), RoundError> {
        let want: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.running)
            .filter(|(_, t)| {
                t.members.iter().any(|(slot, m)| {
                    m.node.is_some()
                        && m.address.is_none()
                        && !m.released
                        && !m.draining()
                        && t.note.as_ref().and_then(|n| n.port(*slot)).is_none()
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in want {
            let slurm = self.slurm.clone();
            let d = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.job_details(id)).await?;
            if let (Some(t), Some(note)) = (self.tracked.get_mut(&id), d.and_then(|d| ReplicaNote::decode(&d.comment)))
            {
                t.note = Some(note);
            }
        }
        Ok(())
    }

    /// Why a replica job that left the queue counts as a failed start, if
    /// it does: onepoold did not release it, Slurm did not preempt it, and
    /// its server ended by itself (the launcher's note says so), its
    /// launcher never started, or Slurm ended it (time limit, node, memory)
    /// before it served — always within [`FAILED_START_WINDOW`] of its
    /// first answer. A job that ended cleanly (COMPLETED: the launcher
    /// drained on a notice and exited 0) or was cancelled, preempted or
    /// requeued did not fail to start, whether or not a poll saw it being
    /// preempted. The cause comes from Slurm's record of the job and the
    /// launcher's note (the server's signal or code, its last lines).
    async fn failed_start_cause(&self, id: u32, t: &TrackedJob) -> Option<String> {
        let ours = t.failure_counted || t.members.values().any(|m| m.released || m.drain_started.is_some());
        let short = t.served_at.is_none_or(|s| s.elapsed() < FAILED_START_WINDOW);
        if ours || t.preempt_end.is_some() || !short {
            return None;
        }
        let slurm = self.slurm.clone();
        let details = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.job_details(id))
            .await
            .ok()
            .flatten();
        let when =
            if t.served_at.is_some() { "ended within its first minutes of serving" } else { "ended before it served" };
        let Some(d) = details else {
            // No record left (MinJobAge): a job seen running that never
            // served is still a failed start; nothing more is known.
            return (t.seen_running.is_some() && t.served_at.is_none())
                .then(|| format!("job {id} {when}; Slurm no longer holds its record (MinJobAge)"));
        };
        if matches!(d.state.as_str(), "COMPLETED" | "CANCELLED" | "PREEMPTED" | "REQUEUED" | "REQUEUE_HOLD") {
            return None;
        }
        let note = ReplicaNote::decode(&d.comment).unwrap_or_default();
        let server = t.members.keys().find_map(|slot| note.ended(*slot));
        // It listened and its server did not end by itself: a drain that
        // timed out, or Slurm's end (time, node, memory); a failure to
        // start only if it never served.
        if server.is_none() && !note.listening.is_empty() && t.served_at.is_some() {
            return None;
        }
        let mut cause = format!("job {id} {when}: {}", d.ending());
        cause.push_str(&launcher_end(&note, server));
        Some(cause)
    }

    /// This daemon's jobs with job_submit/onepool's record; stops replica
    /// control for good when a job it submitted came back without one.
    async fn read(&mut self) -> Result<Vec<JobInfo>, RoundError> {
        if let Some(why) = &self.halted {
            return Err(RoundError::Halted(why.clone()));
        }
        let (slurm, uid) = (self.slurm.clone(), self.uid);
        let mut jobs = blocking(&self.metrics, &self.name, "squeue", move || slurm.user_jobs(uid)).await?;
        self.read_records(&mut jobs).await?;
        if let Some(j) = jobs
            .iter()
            .find(|j| self.tracked.contains_key(&j.job_id) && owned(j, &self.name, self.uid, &self.settings).is_none())
        {
            let why = format!(
                "replica control stopped: job {} that onepoold submitted came back without job_submit/onepool's record for endpoint {} (admin comment {:?}); \
                 the plugin is not in JobSubmitPlugins or the policy is in audit mode. Submitting again would repeat this every poll: \
                 fix the cluster, cancel the job (scancel {}) and restart onepoold",
                j.job_id, self.name, j.admin_comment, j.job_id
            );
            tracing::error!(endpoint = %self.name, job = j.job_id, "{why}");
            self.halted = Some(why.clone());
            return Err(RoundError::Halted(why));
        }
        Ok(jobs)
    }

    /// Tracks this endpoint's live replica jobs (and, for per-node jobs,
    /// where each replica runs); jobs that left the queue leave the router.
    async fn adopt(&mut self, jobs: Vec<JobInfo>) -> Result<HashMap<u32, (JobInfo, Live)>, RoundError> {
        let mut seen: HashMap<u32, (JobInfo, Live)> = HashMap::new();
        let mut owned_jobs = Vec::new();
        for j in jobs {
            let Some((port, kind)) = owned(&j, &self.name, self.uid, &self.settings) else { continue };
            let Some(l) = live(&j) else { continue };
            owned_jobs.push((j.job_id, port, kind));
            seen.insert(j.job_id, (j, l));
        }
        // Which replica runs where in per-node jobs: their steps' names.
        let mut steps: HashMap<u32, Vec<(String, u16)>> = HashMap::new();
        if self.per_node() && seen.values().any(|(_, l)| *l == Live::Running) {
            let (slurm, uid) = (self.slurm.clone(), self.uid);
            for s in blocking(&self.metrics, &self.name, "squeue_steps", move || slurm.steps(uid)).await? {
                if let (true, Some(port)) = (seen.contains_key(&s.job_id), port_from_step_name(&s.name)) {
                    steps.entry(s.job_id).or_default().push((s.nodes, port));
                }
            }
        }
        for (id, port, kind) in owned_jobs {
            let (j, l) = &seen[&id];
            self.observe(j, *l, port, kind, steps.get(&id).map(Vec::as_slice).unwrap_or(&[]));
        }
        let gone: Vec<u32> = self.tracked.keys().filter(|id| !seen.contains_key(id)).copied().collect();
        for id in gone {
            if let Some(mut t) = self.tracked.remove(&id) {
                for m in t.members.values_mut() {
                    Self::unroute(&self.endpoint, m);
                }
                tracing::info!(endpoint = %self.name, job = id, "replica job ended; out of the router");
                if let Some((seen, at, mode)) = t.preempt_seen {
                    self.reclaimed(id, &t, seen, at, mode);
                }
                if let Some(cause) = self.failed_start_cause(id, &t).await {
                    self.failed_start(id, cause);
                }
            }
        }
        Ok(seen)
    }

    /// Every replica still holding GPUs, as reconcile sees it.
    fn replicas(&self, seen: &HashMap<u32, (JobInfo, Live)>, snap: &EndpointSnapshot, now: Instant) -> Vec<Replica> {
        let unix = unix_now();
        let mut replicas = Vec::new();
        for (id, t) in &self.tracked {
            let Some((j, l)) = seen.get(id) else { continue };
            let running = *l == Live::Running && j.start_time > 0;
            let age = if running { Duration::from_secs(unix.saturating_sub(j.start_time)) } else { Duration::ZERO };
            // An adopted replica older than startup_timeout would otherwise
            // be replaced before its first health check (issue #18: every
            // restart of onepoold cancelled them).
            let starting_for = match t.seen_running {
                Some(seen) if running => age.min(now.saturating_duration_since(seen)),
                _ => Duration::ZERO,
            };
            // Slurm prints huge values for UNLIMITED.
            let time_left = (running && j.time_limit > 0 && j.time_limit < 1 << 31)
                .then(|| Duration::from_secs((j.start_time + j.time_limit * 60).saturating_sub(unix)));
            let holding = t.members.values().filter(|m| !m.released).count();
            for (port, m) in &t.members {
                if m.released {
                    continue;
                }
                let r = m.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a));
                let mut in_flight = r.map(|r| r.in_flight).unwrap_or(0);
                let phase = match (l, r.map(|r| r.state)) {
                    (Live::Pending, _) => Phase::Pending,
                    _ if m.draining() => Phase::Draining,
                    (_, Some(ReplicaState::Draining)) => Phase::Draining,
                    (_, Some(ReplicaState::Ready | ReplicaState::Out)) => Phase::Serving,
                    _ => Phase::Starting,
                };
                // A drain past its timeout ends like a finished one.
                if m.ended || m.drain_started.is_some_and(|d| now.duration_since(d) >= self.settings.drain_timeout) {
                    in_flight = 0;
                }
                replicas.push(Replica {
                    job: *id,
                    slot: *port,
                    pinned: holding > 1 && m.node.is_some() && m.node == t.batch_host,
                    kind: t.kind,
                    phase,
                    in_flight,
                    age,
                    starting_for,
                    time_left,
                    being_preempted: j.is_being_preempted(),
                });
            }
        }
        replicas
    }

    /// How many replicas the endpoint wants now, from its load (recorded
    /// for the autoscaler and shown in the view).
    async fn decide(&mut self, snap: &EndpointSnapshot, replicas: &[Replica], now: Instant) -> u32 {
        let (load, scraped) = self.load(snap).await;
        // The endpoint's own count: replicas that leave do not take their
        // requests out of the rate (issue #18: 0.0 requests/s was shown at
        // about 27 while a replica drained).
        let served = snap.served_total;
        let rate = match self.last_served {
            Some((before, at)) if served >= before && now > at => (served - before) as f64 / (now - at).as_secs_f64(),
            _ => 0.0,
        };
        self.last_served = Some((served, now));
        let secs = now.duration_since(self.started).as_secs_f64();
        self.autoscaler.record(secs, load);
        let ready = replicas.iter().filter(|r| r.phase == Phase::Serving).count() as u32;
        let rec = self.autoscaler.recommend(secs, ready);
        let mut desired = rec.replicas;
        if now.duration_since(self.started) < self.settings.scale_down_delay {
            desired = desired.max(self.adopted.unwrap_or(0));
        }
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.desired = desired.clamp(self.settings.min, self.settings.max.max(self.settings.min));
        v.load = load;
        v.rate = rate;
        v.scraped = scraped;
        desired
    }

    /// Drains, releases and submits what reconcile asks for `desired`.
    async fn act(&mut self, desired: u32, replicas: &[Replica]) -> Result<(), RoundError> {
        let s = &self.settings;
        let mut errors = Vec::new();
        let headroom = match &s.warm {
            None => None,
            Some(w) => {
                let gpus_wanted = match self.gpus_wanted(&w.scope).await {
                    Ok(wanted) => wanted,
                    // Unknown: as if wanted, so that nothing is kept or
                    // added on GPUs somebody may be waiting for.
                    Err(e) => {
                        errors.push(e);
                        true
                    }
                };
                let replicas = w.spec.replicas_above(desired.clamp(s.min, s.max.max(s.min)));
                Some(Headroom { replicas, gpus_wanted })
            }
        };
        {
            let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
            v.headroom = headroom.map(|h| h.replicas);
            v.gpus_wanted = headroom.map(|h| h.gpus_wanted);
        }
        let target = EndpointTarget {
            min: s.min,
            max: s.max,
            desired,
            renew_before: s.startup_timeout + s.drain_timeout + Duration::from_secs(60),
            startup_timeout: s.startup_timeout,
            headroom,
        };
        let actions = reconcile(&target, replicas);
        let mut release = Vec::new();
        for action in &actions {
            match *action {
                Action::Submit(_) => {}
                Action::Drain { job, slot } => self.drain(job, slot),
                Action::Release { job, slot } => {
                    // What the decision saw, for the day a release cuts
                    // something short.
                    if let Some(r) = replicas.iter().find(|r| (r.job, r.slot) == (job, slot)) {
                        tracing::info!(endpoint = %self.name, job, port = slot, phase = ?r.phase, in_flight = r.in_flight,
                            "releasing a replica's GPUs");
                        if r.phase == Phase::Starting && r.starting_for > self.settings.startup_timeout {
                            let counted =
                                self.tracked.get_mut(&job).map(|t| std::mem::replace(&mut t.failure_counted, true));
                            if counted == Some(false) {
                                let cause = self.never_healthy_cause(job, r.starting_for);
                                self.failed_start(job, cause);
                            }
                        }
                    }
                    release.push((job, slot))
                }
            }
        }
        if let Err(e) = self.release(&release).await {
            errors.push(e);
        }
        let submissions = pack_submissions(&actions, self.settings.replicas_per_job);
        let unproven = self.tracked.values().filter(|t| t.served_at.is_none() && !t.failure_counted).count();
        let now = self.since_start(Instant::now());
        let allowed = match self.backoff.allowance(now, unproven) {
            Allowance::Any => submissions.len(),
            Allowance::One => 1,
            Allowance::None { .. } => 0,
        };
        if allowed < submissions.len() {
            tracing::debug!(endpoint = %self.name, wanted = submissions.len(), allowed, "start back-off holds submissions");
        }
        for (kind, n) in submissions.into_iter().take(allowed) {
            // A probe is one replica, whatever the job could host.
            let n = if self.backoff.active() { 1 } else { n };
            if let Err(e) = self.submit(kind, n).await {
                errors.push(e);
                break;
            }
        }
        RoundError::all(errors)
    }

    /// Why a replica released for not becoming healthy failed, with what
    /// its launcher reported (where it listens).
    fn never_healthy_cause(&self, job: u32, starting_for: Duration) -> String {
        let secs = starting_for.as_secs();
        let limit = onepool_decisions::duration::format(self.settings.startup_timeout);
        let t = self.tracked.get(&job);
        let reported = t.and_then(|t| t.note.as_ref()).is_some_and(|n| !n.listening.is_empty());
        let routed = t.is_some_and(|t| t.members.values().any(|m| m.address.is_some()));
        let detail = match (reported, routed) {
            (false, _) => "its launcher never reported a port (see the job's output file)",
            (true, false) => "its node's address could not be resolved",
            (true, true) => "its health checks never passed",
        };
        format!("job {job} ran {secs} s without becoming healthy (startup_timeout {limit}): {detail}")
    }

    /// Whether a pending job in the pool, other than a warm replica, waits
    /// for nodes or GPUs (one squeue, shared by the endpoints).
    async fn gpus_wanted(&self, scope: &crate::config::PoolScope) -> Result<bool, RoundError> {
        let (slurm, parts) = (self.slurm.clone(), scope.partitions.clone());
        let waiting = blocking(&self.metrics, &self.name, "squeue_pending", move || slurm.waiting(&parts)).await?;
        Ok(waiting.iter().any(|w| w.wants_resources() && !scope.warm_qos.contains(&w.qos)))
    }

    /// What the autoscaler sees: requests queued in the router plus each
    /// replica's load, from its own metrics where configured and readable,
    /// else the router's count of its requests in flight.
    async fn load(&self, snap: &EndpointSnapshot) -> (f64, Option<(usize, usize)>) {
        let queued = snap.queued as f64;
        let Some(client) = &self.scraper else {
            return (queued + f64::from(snap.replicas.iter().map(|r| r.in_flight).sum::<u32>()), None);
        };
        let serving: Vec<_> = snap.replicas.iter().filter(|r| r.state == ReplicaState::Ready).collect();
        let mut reads = tokio::task::JoinSet::new();
        for (i, r) in serving.iter().enumerate() {
            let (client, address) = (client.clone(), r.address);
            let (path, names) = (self.settings.metrics_path.clone(), self.settings.load_metrics.clone());
            reads.spawn(async move { (i, crate::replica_metrics::scrape(&client, address, &path, &names).await) });
        }
        let mut own = vec![None; serving.len()];
        while let Some(Ok((i, r))) = reads.join_next().await {
            match r {
                Ok(v) => own[i] = Some(v),
                Err(e) => tracing::debug!(endpoint = %self.name, "replica load metrics: {e}"),
            }
        }
        let ok = own.iter().filter(|v| v.is_some()).count();
        let mut load = queued;
        for r in &snap.replicas {
            let i = serving.iter().position(|s| s.address == r.address);
            load += i.and_then(|i| own[i]).unwrap_or(f64::from(r.in_flight));
        }
        (load, Some((ok, serving.len())))
    }

    /// Running replicas not yet in the router join it at their node's
    /// address (as "starting" when health checks will bring them in).
    async fn route_running(&mut self) -> Result<(), RoundError> {
        // (job, slot, the port its launcher reported, node)
        let need: Vec<(u32, u16, u16, String)> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.running)
            .flat_map(|(id, t)| {
                t.members.iter().filter_map(move |(slot, m)| {
                    let node = m.node.clone()?;
                    let port = t.note.as_ref()?.port(*slot)?;
                    (m.address.is_none() && !m.released && !m.draining()).then_some((*id, *slot, port, node))
                })
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let slurm = self.slurm.clone();
        let nodes = blocking(&self.metrics, &self.name, "sinfo", move || slurm.nodes()).await?;
        for (id, slot, port, host) in need {
            let Some(node) = nodes.iter().find(|n| n.name == host) else { continue };
            let host = if node.address.is_empty() { node.name.as_str() } else { node.address.as_str() };
            let address = match host.parse::<IpAddr>() {
                Ok(ip) => Some(SocketAddr::new(ip, port)),
                Err(_) => tokio::net::lookup_host((host, port)).await.ok().and_then(|mut a| a.next()),
            };
            let Some(address) = address else {
                tracing::warn!(endpoint = %self.name, job = id, host, "cannot resolve the replica's node address");
                continue;
            };
            match self.endpoint.add(address, None, !self.health_checked) {
                Ok(_) | Err(RegistryError::Duplicate { .. }) => {
                    tracing::info!(endpoint = %self.name, job = id, %address, "replica running; in the router");
                    // Warm headroom stays idle until the others are full:
                    // Slurm then takes it back without a drain to wait for.
                    if self.tracked.get(&id).is_some_and(|t| t.kind == Kind::Warm) {
                        let _ = self.endpoint.set_spill(address, true);
                    }
                    if let Some(m) = self.tracked.get_mut(&id).and_then(|t| t.members.get_mut(&slot)) {
                        m.address = Some(address);
                    }
                }
                Err(e) => tracing::warn!(endpoint = %self.name, job = id, "cannot add the replica: {e}"),
            }
        }
        Ok(())
    }

    /// A block of `want` port pairs (fewer if no block that large is free:
    /// the job then hosts fewer replicas) that no tracked job uses, taken
    /// in turn through the range so a port that failed is not retried at once.
    fn free_ports(&mut self, want: u32) -> Option<(u16, u32)> {
        let (lo, hi) = self.settings.port_range;
        let ports = u32::from(hi) - u32::from(lo) + 1;
        let pairs = ports / 2;
        let free = |p: u32| {
            let port = lo + (2 * p) as u16;
            !self.tracked.values().any(|t| t.uses(port) || t.uses(port + 1))
        };
        for n in (1..=want.max(1)).rev() {
            for k in 0..pairs {
                let i = (self.next_pair + k) % pairs;
                if i + n <= pairs && (i..i + n).all(free) {
                    self.next_pair = i + n;
                    return Some((lo + (2 * i) as u16, n));
                }
            }
        }
        None
    }

    async fn submit(&mut self, kind: Kind, replicas: u32) -> Result<(), RoundError> {
        if self.submit_after.is_some_and(|t| Instant::now() < t) {
            return Ok(());
        }
        let (port, replicas) = self.free_ports(replicas).ok_or(RoundError::NoFreePorts)?;
        let args = sbatch_args(&self.name, &self.settings, kind, port, replicas);
        let slurm = self.slurm.clone();
        let r = blocking(&self.metrics, &self.name, "sbatch", move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            slurm.submit(&a)
        })
        .await;
        match r {
            Ok(job) => {
                tracing::info!(endpoint = %self.name, job, port, replicas, ?kind, "submitted a replica job");
                let mut t = TrackedJob::new(port, kind, replicas as u16);
                let n = if self.per_node() { replicas as usize } else { 1 };
                for p in (0..n).filter_map(|i| onepool_launcher::replica_group::port_of(port, i)) {
                    t.members.insert(p, Member::default());
                }
                self.tracked.insert(job, t);
                self.view.lock().unwrap_or_else(|e| e.into_inner()).submitted.push(job);
                Ok(())
            }
            Err(e) => {
                // Do not hammer slurmctld with a submission it refuses.
                self.submit_after = Some(Instant::now() + self.settings.poll_interval.max(Duration::from_secs(1)) * 5);
                Err(e.during(format!("submitting a {kind:?} replica job")))
            }
        }
    }

    /// Out of the router at once; reconcile releases it once nothing is in
    /// flight (or the drain timeout passed).
    fn drain(&mut self, job: u32, port: u16) {
        let Some(m) = self.tracked.get_mut(&job).and_then(|t| t.members.get_mut(&port)) else { return };
        if m.drain_started.is_some() || m.released {
            return;
        }
        m.drain_started = Some(Instant::now());
        m.drain_started_unix = Some(unix_now());
        tracing::info!(endpoint = %self.name, job, port, node = ?m.node, "draining a replica");
        if let Some(address) = m.address {
            let endpoint = self.endpoint.clone();
            let deadline = self.settings.drain_timeout;
            tokio::spawn(async move {
                let _ = endpoint.drain(address, deadline).await;
            });
        }
    }

    /// Gives the GPUs of drained (or never serving) replicas back:
    /// scancel a job none of whose replicas is left, shrink a running one
    /// to its other nodes, ask a pending one for fewer nodes.
    async fn release(&mut self, release: &[(u32, u16)]) -> Result<(), RoundError> {
        if release.is_empty() {
            return Ok(());
        }
        let layouts: Vec<JobLayout> = self
            .tracked
            .iter()
            .filter(|(id, _)| release.iter().any(|(j, _)| j == *id))
            .map(|(id, t)| JobLayout {
                job: *id,
                pending: !t.running,
                batch_host: t.batch_host.clone(),
                replicas: t.members.iter().filter(|(_, m)| !m.released).map(|(p, m)| (*p, m.node.clone())).collect(),
            })
            .collect();
        let mut errors = Vec::new();
        for plan in plan_releases(&layouts, release) {
            let r = match plan {
                Release::Cancel { job } => self.cancel(job).await,
                Release::Shrink { job, keep, released } => {
                    let list = keep.join(",");
                    self.update(job, "NodeList", list, &released, "released its node").await
                }
                Release::Resize { job, nodes, released } => {
                    self.update(job, "NumNodes", nodes.to_string(), &released, "asks for fewer nodes").await
                }
                Release::Held { job, slot } => {
                    tracing::debug!(endpoint = %self.name, job, port = slot, "drained replica on the batch host waits for the rest of its job");
                    Ok(())
                }
            };
            if let Err(e) = r {
                errors.push(e);
            }
        }
        RoundError::all(errors)
    }

    /// `scontrol update JobId=job key=value`, then the `released` replicas
    /// are out of the router for good.
    async fn update(
        &mut self,
        job: u32,
        key: &'static str,
        value: String,
        released: &[u16],
        what: &str,
    ) -> Result<(), RoundError> {
        let slurm = self.slurm.clone();
        let v = value.clone();
        let r =
            blocking(&self.metrics, &self.name, "scontrol_update", move || slurm.update_job(job, &[(key, v.as_str())]))
                .await;
        let Some(t) = self.tracked.get_mut(&job) else { return Ok(()) };
        match r {
            Ok(()) => {
                for port in released {
                    if let Some(m) = t.members.get_mut(port) {
                        Self::unroute(&self.endpoint, m);
                        m.released = true;
                        tracing::info!(endpoint = %self.name, job, port, node = ?m.node, "{key}={value}: replica {what}");
                        if let (true, Some(n)) = (key == "NodeList", m.node.clone()) {
                            self.view.lock().unwrap_or_else(|e| e.into_inner()).shrunk.push((job, n));
                        }
                    }
                }
                if key == "NumNodes" {
                    // Placeholders: the next poll lays them out anew.
                    t.members.retain(|p, _| !released.contains(p));
                }
                Ok(())
            }
            Err(e) => Err(e.during(format!("scontrol update JobId={job} {key}={value}"))),
        }
    }

    async fn cancel(&mut self, job: u32) -> Result<(), RoundError> {
        let Some(t) = self.tracked.get_mut(&job) else { return Ok(()) };
        for m in t.members.values_mut() {
            Self::unroute(&self.endpoint, m);
            // Never back into the router, whatever scancel says.
            m.drain_started.get_or_insert_with(Instant::now);
            m.drain_started_unix.get_or_insert_with(unix_now);
        }
        let slurm = self.slurm.clone();
        let r = blocking(&self.metrics, &self.name, "scancel", move || slurm.cancel(job, None)).await;
        if let (Ok(()), Some(t)) = (&r, self.tracked.get_mut(&job)) {
            t.members.values_mut().for_each(|m| m.released = true);
        }
        match r {
            Ok(()) => {
                tracing::info!(endpoint = %self.name, job, "cancelled a replica job");
                Ok(())
            }
            Err(e) => Err(e.during(format!("cancelling replica job {job}"))),
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
