//! The GPU hand-off check and Slurm's device isolation on nodes that track
//! processes and constrain devices by cgroup (`ProctrackType=proctrack/cgroup`,
//! `TaskPlugin=task/cgroup`, `ConstrainDevices=yes`), as production nodes
//! run them (issues #24 and #25), on a cluster of its own
//! (`onepool-devcluster up --cgroup`, cgroup v1: see
//! onepool_dev_cluster::cgroups for what this machine offers). The tests
//! run as an ordinary user and end with protected work getting its GPUs.
//!
//! Where the machine cannot host the mode, each test says so with the
//! measured reason and passes without running (a machine without cgroup v1
//! freezer and devices hierarchies).

use std::time::Duration;

use onepool_tests::{cgroup_cluster, Cleanup, TestCluster, User};

fn user(c: &TestCluster) -> User {
    c.user("op-mal", "research")
}

fn drained_reason(c: &TestCluster, node: &str) -> Option<String> {
    let out = c.ok("sinfo", &["-h", "-R", "-N", "-o", "%N|%E"]);
    out.lines().find_map(|l| l.split_once('|').filter(|(n, _)| *n == node).map(|(_, r)| r.to_string()))
}

fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// An empty file in the cluster's folder that the user's job writes into.
fn shared_file(c: &TestCluster, name: &str) -> std::path::PathBuf {
    let out = c.cluster.layout.root.join(format!("{name}-{}.out", std::process::id()));
    std::fs::write(&out, "").unwrap();
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    out
}

/// `script` as a 1-GPU agents job of `u` on `node`; its id.
fn submit_as(c: &TestCluster, u: &User, node: &str, script: &str) -> u32 {
    let args = [
        "--parsable",
        "-o",
        "/dev/null",
        "-A",
        "research",
        "--workload=agents",
        "--gpus=1",
        "-w",
        node,
        "--wrap",
        script,
    ];
    let r = c.run_as(u, "sbatch", &args);
    assert!(r.ok, "{}{}", r.stdout, r.stderr);
    r.stdout.trim().parse().unwrap()
}

/// The cluster, or `None` after printing why this machine cannot host it.
fn cluster() -> Option<&'static TestCluster> {
    match cgroup_cluster() {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("NOT RUN: no cgroup mode on this machine: {why}");
            None
        }
    }
}

/// Protected training runs on the node the test used.
fn protected_work_runs_on(c: &TestCluster, node: &str) {
    let _ = c.run("scontrol", &["update", &format!("NodeName={node}"), "State=RESUME"]);
    let id =
        c.sbatch(&["--workload=critical-training", "-t", "10", "--gpus=4", "-N1", "-w", node, "--wrap", "sleep 60"]);
    c.wait_state(id, "RUNNING", Duration::from_secs(60));
    assert_eq!(c.allocated_gpus(id), 4);
}

