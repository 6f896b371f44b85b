//! The GPU hand-off check on the real cluster, with the fake GPU source
//! (this machine has no NVIDIA driver). The check kills only processes
//! proven to be of a departed job, by their job cgroup or a slurmstepd
//! ancestor; this cluster runs `proctrack/linuxproc` without cgroups, and a
//! process that outlives its step is reparented away from its slurmstepd,
//! so here nothing left behind can be proven: a straggler the job leaves on
//! its GPU, a process that only claims a job in its environment and one of
//! no job at all each drain the node with a reason naming the GPU and the
//! holder, and are not killed; protected work runs on clean GPUs elsewhere;
//! with no GPU source at all jobs still run. (The kill through a pidfd of a
//! process under a root slurmstepd is tested in the SPANK plugin's unit
//! tests.)

use std::fs::OpenOptions;
use std::io::Write;
use std::process::{Child, Command};
use std::time::Duration;

use onepool_tests::{cluster, Cleanup, TestCluster};

/// The job script's own GPU as a device minor: in the dev cluster node k
/// holds minors 4(k-1)..4k-1, in Slurm's index order.
const MINOR_OF_MY_GPU: &str = r#"minor=$(( (${SLURMD_NODENAME#node} - 1) * 4 + ${SLURM_JOB_GPUS%%,*} ))"#;

fn fake_file(c: &TestCluster) -> std::path::PathBuf {
    c.cluster.layout.gpu_processes()
}

fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn drained_reason(c: &TestCluster, node: &str) -> Option<String> {
    let out = c.ok("sinfo", &["-h", "-R", "-N", "-o", "%N|%E"]);
    out.lines().find_map(|l| l.split_once('|').filter(|(n, _)| *n == node).map(|(_, r)| r.to_string()))
}

struct Resume<'a>(&'a TestCluster, String, Option<Child>);

/// A process the test left running that is not its child.
struct KillPid(u32);

impl Drop for KillPid {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid the job reported; the test ends it.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        if let Some(mut child) = self.2.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.0.run("scontrol", &["update", &format!("NodeName={}", self.1), "State=RESUME"]);
    }
}

#[test]
fn a_straggler_that_outlived_its_step_is_not_proven_so_the_epilog_drains_instead_of_killing() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let fake = fake_file(c);
    let out = std::env::temp_dir().join(format!("onepool-straggler-{}", std::process::id()));
    let script = format!(
        "{MINOR_OF_MY_GPU}\nsetsid sleep 1000 </dev/null >/dev/null 2>&1 &\necho \"$minor $!\" >> {}\necho \"$SLURMD_NODENAME $minor $!\" > {}\n",
        fake.display(),
        out.display()
    );
    let job = c.sbatch(&["--gpus=1", "--wrap", &script]);
    c.wait_until("the job to finish", Duration::from_secs(30), || c.state(job).is_none());
    let said = std::fs::read_to_string(&out).expect("the job wrote its straggler");
    let _ = std::fs::remove_file(out);
    let f: Vec<&str> = said.split_whitespace().collect();
    let (node, minor, pid): (&str, u32, u32) = (f[0], f[1].parse().unwrap(), f[2].parse().unwrap());
    let _resume = Resume(c, node.to_string(), None);
    let _straggler = KillPid(pid);
    c.wait_until("the epilog to drain the node", Duration::from_secs(30), || drained_reason(c, node).is_some());
    let reason = drained_reason(c, node).unwrap();
    assert!(
        reason.contains(&format!(
            "onepool: after job {job}: /dev/nvidia{minor} held by pid {pid} (sleep, uid 0), no Slurm job proven"
        )),
        "sinfo -R reason: {reason}"
    );
    assert!(pid_alive(pid), "the straggler {pid} was killed without proof of its job");
    assert!(!c.log(&format!("slurmd-{node}")).contains(&format!("killing /dev/nvidia{minor} held by pid {pid} ")));
}

