//! The foundation, on the real cluster: nodes and fake GPUs, GPU binding,
//! QOS preemption, and both plugins loaded by every daemon and command that
//! should load them.

use std::time::Duration;

use onepool_tests::{cluster, Cleanup};

#[test]
fn four_nodes_with_four_gpus_each_are_idle() {
    let c = cluster();
    let out = c.ok("sinfo", &["-h", "-N", "-p", "gpu", "-o", "%N %t %G"]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 4, "sinfo: {out}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], format!("node{}", i + 1));
        assert_eq!(r[1], "idle", "{out}");
        assert_eq!(r[2], "gpu:4", "{out}");
    }
}

#[test]
fn a_one_gpu_job_sees_exactly_one_gpu() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let out = c.ok("srun", &["--gpus=1", "bash", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES GPUS=$SLURM_JOB_GPUS"]);
    let line = out.lines().find(|l| l.starts_with("CVD=")).unwrap_or_else(|| panic!("no CVD line in {out:?}"));
    let cvd = line.split_whitespace().next().unwrap().trim_start_matches("CVD=");
    assert_eq!(cvd.split(',').count(), 1, "{line}");
    assert!(cvd.parse::<u32>().is_ok(), "{line}");

    let out = c.ok("srun", &["--gpus=4", "-N1", "bash", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]);
    let cvd = out.trim().trim_start_matches("CVD=");
    assert_eq!(cvd.split(',').count(), 4, "{out}");
}

#[test]
fn a_guaranteed_job_preempts_an_opportunistic_one() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let from = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    // Opportunistic work holds every GPU flexible work may hold (12), and
    // baseline serving the 4 reserved ones.
    let borrowers: Vec<u32> =
        (0..3).map(|_| c.sbatch(&["-q", "op-agents", "--gpus=4", "-N1", "--wrap", "sleep 600"])).collect();
    let baseline = c.sbatch(&["-q", "op-inference-baseline", "--gpus=4", "-N1", "--wrap", "sleep 600"]);
    for j in borrowers.iter().chain([&baseline]) {
        c.wait_state(*j, "RUNNING", Duration::from_secs(30));
    }
    let owner = c.sbatch(&["-q", "op-critical-training", "--time=1:00:00", "--gpus=4", "-N1", "--wrap", "sleep 600"]);
    // The borrowers are younger than PreemptExemptTime (10 s): Slurm
    // preempts one at its first scheduling pass after that, which was
    // 10-39 s after submission in runs here (the main scheduler's periodic
    // pass is every 60 s).
    let took = c.wait_state(owner, "RUNNING", Duration::from_secs(80));
    eprintln!("guaranteed job running {took:?} after submission");
    let gone: Vec<u32> = borrowers.iter().copied().filter(|b| c.state(*b).is_none()).collect();
    assert_eq!(gone.len(), 1, "exactly one borrower yields 4 GPUs: {gone:?}");
    assert_eq!(c.state(baseline).as_deref(), Some("RUNNING"), "protected work is never preempted");
    c.wait_until("accounting to record the preemption", Duration::from_secs(30), || {
        c.sacct_state(gone[0]).as_deref() == Some("PREEMPTED")
    });

    // `onepool report` measures the same from Slurm's accounting: the
    // reclaim, who got the GPUs and how soon, the classes' GPU-hours
    // (sacct counts whole seconds: the owner has run for some first).
    std::thread::sleep(Duration::from_secs(2));
    let out = c
        .cmd(onepool_tests::build_dir().join("onepool").to_str().unwrap())
        .args(["report", "--json", "--from", &from])
        .arg(c.cluster.layout.policy())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reclaims = r["reclaims"].as_array().unwrap();
    assert_eq!(reclaims.len(), 1, "{r:#}");
    let x = &reclaims[0];
    assert_eq!(
        (x["job"].as_str(), x["class"].as_str(), x["mode"].as_str()),
        (Some(gone[0].to_string().as_str()), Some("agents"), Some("immediate"))
    );
    assert_eq!(
        (x["for_job"].as_str(), x["for_class"].as_str()),
        (Some(owner.to_string().as_str()), Some("critical-training")),
        "{x}"
    );
    // sacct's times are whole seconds.
    assert!(x["time_to_capacity_s"].as_f64().unwrap() <= took.as_secs_f64().ceil() + 1.0, "{x} (measured {took:?})");
    let hours = |class: &str| {
        r["classes"].as_array().unwrap().iter().find(|c| c["class"] == class).unwrap()["gpu_hours"].as_f64().unwrap()
    };
    assert!(hours("agents") > 0.0 && hours("critical-training") > 0.0 && hours("inference-baseline") > 0.0, "{r:#}");
}

