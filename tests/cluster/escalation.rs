//! The guarantee tested the way an attacker would: an ordinary user (no
//! entitlement to any protected class) tries every path a user has to take
//! more of the pool than the policy gives, or to take it out of the reach
//! of preemption: sbatch, srun, salloc, arrays, heterogeneous jobs, libslurm
//! without SPANK, and `scontrol update` of every field that sizes or places
//! a job. Each attempt records what the user is told and that slurmctld
//! still answers; each test ends with the point of it all: protected work
//! submitted afterwards gets its GPUs, and every job of the attacker that
//! runs stays inside its flexible class.

use std::path::PathBuf;
use std::time::Duration;

use onepool_tests::{build_dir, cluster, Cleanup, Ran, TestCluster, User};

fn attacker(c: &TestCluster) -> User {
    c.user("op-eve", "research")
}
fn owner(c: &TestCluster) -> User {
    c.user("op-alice", "core-ml")
}

/// Flexible class QOS and their GPU caps in the test policy (etc/onepool.toml).
const FLEXIBLE: [(&str, u64); 3] = [("op-training", 12), ("op-inference", 4), ("op-agents", 4)];
const FLEXIBLE_PARTITION: &str = "gpu-flex";
/// GPUs flexible work may hold together (16 in the pool, 4 reserved).
const FLEXIBLE_CAP: u64 = 12;

/// Every running job of `u` is in a flexible class's QOS, in the flexible
/// partition, within its class's cap; together within the flexible cap.
fn attacker_stays_in_the_pool(c: &TestCluster, u: &User) {
    let out = c.ok("squeue", &["-h", "-u", &u.name, "-t", "RUNNING", "-o", "%i"]);
    let mut total = 0;
    for id in out.split_whitespace() {
        let job = id.split('_').next().unwrap().parse().unwrap();
        let f = c.job_fields(job);
        let qos = f.get("QOS").cloned().unwrap_or_default();
        let cap = FLEXIBLE
            .iter()
            .find(|(q, _)| *q == qos)
            .unwrap_or_else(|| panic!("job {id} of {} runs in QOS {qos}, outside the pool's classes", u.name))
            .1;
        assert_eq!(f["Partition"], FLEXIBLE_PARTITION, "job {id} runs outside the flexible partition");
        let gpus = c.allocated_gpus(job);
        assert!(gpus <= cap, "job {id} holds {gpus} GPUs, past its class cap {cap}");
        total += gpus;
    }
    assert!(total <= FLEXIBLE_CAP, "{} holds {total} GPUs, past the flexible cap", u.name);
}

/// The point of every attempt: the protected classes get their GPUs (the
/// baseline its 4 reserved ones, critical training its 8), preempting
/// borrowers if need be, within the policy's minimum run time and a margin.
fn protected_work_runs(c: &TestCluster, attacker: &User) {
    attacker_stays_in_the_pool(c, attacker);
    let alice = owner(c);
    let base = c.sbatch(&["--workload=inference-baseline", "--gpus=4", "-N1", "-t", "10", "--wrap", "sleep 300"]);
    let crit = submit(
        c,
        &alice,
        &[
            "--account=core-ml",
            "--workload=critical-training",
            "-t",
            "10",
            "--gpus-per-node=4",
            "-N2",
            "--wrap",
            "sleep 300",
        ],
    );
    let limit = Duration::from_secs(onepool_tests::TEST_MIN_RUNTIME_SECS + 50);
    c.wait_state(base, "RUNNING", limit);
    c.wait_state(crit, "RUNNING", limit);
    attacker_stays_in_the_pool(c, attacker);
    c.assert_ctld_up();
}

fn as_user(c: &TestCluster, u: &User, program: &str, args: &[&str]) -> Ran {
    let r = c.run_as(u, program, args);
    c.assert_ctld_up();
    r
}

/// sbatch as `u`, which must succeed; the job id.
fn submit(c: &TestCluster, u: &User, args: &[&str]) -> u32 {
    let mut all = vec!["--parsable", "-o", "/dev/null"];
    all.extend_from_slice(args);
    let r = as_user(c, u, "sbatch", &all);
    assert!(r.ok, "sbatch {args:?} as {}: {}", u.name, r.stderr);
    r.stdout.trim().parse().unwrap_or_else(|_| panic!("sbatch printed {:?}", r.stdout))
}

