use std::collections::HashMap;
use std::path::{Path, PathBuf};

use onepool_decisions::policy::load;
use onepool_decisions::render::render;
use onepool_slurm_commands::fake::samples::{qos_matching, CONFIG, PARTITIONS};
use onepool_slurm_commands::fake::FakeRunner;

use super::*;
use crate::policy::source::Source;

const SAMPLE: &str = include_str!("../../../etc/onepool.toml");
const BUILT_22_05_8: u32 = (22 << 16) | (5 << 8) | 8;

fn sample() -> Source {
    Source { name: "etc/onepool.toml".into(), text: SAMPLE.into() }
}

/// A cluster whose settings, QOS and partitions match the sample policy,
/// two GPU nodes on this host and one elsewhere, and onepoold's config fit.
struct Cluster {
    config: String,
    qos: String,
    partitions: String,
    nodes: String,
    assoc: String,
    files: HashMap<PathBuf, String>,
    devices: Vec<String>,
    versions: HashMap<PathBuf, Result<Option<u32>, String>>,
    daemon: Result<String, String>,
    daemon_named: bool,
    policy: Source,
}

impl Cluster {
    fn healthy() -> Cluster {
        let config = format!(
            "{}PluginDir = /usr/lib/slurm:/opt/onepool/lib\nPlugStackConfig = /etc/slurm/plugstack.conf\nProctrackType = proctrack/cgroup\nTaskPlugin = task/affinity,task/cgroup\nSLURM_CONF = /etc/slurm/slurm.conf\nSLURM_VERSION = 22.05.8\n",
            CONFIG.replace("= lua", "= lua,onepool")
        );
        let partitions = format!(
            "{}PartitionName=gpu-flex QoS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents\n",
            PARTITIONS.replace("QoS=N/A", "QoS=N/A AllowQos=op-critical-training,op-inference-baseline")
        );
        let files = HashMap::from([
            // plugstack.conf.d is globbed on the real file system, where it
            // finds nothing: the line is in plugstack.conf itself.
            (
                PathBuf::from("/etc/slurm/plugstack.conf"),
                "include /etc/slurm/plugstack.conf.d/*.conf\nrequired /opt/onepool/lib/spank_onepool.so handoff_timeout=30s\n"
                    .to_string(),
            ),
            (PathBuf::from("/etc/slurm/gres.conf"), "AutoDetect=off\nNodeName=node[1-2] Name=gpu File=/dev/nvidia[0-1]\nNodeName=node3 Name=gpu File=/dev/nvidia[0-1]\n".to_string()),
        ]);
        Cluster {
            config,
            qos: qos_matching(&render(&load(SAMPLE).policy.unwrap())),
            partitions,
            nodes: "NodeName=node1 Arch=x86_64 NodeHostName=localhost Gres=gpu:2 State=IDLE\n\
                    NodeName=node2 Arch=x86_64 NodeHostName=localhost Gres=gpu:2 State=IDLE\n\
                    NodeName=node3 Arch=x86_64 NodeHostName=far Gres=gpu:2 State=IDLE\n\
                    NodeName=login Arch=x86_64 NodeHostName=localhost Gres=(null) State=IDLE\n"
                .into(),
            assoc: onepool_slurm_commands::fake::samples::ASSOC.into(),
            files,
            devices: vec!["/dev/nvidia0".into(), "/dev/nvidia1".into()],
            versions: HashMap::from([
                (PathBuf::from("/opt/onepool/lib/job_submit_onepool.so"), Ok(Some(BUILT_22_05_8))),
                (PathBuf::from("/opt/onepool/lib/spank_onepool.so"), Ok(Some(BUILT_22_05_8))),
            ]),
            daemon: Ok("resume: endpoint llm: answers continue on another replica by token ids (llama-server's /completion: the client's tokens exactly, the rest recomputed from them), at most 3 move(s) each\nclasses: endpoint \"llm\": a request whose key names no class is inference; replicas only lower classes ask for: class agents\n/etc/slurm/onepoold.toml: fits (1 endpoint(s), 0 warning(s))\n".into()),
            daemon_named: false,
            policy: sample(),
        }
    }