#[test]
fn job_submit_plugin_is_loaded_by_slurmctld() {
    let c = cluster();
    assert!(
        c.log("slurmctld").contains("job_submit/onepool: loaded (built for Slurm"),
        "no load line in slurmctld.log"
    );
    assert!(c
        .ok("scontrol", &["show", "config"])
        .lines()
        .any(|l| l.starts_with("JobSubmitPlugins") && l.contains("onepool")));
}

#[test]
fn spank_plugin_is_loaded_by_sbatch_srun_salloc_slurmd_and_slurmstepd() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    // The options exist in every submit command's --help.
    for cmd in ["sbatch", "srun", "salloc"] {
        let help = c.ok(cmd, &["--help"]);
        for opt in
            ["--workload=CLASS", "--reclaim=immediate|graceful|requeue", "--drain-timeout=DURATION", "--endpoint=NAME"]
        {
            assert!(help.contains(opt), "{cmd} --help lacks {opt}");
        }
    }
    // slurmd loads it at start (and says so in its log).
    for n in 1..=4 {
        let log = c.log(&format!("slurmd-node{n}"));
        assert!(log.contains("spank/onepool: loaded in slurmd"), "slurmd-node{n}.log has no load line");
    }
    // slurmstepd runs it for the tasks: the annotation reaches their environment.
    let out = c.ok("srun", &["--workload=training", "printenv", "ONEPOOL_WORKLOAD"]);
    assert_eq!(out.trim(), "training");
    let out = c.ok("salloc", &["--workload=agents", "srun", "printenv", "ONEPOOL_WORKLOAD"]);
    assert!(out.contains("agents"), "{out}");
}

#[test]
fn spank_options_are_checked_on_the_submit_host() {
    let c = cluster();
    let r = c.run("sbatch", &["--drain-timeout=5x", "--wrap", "true"]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("sbatch: error: --drain-timeout: invalid duration \"5x\": it contains a character that is neither a digit nor one of the units d, h, m, s; accepted forms: seconds (90), a number with a unit (90s, 5m, 2h, 1d), units combined (1h30m), or Slurm's [[DD-]HH:]MM:SS (01:30:00)"),
        "{}",
        r.stderr
    );
    let r = c.run("salloc", &["--endpoint=Bad Name", "true"]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("salloc: error: --endpoint: invalid endpoint name \"Bad Name\": it does not start with a lowercase letter (use 1-63 characters: lowercase letters, digits, '-' or '_', starting with a letter)"),
        "{}",
        r.stderr
    );
    let r = c.run("srun", &["--reclaim=later", "true"]);
    assert!(!r.ok);
    assert!(
        r.stderr
            .contains("srun: error: --reclaim: \"later\" is not a reclaim mode; use immediate, graceful or requeue"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_second_cluster_in_another_folder_does_not_collide_and_down_leaves_nothing() {
    let c = cluster();
    let dir = onepool_tests::output_dir().join("second-cluster");
    let second = onepool_dev_cluster::Cluster::at(&dir).unwrap();
    let opts = onepool_dev_cluster::UpOptions { nodes: 2, ..onepool_tests::up_options() };
    let spec = second.up(&opts, &mut |_| {}).expect("second cluster up");
    assert_ne!(spec.cluster, c.spec.cluster);
    assert_ne!(spec.ctld_port, c.spec.ctld_port);
    // Idempotent: a second `up` changes nothing and keeps the same daemons.
    let before = second.status();
    second.up(&opts, &mut |_| {}).unwrap();
    assert_eq!(second.status(), before);
    let out = second.run("srun", &["--gpus=1", "printenv", "SLURM_CLUSTER_NAME"]).unwrap();
    assert_eq!(out.trim(), spec.cluster);
    // Both answer, each with its own nodes.
    assert_eq!(second.run("sinfo", &["-h", "-N", "-p", "gpu", "-o", "%N"]).unwrap().lines().count(), 2);
    assert_eq!(c.ok("sinfo", &["-h", "-N", "-p", "gpu", "-o", "%N"]).lines().count(), 4);
    let pids: Vec<i32> = second.status().iter().filter_map(|(_, p)| *p).collect();
    assert_eq!(pids.len(), 4 + 2, "munged, mariadbd, slurmdbd, slurmctld and 2 slurmd");
    second.down(&mut |_| {}).unwrap();
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty() || stat.contains(") Z "), "pid {pid} still runs after down");
    }
    assert!(second.status().iter().all(|(_, p)| p.is_none()));
    c.assert_ctld_up();
}
