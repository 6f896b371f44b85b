//! What the demo narrates, observed from the outside the way an operator
//! would: Slurm's view of the jobs (`squeue --json`, through the same
//! adapter onepoold uses) and onepoold's router (its control socket,
//! through the daemon's own client). Every change becomes one line of the
//! timeline, stamped with the seconds since the demo started.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::state::JobInfo;
use onepool_slurm_commands::SystemRunner;
use tokio::runtime::Handle;

/// The demo's event log; every line is printed as it happens and kept for
/// the summary.
pub struct Timeline {
    pub t0: Instant,
    events: Mutex<Vec<(f64, String)>>,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline { t0: Instant::now(), events: Mutex::new(Vec::new()) }
    }

    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn note(&self, msg: impl Into<String>) {
        let msg = msg.into();
        let t = self.now();
        println!("  {t:>6.1}s  {msg}");
        let _ = std::io::stdout().flush();
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push((t, msg));
    }

    pub fn events(&self) -> Vec<(f64, String)> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Baseline,
    Supplemental,
    /// A job the demo submitted itself (training, another user's job).
    Other,
}

/// One job as the demo has seen it so far. Times are seconds on the
/// demo's clock, when the change was first observed.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: u32,
    pub label: String,
    pub kind: Kind,
    /// Its start is announced by the demo, not here.
    quiet_start: bool,
    /// The replica's port (from its job name).
    pub port: Option<u16>,
    pub state: String,
    pub node: String,
    /// The replica's state in onepoold's router, if it is there.
    pub router: Option<String>,
    /// Requests the router handed to it.
    pub served: u64,
    /// Requests in flight on it at the last look.
    pub in_flight: u64,
    pub seen: f64,
    pub running: Option<f64>,
    pub serving: Option<f64>,
    pub preempted: Option<f64>,
    pub draining: Option<f64>,
    pub ended: Option<f64>,
}

impl Job {
    pub fn is_replica(&self) -> bool {
        self.kind != Kind::Other
    }

    /// In the router and taking requests.
    pub fn serves(&self) -> bool {
        self.ended.is_none() && self.router.as_deref() == Some("ready")
    }
}

#[derive(Default)]
pub struct Seen {
    pub jobs: BTreeMap<u32, Job>,
    /// Jobs the demo submitted, by id: the name to show, and whether the
    /// demo announces their start itself.
    labels: HashMap<u32, (String, bool)>,
    /// Jobs below this id belong to earlier runs.
    min_id: u32,
    last_error: Option<String>,
}

struct Shared {
    timeline: Arc<Timeline>,
    seen: Mutex<Seen>,
    stop: AtomicBool,
}

pub struct Watch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

pub struct Target {
    pub endpoint: String,
    pub socket: PathBuf,
    pub slurm_conf: String,
    pub uid: u32,
}

fn ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING" | "SUSPENDED" | "REQUEUED" | "REQUEUE_HOLD" | "RESIZING"
    )
}

impl Watch {
    pub fn start(timeline: Arc<Timeline>, target: Target, rt: Handle) -> Watch {
        let shared = Arc::new(Shared { timeline, seen: Mutex::new(Seen::default()), stop: AtomicBool::new(false) });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let slurm = Commands {
                runner: SystemRunner {
                    timeout: Duration::from_secs(20),
                    env: vec![("SLURM_CONF".into(), target.slurm_conf.clone())],
                },
            };
            while !s.stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                s.poll(&slurm, &rt, &target);
                std::thread::sleep(Duration::from_millis(400).saturating_sub(started.elapsed()));
            }
        });
        Watch { shared, thread: Some(thread) }
    }

    pub fn seen(&self) -> MutexGuard<'_, Seen> {
        self.shared.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follow `job` (submitted by the demo) under `label`; jobs with lower
    /// ids than the first one followed are from earlier runs and ignored.
    /// `quiet_start`: the demo announces the job's start itself.
    pub fn follow(&self, job: u32, label: &str, quiet_start: bool) {
        let mut s = self.seen();
        if s.labels.is_empty() && s.min_id == 0 {
            s.min_id = job;
        }
        s.labels.insert(job, (label.to_string(), quiet_start));
    }

    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Seen {
    pub fn replicas(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values().filter(|j| j.is_replica())
    }

    pub fn serving(&self, kind: Kind) -> Vec<&Job> {
        self.replicas().filter(|j| j.kind == kind && j.serves()).collect()
    }

    pub fn job(&self, id: u32) -> Option<&Job> {
        self.jobs.get(&id)
    }
}

/// One replica in onepoold's router.
struct InRouter {
    state: String,
    served: u64,
    in_flight: u64,
}

/// The endpoint's replicas in the router, by the slot in their job's name
/// (a replica listens where the kernel chose; onepoold's view of its jobs
/// says which address is which job's).
fn router_state(rt: &Handle, target: &Target) -> Option<HashMap<u16, InRouter>> {
    let control = onepool_control::Control::new(&target.socket, Duration::from_secs(2));
    let state = rt.block_on(control.state()).ok()?;
    let ep = state.endpoint(&target.endpoint)?;
    let slots: HashMap<std::net::SocketAddr, u16> =
        ep.replica_jobs.iter().flat_map(|v| &v.jobs).filter_map(|j| Some((j.address?, j.port))).collect();
    let mut out = HashMap::new();
    for r in &ep.replicas {
        let Some(slot) = slots.get(&r.address) else { continue };
        out.insert(
            *slot,
            InRouter { state: r.state.as_str().to_string(), served: r.served, in_flight: u64::from(r.in_flight) },
        );
    }
    Some(out)
}

