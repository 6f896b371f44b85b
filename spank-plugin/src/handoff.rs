//! The GPU hand-off check, run in the job_script context
//! (`slurm_spank_job_prolog` / `slurm_spank_job_epilog`, as root, in a
//! short-lived process forked by slurmd; no threads here). A job's GPUs are
//! only released after its epilog finishes, so the departing job's epilog is
//! where a clean hand-off is guaranteed; the prolog is a second line of
//! defence. The rules are in `onepool_decisions::handoff`; this module
//! gathers the facts (which processes hold the job's GPUs, whose they are)
//! and acts (kill, drain the node with a reason, fail).

use std::collections::HashSet;
use std::ffi::{c_int, CString};
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use onepool_decisions::gres_conf;
use onepool_decisions::handoff::{self, DirtyPrologAction, Holder, Plan};
use onepool_gpu::{devfile, GpuDevice, GpuError, GpuSource};
use slurm_sys::bindings::{spank_item, spank_t, update_node_msg_t};
use slurm_sys::NODE_STATE_DRAIN;
use slurm_sys::{host, log};

use crate::args::PluginArgs;
use crate::options::PLUGIN;

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
/// Without `File=` lines (AutoDetect), index i is the i-th smallest minor.
fn job_minors(args: &PluginArgs, node: &str, indices: &[u32], devices: &[GpuDevice]) -> Result<Vec<u32>, String> {
    let path = gres_conf_path(args);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let files = gres_conf::gpu_files(&text, node).map_err(|e| format!("{}: {e}", path.display()))?;
    let all: Vec<u32> = if files.is_empty() {
        let mut m: Vec<u32> = devices.iter().map(|d| d.minor).collect();
        m.sort_unstable();
        m
    } else {
        files.iter().map(|f| devfile::minor_of(Path::new(f)).map_err(|e| e.to_string())).collect::<Result<_, _>>()?
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

/// The Slurm job a process belongs to, from its environment (root can read it).
fn owner_job(pid: u32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|kv| std::str::from_utf8(kv.strip_prefix(b"SLURM_JOB_ID=")?).ok()?.parse().ok())
}

fn command(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_else(|_| "?".into())
}

/// Jobs with a slurmstepd on this host (`slurmstepd: [JOB.STEP]`).
fn running_jobs() -> Vec<u32> {
    let mut jobs = HashSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmd);
        if let Some(rest) = text.strip_prefix("slurmstepd: [") {
            if let Some(id) = rest.split(['.', ']']).next().and_then(|j| j.parse().ok()) {
                jobs.insert(id);
            }
        }
    }
    jobs.into_iter().collect()
}

fn holders(devices: &[GpuDevice], minors: &[u32]) -> Vec<Holder> {
    devices
        .iter()
        .filter(|d| minors.contains(&d.minor))
        .flat_map(|d| {
            d.processes.iter().map(move |p| Holder {
                minor: d.minor,
                pid: p.pid,
                job: owner_job(p.pid),
                command: command(p.pid),
            })
        })
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
    slurm_sys::compat::set_update_node_reason_uid(&mut msg, unsafe { libc::getuid() });
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
            log::error(&format!("{PLUGIN}: {stage} of job {job}: cannot map GPUs {indices:?} to devices: {e}"));
            return if args.require_gpu_source { FAIL } else { OK };
        }
    };
    log::debug(&format!("{PLUGIN}: {stage} of job {job} on {node}: GPU indices {indices:?} are devices {minors:?}"));
    let plan = settle(&mut *source, phase, job, &minors, args.handoff_timeout);
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

/// Kills what may be killed and re-checks until the GPUs are clean or the
/// timeout passes (CUDA contexts linger a while after SIGKILL).
fn settle(
    source: &mut dyn GpuSource,
    phase: Phase,
    job: u32,
    minors: &[u32],
    timeout: Duration,
) -> Result<Plan, GpuError> {
    let deadline = Instant::now() + timeout;
    let mut killed: HashSet<u32> = HashSet::new();
    loop {
        let found = holders(&source.devices()?, minors);
        let plan = match phase {
            Phase::Epilog => handoff::epilog(job, minors, &found),
            Phase::Prolog => {
                let mut running = running_jobs();
                running.push(job);
                handoff::prolog(minors, &found, &running)
            }
        };
        if plan.is_clean() || Instant::now() >= deadline {
            return Ok(plan);
        }
        for h in &plan.kill {
            if killed.insert(h.pid) {
                log::info(&format!("{PLUGIN}: {} of job {job}: killing {h}", phase.name()));
            }
            // SAFETY: kill(2); the pid was just seen on the job's GPU.
            unsafe { libc::kill(h.pid as i32, libc::SIGKILL) };
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
