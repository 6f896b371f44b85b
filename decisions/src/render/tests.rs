use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::annotation::ReclaimMode;
use crate::policy::{load, Capacity, Class, Pool, Tier, TimeLimitRule};

pub(crate) const SAMPLE: &str = include_str!("../../../etc/onepool.toml");

pub(crate) fn policy_of(src: &str) -> Policy {
    let loaded = load(src);
    let diagnostics = loaded.render("p.toml", src);
    loaded.policy.unwrap_or_else(|| panic!("{diagnostics:#?}"))
}

fn commands(r: &Rendered) -> Vec<String> {
    r.sacctmgr_commands().iter().map(|c| c.join(" ")).collect()
}

#[test]
fn the_sample_renders_one_qos_per_class_lowest_rank_first() {
    let r = render(&policy_of(SAMPLE));
    assert_eq!(
        commands(&r),
        [
            "sacctmgr -i add qos op-agents set Priority=1000 PreemptMode=cancel MaxTRESPerJob=gres/gpu=4 Flags=DenyOnLimit",
            "sacctmgr -i add qos op-inference set Priority=2000 Preempt=op-agents PreemptMode=cancel GraceTime=60 MaxTRESPerJob=gres/gpu=4 Flags=DenyOnLimit",
            "sacctmgr -i add qos op-training set Priority=3000 Preempt=op-inference,op-agents PreemptMode=requeue GraceTime=120 MaxTRESPerJob=gres/gpu=12 Flags=DenyOnLimit",
            "sacctmgr -i add qos op-critical-training set Priority=10000 Preempt=op-training,op-inference,op-agents PreemptMode=cancel GrpTRES=gres/gpu=8 MaxTRESPerJob=gres/gpu=8 MaxWall=7-00:00:00 Flags=DenyOnLimit",
            "sacctmgr -i add qos op-inference-baseline set Priority=10000 Preempt=op-training,op-inference,op-agents PreemptMode=cancel GrpTRES=gres/gpu=4 MaxTRESPerJob=gres/gpu=4 Flags=DenyOnLimit",
            "sacctmgr -i add qos onepool-flexible-cap set GrpTRES=gres/gpu=12 Flags=DenyOnLimit",
        ]
    );
    assert_eq!(r.sacctmgr_commands()[0][..6], ["sacctmgr", "-i", "add", "qos", "op-agents", "set"]);
}

#[test]
fn the_sample_renders_the_slurm_conf_settings_and_the_flexible_partition() {
    let r = render(&policy_of(SAMPLE));
    let text = r.slurm_conf_text();
    let settings: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        settings,
        [
            "JobSubmitPlugins=onepool",
            "PriorityType=priority/multifactor",
            "PriorityWeightQOS=10000",
            "PreemptType=preempt/qos",
            "PreemptMode=CANCEL",
            "PreemptExemptTime=00:02:00",
            "AccountingStorageEnforce=associations,limits,qos",
            "SlurmctldParameters=preempt_send_user_signal",
            "AccountingStoreFlags=job_comment",
            "PrologFlags=Alloc",
            "PartitionName=gpu-flex Nodes=ALL QOS=onepool-flexible-cap AllowQos=op-training,op-inference,op-agents MaxTime=INFINITE State=UP",
        ]
    );
    // Every setting has its reason on the line above; the site's own
    // partition line gets what to add to it, as two comment lines.
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * settings.len() + 2);
    assert!(
        text.ends_with("#   add AllowQos=op-critical-training,op-inference-baseline to its PartitionName line; `scontrol update PartitionName=gpu AllowQos=op-critical-training,op-inference-baseline` applies it until slurmctld restarts\n"),
        "{text}"
    );
    let lines = &lines[..2 * settings.len()];
    for pair in lines.chunks(2) {
        assert!(pair[0].starts_with("# ") && pair[0].len() > 20, "{pair:?}");
    }
    assert!(text.contains("requeue there needs batch jobs to be requeueable"), "{text}");
    assert!(text.contains("its partition QOS keeps them off the 4 reserved GPUs, and only flexible classes' QOS run here\nPartitionName="), "{text}");
}

#[test]
fn the_human_form_puts_each_command_under_its_reason() {
    let r = render(&policy_of(SAMPLE));
    let text = r.sacctmgr_text();
    assert!(text.starts_with(
        "# class agents: flexible, rank 3; cancelled at once when reclaimed\nsacctmgr -i add qos op-agents set Priority=1000 "
    ));
    assert!(text.contains(
        "# class inference: flexible, rank 2; when reclaimed, gets a drain notice and 1m (GraceTime), then is cancelled\n"
    ));
    // Six QOS under their reasons, the grant of the class QOS at the root
    // under its, then the service user's account and association.
    assert_eq!(text.lines().count(), 17);
    assert!(text.contains("sacctmgr -i modify account where name=root set qos+=op-agents,op-inference,op-training,op-critical-training,op-inference-baseline\n# onepoold's service user"), "{text}");
    assert!(text.ends_with("sacctmgr -i add account onepool 'Description=onepoold replicas' Organization=onepool\nsacctmgr -i add user onepool Account=onepool\n"), "{text}");
}

