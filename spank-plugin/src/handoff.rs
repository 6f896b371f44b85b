//! The GPU hand-off check, run in the job_script context
//! (`slurm_spank_job_prolog` / `slurm_spank_job_epilog`, as root, in a
//! short-lived process forked by slurmd; no threads here). A job's GPUs are
//! only released after its epilog finishes, so the departing job's epilog is
//! where a clean hand-off is guaranteed; the prolog is a second line of
//! defence. The rules are in `onepool_decisions::handoff` and
//! `onepool_decisions::ownership`; this module gathers the facts (which
//! processes hold the job's GPUs, which job each is proven to belong to,
//! see `procinfo`) and acts (kill through a pidfd, see `kill`; drain the
//! node with a reason; fail).

use std::collections::HashSet;
use std::ffi::{c_int, CString};
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use onepool_decisions::handoff::{self, DirtyPrologAction, Holder, KillRules, Plan, Refusal, Refused};
use onepool_decisions::{gres_conf, ownership};
use onepool_gpu::{devfile, GpuDevice, GpuError, GpuSource};
use slurm_sys::bindings::{spank_item, spank_t, update_node_msg_t};
use slurm_sys::NODE_STATE_DRAIN;
use slurm_sys::{host, log};

use crate::args::PluginArgs;
use crate::kill::{self, Outcome};
use crate::options::PLUGIN;
use crate::procinfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Prolog,
    Epilog,
}

const OK: c_int = 0;
const FAIL: c_int = -1;
const POLL: Duration = Duration::from_millis(250);

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Prolog => "prolog",
            Phase::Epilog => "epilog",
        }
    }
}

fn job_id(sp: spank_t) -> Option<u32> {
    let get = host::spank_get_item()?;
    let mut id: u32 = 0;
    // SAFETY: S_JOB_ID takes one `uint32_t *`.
    let rc = unsafe { get(sp, spank_item::S_JOB_ID, &mut id as *mut u32) };
    (rc == 0).then_some(id)
}

fn job_uid(sp: spank_t) -> Option<u32> {
    let get = host::spank_get_item()?;
    let mut uid: libc::uid_t = 0;
    // SAFETY: S_JOB_UID takes one `uid_t *`.
    let rc = unsafe { get(sp, spank_item::S_JOB_UID, &mut uid as *mut libc::uid_t) };
    (rc == 0).then_some(uid)
}

/// The job-script environment is this process's environment.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// gres.conf beside slurm.conf, unless the plugstack argument names one.
fn gres_conf_path(args: &PluginArgs) -> PathBuf {
    args.gres_conf.clone().unwrap_or_else(|| {
        env("SLURM_CONF")
            .and_then(|c| Path::new(&c).parent().map(|d| d.join("gres.conf")))
            .unwrap_or_else(|| PathBuf::from("/etc/slurm/gres.conf"))
    })
}

/// Device minors of the job's GPUs on this node: Slurm's indices map to
/// gres.conf's `File=` entries in order, and each file to its minor number.
/// A gres.conf that cannot be read or parsed fails the check: guessing the
/// mapping could clean the wrong GPUs and hand a held one on. Only one that
/// names no `File=` for this node (AutoDetect) maps index i to the i-th
/// smallest minor, and the log says so.
fn job_minors(args: &PluginArgs, node: &str, indices: &[u32], devices: &[GpuDevice]) -> Result<Vec<u32>, String> {
    let path = gres_conf_path(args);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read gres.conf {}: {e}", path.display()))?;
    let files = gres_conf::gpu_files(&text, node).map_err(|e| format!("{}: {e}", path.display()))?;
    let all: Vec<u32> = if files.is_empty() {
        log::info(&format!(
            "{PLUGIN}: {} names no GPU File= for {node}: Slurm's GPU indices are taken as devices in minor order",
            path.display()
        ));
        let mut m: Vec<u32> = devices.iter().map(|d| d.minor).collect();
        m.sort_unstable();
        m
    } else {
        files
            .iter()
            .map(|f| devfile::minor_of(Path::new(f)).map_err(|e| format!("{} names {f}: {e}", path.display())))
            .collect::<Result<_, _>>()?
    };
    indices
        .iter()
        .map(|i| {
            all.get(*i as usize)
                .copied()
                .ok_or_else(|| format!("GPU index {i} is not among the {} GPUs of {node}", all.len()))
        })
        .collect()
}

