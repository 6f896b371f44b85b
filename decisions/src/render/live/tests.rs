use std::time::Duration;

use super::*;
use crate::render::tests::{policy_of, SAMPLE};
use crate::render::{render, Rendered};

/// `sacctmgr -n -P show qos` as Slurm 22.05 prints it for a site with its
/// own QOS (the first five fields are real output; the limits and flags
/// follow the formats of sacctmgr's TRES and flag printers).
const SITE_QOS: &str = "\
normal|0||cluster|00:00:00||||
opportunistic|10||cancel|00:00:00||||
guaranteed|1000|opportunistic|cancel|1-00:00:00|cpu=64,gres/gpu=8|gres/gpu=4|DenyOnLimit,NoDecay|7-00:00:00
";

const CONFIG_HEADER: &str = "Configuration data as of 2024-05-01T10:00:00\n";

const SITE_CONFIG: &str = "\
Configuration data as of 2024-05-01T10:00:00
AccountingStorageBackupHost = (null)
AccountingStorageEnforce = associations
JobRequeue              = 1
JobSubmitPlugins        = lua
PreemptExemptTime       = 00:00:00
PreemptMode             = OFF
PreemptType             = preempt/none
PriorityType            = priority/basic
PrologFlags             = (null)
SchedulerParameters     = bf_interval=2,bf_window=60
SlurmctldParameters     = enable_configless

Cgroup Support Configuration:
AllowedRAMSpace         = 100.0%

Slurmctld(primary) at ctl is UP
";

const GPU_PARTITION: &str = "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE GraceTime=0 MaxTime=UNLIMITED Nodes=node[1-4] PriorityTier=1 State=UP TotalCPUs=8 TotalNodes=4 TRES=cpu=8,mem=8000M,node=4,billing=8,gres/gpu=16";

#[test]
fn sacctmgr_qos_lines_are_read_field_by_field() {
    let qos = parse_sacctmgr_qos(SITE_QOS).unwrap();
    assert_eq!(qos.len(), 3);
    assert_eq!(qos[0], LiveQos::fresh("normal"));
    assert_eq!(qos[1].priority, 10);
    assert_eq!(qos[1].preempt_mode, "cancel");
    let g = &qos[2];
    assert_eq!(g.preempt, ["opportunistic"]);
    assert_eq!(g.grace_time, Duration::from_secs(86_400));
    assert_eq!(g.grp_gpus(), Some("8"));
    assert_eq!(g.max_gpus_per_job(), Some("4"));
    assert!(g.has_flag("DenyOnLimit") && g.has_flag("NoDecay"));
    assert_eq!(g.max_wall, Some(Duration::from_secs(7 * 86_400)));
    assert_eq!(qos[1].max_wall, None);
    // `-p` ends lines with '|'.
    let p = parse_sacctmgr_qos("normal|0||cluster|00:00:00|||||\n").unwrap();
    assert_eq!(p[0], LiveQos::fresh("normal"));
}

#[test]
fn output_in_another_format_is_refused_with_its_line() {
    // The five-field format of the Slurm 22.05 sample, not ours.
    let e = parse_sacctmgr_qos("normal|0||cluster|00:00:00\n").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.to_string().contains("expected 9 '|'-separated fields"), "{e}");
    assert!(e.to_string().contains("found 5"), "{e}");
    let e = parse_sacctmgr_qos("normal|0||cluster|00:00:00||||\nx|high||cluster|0:0||||\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("Priority \"high\" is not a whole number"), "{e}");
    let e = parse_sacctmgr_qos("x|1||cluster|00:00:00|gpu||||\n").unwrap_err();
    assert!(e.message.contains("GrpTRES: \"gpu\" is not TRES=LIMIT"), "{e}");
}

#[test]
fn scontrol_config_keeps_keys_and_skips_the_rest() {
    let c = parse_scontrol_config(SITE_CONFIG);
    assert_eq!(c.get("JobSubmitPlugins"), Some("lua"));
    assert_eq!(c.get("SchedulerParameters"), Some("bf_interval=2,bf_window=60"));
    assert_eq!(c.get("PrologFlags"), Some("(null)"));
    assert_eq!(c.get("AllowedRAMSpace"), Some("100.0%"));
    assert!(c.values.keys().all(|k| !k.contains(' ')), "{:?}", c.values.keys());
    assert_eq!(c.get("Configuration data as of 2024-05-01T10:00:00"), None);
}

