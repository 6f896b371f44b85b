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
use onepool_decisions::replicas::{reconcile, Action, EndpointTarget, Kind, Phase, Replica};
use onepool_slurm_commands::adapter::{Slurm, SlurmError};
use onepool_slurm_commands::state::JobInfo;
use serde::Serialize;
use tokio::sync::watch;

use crate::config::ReplicaSettings;
use crate::endpoint::Endpoint;
use crate::registry::{RegistryError, ReplicaState};

/// The Slurm adapter the controllers share (called on blocking threads).
pub type SharedSlurm = Arc<dyn Slurm + Send + Sync>;

/// The replica job's name: the port it listens on is part of it.
pub fn job_name(endpoint: &str, port: u16) -> String {
    format!("onepool-{endpoint}-{port}")
}

/// The port encoded in a replica job's name, if the name is this endpoint's.
pub fn port_from_name(endpoint: &str, name: &str) -> Option<u16> {
    let port = name.strip_prefix("onepool-")?.strip_prefix(endpoint)?.strip_prefix('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

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

/// sbatch's arguments (after `--parsable`) for one replica on `port`.
pub fn sbatch_args(endpoint: &str, s: &ReplicaSettings, kind: Kind, port: u16) -> Vec<String> {
    let class = match kind {
        Kind::Baseline => &s.baseline_workload,
        Kind::Supplemental => &s.supplemental_workload,
    };
    let drain_secs = s.drain_timeout.as_secs_f64().ceil().max(1.0) as u64;
    let script = format!(
        "exec {} replica --listen 0.0.0.0:{port} --backend 127.0.0.1:{} --drain-timeout {} -- {}",
        quote(&s.launcher),
        port + 1,
        onepool_decisions::duration::format(Duration::from_secs(drain_secs)),
        s.command
    );
    let mut args = vec![
        "-J".to_string(),
        job_name(endpoint, port),
        format!("--workload={class}"),
        format!("--endpoint={endpoint}"),
        format!("--gpus={}", s.gpus),
        "-N1".to_string(),
        // A replica lost with its node is replaced at once by a new job; a
        // requeued one would wait Slurm's BeginTime (~2 minutes) first.
        "--no-requeue".to_string(),
        format!("--signal=B:USR1@{drain_secs}"),
    ];
    if let Some(t) = s.time_limit {
        args.push(format!("--time={}", t.as_secs().div_ceil(60).max(1)));
    }
    args.extend(["-o".to_string(), s.output.clone(), "--wrap".to_string(), script]);
    args
}

/// One replica job as the controller sees it (for tests and status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaJob {
    pub job: u32,
    pub port: u16,
    /// "baseline" or "supplemental".
    pub kind: &'static str,
    /// "pending", "starting", "serving" or "draining"; "cancelled" once
    /// scancel was sent and the job has not left the queue yet.
    pub phase: &'static str,
    /// Where the router reaches it, once it runs.
    pub address: Option<SocketAddr>,
    /// The node it runs on.
    pub node: Option<String>,
    /// Slurm picked it as a preemption victim (its grace time runs).
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
    /// In flight plus queued, as the autoscaler saw it last.
    pub load: f64,
    /// Requests answered per second over the last poll.
    pub rate: f64,
    /// With `load_metrics`: replicas whose own metrics were read at the
    /// last poll, of those serving (the rest counted with the router's).
    pub scraped: Option<(usize, usize)>,
    /// Replica jobs submitted by this controller since it started.
    pub submitted: Vec<u32>,
    /// The last failed Slurm call, if the last poll had one.
    pub last_error: Option<String>,
}

struct Tracked {
    port: u16,
    kind: Kind,
    /// In the router at this address.
    address: Option<SocketAddr>,
    drain_started: Option<Instant>,
    /// The same moment in Unix seconds, for status.
    drain_started_unix: Option<u64>,
    cancelled: bool,
    node: Option<String>,
    /// Slurm's preemption deadline (Unix seconds), once it picked this job.
    preempt_end: Option<u64>,
}

pub struct Controller {
    name: String,
    endpoint: Arc<Endpoint>,
    /// Replicas join as "starting" and wait for health checks when true.
    health_checked: bool,
    settings: ReplicaSettings,
    slurm: SharedSlurm,
    uid: u32,
    tracked: BTreeMap<u32, Tracked>,
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
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, SlurmError> + Send + 'static) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{e}{}", if e.is_retryable() { " (retryable)" } else { "" })),
        Err(e) => Err(format!("the Slurm call failed: {e}")),
    }
}