/// The lowest uid the check may kill: the plugstack.conf bound, else one
/// above login.defs' system users. An unreadable login.defs gives 1000, the
/// usual value, rather than no bound at all.
fn kill_rules(args: &PluginArgs) -> KillRules {
    let min_uid = args.handoff_min_uid.unwrap_or_else(|| {
        ownership::login_defs_min_uid(&std::fs::read_to_string("/etc/login.defs").unwrap_or_default())
    });
    KillRules { min_uid }
}

fn holders(devices: &[GpuDevice], minors: &[u32], node: &str, stepd_uid: u32) -> Vec<Holder> {
    devices
        .iter()
        .filter(|d| minors.contains(&d.minor))
        .flat_map(|d| d.processes.iter().map(move |p| procinfo::holder(d.minor, p.pid, node, stepd_uid)))
        .collect()
}

/// Drains `node` with `reason` (Slurm's own reason would only say "Epilog
/// error"), through slurmctld.
fn drain(node: &str, reason: &str) -> Result<(), String> {
    let (Some(init), Some(update)) = (host::slurm_init_update_node_msg(), host::slurm_update_node()) else {
        return Err("this process cannot update nodes (no slurm_update_node)".into());
    };
    let names = CString::new(node).map_err(|e| e.to_string())?;
    let why = log::to_cstring_lossy(reason);
    let mut msg: update_node_msg_t = unsafe { std::mem::zeroed() };
    // SAFETY: Slurm initialises the message; the strings outlive the call
    // and are not freed by slurm_update_node.
    unsafe { init(&mut msg) };
    msg.node_names = names.as_ptr() as *mut _;
    msg.node_state = NODE_STATE_DRAIN;
    msg.reason = why.as_ptr() as *mut _;
    msg.reason_uid = unsafe { libc::getuid() };
    let rc = unsafe { update(&mut msg) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("slurm_update_node returned {rc}"))
    }
}

/// The check; returns the entry point's result.
pub fn run(sp: spank_t, phase: Phase, args: &PluginArgs) -> c_int {
    let stage = phase.name();
    let Some(indices) = env("SLURM_JOB_GPUS") else { return OK };
    let indices = match handoff::parse_index_list(&indices) {
        Ok(i) if !i.is_empty() => i,
        Ok(_) => return OK,
        Err(e) => {
            log::error(&format!("{PLUGIN}: {stage}: SLURM_JOB_GPUS: {e}; GPU hand-off check skipped"));
            return OK;
        }
    };
    let Some(job) = job_id(sp) else {
        log::error(&format!("{PLUGIN}: {stage}: no job id; GPU hand-off check skipped"));
        return OK;
    };
    let node = env("SLURMD_NODENAME").unwrap_or_default();
    let job_uid = job_uid(sp);
    let mut source = match onepool_gpu::open(&args.gpu_source) {
        Ok(Some(s)) => s,
        Ok(None) => return OK,
        Err(e) => return source_unavailable(stage, job, &e, args),
    };
    let devices = match source.devices() {
        Ok(d) => d,
        Err(e) => return source_unavailable(stage, job, &e, args),
    };
    let minors = match job_minors(args, &node, &indices, &devices) {
        Ok(m) => m,
        Err(e) => {
            // Which GPUs to check is unknown, so none may be handed on.
            log::error(&format!("{PLUGIN}: {stage} of job {job}: cannot map GPUs {indices:?} to devices: {e}"));
            let reason = format!("onepool: after job {job}: GPU hand-off check failed: {e}");
            if let Err(e) = drain(&node, &reason) {
                log::error(&format!("{PLUGIN}: cannot drain {node}: {e}"));
            }
            return FAIL;
        }
    };
    log::debug(&format!("{PLUGIN}: {stage} of job {job} on {node}: GPU indices {indices:?} are devices {minors:?}"));
    let facts = Facts { job, job_uid, node: &node, minors: &minors, rules: kill_rules(args) };
    let plan = settle(&mut *source, phase, &facts, args.handoff_timeout);
    let plan = match plan {
        Ok(p) => p,
        Err(e) => return source_unavailable(stage, job, &e, args),
    };
    if plan.is_clean() {
        log::verbose(&format!("{PLUGIN}: {stage} of job {job}: GPUs {minors:?} are clean"));
        return OK;
    }
    let reason = plan.drain_reason(job).unwrap_or_default();
    log::error(&format!(
        "{PLUGIN}: {stage} of job {job} on {node}: GPU still held after {:?}: {reason}",
        args.handoff_timeout
    ));
    if let Err(e) = drain(&node, &reason) {
        log::error(&format!("{PLUGIN}: cannot drain {node}: {e}"));
    }
    match (phase, args.prolog_dirty) {
        (Phase::Prolog, DirtyPrologAction::Run) => OK,
        _ => FAIL,
    }
}