#[test]
fn scontrol_partitions_one_a_line() {
    let text = format!(
        "{GPU_PARTITION}\nPartitionName=gpu-flex AllowQos=op-agents,op-training Nodes=ALL QoS=onepool-flexible-cap State=UP\n"
    );
    let p = parse_scontrol_partitions(&text).unwrap();
    assert_eq!(
        p,
        [
            LivePartition { name: "gpu".into(), nodes: Some("node[1-4]".into()), qos: None, allow_qos: None },
            LivePartition {
                name: "gpu-flex".into(),
                nodes: Some("ALL".into()),
                qos: Some("onepool-flexible-cap".into()),
                allow_qos: Some(vec!["op-agents".into(), "op-training".into()]),
            },
        ]
    );
    let e = parse_scontrol_partitions("Nodes=a\n").unwrap_err();
    assert!(e.message.contains("no PartitionName="), "{e}");
}

/// A cluster already configured by `r`, with the site's own QOS too.
fn live_of(r: &Rendered) -> (Vec<LiveQos>, LiveConfig, Vec<LivePartition>) {
    let qos: Vec<String> = r.all_qos().map(sacctmgr_line).collect();
    let qos = parse_sacctmgr_qos(&format!("{SITE_QOS}{}\n", qos.join("\n"))).unwrap();
    let mut config = CONFIG_HEADER.to_string();
    for line in &r.slurm_conf {
        config.push_str(&format!("{:<23} = {}\n", line.key, line.value));
    }
    let allow: Vec<String> = r.partition_access.iter().flat_map(|a| a.allow_qos.clone()).collect();
    let mut partitions = GPU_PARTITION.replace("AllowQos=ALL", &format!("AllowQos={}", allow.join(",")));
    if let Some(p) = &r.flexible_partition {
        partitions.push_str(&format!(
            "\nPartitionName={} Nodes={} QoS={} AllowQos={}\n",
            p.name,
            p.nodes,
            p.qos.name,
            p.allow_qos.join(",")
        ));
    }
    (qos, parse_scontrol_config(&config), parse_scontrol_partitions(&partitions).unwrap())
}

#[test]
fn nothing_to_change_when_the_cluster_matches() {
    let r = render(&policy_of(SAMPLE));
    let (qos, config, partitions) = live_of(&r);
    let c = diff(&r, &qos, &config, &partitions);
    assert!(c.is_empty(), "{c:#?}");
    assert!(c.problems.is_empty(), "{c:#?}");
    assert_eq!(c.sacctmgr_text(), "");
    assert_eq!(c.slurm_conf_text(), "");
}