#[test]
fn a_gpu_held_by_a_foreign_process_drains_the_node_and_protected_work_runs_elsewhere() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let fake = fake_file(c);
    // A job takes a GPU; while it runs, something that is not a Slurm job
    // grabs the same GPU.
    let said = std::env::temp_dir().join(format!("onepool-gpus-{}", std::process::id()));
    let _ = std::fs::remove_file(&said);
    let job = c.sbatch(&[
        "--gpus=1",
        "-w",
        "node2",
        "--wrap",
        &format!("echo $SLURM_JOB_GPUS > {}; sleep 600", said.display()),
    ]);
    c.wait_until("the job to say which GPU it has", Duration::from_secs(30), || {
        std::fs::read_to_string(&said).is_ok_and(|s| s.ends_with('\n'))
    });
    let index: u32 = std::fs::read_to_string(&said).unwrap().trim().parse().unwrap();
    let _ = std::fs::remove_file(&said);
    let minor = 4 + index;
    let holder = Command::new("sleep").arg("1000").env_remove("SLURM_JOB_ID").spawn().unwrap();
    let holder_pid = holder.id();
    let _resume = Resume(c, "node2".into(), Some(holder));
    writeln!(OpenOptions::new().append(true).open(&fake).unwrap(), "{minor} {holder_pid}").unwrap();
    c.ok("scancel", &[&job.to_string()]);
    c.wait_until("node2 to be drained by the epilog", Duration::from_secs(30), || drained_reason(c, "node2").is_some());
    let reason = drained_reason(c, "node2").unwrap();
    assert!(
        reason.contains(&format!(
            "onepool: after job {job}: /dev/nvidia{minor} held by pid {holder_pid} (sleep, uid 0), no Slurm job proven"
        )),
        "sinfo -R reason: {reason}"
    );
    // Protected work submitted now runs on clean GPUs elsewhere, not held.
    let owner = c.sbatch(&["-q", "op-critical-training", "--time=10:00", "--gpus=4", "-N1", "--wrap", "sleep 60"]);
    c.wait_state(owner, "RUNNING", Duration::from_secs(30));
    let node = c.job_fields(owner)["NodeList"].clone();
    assert_ne!(node, "node2");
}

#[test]
fn without_any_gpu_source_jobs_still_run() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let plugstack = c.cluster.layout.plugstack_conf();
    let original = std::fs::read_to_string(&plugstack).unwrap();
    // slurmstepd reads plugstack.conf for every job: NVML, with no driver here.
    let nvml = original.replace(&format!("gpu_source=fake:{}", fake_file(c).display()), "gpu_source=nvml");
    assert_ne!(nvml, original);
    std::fs::write(&plugstack, &nvml).unwrap();
    struct Restore(std::path::PathBuf, String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, &self.1);
        }
    }
    let _restore = Restore(plugstack, original);
    let out = c.ok("srun", &["--gpus=1", "bash", "-c", "echo ran on $SLURMD_NODENAME"]);
    assert!(out.contains("ran on node"), "{out}");
    let job = c.sbatch(&["--gpus=2", "--wrap", "true"]);
    c.wait_until("the batch job to finish", Duration::from_secs(30), || c.state(job).is_none());
    assert_eq!(c.final_state(job).as_deref(), Some("COMPLETED"));
    assert!(c.ok("sinfo", &["-h", "-R"]).trim().is_empty(), "no node may be drained for lacking NVML");
}

#[test]
fn a_slurm_job_id_in_the_environment_is_no_proof_so_the_prolog_drains_and_kills_nothing() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    // A process claiming to be a long-gone job's sits on node3's first GPU
    // (minor 8): anyone can set SLURM_JOB_ID.
    let orphan = Command::new("sleep").arg("1000").env("SLURM_JOB_ID", "999999").spawn().unwrap();
    let pid = orphan.id();
    let _resume = Resume(c, "node3".into(), Some(orphan));
    writeln!(OpenOptions::new().append(true).open(fake_file(c)).unwrap(), "8 {pid}").unwrap();
    let job = c.sbatch(&["--gpus=4", "-w", "node3", "--wrap", "true"]);
    c.wait_until("the prolog to drain node3", Duration::from_secs(30), || drained_reason(c, "node3").is_some());
    let reason = drained_reason(c, "node3").unwrap();
    assert!(
        reason.contains(&format!(
            "onepool: after job {job}: /dev/nvidia8 held by pid {pid} (sleep, uid 0), no Slurm job proven"
        )),
        "sinfo -R reason: {reason}"
    );
    assert!(pid_alive(pid), "a process that only claimed job 999999 was killed");
    // prolog_dirty=fail: the job never ran on the held GPU; Slurm requeues it held.
    assert_ne!(c.sacct_state(job).as_deref(), Some("COMPLETED"));
    assert!(!c.log("slurmd-node3").contains(&format!("killing /dev/nvidia8 held by pid {pid} ")));
}
