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
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use onepool_decisions::handoff::{self, DirtyPrologAction, Holder, KillRules, Plan, Refusal, Refused};
use onepool_decisions::{gres_conf, ownership};
use onepool_gpu_inventory::{devfile, GpuDevice, GpuError, GpuSource};
use slurm_sys::log;
use slurm_sys::spank::Spank;

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
    slurm_sys::node::drain(node, reason).map_err(|e| e.to_string())
}

/// The check; returns the entry point's result.
pub fn run(sp: Spank, phase: Phase, args: &PluginArgs) -> c_int {
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
    let Some(job) = sp.job_id() else {
        log::error(&format!("{PLUGIN}: {stage}: no job id; GPU hand-off check skipped"));
        return OK;
    };
    let node = env("SLURMD_NODENAME").unwrap_or_default();
    let job_uid = sp.job_uid();
    let mut source = match onepool_gpu_inventory::open(&args.gpu_source) {
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
                    log::info(&format!("{PLUGIN}: {stage} of job {job}: killing {h}, proven by {proof}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn device(minor: u32) -> GpuDevice {
        GpuDevice {
            minor,
            nvml_index: None,
            uuid: None,
            name: None,
            memory_total_bytes: None,
            memory_used_bytes: None,
            processes: Vec::new(),
        }
    }

    fn with_gres_conf(path: &Path) -> PluginArgs {
        PluginArgs { gres_conf: Some(path.to_path_buf()), ..PluginArgs::default() }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("onepool-handoff-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_unreadable_gres_conf_is_an_error_naming_the_path_and_the_os_error() {
        let dir = scratch("unreadable");
        let devices = [device(4), device(5)];
        // A directory: it exists, and reading it fails (as root too, unlike
        // a file without read permission).
        let e = job_minors(&with_gres_conf(&dir), "node1", &[0], &devices).unwrap_err();
        assert!(e.starts_with(&format!("cannot read gres.conf {}: ", dir.display())), "{e}");
        assert!(e.contains("directory"), "{e}");
        let missing = dir.join("gres.conf");
        let e = job_minors(&with_gres_conf(&missing), "node1", &[0], &devices).unwrap_err();
        assert!(e.starts_with(&format!("cannot read gres.conf {}: No such file", missing.display())), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_gres_conf_that_does_not_parse_is_an_error() {
        let dir = scratch("parse");
        let conf = dir.join("gres.conf");
        std::fs::write(&conf, "NodeName=node[1- Name=gpu File=/dev/nvidia[0-1]\n").unwrap();
        let e = job_minors(&with_gres_conf(&conf), "node1", &[0], &[device(0)]).unwrap_err();
        assert!(e.starts_with(&format!("{}: gres.conf line 1: NodeName", conf.display())), "{e}");
        std::fs::write(&conf, "Name=gpu File=/nonexistent/nvidia0\n").unwrap();
        let e = job_minors(&with_gres_conf(&conf), "node1", &[0], &[device(0)]).unwrap_err();
        assert!(e.contains("names /nonexistent/nvidia0: cannot read GPU device file"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_a_gres_conf_without_files_for_the_node_maps_indices_in_minor_order() {
        let dir = scratch("autodetect");
        let conf = dir.join("gres.conf");
        std::fs::write(&conf, "AutoDetect=nvml\nNodeName=other Name=gpu File=/nonexistent/nvidia0\n").unwrap();
        let devices = [device(9), device(4), device(6)];
        assert_eq!(job_minors(&with_gres_conf(&conf), "node1", &[0, 2], &devices).unwrap(), [4, 9]);
        let e = job_minors(&with_gres_conf(&conf), "node1", &[3], &devices).unwrap_err();
        assert_eq!(e, "GPU index 3 is not among the 3 GPUs of node1");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A child as a regular user would start it: uid 4242 when the tests
    /// run as root, else the caller's own.
    fn user_child(env: &[(&str, &str)]) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("sleep");
        c.arg("60").stdin(std::process::Stdio::null()).envs(env.iter().copied());
        if slurm_sys::os::geteuid() == 0 {
            c.uid(4242).gid(4242);
        }
        c.spawn().unwrap()
    }

    /// The check's loop on a fake source naming `pid` on GPU 0.
    fn settle_on(name: &str, pid: u32, phase: Phase) -> Plan {
        settle_for(name, 4242, pid, phase)
    }

    fn settle_for(name: &str, job: u32, pid: u32, phase: Phase) -> Plan {
        let dir = scratch(name);
        let file = dir.join("gpus");
        std::fs::write(&file, format!("gpus 0-1\n0 {pid}\n")).unwrap();
        let mut source = onepool_gpu_inventory::FakeSource::new(file);
        let facts = Facts { job, job_uid: None, node: "node1", minors: &[0], rules: KillRules { min_uid: 1 } };
        let plan = settle(&mut source, phase, &facts, Duration::from_millis(600)).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        plan
    }

    #[test]
    fn a_spoofed_slurm_job_id_gets_a_holder_refused_not_killed() {
        for phase in [Phase::Epilog, Phase::Prolog] {
            let mut child = user_child(&[("SLURM_JOB_ID", "4242"), ("SLURM_JOBID", "4242")]);
            let plan = settle_on("spoofed", child.id(), phase);
            let alive = child.try_wait().unwrap().is_none();
            let _ = child.kill();
            let _ = child.wait();
            assert!(alive, "{phase:?}: a process that only says it is of job 4242 was killed");
            assert!(plan.kill.is_empty(), "{plan:?}");
            assert_eq!(plan.refused.len(), 1, "{plan:?}");
            assert_eq!(plan.refused[0].why, Refusal::NotProven);
            let reason = plan.drain_reason(4242).unwrap();
            assert!(reason.ends_with(", no Slurm job proven"), "{reason}");
        }
    }

    /// A root process running a binary named slurmstepd, titled as job
    /// `job`'s step 0, whose child is a user's task; the task's pid.
    fn stand_in_slurmstepd(dir: &Path, job: u32) -> (std::process::Child, u32) {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let stepd = dir.join("slurmstepd");
        std::fs::copy("/bin/bash", &stepd).unwrap();
        let mut c = std::process::Command::new(&stepd)
            .arg0(format!("slurmstepd: [{job}.0]"))
            .args(["-c", "setpriv --reuid=4242 --regid=4242 --clear-groups sleep 60 & echo $!; wait"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let task = line.trim().parse().unwrap();
        // setpriv execs sleep: wait (bounded) until the task runs as the user.
        for _ in 0..200 {
            if procinfo::uids(task).is_some_and(|u| u.real == 4242) && procinfo::stat(task).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        (c, task)
    }

    #[test]
    fn a_task_under_a_root_slurmstepd_is_killed_by_its_jobs_epilog_and_kept_by_another_jobs_prolog() {
        if slurm_sys::os::geteuid() != 0 {
            eprintln!("skipped: a stand-in slurmstepd must run as root");
            return;
        }
        let dir = scratch("stepd");
        let (mut stepd, task) = stand_in_slurmstepd(&dir, 4243);
        // Job 4243 still runs here (its slurmstepd does): another job's
        // prolog leaves the task alone.
        let prolog = settle_for("stepd-prolog", 4244, task, Phase::Prolog);
        let kept = procinfo::stat(task).is_some_and(|s| s.state != 'Z');
        // Job 4243's own epilog kills it, through the pidfd.
        let epilog = settle_for("stepd-epilog", 4243, task, Phase::Epilog);
        let gone = procinfo::stat(task).is_none_or(|s| s.state == 'Z');
        let _ = stepd.kill();
        let _ = stepd.wait();
        let _ = std::fs::remove_dir_all(dir);
        assert!(kept, "a task of a running job was killed by another job's prolog");
        assert_eq!(prolog.refused.len(), 1, "{prolog:?}");
        assert_eq!(prolog.refused[0].why, Refusal::StillRunning);
        assert!(
            matches!(prolog.refused[0].holder.proof, Some(ownership::Proof::Slurmstepd { job: 4243, .. })),
            "{prolog:?}"
        );
        assert!(epilog.is_clean(), "{epilog:?}");
        assert!(gone, "the job's own task survived its epilog");
    }

    #[test]
    fn the_kill_bound_comes_from_the_argument_or_login_defs() {
        let args = PluginArgs { handoff_min_uid: Some(5000), ..PluginArgs::default() };
        assert_eq!(kill_rules(&args).min_uid, 5000);
        assert!(kill_rules(&PluginArgs::default()).min_uid >= 1);
    }
}