const TWO_FLEXIBLE: &str = r#"
[pool]
partitions = ["gpu"]
total_gpus = 8
default_class = "batch"

[classes.owners]
tier = "protected"
qos = "owners"
entitled = { accounts = ["a"] }
capacity = { lendable = 6 }

[classes.site]
tier = "flexible"
rank = 1
qos = "site-normal"
manage_qos = false

[classes.batch]
tier = "flexible"
rank = 7
qos = "op-batch"
"#;

#[test]
fn site_managed_qos_are_never_rendered_but_still_preempted() {
    let r = render(&policy_of(TWO_FLEXIBLE));
    assert_eq!(
        commands(&r),
        [
            "sacctmgr -i add qos op-batch set Priority=1000 PreemptMode=cancel",
            "sacctmgr -i add qos owners set Priority=10000 Preempt=site-normal,op-batch PreemptMode=cancel GrpTRES=gres/gpu=6",
        ]
    );
    assert_eq!(r.site_qos, [SiteQos { class: "site".into(), qos: "site-normal".into() }]);
    // No GPUs reserved: no flexible partition, and no QOS that caps it;
    // every class's QOS may run in the pool's partition, and only they.
    assert!(r.flexible_partition.is_none());
    assert!(!r.slurm_conf_text().lines().any(|l| l.starts_with("PartitionName")));
    assert_eq!(r.partition_access.len(), 1);
    assert_eq!(r.partition_access[0].allow_qos, ["owners", "site-normal", "op-batch"]);
}

#[test]
fn an_immediate_class_gets_no_grace_time_even_if_the_file_gives_one() {
    let src = TWO_FLEXIBLE.replace("qos = \"op-batch\"", "qos = \"op-batch\"\ngrace_time = \"30s\"");
    let r = render(&policy_of(&src));
    let batch = r.qos.iter().find(|q| q.name == "op-batch").unwrap();
    assert_eq!(batch.grace_time, Duration::ZERO);
}

#[test]
fn slurm_times() {
    for (secs, want) in [(0, "00:00:00"), (120, "00:02:00"), (3_723, "01:02:03"), (93_600, "1-02:00:00")] {
        assert_eq!(slurm_time(Duration::from_secs(secs)), want);
    }
}

#[test]
fn an_empty_preempt_list_is_written_as_sacctmgr_documents_it() {
    let argv = modify_command("op-a", &[QosSetting::Preempt(vec![]), QosSetting::GrpGpus(None)]);
    assert_eq!(argv[7], "Preempt=");
    assert_eq!(shell_line(&argv), "sacctmgr -i modify qos where name=op-a set Preempt='' GrpTRES=gres/gpu=-1");
    let flags = modify_command("op-a", &[QosSetting::DenyOnLimit(true), QosSetting::DenyOnLimit(false)]);
    assert_eq!(flags[7..], ["Flags+=DenyOnLimit", "Flags-=DenyOnLimit"]);
}

fn conf(key: &str) -> ConfLine {
    render(&policy_of(SAMPLE)).slurm_conf.into_iter().find(|l| l.key == key).unwrap()
}

#[test]
fn live_values_that_already_do_the_job_need_no_change() {
    for (key, live) in [
        ("JobSubmitPlugins", "lua,onepool"),
        ("JobSubmitPlugins", "job_submit/onepool"),
        ("PriorityType", "priority/multifactor"),
        ("PreemptMode", "REQUEUE"),
        ("PreemptMode", "CANCEL,GANG"),
        ("PreemptExemptTime", "00:02:00"),
        ("AccountingStorageEnforce", "associations,limits,qos,safe"),
        ("AccountingStorageEnforce", "qos,safe"),
        ("SlurmctldParameters", "enable_configless,preempt_send_user_signal"),
        ("PrologFlags", "Alloc,Contain"),
        ("PrologFlags", "contain"),
    ] {
        assert_eq!(conf(key).needed_change(Some(live)), None, "{key}={live}");
    }
}