/// What the check knows about the job and the node.
struct Facts<'a> {
    job: u32,
    job_uid: Option<u32>,
    node: &'a str,
    minors: &'a [u32],
    rules: KillRules,
}

/// Kills what may be killed and re-checks until the GPUs are clean or the
/// timeout passes (CUDA contexts linger a while after SIGKILL). Without
/// pidfds nothing is killed: the plan comes back at once, the holders
/// refused, so the node is drained instead.
fn settle(source: &mut dyn GpuSource, phase: Phase, f: &Facts, timeout: Duration) -> Result<Plan, GpuError> {
    let deadline = Instant::now() + timeout;
    let stage = phase.name();
    let job = f.job;
    let stepd_uid = procinfo::stepd_uid();
    let mut said: HashSet<(u32, u64)> = HashSet::new();
    loop {
        let found = holders(&source.devices()?, f.minors, f.node, stepd_uid);
        let mut plan = match phase {
            Phase::Epilog => handoff::epilog(job, f.job_uid, f.minors, &found, &f.rules),
            Phase::Prolog => {
                let mut running = procinfo::running_jobs(stepd_uid);
                running.push(job);
                handoff::prolog(f.minors, &found, &running, &f.rules)
            }
        };
        if plan.is_clean() || Instant::now() >= deadline {
            return Ok(plan);
        }
        for h in std::mem::take(&mut plan.kill) {
            let first = said.insert((h.pid, h.start_time.unwrap_or_default()));
            let proof = h.proof.as_ref().map(ToString::to_string).unwrap_or_default();
            match kill::kill(&h, &f.rules) {
                Outcome::Signalled if first => {
                    log::info(&format!("{PLUGIN}: {stage} of job {job}: killing {h} ({proof})"))
                }
                Outcome::Signalled | Outcome::Gone => {}
                Outcome::Reused { now } => log::info(&format!(
                    "{PLUGIN}: {stage} of job {job}: not killing pid {}: it started at {now}, not at {:?} as the \
                     holder did (the pid was reused)",
                    h.pid, h.start_time
                )),
                Outcome::Refused(why) => {
                    log::info(&format!("{PLUGIN}: {stage} of job {job}: not killing {}", Refused { holder: h, why }))
                }
                Outcome::NoPidfd => {
                    log::error(&format!(
                        "{PLUGIN}: {stage} of job {job}: not killing {h}: this kernel has no pidfd_open (Linux 5.3), \
                         and kill(2) could hit a reused pid; draining instead"
                    ));
                    plan.refused.push(Refused { holder: h, why: Refusal::NoPidfd });
                }
                Outcome::Failed(e) => log::error(&format!("{PLUGIN}: {stage} of job {job}: cannot kill {h}: {e}")),
            }
        }
        if plan.refused.iter().any(|r| r.why == Refusal::NoPidfd) {
            return Ok(plan);
        }
        sleep(POLL);
    }
}

fn source_unavailable(stage: &str, job: u32, e: &GpuError, args: &PluginArgs) -> c_int {
    if e.is_no_driver() && !args.require_gpu_source {
        log::verbose(&format!("{PLUGIN}: {stage} of job {job}: {e}"));
        return OK;
    }
    log::error(&format!("{PLUGIN}: {stage} of job {job}: {e}"));
    if args.require_gpu_source {
        FAIL
    } else {
        OK
    }
}