    fn examine(self, local: bool) -> anyhow::Result<Vec<Check>> {
        let mut runner = FakeRunner::new(&self.qos, &self.config, &self.partitions);
        runner.answers.insert(SHOW_NODES.join(" "), Ok(self.nodes.clone()));
        runner.answers.insert(live::SHOW_ASSOC.join(" "), Ok(self.assoc.clone()));
        runner.answers.insert("onepoold --check --config /etc/slurm/onepoold.toml".into(), self.daemon.clone());
        if local {
            runner.answers.remove(&live::SHOW_QOS.join(" "));
            runner.answers.remove(&live::SHOW_ASSOC.join(" "));
        }
        let files = self.files.clone();
        let plugin_paths: Vec<PathBuf> = self.versions.keys().cloned().collect();
        let devices = self.devices.clone();
        let versions = self.versions.clone();
        let host = Host {
            names: vec!["localhost".into()],
            read: Box::new(move |p: &Path| {
                files
                    .get(p)
                    .map(|t| t.clone().into_bytes())
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
            }),
            kind: Box::new(move |p: &str| {
                let plugin = plugin_paths.iter().any(|f| f.as_os_str() == p);
                (devices.iter().any(|d| d == p) || plugin).then_some(!plugin)
            }),
            plugin_version: Box::new(move |p: &Path| versions.get(p).cloned().unwrap_or(Err("missing".into()))),
            onepoold: PathBuf::from("onepoold"),
        };
        let daemon = DaemonConfig { path: "/etc/slurm/onepoold.toml".into(), named: self.daemon_named };
        examine(&self.policy, Some(&daemon), local, &runner, &host)
    }
}

fn find<'a>(checks: &'a [Check], what: &str) -> &'a Check {
    checks.iter().find(|c| c.what == what).unwrap_or_else(|| panic!("no check {what:?} in {checks:#?}"))
}

#[test]
fn a_cluster_that_matches_the_policy_passes_every_check() {
    let checks = Cluster::healthy().examine(false).unwrap();
    let not_passed: Vec<&Check> = checks.iter().filter(|c| c.status != Status::Pass).collect();
    // node3 runs elsewhere: its device files cannot be seen from here.
    assert_eq!(not_passed.len(), 1, "{not_passed:#?}");
    assert_eq!(not_passed[0].what, "gres.conf GPUs of other hosts");
    assert_eq!(not_passed[0].status, Status::Warn);
    let whats: Vec<&str> = checks.iter().map(|c| c.what.as_str()).collect();
    for key in [
        "JobSubmitPlugins",
        "PreemptType",
        "PreemptMode",
        "AccountingStorageEnforce",
        "PriorityWeightQOS",
        "SlurmctldParameters",
        "PrologFlags",
    ] {
        assert!(whats.contains(&format!("slurm.conf {key}").as_str()), "{whats:?}");
    }
    for q in [
        "QOS op-critical-training (class critical-training)",
        "QOS op-inference-baseline (class inference-baseline)",
        "QOS onepool-flexible-cap (flexible partition)",
        "partition gpu",
        "partition gpu-flex (flexible)",
        "associations' QOS lists",
        "onepoold's Slurm association onepool/onepool",
    ] {
        assert!(whats.contains(&q), "{q}: {whats:?}");
    }
    assert_eq!(find(&checks, "gres.conf GPUs of node1").detail, "2 device file(s) present");
    assert!(!whats.contains(&"gres.conf GPUs of login"), "a node without GPUs has nothing to check");
    assert_eq!(
        find(&checks, "plugin job_submit_onepool.so").detail,
        "/opt/onepool/lib/job_submit_onepool.so, built for Slurm 22.05.8; slurmctld runs 22.05.8"
    );
    assert!(find(&checks, "plugstack spank_onepool.so").detail.starts_with("required at /etc/slurm/plugstack.conf:2"));
    let daemon = &find(&checks, "onepoold config").detail;
    assert!(daemon.contains("fits (1 endpoint(s), 0 warning(s)); endpoint llm: answers continue"), "{daemon}");
    assert!(
        daemon.ends_with("at most 3 move(s) each; endpoint \"llm\": a request whose key names no class is inference; replicas only lower classes ask for: class agents"),
        "{daemon}"
    );
    let text = checks::text(&checks);
    assert!(text.ends_with(&format!("{} passed, 1 warning(s), 0 failed\n", checks.len() - 1)), "{text}");
}