fn held_agents_job(c: &TestCluster, u: &User) -> u32 {
    submit(c, u, &["-A", &u.account, "--workload=agents", "--gpus=4", "-t", "10", "--hold", "--wrap", "sleep 300"])
}

const OVER_CAP: &str = "onepool: class agents allows at most 4 GPUs per job and this job asks for 16";
const EXCLUSIVE: &str = "onepool: class agents allows at most 4 GPUs per job and this --exclusive job gets every GPU of its 2 node(s), 8 (it asks for 2)";

#[test]
fn every_submission_path_is_classified_and_capped() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let eve = attacker(c);
    let a = eve.account.as_str();
    // Users the policy does not name are not looked up on slurmctld's
    // submit path (NSS can block): they are named by uid.
    let not_entitled = |class: &str| {
        format!("onepool: class {class} is protected and uid {} with account research is not entitled to it", eve.uid)
    };
    let (critical, baseline) = (not_entitled("critical-training"), not_entitled("inference-baseline"));
    // (program, arguments, what the user must read)
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("sbatch", vec!["-A", a, "--qos=normal", "-p", "gpu", "--gpus=16", "--wrap", "true"], OVER_CAP),
        ("sbatch", vec!["-A", a, "--qos=op-critical-training", "-t", "10", "--gpus=1", "--wrap", "true"], &critical),
        ("sbatch", vec!["-A", a, "--workload=inference-baseline", "--gpus=1", "--wrap", "true"], &baseline),
        // A node range may be given its upper end: 4 nodes x 4 GPUs.
        ("sbatch", vec!["-A", a, "-N1-4", "--gpus-per-node=4", "--wrap", "true"], OVER_CAP),
        (
            "sbatch",
            vec!["-A", a, "-N1", "--sockets-per-node=2", "--gpus-per-socket=4", "--wrap", "true"],
            "onepool: class agents allows at most 4 GPUs per job and this job asks for 8",
        ),
        (
            "sbatch",
            vec!["-A", a, "-N2", "--ntasks-per-node=4", "--gpus-per-task=1", "--wrap", "true"],
            "onepool: class agents allows at most 4 GPUs per job and this job asks for 8",
        ),
        ("sbatch", vec!["-A", a, "--array=0-3", "--qos=normal", "-p", "gpu", "--gpus=16", "--wrap", "true"], OVER_CAP),
        (
            "sbatch",
            vec![
                "-A",
                a,
                "-t",
                "5",
                "--gpus=1",
                ":",
                "-A",
                a,
                "--qos=normal",
                "-p",
                "gpu",
                "--gpus=16",
                "--wrap",
                "true",
            ],
            OVER_CAP,
        ),
        // --exclusive gets every GPU of its nodes (issue #25): 2 x 4 = 8.
        ("sbatch", vec!["-A", a, "--workload=agents", "--gpus=2", "--exclusive", "-N2", "--wrap", "true"], EXCLUSIVE),
        ("srun", vec!["-A", a, "--workload=agents", "--gpus=2", "--exclusive", "-N2", "true"], EXCLUSIVE),
        ("salloc", vec!["-A", a, "--workload=agents", "--gpus=2", "--exclusive", "-N2", "true"], EXCLUSIVE),
        ("srun", vec!["-A", a, "--qos=normal", "-p", "gpu", "--gpus=16", "true"], OVER_CAP),
        ("salloc", vec!["-A", a, "--qos=normal", "-p", "gpu", "--gpus=16", "true"], OVER_CAP),
        (
            "sbatch",
            vec!["-A", a, "--workload=agents", "--drain-timeout=99999999999999999-00:00:00", "--wrap", "true"],
            "--drain-timeout: invalid duration \"99999999999999999-00:00:00\": the number of days is too large",
        ),
    ];
    for (program, args, message) in &cases {
        let r = as_user(c, &eve, program, args);
        assert!(!r.ok, "{program} {args:?} was accepted: {}", r.stdout);
        assert!(r.stderr.contains(message), "{program} {args:?}: expected {message:?}, the user read:\n{}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
    // Asking for the site's QOS and the pool's partition by name lands the
    // job in its class all the same.
    let j = submit(c, &eve, &["-A", a, "--qos=normal", "-p", "gpu", "--gpus=4", "--hold", "--wrap", "true"]);
    let f = c.job_fields(j);
    assert_eq!((f["QOS"].as_str(), f["Partition"].as_str()), ("op-agents", FLEXIBLE_PARTITION));
    // One node --exclusive: its 4 GPUs are within the class's cap; it runs
    // (protected_work_runs checks what it holds).
    let x = submit(
        c,
        &eve,
        &["-A", a, "--workload=agents", "--gpus=1", "--exclusive", "-N1", "-t", "10", "--wrap", "sleep 300"],
    );
    c.wait_state(x, "RUNNING", Duration::from_secs(30));
    assert_eq!(c.allocated_gpus(x), 4, "Slurm gives --exclusive every GPU of the node");
    protected_work_runs(c, &eve);
}

fn raw_submit(c: &TestCluster, u: &User, args: &[&str]) -> Ran {
    let bin: PathBuf = build_dir().join("raw_submit");
    let mut cmd = std::process::Command::new("runuser");
    cmd.args(["-u", &u.name, "--", "env"]);
    for (k, v) in c.cluster.env() {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(bin).args(args).current_dir("/tmp");
    let r: Ran = cmd.output().unwrap().into();
    c.assert_ctld_up();
    r
}

/// libslurm without SPANK: every field a job description has, set by hand.
#[test]
fn libslurm_without_spank_gets_the_same_rules() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let eve = attacker(c);
    let before = c.log("slurmctld").len();
    let r = raw_submit(c, &eve, &["--qos", "normal", "--partition", "gpu", "--gpus", "16"]);
    assert!(!r.ok && r.stdout.contains("error: "), "{}", r.stdout);
    let r =
        raw_submit(c, &eve, &["--partition", "gpu", "--min-nodes", "1", "--max-nodes", "4", "--gpus-per-node", "4"]);
    assert!(!r.ok, "{}", r.stdout);
    // Slurm keeps the admin comment (onepool's record) for administrators:
    // a forged record is refused outright (measured on 22.05).
    let r = raw_submit(c, &eve, &["--hold", "--admin-comment", "onepool:class=critical-training;tier=protected"]);
    assert!(!r.ok && r.stdout.contains("Access/permission denied"), "{}", r.stdout);
    let log = &c.log("slurmctld")[before..];
    assert!(log.contains(OVER_CAP), "{log}");
    assert!(!log.contains("panic"), "{log}");
    // Through a SPANK variable of its own, a huge drain timeout is refused
    // with the same sentence, not an overflow.
    let r = raw_submit(c, &eve, &["SLURM_SPANK_ONEPOOL_DRAIN_TIMEOUT=99999999999999999-00:00:00"]);
    assert!(!r.ok, "{}", r.stdout);
    let log = &c.log("slurmctld")[before..];
    assert!(log.contains("the number of days is too large"), "{log}");
    assert!(!log.contains("panic"), "{log}");
    protected_work_runs(c, &eve);
}

/// What Slurm 22.05 does with an update job_modify cannot judge (the job's
/// current class is not visible to it): the job may be changed, but it
/// never runs past its class's limits.
enum Outcome {
    /// Refused; the user reads `user`, slurmctld.log gets `log` (if any).
    Refused { user: &'static str, log: Option<&'static str> },
    /// Accepted; once released the job stays pending for one of these reasons.
    Held(&'static [&'static str]),
    /// Accepted and harmless: the job may run, within its class.
    Harmless,
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn scontrol_update_of_every_field_keeps_the_job_in_its_class() {
    use Outcome::*;
    let c = cluster();
    let _cleanup = Cleanup(c);
    let eve = attacker(c);
    const DENIED: &str = "Access/permission denied";
    let cases: Vec<(&str, Outcome)> = vec![
        (
            "QOS=normal Partition=gpu TresPerJob=gres:gpu:16",
            Refused { user: DENIED, log: Some("onepool: partition gpu is in the GPU pool") },
        ),
        ("Partition=gpu", Refused { user: DENIED, log: Some("onepool: partition gpu is in the GPU pool") }),
        ("Partition=gpu-flex", Refused { user: DENIED, log: Some("onepool: partition gpu-flex is in the GPU pool") }),
        ("QOS=op-training", Refused { user: DENIED, log: Some("onepool: QOS op-training is class training's") }),
        // Slurm finds QOS without case: so does the plugin.
        ("QOS=OP-TRAINING", Refused { user: DENIED, log: Some("onepool: QOS OP-TRAINING is class training's") }),
        (
            "QOS=OP-CRITICAL-TRAINING",
            Refused { user: DENIED, log: Some("onepool: class critical-training is protected") },
        ),
        (
            "QOS=op-critical-training",
            Refused { user: DENIED, log: Some("onepool: class critical-training is protected") },
        ),
        (
            "QOS=op-inference-baseline",
            Refused { user: DENIED, log: Some("onepool: class inference-baseline is protected") },
        ),
        (
            "QOS=onepool-flexible-cap",
            Refused { user: DENIED, log: Some("onepool: QOS onepool-flexible-cap is the partition QOS") },
        ),
        ("Account=core-ml", Refused { user: "Invalid account", log: None }),
        // On a held job Slurm answers about the hold; it refuses either way.
        ("Priority=4294967000", Refused { user: "held state", log: None }),
        ("Nice=-10000", Refused { user: DENIED, log: None }),
        ("TresPerNode=gres:gpu:4 NumNodes=4", Refused { user: "Invalid generic resource", log: None }),
        ("TresPerTask=gres:gpu:8 NumTasks=2", Refused { user: "Invalid generic resource", log: None }),
        ("TresPerSocket=gres:gpu:8", Refused { user: "Invalid generic resource", log: None }),
        ("Gres=gpu:16", Refused { user: "Invalid generic resource", log: None }),
        // The QOS of the site: the job leaves its class but may not run in
        // the pool's partitions (AllowQos).
        ("QOS=normal", Held(&["QOS_not_permitted_to_use_this_partition"])),
        ("TresPerJob=gres:gpu:16", Held(&["QOSMaxGRESPerJob", "QOSGrpGRES"])),
        ("TresPerNode=gres:gpu:4 NumNodes=1-4", Harmless),
        ("TimeLimit=UNLIMITED", Harmless),
    ];
    let mut held = Vec::new();
    for (update, outcome) in &cases {
        let j = held_agents_job(c, &eve);
        let before = c.log("slurmctld").len();
        let mut args = vec!["update".to_string(), format!("JobId={j}")];
        args.extend(update.split_whitespace().map(str::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = as_user(c, &eve, "scontrol", &args);
        match outcome {
            Refused { user, log } => {
                assert!(!r.ok, "scontrol update {update} was accepted");
                assert!(r.stderr.contains(user), "scontrol update {update}: the user read {:?}", r.stderr);
                if let Some(line) = log {
                    let log = &c.log("slurmctld")[before..];
                    assert!(
                        log.contains(&format!(
                            "job_submit/onepool: refused update of job {j} by uid {}: {line}",
                            eve.uid
                        )),
                        "scontrol update {update}: no refusal line in slurmctld.log:\n{log}"
                    );
                }
                let f = c.job_fields(j);
                assert_eq!((f["QOS"].as_str(), f["Partition"].as_str()), ("op-agents", FLEXIBLE_PARTITION), "{update}");
            }
            Held(reasons) => {
                assert!(r.ok, "scontrol update {update}: {}", r.stderr);
                held.push((j, *update, *reasons));
            }
            Harmless => assert!(r.ok, "scontrol update {update}: {}", r.stderr),
        }
    }
    // Release everything (the attacker's own jobs) and let Slurm schedule.
    let ids = c.ok("squeue", &["-h", "-u", &eve.name, "-o", "%i"]);
    let mut args = vec!["release"];
    args.extend(ids.split_whitespace());
    let r = as_user(c, &eve, "scontrol", &args);
    assert!(r.ok, "{}", r.stderr);
    for (j, update, reasons) in &held {
        c.wait_until(&format!("job {j} ({update}) to be held back by Slurm"), Duration::from_secs(30), || {
            let f = c.job_fields(*j);
            f["JobState"] == "PENDING" && reasons.iter().any(|r| f["Reason"].contains(r))
        });
    }
    // And requeue/release of jobs that are not one's own.
    let other = c.sbatch(&["--workload=agents", "--gpus=1", "--hold", "--wrap", "true"]);
    for verb in ["release", "requeue", "hold"] {
        let r = as_user(c, &eve, "scontrol", &[verb, &other.to_string()]);
        assert!(!r.ok, "{verb} of another user's job was accepted");
    }
    protected_work_runs(c, &eve);
    for (j, update, _) in &held {
        assert_eq!(c.state(*j).as_deref(), Some("PENDING"), "job {j} ({update}) started");
    }
}

/// An entitled user may not stretch a protected job past its class either:
/// the class QOS's MaxWall (7 days for critical-training) holds it back.
#[test]
fn a_protected_job_stretched_past_its_class_never_starts() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let alice = owner(c);
    let j = submit(
        c,
        &alice,
        &[
            "--account=core-ml",
            "--workload=critical-training",
            "-t",
            "1:00:00",
            "--gpus=4",
            "--hold",
            "--wrap",
            "sleep 300",
        ],
    );
    let r = as_user(c, &alice, "scontrol", &["update", &format!("JobId={j}"), "TimeLimit=8-00:00:00"]);
    assert!(r.ok, "{}", r.stderr);
    let r = as_user(c, &alice, "scontrol", &["update", &format!("JobId={j}"), "TresPerJob=gres:gpu:12"]);
    assert!(r.ok, "{}", r.stderr);
    let r = as_user(c, &alice, "scontrol", &["release", &j.to_string()]);
    assert!(r.ok, "{}", r.stderr);
    c.wait_until("the stretched job to be held by its QOS", Duration::from_secs(30), || {
        let f = c.job_fields(j);
        f["JobState"] == "PENDING" && f["Reason"].starts_with("QOSMax")
    });
    // An administrator may still set it right.
    c.ok("scontrol", &["update", &format!("JobId={j}"), "TimeLimit=1:00:00", "TresPerJob=gres:gpu:4"]);
    c.wait_state(j, "RUNNING", Duration::from_secs(30));
}

/// Requeue: a running job of the attacker goes back to pending, where a
/// move to the site's QOS must keep it from ever running in the pool again.
#[test]
fn a_requeued_job_moved_to_the_site_qos_never_runs_again() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let eve = attacker(c);
    let j = submit(c, &eve, &["-A", &eve.account, "--requeue", "--gpus=4", "-t", "10", "--wrap", "sleep 300"]);
    c.wait_state(j, "RUNNING", Duration::from_secs(30));
    let id = j.to_string();
    let jid = format!("JobId={j}");
    let r = as_user(c, &eve, "scontrol", &["requeue", &id]);
    assert!(r.ok, "requeue: {}", r.stderr);
    c.wait_state(j, "PENDING", Duration::from_secs(30));
    let r = as_user(c, &eve, "scontrol", &["update", &jid, "QOS=normal"]);
    assert!(r.ok, "{}", r.stderr);
    // A requeued batch job waits for its BeginTime; its owner may lift it.
    let r = as_user(c, &eve, "scontrol", &["update", &jid, "StartTime=now"]);
    assert!(r.ok, "{}", r.stderr);
    c.wait_until("the requeued job to be held back by AllowQos", Duration::from_secs(30), || {
        let f = c.job_fields(j);
        f["JobState"] == "PENDING" && f["Reason"].contains("QOS_not_permitted_to_use_this_partition")
    });
    protected_work_runs(c, &eve);
    assert_eq!(c.state(j).as_deref(), Some("PENDING"));
}

/// Slurm's operators may move jobs between classes (slurmctld's own
/// validate_operator decides, looked up in slurmctld at run time).
#[test]
fn a_slurm_operator_may_move_a_job_between_classes() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let oper = c.user("op-oper", "research");
    c.ok("sacctmgr", &["-i", "modify", "user", "where", "name=op-oper", "set", "AdminLevel=Operator"]);
    let j = held_agents_job(c, &oper);
    // slurmctld learns the admin level from slurmdbd a moment later.
    c.wait_until("the operator's update to be accepted", Duration::from_secs(30), || {
        as_user(c, &oper, "scontrol", &["update", &format!("JobId={j}"), "QOS=op-training"]).ok
    });
    assert_eq!(c.job_fields(j)["QOS"], "op-training");
    c.ok("sacctmgr", &["-i", "modify", "user", "where", "name=op-oper", "set", "AdminLevel=None"]);
}