impl Tracked {
    fn new(port: u16, kind: Kind) -> Tracked {
        Tracked {
            port,
            kind,
            address: None,
            drain_started: None,
            drain_started_unix: None,
            cancelled: false,
            node: None,
            preempt_end: None,
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
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
        });
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
            scraper: settings_has_metrics.then(|| crate::replica_metrics::client(scrape_timeout)),
            view: view.clone(),
        };
        (c, view)
    }

    /// Polls until `shutdown` turns true. Stopping leaves every replica job
    /// running: the next start re-adopts them.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                return;
            }
            let error = self.round().await.err();
            if let Some(e) = &error {
                tracing::warn!(endpoint = %self.name, "replica controller: {e}");
            }
            {
                let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
                v.rounds += 1;
                v.last_error = error;
                v.jobs = self.jobs_view();
                v.min = self.settings.min;
                v.max = self.settings.max;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll_interval) => {}
                _ = crate::daemon::stopped(&mut shutdown) => return,
            }
        }
    }

    fn jobs_view(&self) -> Vec<ReplicaJob> {
        let snap = self.endpoint.snapshot();
        self.tracked
            .iter()
            .map(|(job, t)| {
                let state = t.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a)).map(|r| r.state);
                ReplicaJob {
                    job: *job,
                    port: t.port,
                    kind: match t.kind {
                        Kind::Baseline => "baseline",
                        Kind::Supplemental => "supplemental",
                    },
                    phase: if t.cancelled {
                        "cancelled"
                    } else if t.drain_started.is_some() || state == Some(ReplicaState::Draining) {
                        "draining"
                    } else {
                        match state {
                            Some(ReplicaState::Ready | ReplicaState::Out) => "serving",
                            Some(ReplicaState::Starting) => "starting",
                            _ if t.address.is_some() => "starting",
                            _ => "pending",
                        }
                    },
                    address: t.address,
                    node: t.node.clone(),
                    preempted: t.preempt_end.is_some(),
                    drain_deadline: match (t.drain_started_unix, t.preempt_end) {
                        (Some(d), p) => {
                            let ours = d + self.settings.drain_timeout.as_secs();
                            Some(p.map_or(ours, |p| p.min(ours)))
                        }
                        (None, p) => p,
                    },
                }
            })
            .collect()
    }

    /// One poll: read, adopt, route, decide, act.
    async fn round(&mut self) -> Result<(), String> {
        let slurm = self.slurm.clone();
        let jobs = blocking(move || slurm.jobs()).await?;
        let now = Instant::now();
        let mut seen: HashMap<u32, (JobInfo, Live)> = HashMap::new();
        for j in jobs {
            let Some((port, kind)) = owned(&j, &self.name, self.uid, &self.settings) else { continue };
            let Some(l) = live(&j) else { continue };
            self.tracked.entry(j.job_id).or_insert_with(|| {
                tracing::info!(endpoint = %self.name, job = j.job_id, port, ?kind, state = %j.job_state, "adopted a replica job");
                Tracked::new(port, kind)
            });
            if let Some(t) = self.tracked.get_mut(&j.job_id) {
                if l == Live::Running && !j.nodes.is_empty() {
                    t.node = Some(if j.batch_host.is_empty() { j.nodes.clone() } else { j.batch_host.clone() });
                }
                // Slurm's kill comes at end_time once it preempts the job.
                t.preempt_end = j.is_being_preempted().then_some(j.end_time).filter(|e| *e > 0);
            }
            seen.insert(j.job_id, (j, l));
        }
        // A job back in the queue (requeued by an admin or after a node
        // failure) runs elsewhere next time: out of the router until then.
        for (id, t) in self.tracked.iter_mut() {
            if t.address.is_some() && seen.get(id).is_some_and(|(_, l)| *l == Live::Pending) {
                if let Some(a) = t.address.take() {
                    let _ = self.endpoint.remove(a);
                }
                t.node = None;
                tracing::info!(endpoint = %self.name, job = id, "replica job is pending again; out of the router");
            }
        }
        // Jobs that left the queue leave the router.
        let gone: Vec<u32> = self.tracked.keys().filter(|id| !seen.contains_key(id)).copied().collect();
        for id in gone {
            if let Some(t) = self.tracked.remove(&id) {
                if let Some(a) = t.address {
                    let _ = self.endpoint.remove(a);
                }
                tracing::info!(endpoint = %self.name, job = id, "replica job ended; out of the router");
            }
        }
        self.route_running(&seen).await?;
        if self.adopted.is_none() {
            let n = self.tracked.values().filter(|t| !t.cancelled && t.drain_started.is_none()).count() as u32;
            self.adopted = Some(n);
        }
        // What reconcile needs.
        let snap = self.endpoint.snapshot();
        let unix = unix_now();
        let mut replicas = Vec::new();
        for (id, t) in &self.tracked {
            let Some((j, l)) = seen.get(id) else { continue };
            if t.cancelled {
                continue;
            }
            let r = t.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a));
            let mut in_flight = r.map(|r| r.in_flight).unwrap_or(0);
            let phase = match (l, r.map(|r| r.state)) {
                (Live::Pending, _) => Phase::Pending,
                _ if t.drain_started.is_some() => Phase::Draining,
                (_, Some(ReplicaState::Draining)) => Phase::Draining,
                (_, Some(ReplicaState::Ready | ReplicaState::Out)) => Phase::Serving,
                _ => Phase::Starting,
            };
            // A drain past its timeout ends like a finished one.
            if t.drain_started.is_some_and(|d| now.duration_since(d) >= self.settings.drain_timeout) {
                in_flight = 0;
            }
            let running = *l == Live::Running && j.start_time > 0;
            let age = if running { Duration::from_secs(unix.saturating_sub(j.start_time)) } else { Duration::ZERO };
            // Slurm prints huge values for UNLIMITED.
            let time_left = (running && j.time_limit > 0 && j.time_limit < 1 << 31)
                .then(|| Duration::from_secs((j.start_time + j.time_limit * 60).saturating_sub(unix)));
            replicas.push(Replica {
                job: *id,
                kind: t.kind,
                phase,
                in_flight,
                age,
                time_left,
                being_preempted: j.is_being_preempted(),
            });
        }
        let (load, scraped) = self.load(&snap).await;
        let served: u64 = snap.replicas.iter().map(|r| r.served).sum();
        let rate = match self.last_served {
            // Removed replicas take their counts along: no negative rates.
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
        {
            let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
            v.desired = desired.clamp(self.settings.min, self.settings.max.max(self.settings.min));
            v.load = load;
            v.rate = rate;
            v.scraped = scraped;
        }
        let s = &self.settings;
        let target = EndpointTarget {
            min: s.min,
            max: s.max,
            desired,
            renew_before: s.startup_timeout + s.drain_timeout + Duration::from_secs(60),
            startup_timeout: s.startup_timeout,
        };
        let mut errors = Vec::new();
        for action in reconcile(&target, &replicas) {
            let r = match action {
                Action::Submit(kind) => self.submit(kind).await,
                Action::Drain { job } => {
                    self.drain(job);
                    Ok(())
                }
                Action::Cancel { job } => self.cancel(job).await,
            };
            if let Err(e) = r {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// What the autoscaler sees: requests queued in the router plus each
    /// replica's load, from its own metrics where configured and readable,
    /// else the router's count of its requests in flight.
    async fn load(&self, snap: &crate::endpoint::EndpointSnapshot) -> (f64, Option<(usize, usize)>) {
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
    async fn route_running(&mut self, seen: &HashMap<u32, (JobInfo, Live)>) -> Result<(), String> {
        let need: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(id, t)| {
                t.address.is_none()
                    && !t.cancelled
                    && t.drain_started.is_none()
                    && seen.get(id).is_some_and(|(_, l)| *l == Live::Running)
            })
            .map(|(id, _)| *id)
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let slurm = self.slurm.clone();
        let nodes = blocking(move || slurm.nodes()).await?;
        for id in need {
            let (job, _) = &seen[&id];
            let host = if job.batch_host.is_empty() { job.nodes.as_str() } else { job.batch_host.as_str() };
            let Some(node) = nodes.iter().find(|n| n.name == host) else { continue };
            let host = if node.address.is_empty() { node.name.as_str() } else { node.address.as_str() };
            let port = self.tracked[&id].port;
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
                    tracing::info!(endpoint = %self.name, job = id, %address, "replica job running; in the router");
                    if let Some(t) = self.tracked.get_mut(&id) {
                        t.address = Some(address);
                    }
                }
                Err(e) => tracing::warn!(endpoint = %self.name, job = id, "cannot add the replica: {e}"),
            }
        }
        Ok(())
    }

    /// A port pair (launcher, server) no tracked job uses, taken in turn
    /// through the range so a port that failed is not retried at once.
    fn free_port(&mut self) -> Option<u16> {
        let (lo, hi) = self.settings.port_range;
        let ports = u32::from(hi) - u32::from(lo) + 1;
        let pairs = ports / 2;
        for k in 0..pairs {
            let i = (self.next_pair + k) % pairs;
            let p = lo + (2 * i) as u16;
            if !self.tracked.values().any(|t| t.port.abs_diff(p) <= 1) {
                self.next_pair = i + 1;
                return Some(p);
            }
        }
        None
    }

    async fn submit(&mut self, kind: Kind) -> Result<(), String> {
        if self.submit_after.is_some_and(|t| Instant::now() < t) {
            return Ok(());
        }
        let port = self.free_port().ok_or_else(|| "no free port pair left in port_range".to_string())?;
        let args = sbatch_args(&self.name, &self.settings, kind, port);
        let slurm = self.slurm.clone();
        let r = blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            slurm.submit(&a)
        })
        .await;
        match r {
            Ok(job) => {
                tracing::info!(endpoint = %self.name, job, port, ?kind, "submitted a replica job");
                self.tracked.insert(job, Tracked::new(port, kind));
                self.view.lock().unwrap_or_else(|e| e.into_inner()).submitted.push(job);
                Ok(())
            }
            Err(e) => {
                // Do not hammer slurmctld with a submission it refuses.
                self.submit_after = Some(Instant::now() + self.settings.poll_interval.max(Duration::from_secs(1)) * 5);
                Err(format!("submitting a {kind:?} replica: {e}"))
            }
        }
    }

    /// Out of the router at once; reconcile cancels it once nothing is in
    /// flight (or the drain timeout passed).
    fn drain(&mut self, job: u32) {
        let Some(t) = self.tracked.get_mut(&job) else { return };
        if t.drain_started.is_some() || t.cancelled {
            return;
        }
        t.drain_started = Some(Instant::now());
        t.drain_started_unix = Some(unix_now());
        tracing::info!(endpoint = %self.name, job, "draining a replica job");
        if let Some(address) = t.address {
            let endpoint = self.endpoint.clone();
            let deadline = self.settings.drain_timeout;
            tokio::spawn(async move {
                let _ = endpoint.drain(address, deadline).await;
            });
        }
    }

    async fn cancel(&mut self, job: u32) -> Result<(), String> {
        let Some(t) = self.tracked.get_mut(&job) else { return Ok(()) };
        if t.cancelled {
            return Ok(());
        }
        if let Some(a) = t.address.take() {
            let _ = self.endpoint.remove(a);
        }
        // Never back into the router, whatever scancel says.
        t.drain_started.get_or_insert_with(Instant::now);
        t.drain_started_unix.get_or_insert_with(unix_now);
        let slurm = self.slurm.clone();
        let r = blocking(move || slurm.cancel(job, None)).await;
        if let Some(t) = self.tracked.get_mut(&job) {
            t.cancelled = r.is_ok();
        }
        match r {
            Ok(()) => {
                tracing::info!(endpoint = %self.name, job, "cancelled a replica job");
                Ok(())
            }
            Err(e) => Err(format!("cancelling replica job {job}: {e}")),
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