#[test]
fn each_broken_setting_fails_with_its_fix() {
    let mut c = Cluster::healthy();
    c.config = c
        .config
        .replace("preempt/qos", "preempt/none")
        .replace("SlurmctldParameters     = preempt_send_user_signal", "SlurmctldParameters     = enable_configless")
        .replace("PreemptExemptTime       = 00:02:00", "PreemptExemptTime       = 00:00:00");
    c.qos = c.qos.replace("op-training|3000|", "op-training|1|");
    assert!(!c.qos.contains("op-training|3000|"), "the fixture changed op-training");
    c.files.insert(PathBuf::from("/etc/slurm/plugstack.conf"), "optional /opt/onepool/lib/spank_onepool.so\n".into());
    c.versions.insert(PathBuf::from("/opt/onepool/lib/job_submit_onepool.so"), Ok(Some((24 << 16) | (11 << 8) | 1)));
    c.devices.pop();
    c.assoc = "root||normal,op-agents\nroot|root|normal,op-agents\nresearch|ann|normal,op-agents\n".into();
    c.daemon = Err("error: endpoint chat: replicas.supplemental_workload = \"nope\" is not a class of the policy\n/etc/slurm/onepoold.toml: onepoold would not start (1 error(s))\n".into());
    let checks = c.examine(false).unwrap();
    let preempt = find(&checks, "slurm.conf PreemptType");
    assert_eq!(preempt.status, Status::Fail);
    assert!(preempt.detail.starts_with("preempt/none: reclaim follows the class QOS Preempt lists"), "{preempt:?}");
    assert_eq!(
        preempt.fix.as_deref(),
        Some("set PreemptType=preempt/qos in slurm.conf, then `scontrol reconfigure` (or restart slurmctld)")
    );
    assert_eq!(find(&checks, "slurm.conf SlurmctldParameters").fix.as_deref(), Some("set SlurmctldParameters=enable_configless,preempt_send_user_signal in slurm.conf, then `scontrol reconfigure` (or restart slurmctld)"));
    assert_eq!(
        find(&checks, "slurm.conf PreemptExemptTime").status,
        Status::Warn,
        "a different exempt time only changes thrash protection"
    );
    let training = find(&checks, "QOS op-training (class training)");
    assert_eq!(training.status, Status::Fail);
    assert_eq!(training.detail, "differs from the policy, which wants Priority=3000");
    assert_eq!(training.fix.as_deref(), Some("sacctmgr -i modify qos where name=op-training set Priority=3000"));
    let stack = find(&checks, "plugstack spank_onepool.so");
    assert_eq!(
        (stack.status, stack.fix.as_deref()),
        (Status::Fail, Some("change `optional` to `required` at /etc/slurm/plugstack.conf:1"))
    );
    let plugin = find(&checks, "plugin job_submit_onepool.so");
    assert_eq!(plugin.detail, "/opt/onepool/lib/job_submit_onepool.so was built for Slurm 24.11.1 but slurmctld runs 22.05.8: Slurm refuses it");
    assert_eq!(find(&checks, "plugin spank_onepool.so").status, Status::Pass);
    let grants = find(&checks, "associations' QOS lists");
    assert_eq!(grants.status, Status::Fail);
    assert_eq!(grants.fix.as_deref(), Some("sacctmgr -i modify account where name=root set qos+=op-inference,op-training,op-critical-training,op-inference-baseline"));
    let service = find(&checks, "onepoold's Slurm association onepool/onepool");
    assert_eq!(
        (service.status, service.fix.as_deref()),
        (Status::Warn, Some("sacctmgr -i add account onepool 'Description=onepoold replicas' Organization=onepool && sacctmgr -i add user onepool Account=onepool"))
    );
    let gres = find(&checks, "gres.conf GPUs of node1");
    assert_eq!((gres.status, gres.detail.as_str()), (Status::Fail, "missing: /dev/nvidia1"));
    let daemon = find(&checks, "onepoold config");
    assert_eq!(daemon.status, Status::Fail);
    assert_eq!(daemon.detail, "/etc/slurm/onepoold.toml: error: endpoint chat: replicas.supplemental_workload = \"nope\" is not a class of the policy");
    let v = checks::json(&checks);
    assert_eq!(v["failed"], checks.iter().filter(|c| c.status == Status::Fail).count());
    assert_eq!(v["checks"][0]["status"], "pass");
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["check"] == "slurm.conf PreemptType" && c["status"] == "fail"));
}

