//! `onepool policy check|render` as a user runs them: the built binary,
//! its output and its exit status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `onepool ARGS` in the workspace root, with no policy in the environment.
fn onepool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onepool"))
        .args(args)
        .current_dir(workspace())
        .env_remove("ONEPOOL_POLICY")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A policy file under cargo's scratch folder for integration tests.
fn temp_policy(name: &str, content: &str) -> String {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

#[test]
fn check_passes_the_sample() {
    let out = onepool(&["policy", "check", "etc/onepool.toml"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text(&out.stdout), "etc/onepool.toml: ok (5 classes, 16 GPUs, 4 reserved)\n");
}

#[test]
fn check_reports_each_problem_at_its_line_and_column() {
    let sample = std::fs::read_to_string(workspace().join("etc/onepool.toml")).unwrap();
    let broken = sample.replace("total_gpus = 16", "total_gpus = \"sixteen\"");
    let file = temp_policy("broken.toml", &broken);
    let out = onepool(&["policy", "check", &file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        format!(
            "{file}:11:14: error: invalid type: string \"sixteen\", expected u32; give the value the type the message names\n{file}: 1 error\n"
        )
    );
}

#[test]
fn check_reads_the_file_named_by_the_environment() {
    let file = temp_policy("env.toml", "[pool]\n");
    let out = Command::new(env!("CARGO_BIN_EXE_onepool"))
        .args(["policy", "check"])
        .env("ONEPOOL_POLICY", &file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stdout).starts_with(&format!("{file}:1:1: error: missing field `partitions`")), "{out:?}");
}

#[test]
fn a_missing_file_is_one_clear_line() {
    let out = onepool(&["policy", "check", "no/such/policy.toml"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        text(&out.stderr),
        "onepool: cannot read policy file no/such/policy.toml (check the path): No such file or directory (os error 2)\n"
    );
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn render_prints_the_qos_commands_and_the_slurm_conf_fragment() {
    let out = onepool(&["policy", "render", "etc/onepool.toml"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = text(&out.stdout);
    for line in [
        "sacctmgr -i add qos op-agents set Priority=1000 PreemptMode=cancel MaxTRESPerJob=gres/gpu=4 Flags=DenyOnLimit",
        "sacctmgr -i add qos op-training set Priority=3000 Preempt=op-inference,op-agents PreemptMode=requeue GraceTime=120 MaxTRESPerJob=gres/gpu=12 Flags=DenyOnLimit",
        "sacctmgr -i add qos op-critical-training set Priority=10000 Preempt=op-training,op-inference,op-agents PreemptMode=cancel GrpTRES=gres/gpu=8 MaxTRESPerJob=gres/gpu=8 MaxWall=7-00:00:00 Flags=DenyOnLimit",
        "sacctmgr -i add qos onepool-flexible-cap set GrpTRES=gres/gpu=12 Flags=DenyOnLimit",
        "JobSubmitPlugins=onepool",
        "PreemptExemptTime=00:02:00",
        "PartitionName=gpu-flex Nodes=ALL QOS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents MaxTime=INFINITE State=UP",
        "#   add AllowQos=op-critical-training,op-inference-baseline to its PartitionName line; `scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline` applies it until slurmctld restarts",
    ] {
        assert!(stdout.lines().any(|l| l == line), "missing {line:?} in:\n{stdout}");
    }
    // QOS come before the slurm.conf lines that name them.
    assert!(stdout.find("add qos onepool-flexible-cap").unwrap() < stdout.find("PartitionName=").unwrap());
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn render_parts_and_json() {
    let conf = text(&onepool(&["policy", "render", "etc/onepool.toml", "--slurm-conf-only"]).stdout);
    assert!(
        conf.starts_with("# onepool slurm.conf settings for etc/onepool.toml\n\n# onepool's slurmctld plugin"),
        "{conf}"
    );
    assert!(!conf.contains("sacctmgr"), "{conf}");
    let qos = text(&onepool(&["policy", "render", "etc/onepool.toml", "--sacctmgr-only"]).stdout);
    assert!(
        qos.lines().all(|l| l.is_empty()
            || l.starts_with("# ")
            || l.starts_with("sacctmgr -i add qos ")
            || l.starts_with("sacctmgr -i add account onepool ")
            || l == "sacctmgr -i add user onepool Account=onepool"
            || l.starts_with("sacctmgr -i modify account where name=root set qos+=")),
        "{qos}"
    );
    // Without the grant every job given a class QOS is refused under
    // AccountingStorageEnforce=qos; it comes after the QOS it names.
    let grant = "sacctmgr -i modify account where name=root set qos+=op-agents,op-inference,op-training,op-critical-training,op-inference-baseline";
    assert!(qos.find(grant).unwrap() > qos.find("add qos op-inference-baseline").unwrap(), "{qos}");
    assert_eq!(qos.lines().filter(|l| l.starts_with("sacctmgr -i add qos")).count(), 6);
    assert!(
        qos.contains("# onepoold's service user onepool submits and owns the replica jobs (so model servers never run as root); the policy entitles it to inference-baseline\n"),
        "{qos}"
    );

    let out = onepool(&["policy", "render", "etc/onepool.toml", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first: Vec<&str> = v["sacctmgr"][0].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert_eq!(first[..6], ["sacctmgr", "-i", "add", "qos", "op-agents", "set"]);
    assert_eq!(v["qos"][2]["preempt_mode"], "requeue");
    assert_eq!(v["slurm_conf"][5]["value"], "00:02:00");
    assert_eq!(v["flexible_partition"]["qos"], "onepool-flexible-cap");
    assert_eq!(v["service"]["user"], "onepool");
    assert_eq!(v["service"]["protected_classes"][0], "inference-baseline");
    assert_eq!(v["service"]["commands"][1][3], "user");

    let both = onepool(&["policy", "render", "etc/onepool.toml", "--sacctmgr-only", "--slurm-conf-only"]);
    assert_eq!(both.status.code(), Some(2), "{both:?}");
}

#[test]
fn render_refuses_a_policy_with_errors() {
    let file = temp_policy("render-broken.toml", "[pool]\npartitions = []\ntotal_gpus = 4\ndefault_class = \"a\"\n\n[classes.a]\ntier = \"flexible\"\nrank = 1\nqos = \"qa\"\n");
    let out = onepool(&["policy", "render", &file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "{file}:2:14: error: the pool lists no partition; name the partition(s) whose GPUs the pool covers\n{file}: 1 error; nothing rendered: fix the errors first (onepool policy check {file})\n"
        )
    );
}