/// A process a job started with `setsid` outlives its step but not its job
/// cgroup: while the job runs, the hand-off check of another job on the
/// node proves whose it is (its cgroup path) and names the job; when the
/// job ends, Slurm kills it with the job. Under proctrack/linuxproc the
/// same process is "no Slurm job proven" and drains the node for good
/// (tests/cluster/handoff.rs).
#[test]
fn a_setsid_process_is_proven_by_its_job_cgroup_and_goes_with_its_job() {
    let Some(c) = cluster() else { return };
    let _cleanup = Cleanup(c);
    let mal = user(c);
    let node = "node2";
    let out = shared_file(c, "setsid");
    let script = format!("setsid sleep 1000 </dev/null >/dev/null 2>&1 &\necho $! > {}\nsleep 300\n", out.display());
    let holder_job = submit_as(c, &mal, node, &script);
    c.wait_state(holder_job, "RUNNING", Duration::from_secs(30));
    c.wait_until("the job to start its setsid process", Duration::from_secs(10), || {
        std::fs::read_to_string(&out).is_ok_and(|s| !s.trim().is_empty())
    });
    let pid: u32 = std::fs::read_to_string(&out).unwrap().trim().parse().unwrap();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    eprintln!("the setsid process {pid}: {}", cgroup.lines().find(|l| l.contains("freezer")).unwrap_or("?"));
    assert!(cgroup.contains(&format!("/job_{holder_job}/")), "in its job's cgroup: {cgroup}");
    // The fake GPU source says it holds the node's other GPUs (node2 has
    // minors 4-7): the next job there finds it on its GPU.
    let mut fake = std::fs::OpenOptions::new().append(true).open(c.cluster.layout.gpu_processes()).unwrap();
    for minor in 4..8 {
        std::io::Write::write_all(&mut fake, format!("{minor} {pid}\n").as_bytes()).unwrap();
    }
    drop(fake);
    let next = c.sbatch(&["--workload=agents", "--gpus=1", "-w", node, "--wrap", "true"]);
    c.wait_until("the prolog to find the held GPU", Duration::from_secs(30), || drained_reason(c, node).is_some());
    let reason = drained_reason(c, node).unwrap();
    eprintln!("job {next}'s prolog: {reason}");
    assert!(reason.contains(&format!("held by pid {pid} (sleep, uid {}) of job {holder_job}", mal.uid)), "{reason}");
    assert!(pid_alive(pid), "a process of a running job is never killed");
    // The job ends: Slurm ends its cgroup's processes, setsid or not.
    c.ok("scancel", &[&holder_job.to_string(), &next.to_string()]);
    c.wait_until("the setsid process to go with its job", Duration::from_secs(30), || !pid_alive(pid));
    // Clean the fake source again (the process is gone) and use the node.
    let text = std::fs::read_to_string(c.cluster.layout.gpu_processes()).unwrap();
    let kept: String = text.lines().filter(|l| !l.ends_with(&format!(" {pid}"))).map(|l| format!("{l}\n")).collect();
    std::fs::write(c.cluster.layout.gpu_processes(), kept).unwrap();
    let _ = std::fs::remove_file(&out);
    protected_work_runs_on(c, node);
}

/// A job may open only the GPUs Slurm gave it: the node's other GPU device
/// files are denied by the devices cgroup (EPERM), its own is allowed (and
/// answers ENXIO here: a fake device node, no driver).
#[test]
fn a_job_cannot_open_a_gpu_it_was_not_given() {
    let Some(c) = cluster() else { return };
    let _cleanup = Cleanup(c);
    let mal = user(c);
    let node = "node3";
    let dev = c.cluster.layout.root.join("dev");
    let out = shared_file(c, "devices");
    // node3 holds minors 8-11.
    let script = format!(
        "echo gpus=$SLURM_JOB_GPUS >> {out}\nfor m in 8 9 10 11; do python3 -c '\nimport os, sys\ntry:\n    os.close(os.open(sys.argv[1], os.O_RDWR)); print(sys.argv[2], \"opened\")\nexcept OSError as e:\n    print(sys.argv[2], e.errno)' {dev}/nvidia$m $m >> {out}; done\n",
        out = out.display(),
        dev = dev.display()
    );
    let job = submit_as(c, &mal, node, &script);
    c.wait_until("the job to finish", Duration::from_secs(60), || c.state(job).is_none());
    let said = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    eprintln!("job {job} on {node}:\n{said}");
    let own: u32 =
        said.lines().find_map(|l| l.strip_prefix("gpus=")).and_then(|g| g.split(',').next()?.parse().ok()).unwrap();
    let own_minor = 8 + own;
    for line in said.lines().filter(|l| !l.starts_with("gpus=")) {
        let (minor, result) = line.split_once(' ').unwrap();
        let minor: u32 = minor.parse().unwrap();
        if minor == own_minor {
            assert_eq!(result, libc::ENXIO.to_string(), "its own GPU is allowed (no driver behind the fake node)");
        } else {
            assert_eq!(result, libc::EPERM.to_string(), "/dev/nvidia{minor} is not the job's: {said}");
        }
    }
    protected_work_runs_on(c, node);
}