#[test]
fn missing_plugins_and_plugstack_line_fail() {
    let mut c = Cluster::healthy();
    c.files.insert(PathBuf::from("/etc/slurm/plugstack.conf"), "required /usr/lib/slurm/other.so\n".into());
    c.versions.clear();
    let checks = c.examine(false).unwrap();
    let stack = find(&checks, "plugstack spank_onepool.so");
    assert_eq!(stack.detail, "no line loads it (read: /etc/slurm/plugstack.conf)");
    assert_eq!(
        find(&checks, "plugin job_submit_onepool.so").detail,
        "not found in PluginDir (/usr/lib/slurm:/opt/onepool/lib)"
    );
}

#[test]
fn local_checks_only_what_this_host_holds() {
    let checks = Cluster::healthy().examine(true).unwrap();
    let whats: Vec<&str> = checks.iter().map(|c| c.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            "policy",
            "plugstack spank_onepool.so",
            "process tracking",
            "plugin spank_onepool.so",
            "gres.conf GPUs of node1",
            "gres.conf GPUs of node2",
            "gres.conf GPUs of other hosts"
        ]
    );
}

/// A host with no files, for checks that never get to them.
fn nothing_here() -> Host {
    Host {
        names: vec![],
        read: Box::new(|_: &Path| Err(std::io::Error::from(std::io::ErrorKind::NotFound))),
        kind: Box::new(|_: &str| None),
        plugin_version: Box::new(|_: &Path| Ok(None)),
        onepoold: PathBuf::from("onepoold"),
    }
}

#[test]
fn a_slurm_command_that_fails_is_trouble_not_a_verdict() {
    let mut runner = FakeRunner::new("", "", "");
    runner.answers.insert(
        live::SHOW_CONFIG.join(" "),
        Err("slurm_load_ctl_conf error: Unable to contact slurm controller".into()),
    );
    let host = nothing_here();
    let e = format!("{:#}", examine(&sample(), None, false, &runner, &host).unwrap_err());
    assert!(e.starts_with("the doctor needs `scontrol show config`"), "{e}");
    assert!(e.contains("Unable to contact slurm controller"), "{e}");
}

#[test]
fn a_policy_with_errors_is_one_failed_check() {
    let src = Source { name: "p.toml".into(), text: SAMPLE.replace("rank = 3", "rank = 2") };
    let host = nothing_here();
    let checks = examine(&src, None, false, &FakeRunner::new("", "", ""), &host).unwrap();
    assert_eq!(checks.len(), 1);
    assert_eq!((checks[0].status, checks[0].fix.as_deref()), (Status::Fail, Some("onepool policy check p.toml")));
}

#[test]
fn during_an_audit_trial_the_packaged_daemon_config_is_a_warning_and_a_named_one_is_checked() {
    let audit = |named: bool| {
        let mut c = Cluster::healthy();
        c.policy.text = c.policy.text.replace("audit = false", "audit = true");
        assert!(c.policy.text.contains("audit = true"), "the sample changed");
        c.daemon = Err("error: the policy is in audit mode (pool.audit = true)\n".into());
        c.daemon_named = named;
        c.examine(false).unwrap()
    };
    let found = audit(false);
    let d = find(&found, "onepoold config");
    assert_eq!(d.status, Status::Warn);
    assert_eq!(
        d.detail,
        "/etc/slurm/onepoold.toml not checked: the policy is in audit mode, where onepoold cannot run"
    );
    assert!(found.iter().all(|c| c.status != Status::Fail), "{found:#?}");
    let named = audit(true);
    assert_eq!(find(&named, "onepoold config").status, Status::Fail);
}

/// What `onepoold --check` accepts but warns about (here clear HTTP to the
/// replicas) is a warning of the doctor's, not a pass.
#[test]
fn onepoold_s_warnings_are_the_doctor_s() {
    let path = "/etc/slurm/onepoold.toml";
    let plain = "warning: endpoint \"llm\" [endpoint.replicas]: transport = \"plain\": onepoold's replica key and every prompt ... in clear\n/etc/slurm/onepoold.toml: fits (1 endpoint(s), 1 warning(s))\n";
    let c = checks::daemon(Some(path), Some(Ok(plain.into())));
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.contains("fits (1 endpoint(s), 1 warning(s)): endpoint \"llm\"") && c.detail.contains("\"plain\""),
        "{}",
        c.detail
    );
    let clean = checks::daemon(Some(path), Some(Ok(format!("{path}: fits (1 endpoint(s), 0 warning(s))\n"))));
    assert_eq!(clean.status, Status::Pass);
}