#[test]
fn live_values_are_merged_not_replaced() {
    for (key, live, want) in [
        ("JobSubmitPlugins", Some("lua"), "lua,onepool"),
        ("JobSubmitPlugins", Some("(null)"), "onepool"),
        ("JobSubmitPlugins", None, "onepool"),
        ("AccountingStorageEnforce", Some("none"), "associations,limits,qos"),
        ("AccountingStorageEnforce", Some("associations"), "associations,limits,qos"),
        ("AccountingStorageEnforce", Some("safe"), "safe,qos"),
        ("SlurmctldParameters", Some("enable_configless"), "enable_configless,preempt_send_user_signal"),
        ("PrologFlags", Some("X11"), "X11,Alloc"),
        ("PreemptMode", Some("OFF"), "CANCEL"),
        ("PreemptMode", Some("SUSPEND,GANG"), "CANCEL,GANG"),
        ("PreemptExemptTime", Some("00:00:00"), "00:02:00"),
        ("PreemptExemptTime", Some("-1"), "00:02:00"),
        ("PriorityType", Some("priority/basic"), "priority/multifactor"),
        ("PriorityWeightQOS", Some("0"), "10000"),
    ] {
        assert_eq!(conf(key).needed_change(live).as_deref(), Some(want), "{key}={live:?}");
    }
}

fn class(name: &str, tier: Tier, manage_qos: bool) -> Class {
    Class {
        name: name.into(),
        tier,
        qos: format!("q-{name}"),
        manage_qos,
        match_partitions: vec![],
        description: String::new(),
        entitled: None,
        max_gpus_per_job: None,
        time_limit: TimeLimitRule::default(),
    }
}

fn policy_from(classes: Vec<Class>) -> Policy {
    Policy {
        pool: Pool {
            gpus_per_node: None,
            partitions: vec!["gpu".into()],
            gpu_types: vec![],
            total_gpus: 64,
            default_class: classes.first().map(|c| c.name.clone()).unwrap_or_default(),
            min_runtime_before_reclaim: Duration::ZERO,
            flexible_partition: Some("gpu-flex".into()),
            nodes: "ALL".into(),
            audit: false,
        },
        classes,
    }
}

#[test]
fn many_flexible_classes_stay_below_the_protected_ones() {
    let mut classes = vec![class("p", Tier::Protected { capacity: Capacity { lendable: 1, reserved: 0 } }, true)];
    for rank in 1..=12 {
        classes.push(class(
            &format!("f{rank}"),
            Tier::Flexible {
                rank: rank * 100,
                reclaim: ReclaimMode::Immediate,
                drain_timeout: Duration::ZERO,
                grace_time: Duration::ZERO,
            },
            true,
        ));
    }
    let r = render(&policy_from(classes));
    let priority = |name: &str| r.qos.iter().find(|q| q.name == name).unwrap().priority;
    assert_eq!(priority("q-f1"), 12_000);
    assert_eq!(priority("q-f12"), 1_000);
    assert_eq!(priority("q-p"), 13_000);
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    let protected = prop::collection::vec((1u32..8, 0u32..4, any::<bool>()), 0..4);
    let flexible = prop::collection::btree_map(1u32..u32::MAX, (0usize..3, 0u64..600, any::<bool>()), 0..16);
    (protected, flexible).prop_map(|(protected, flexible)| {
        let mut classes = Vec::new();
        for (i, (lendable, reserved, manage)) in protected.into_iter().enumerate() {
            classes.push(class(
                &format!("p{i}"),
                Tier::Protected { capacity: Capacity { lendable, reserved } },
                manage,
            ));
        }
        for (rank, (mode, grace, manage)) in flexible {
            classes.push(class(
                &format!("f{rank}"),
                Tier::Flexible {
                    rank,
                    reclaim: ReclaimMode::ALL[mode],
                    drain_timeout: Duration::from_secs(grace),
                    grace_time: Duration::from_secs(grace),
                },
                manage,
            ));
        }
        policy_from(classes)
    })
}

proptest! {
    #[test]
    fn flexible_qos_never_reach_protected_priority_nor_preempt_protected_qos(policy in arb_policy()) {
        let r = render(&policy);
        let protected: Vec<&QosSpec> = r.qos.iter()
            .filter(|q| q.class.as_deref().and_then(|c| policy.class(c)).is_some_and(Class::is_protected))
            .collect();
        let protected_names: Vec<&str> = policy.classes.iter().filter(|c| c.is_protected()).map(|c| c.qos.as_str()).collect();
        for q in r.all_qos() {
            for target in &q.preempt {
                prop_assert!(!protected_names.contains(&target.as_str()), "{} preempts protected {}", q.name, target);
            }
            let flexible = q.class.as_deref().and_then(|c| policy.class(c)).is_some_and(|c| !c.is_protected());
            if flexible {
                for p in &protected {
                    prop_assert!(q.priority < p.priority, "{} {} >= {} {}", q.name, q.priority, p.name, p.priority);
                }
            }
        }
        // Every QOS a Preempt list names was created before it, or is the site's.
        let mut created: Vec<&str> = r.site_qos.iter().map(|s| s.qos.as_str()).collect();
        for q in r.all_qos() {
            for target in &q.preempt {
                prop_assert!(created.contains(&target.as_str()), "{} names {} before it exists", q.name, target);
            }
            created.push(&q.name);
        }
    }
}