#[test]
fn a_new_cluster_gets_everything_and_the_site_keeps_its_own() {
    let r = render(&policy_of(SAMPLE));
    let c = diff(
        &r,
        &parse_sacctmgr_qos(SITE_QOS).unwrap(),
        &parse_scontrol_config(SITE_CONFIG),
        &parse_scontrol_partitions(GPU_PARTITION).unwrap(),
    );
    assert_eq!(c.sacctmgr_commands(), r.sacctmgr_commands());
    let text = c.sacctmgr_text();
    for site in ["normal", "opportunistic", "guaranteed"] {
        assert!(!text.contains(site), "touches site QOS {site}:\n{text}");
    }
    let conf: Vec<String> = c.slurm_conf.iter().map(|c| format!("{}={}", c.key, c.value)).collect();
    assert_eq!(
        conf,
        [
            "JobSubmitPlugins=lua,onepool",
            "PriorityType=priority/multifactor",
            "PriorityWeightQOS=10000",
            "PreemptType=preempt/qos",
            "PreemptMode=CANCEL",
            "PreemptExemptTime=00:02:00",
            "AccountingStorageEnforce=associations,limits,qos",
            "SlurmctldParameters=enable_configless,preempt_send_user_signal",
            "AccountingStoreFlags=job_comment",
            "PrologFlags=Alloc",
        ]
    );
    assert_eq!(c.slurm_conf[0].live.as_deref(), Some("lua"));
    assert_eq!(c.slurm_conf[2].live, None);
    let text = c.slurm_conf_text();
    assert!(text.contains("(now: lua)\nJobSubmitPlugins=lua,onepool\n"), "{text}");
    assert!(text.contains("(now: not set)\nPriorityWeightQOS=10000\n"), "{text}");
    assert!(
        text.contains("PartitionName=gpu-flex Nodes=ALL QOS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents MaxTime=INFINITE State=UP\n"),
        "{text}"
    );
    // The site's pool partition lets every QOS run: only protected ones may.
    assert_eq!(c.access.len(), 1, "{:?}", c.access);
    assert_eq!((c.access[0].want.name.as_str(), c.access[0].live.as_ref()), ("gpu", None));
    assert_eq!(c.access[0].want.allow_qos, ["op-critical-training", "op-inference-baseline"]);
    assert!(
        text.ends_with("# (now: AllowQos=ALL)\n# partition gpu: only protected classes run here (flexible ones run in gpu-flex, under its cap)\n#   add AllowQos=op-critical-training,op-inference-baseline to its PartitionName line; `scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline` applies it until slurmctld restarts\n"),
        "{text}"
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
}

#[test]
fn only_the_fields_that_differ_are_modified_and_additions_come_first() {
    let r = render(&policy_of(SAMPLE));
    let (mut qos, config, partitions) = live_of(&r);
    let agents = qos.iter_mut().find(|q| q.name == "op-agents").unwrap();
    agents.priority = 500;
    // Limits on other TRES and other flags are the site's business.
    agents.grp_tres.push(("cpu".into(), "10".into()));
    agents.flags.push("NoDecay".into());
    let training = qos.iter_mut().find(|q| q.name == "op-training").unwrap();
    training.preempt = vec!["op-agents".into(), "normal".into()];
    training.preempt_mode = "cancel".into();
    training.max_tres_per_job = vec![("gres/gpu".into(), "8".into())];
    let critical = qos.iter_mut().find(|q| q.name == "op-critical-training").unwrap();
    critical.flags.clear();
    critical.grp_tres.clear();
    qos.retain(|q| q.name != "op-inference");
    let base = qos.iter_mut().find(|q| q.name == "op-inference-baseline").unwrap();
    base.max_tres_per_job.clear();
    base.flags.clear();
    let cap = qos.iter_mut().find(|q| q.name == "onepool-flexible-cap").unwrap();
    cap.grace_time = Duration::from_secs(30);
    cap.max_tres_per_job = vec![("gres/gpu".into(), "2".into())];

    let c = diff(&r, &qos, &config, &partitions);
    let lines: Vec<String> = c.sacctmgr_commands().iter().map(|a| a.join(" ")).collect();
    assert_eq!(
        lines,
        [
            "sacctmgr -i add qos op-inference set Priority=2000 Preempt=op-agents PreemptMode=cancel GraceTime=60 MaxTRESPerJob=gres/gpu=4 Flags=DenyOnLimit",
            "sacctmgr -i modify qos where name=op-agents set Priority=1000",
            "sacctmgr -i modify qos where name=op-training set Preempt=op-inference,op-agents PreemptMode=requeue MaxTRESPerJob=gres/gpu=12",
            "sacctmgr -i modify qos where name=op-critical-training set GrpTRES=gres/gpu=8 Flags+=DenyOnLimit",
            "sacctmgr -i modify qos where name=op-inference-baseline set MaxTRESPerJob=gres/gpu=4 Flags+=DenyOnLimit",
            "sacctmgr -i modify qos where name=onepool-flexible-cap set GraceTime=0 MaxTRESPerJob=gres/gpu=-1",
        ]
    );
    assert!(c.slurm_conf.is_empty() && c.partition.is_none(), "{c:#?}");
}

#[test]
fn qos_names_compare_without_case_as_slurm_stores_them_lower_case() {
    let r = render(&policy_of(SAMPLE));
    let (mut qos, config, partitions) = live_of(&r);
    for q in &mut qos {
        q.name = q.name.to_ascii_uppercase();
        q.preempt = q.preempt.iter().map(|p| p.to_ascii_uppercase()).collect();
    }
    assert!(diff(&r, &qos, &config, &partitions).is_empty());
}

const SITE_MANAGED: &str = r#"
[pool]
partitions = ["gpu", "gpu-big"]
total_gpus = 8
default_class = "batch"
flexible_partition = "gpu-flex"

[classes.owners]
tier = "protected"
qos = "owners"
entitled = { accounts = ["a"] }
capacity = { lendable = 2, reserved = 2 }

[classes.site]
tier = "flexible"
rank = 1
qos = "normal"
manage_qos = false

[classes.batch]
tier = "flexible"
rank = 2
qos = "op-batch"
reclaim = "requeue"
drain_timeout = "30s"
"#;

#[test]
fn a_missing_site_qos_and_pool_partition_are_errors_that_say_how_to_fix_them() {
    let r = render(&policy_of(SITE_MANAGED));
    let config = parse_scontrol_config(&SITE_CONFIG.replace("JobRequeue              = 1", "JobRequeue = 0"));
    let c = diff(&r, &[], &config, &parse_scontrol_partitions(GPU_PARTITION).unwrap());
    let problems: Vec<String> = c.problems.iter().map(|p| format!("{:?}: {p}", p.severity)).collect();
    assert_eq!(
        problems,
        [
            "Error: class site maps to QOS \"normal\", which does not exist on the cluster (the policy says the site manages it: manage_qos = false); create it (sacctmgr -i add qos normal) or set manage_qos = true in [classes.site] so that onepool creates it",
            "Warning: JobRequeue=0: reclaimed jobs of class batch are cancelled, not requeued, unless submitted with --requeue; set JobRequeue=1 in slurm.conf (Slurm's default), or submit those jobs with sbatch --requeue",
            "Error: the pool's partition \"gpu-big\" does not exist on the cluster; define it in slurm.conf, or correct pool.partitions in the policy",
        ]
    );
    assert!(c.has_errors());
    // The site's QOS is never created by onepool.
    assert!(c.qos.iter().all(|q| q.name() != "normal"));

    let c = diff(&r, &parse_sacctmgr_qos(SITE_QOS).unwrap(), &config, &[]);
    assert!(!c.problems.iter().any(|p| p.message.contains("QOS \"normal\"")), "{:?}", c.problems);
}

#[test]
fn a_flexible_partition_without_the_cap_is_reported() {
    let r = render(&policy_of(SITE_MANAGED));
    let (qos, config, _) = live_of(&r);
    let partitions = parse_scontrol_partitions(&format!(
        "{GPU_PARTITION}\nPartitionName=gpu-big QoS=N/A\nPartitionName=gpu-flex QoS=N/A\n"
    ))
    .unwrap();
    let c = diff(&r, &qos, &config, &partitions);
    assert_eq!(
        c.partition,
        Some(PartitionChange::WrongQos { name: "gpu-flex".into(), live_qos: None, qos: "onepool-flexible-cap".into() })
    );
    assert!(c.slurm_conf_text().contains("`scontrol update PartitionName=gpu-flex QOS=onepool-flexible-cap`"));
    assert!(c.problems.is_empty(), "{:?}", c.problems);
}

#[test]
fn a_partition_outside_the_pool_on_its_nodes_is_a_warning() {
    let r = render(&policy_of(SAMPLE));
    let (qos, config, mut partitions) = live_of(&r);
    let cpu = |nodes: &str| LivePartition { name: "cpu".into(), nodes: Some(nodes.into()), qos: None, allow_qos: None };
    partitions.push(cpu("node[3-9]"));
    let c = diff(&r, &qos, &config, &partitions);
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    assert!(!c.problems[0].is_error());
    assert!(
        c.problems[0].message.starts_with("partition cpu is not in the pool but shares its nodes (node3,node4)"),
        "{}",
        c.problems[0].message
    );
    partitions.pop();
    partitions.push(cpu("cpu[1-8]"));
    assert!(diff(&r, &qos, &config, &partitions).problems.is_empty());
    partitions.pop();
    partitions.push(cpu("ALL"));
    assert_eq!(diff(&r, &qos, &config, &partitions).problems.len(), 1);
    partitions.pop();
    partitions.push(LivePartition { nodes: None, ..cpu("") });
    assert!(diff(&r, &qos, &config, &partitions).problems.is_empty());
}

/// Audit mode changes nothing: the plugin sets no class QOS then, so no
/// partition may admit only the class QOS.
#[test]
fn audit_mode_renders_no_allow_qos() {
    let r = render(&policy_of(&SAMPLE.replace("audit = false", "audit = true")));
    assert!(r.partition_access.is_empty());
    let fp = r.flexible_partition.as_ref().unwrap();
    assert!(fp.access().is_none() && !fp.line().contains("AllowQos"), "{}", fp.line());
    assert!(!r.slurm_conf_text().contains("AllowQos"));
}