#[test]
fn a_serving_preflight_passes_with_its_time_and_fails_with_the_replica_s_last_lines() {
    let ok = "preflight of endpoint chat: replica job 7\n  running on node1: 0.6 s\n  its launcher listening at 127.0.0.1:41234: 1.1 s\n  healthy: 8.2 s\n  first chat completion answered (SmolLM2): 8.6 s\n";
    let c = checks::preflight("chat", Some("/etc/slurm/onepoold.toml"), Ok(ok.into()));
    assert_eq!(c.status, Status::Pass);
    assert_eq!(c.detail, "preflight of endpoint chat: replica job 7; first chat completion answered (SmolLM2): 8.6 s");
    let failed = "preflight of endpoint chat: replica job 8\n  FAILED: job 8 ended before it served: FAILED, exit code 139; the model server killed by SIGSEGV; last output:\n    | ggml_backend_amx_mul_mat\n";
    let c = checks::preflight("chat", Some("/etc/slurm/onepoold.toml"), Err(failed.into()));
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("killed by SIGSEGV") && c.detail.contains("| ggml_backend_amx_mul_mat"), "{}", c.detail);
    assert!(c.fix.unwrap().contains("/etc/slurm/onepoold.toml"));
}

#[test]
fn nodes_that_do_not_track_processes_by_cgroup_fail_while_the_hand_off_check_is_on() {
    let stack =
        |args: &str| vec![("/etc/slurm/plugstack.conf".to_string(), format!("required /x/spank_onepool.so {args}\n"))];
    let conf = |proctrack: &'static str, task: &'static str| {
        move |k: &str| match k {
            "ProctrackType" => Some(proctrack.to_string()),
            "TaskPlugin" => Some(task.to_string()),
            _ => None,
        }
    };
    let c = checks::process_tracking(&stack(""), conf("proctrack/linuxproc", "task/none"));
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.starts_with("ProctrackType=proctrack/linuxproc: a process a job leaves behind"), "{}", c.detail);
    assert!(c.fix.as_deref().unwrap().contains("ProctrackType=proctrack/cgroup"));
    let fake = checks::process_tracking(&stack("gpu_source=fake:/tmp/g"), conf("proctrack/linuxproc", "task/none"));
    assert_eq!(fake.status, Status::Warn, "a test cluster's fake source");
    let off = checks::process_tracking(&stack("gpu_source=none"), conf("proctrack/linuxproc", "task/none"));
    assert_eq!(off.status, Status::Pass);
    let no_devices = checks::process_tracking(&stack(""), conf("proctrack/cgroup", "task/affinity"));
    assert_eq!(no_devices.status, Status::Warn);
    assert_eq!(checks::process_tracking(&stack(""), conf("proctrack/cgroup", "task/cgroup")).status, Status::Pass);
}

/// The lock's holder as onepoold's control API tells it (issue #42): a
/// stranger holding it is a FAIL with the fix; an instance of ours acting
/// or followed is a PASS; nobody seen acting is a warning.
#[test]
fn a_stranger_holding_onepoold_s_lock_fails_the_doctor() {
    use onepool_control::api::Leadership;
    let base = Leadership {
        instance: "svc-a".into(),
        shared: true,
        acting: false,
        acting_since: None,
        acting_instance: Some("database connection 15".into()),
        takeovers: 0,
        last_takeover: None,
        last_error: None,
        foreign_holder: Some("database connection 15".into()),
    };
    let c = checks::leadership(Ok(Some(base.clone())));
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.detail.contains("database connection 15") && c.detail.contains("no instance acts"), "{c:?}");
    assert!(c.fix.as_deref().is_some_and(|f| f.contains("KILL")), "{c:?}");
    let ours = Leadership {
        foreign_holder: None,
        acting_instance: Some("the connection from 10.0.0.2".into()),
        ..base.clone()
    };
    assert_eq!(checks::leadership(Ok(Some(ours))).status, Status::Pass);
    let acting = Leadership { foreign_holder: None, acting: true, ..base.clone() };
    assert_eq!(checks::leadership(Ok(Some(acting))).status, Status::Pass);
    let nobody = Leadership { foreign_holder: None, acting_instance: None, ..base };
    assert_eq!(checks::leadership(Ok(Some(nobody))).status, Status::Warn);
    assert_eq!(checks::leadership(Err("cannot reach onepoold".into())).status, Status::Warn);
}