impl Shared {
    fn poll(&self, slurm: &Commands<SystemRunner>, rt: &Handle, target: &Target) {
        let jobs = match slurm.jobs() {
            Ok(j) => j,
            Err(e) => {
                let e = e.to_string();
                let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if s.last_error.as_deref() != Some(e.as_str()) {
                    eprintln!("onepool-demo: squeue failed (retrying): {e}");
                    s.last_error = Some(e);
                }
                return;
            }
        };
        let router = router_state(rt, target);
        let tl = &self.timeline;
        let mut s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        s.last_error = None;
        let min_id = s.min_id;
        if min_id == 0 {
            return;
        }
        for j in &jobs {
            if j.job_id < min_id {
                continue;
            }
            let port = (j.user_id == target.uid)
                .then(|| onepool_launcher::conventions::port_from_name(&target.endpoint, &j.name))
                .flatten();
            let label = s.labels.get(&j.job_id).cloned();
            if port.is_none() && label.is_none() {
                continue;
            }
            let entry = s.jobs.entry(j.job_id).or_insert_with(|| new_job(j, port, label, tl));
            update(entry, j, router.as_ref(), tl);
        }
    }
}

fn new_job(j: &JobInfo, port: Option<u16>, label: Option<(String, bool)>, tl: &Timeline) -> Job {
    let quiet_start = label.as_ref().is_some_and(|l| l.1);
    let label = label.map(|l| l.0);
    let class = j.record().map(|r| r.class).unwrap_or_default();
    let kind = match (port, class.as_str()) {
        (None, _) => Kind::Other,
        (Some(_), "inference-baseline") => Kind::Baseline,
        (Some(_), _) => Kind::Supplemental,
    };
    let seen = tl.now();
    let label = label.unwrap_or_else(|| match kind {
        Kind::Baseline => format!("baseline replica {}", j.job_id),
        _ => format!("supplemental replica {}", j.job_id),
    });
    if kind != Kind::Other {
        tl.note(format!(
            "onepoold submitted {label} ({}, QOS {}, {} GPUs){}",
            j.name,
            j.qos,
            j.gpus(),
            if j.is_pending() && !j.state_reason.is_empty() && j.state_reason != "None" {
                format!(": pending ({})", j.state_reason)
            } else {
                String::new()
            }
        ));
    }
    Job {
        id: j.job_id,
        label,
        kind,
        quiet_start,
        port,
        state: String::new(),
        node: String::new(),
        router: None,
        served: 0,
        in_flight: 0,
        seen,
        running: None,
        serving: None,
        preempted: None,
        draining: None,
        ended: None,
    }
}

fn update(e: &mut Job, j: &JobInfo, router: Option<&HashMap<u16, InRouter>>, tl: &Timeline) {
    if e.ended.is_some() {
        return;
    }
    if !j.nodes.is_empty() {
        e.node = j.nodes.clone();
    }
    if j.job_state == "RUNNING" && e.running.is_none() {
        e.running = Some(tl.now());
        if e.is_replica() {
            tl.note(format!("{} running on {}: launcher up, model loading", e.label, e.node));
        } else if !e.quiet_start {
            tl.note(format!("{} running on {}", e.label, e.node));
        }
    }
    // A job that ended keeps its preempt_time, so a victim that was quicker
    // than one poll is still seen.
    if j.preempt_time != 0 && e.preempted.is_none() {
        e.preempted = Some(tl.now());
        tl.note(format!(
            "Slurm picks {} on {} as the preemption victim: USR1 notice to {}",
            e.label,
            e.node,
            if e.is_replica() { "its launcher, which drains" } else { "the job" }
        ));
    }
    if let (Some(port), Some(router)) = (e.port, router) {
        if let Some(InRouter { state, served, in_flight }) = router.get(&port) {
            e.served = e.served.max(*served);
            e.in_flight = *in_flight;
            if e.router.as_deref() != Some(state.as_str()) {
                match state.as_str() {
                    "ready" if e.serving.is_none() => {
                        e.serving = Some(tl.now());
                        tl.note(format!("{} serving: healthy, in the router", e.label));
                    }
                    "ready" => tl.note(format!("{} back in the router", e.label)),
                    "draining" => {
                        e.draining.get_or_insert(tl.now());
                        tl.note(format!(
                            "{} draining: out of the router; its {in_flight} request(s) in flight finish",
                            e.label
                        ));
                    }
                    "out" => tl.note(format!("{} failing requests or health checks: out of the router", e.label)),
                    _ => {}
                }
                e.router = Some(state.clone());
            }
        }
    }
    if e.state != j.job_state {
        if j.job_state == "PENDING" && e.state.is_empty() && !e.is_replica() && j.state_reason != "None" {
            tl.note(format!("{} pending ({})", e.label, j.state_reason));
        }
        e.state = j.job_state.clone();
    }
    if ended(&j.job_state) {
        e.ended = Some(tl.now());
        e.router = None;
        tl.note(if e.is_replica() {
            format!("{} ended ({}); the router handed it {} requests", e.label, j.job_state, e.served)
        } else {
            format!("{} ended ({})", e.label, j.job_state)
        });
    }
}
