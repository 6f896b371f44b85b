use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::policy::load;

const SAMPLE: &str = include_str!("../../etc/onepool.toml");

fn sample() -> Policy {
    load(SAMPLE).policy.expect("sample policy loads")
}

/// A directory with named users and group memberships.
#[derive(Default)]
struct Dir {
    users: HashMap<u32, String>,
    groups: HashMap<String, Vec<u32>>,
}

impl Directory for Dir {
    fn user_name(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).map(String::as_str)
    }
    fn in_group(&self, uid: u32, _gid: u32, group: &str) -> bool {
        self.groups.get(group).is_some_and(|m| m.contains(&uid))
    }
}

fn dir() -> Dir {
    let mut d = Dir::default();
    d.users.insert(1000, "alice".into());
    d.users.insert(1001, "bob".into());
    d
}

const ALICE: Submitter = Submitter { uid: 1000, gid: 1000 };
const ROOT: Submitter = Submitter { uid: 0, gid: 0 };

fn job(workload: Option<&str>) -> JobRequest {
    let mut j = JobRequest { gpus: 1, ..Default::default() };
    j.annotation.workload = workload.map(str::to_string);
    j
}

fn accepted(v: Verdict) -> Placement {
    match v {
        Verdict::Accept(p) => p,
        other => panic!("expected acceptance, got {other:?}"),
    }
}

fn refused(v: Verdict) -> Refusal {
    match v {
        Verdict::Refuse(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn unannotated_job_gets_the_default_class_and_the_flexible_partition() {
    let p = accepted(classify(&sample(), &dir(), ALICE, &job(None)));
    assert_eq!(p.class, "agents");
    assert_eq!(p.qos, "op-agents");
    assert_eq!(p.partition.as_deref(), Some("gpu-flex"));
    assert_eq!(p.time_limit, Some(Duration::from_secs(4 * 3600)));
    assert_eq!(p.record.encode(), "onepool:class=agents;tier=flexible;reclaim=immediate");
}

#[test]
fn annotation_beats_qos_beats_partition() {
    let pol = sample();
    let mut j = job(None);
    j.qos = Some("op-inference".into());
    assert_eq!(accepted(classify(&pol, &dir(), ALICE, &j)).class, "inference");
    j.annotation.workload = Some("inference".into());
    assert_eq!(accepted(classify(&pol, &dir(), ALICE, &j)).class, "inference");
    j.annotation.workload = Some("training".into());
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::Conflict);
    assert_eq!(
        r.message,
        "onepool: --workload=training conflicts with --qos=op-inference (the QOS of class inference); drop --qos, onepool sets it from the class"
    );
}

#[test]
fn unknown_class_lists_the_valid_ones() {
    let r = refused(classify(&sample(), &dir(), ALICE, &job(Some("gaming"))));
    assert_eq!(r.rule, Rule::UnknownClass);
    assert_eq!(
        r.message,
        "onepool: --workload=gaming is not a workload class here; use one of: critical-training, inference-baseline, training, inference, agents"
    );
}

#[test]
fn protected_class_needs_entitlement() {
    let pol = sample();
    let mut j = job(Some("critical-training"));
    j.time_limit = Some(Duration::from_secs(3600));
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::NotEntitled);
    assert_eq!(
        r.message,
        "onepool: class critical-training is protected and alice is not entitled to it (entitled: accounts core-ml); if you belong to one of its accounts, submit with --account=core-ml"
    );
    j.account = Some("core-ml".into());
    let p = accepted(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(p.qos, "op-critical-training");
    assert_eq!(p.partition, None, "protected work stays in the pool partition");
    assert_eq!(p.record.encode(), "onepool:class=critical-training;tier=protected");
    // root is entitled everywhere.
    j.account = None;
    assert!(matches!(classify(&pol, &dir(), ROOT, &j), Verdict::Accept(_)));
}

#[test]
fn group_entitlement() {
    let mut pol = sample();
    pol.classes.iter_mut().find(|c| c.name == "critical-training").unwrap().entitled.as_mut().unwrap().groups =
        vec!["ml".into()];
    let mut d = dir();
    let mut j = job(Some("critical-training"));
    j.time_limit = Some(Duration::from_secs(60));
    assert!(matches!(classify(&pol, &d, ALICE, &j), Verdict::Refuse(_)));
    d.groups.insert("ml".into(), vec![1000]);
    assert!(matches!(classify(&pol, &d, ALICE, &j), Verdict::Accept(_)));
}

#[test]
fn gpu_cap_names_the_limit_and_a_class_that_fits() {
    let mut j = job(Some("agents"));
    j.gpus = 8;
    let r = refused(classify(&sample(), &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::GpuCap);
    assert_eq!(
        r.message,
        "onepool: class agents allows at most 4 GPUs per job and this job asks for 8; ask for 4 or fewer, or use --workload=training"
    );
}

#[test]
fn time_limit_rules() {
    let pol = sample();
    let mut j = job(Some("critical-training"));
    j.account = Some("core-ml".into());
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::TimeLimitRequired);
    assert_eq!(
        r.message,
        "onepool: class critical-training requires a time limit; add --time (e.g. --time=4:00:00), at most 7d"
    );
    j.time_limit = Some(Duration::from_secs(8 * 86400));
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::TimeLimitTooLong);
    assert_eq!(
        r.message,
        "onepool: class critical-training allows a time limit of at most 7d and this job asks for 8d; lower --time"
    );
}

#[test]
fn reclaim_annotations() {
    let pol = sample();
    let mut j = job(Some("inference"));
    j.annotation.reclaim = Some(ReclaimMode::Immediate);
    let p = accepted(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(p.record.reclaim, Some(ReclaimMode::Immediate));
    assert_eq!(p.record.drain_timeout, None);

    let mut j = job(Some("inference"));
    j.annotation.drain_timeout = Some(Duration::from_secs(30));
    j.annotation.endpoint = Some("llm".into());
    let p = accepted(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(p.record.encode(), "onepool:class=inference;tier=flexible;reclaim=graceful;drain=30s;endpoint=llm");

    j.annotation.drain_timeout = Some(Duration::from_secs(300));
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(
        r.message,
        "onepool: --drain-timeout=5m is longer than class inference's 1m, which is all the grace Slurm gives; ask for 1m or less"
    );

    let mut j = job(Some("agents"));
    j.annotation.reclaim = Some(ReclaimMode::Graceful);
    assert_eq!(refused(classify(&pol, &dir(), ALICE, &j)).rule, Rule::ReclaimNotAllowed);
}

#[test]
fn jobs_outside_the_pool_are_left_alone() {
    let mut j = job(Some("gaming"));
    j.partition = Some("cpu".into());
    assert_eq!(classify(&sample(), &dir(), ALICE, &j), Verdict::Outside);
}

#[test]
fn jobs_for_gpu_types_outside_the_pool_are_left_alone() {
    let mut pol = sample();
    pol.pool.gpu_types = vec!["h200".into()];
    let mut j = job(Some("gaming"));
    j.gpu_type = Some("t4".into());
    assert_eq!(classify(&pol, &dir(), ALICE, &j), Verdict::Outside);
    j.gpu_type = Some("h200".into());
    assert_eq!(refused(classify(&pol, &dir(), ALICE, &j)).rule, Rule::UnknownClass);
}

#[test]
fn modify_refuses_escalation_into_protected_classes() {
    let pol = sample();
    for qos in ["op-critical-training", "OP-CRITICAL-TRAINING"] {
        let m = ModifyRequest { qos: Some(qos.into()), ..Default::default() };
        let r = check_modify(&pol, &dir(), ALICE, &m).unwrap_err();
        assert_eq!(r.rule, Rule::NotEntitled, "{qos}");
        assert!(check_modify(&pol, &dir(), ROOT, &m).is_ok());
    }
}

/// A class is chosen at submission: no update by a user moves a job to
/// any class's QOS, flexible ones included, nor into the pool's partitions.
#[test]
fn modify_refuses_every_move_into_a_class_or_the_pool() {
    let pol = sample();
    let m = |qos: Option<&str>, partition: Option<&str>| ModifyRequest {
        qos: qos.map(str::to_string),
        partition: partition.map(str::to_string),
        ..Default::default()
    };
    // Slurm takes QOS names in any case.
    for qos in [
        "op-training",
        "OP-TRAINING",
        "op-agents",
        "Op-Inference",
        crate::policy::FLEXIBLE_CAP_QOS,
        "ONEPOOL-FLEXIBLE-CAP",
    ] {
        let r = check_modify(&pol, &dir(), ALICE, &m(Some(qos), None)).unwrap_err();
        assert_eq!(r.rule, Rule::ClassChange, "{qos}: {}", r.message);
        assert!(r.message.starts_with("onepool: QOS ") && r.message.contains("submit a new job"), "{}", r.message);
        assert!(check_modify(&pol, &dir(), ROOT, &m(Some(qos), None)).is_ok());
    }
    for part in ["gpu", "gpu-flex", "cpu,gpu"] {
        let r = check_modify(&pol, &dir(), ALICE, &m(None, Some(part))).unwrap_err();
        assert_eq!(r.rule, Rule::PartitionChange, "{part}");
        assert!(r.message.contains("is in the GPU pool"), "{}", r.message);
        assert!(check_modify(&pol, &dir(), ROOT, &m(None, Some(part))).is_ok());
    }
    // Outside the pool, the site's QOS and partitions are the site's.
    assert!(check_modify(&pol, &dir(), ALICE, &m(Some("normal"), Some("cpu"))).is_ok());
    assert!(check_modify(&pol, &dir(), ALICE, &m(Some("normal"), None)).is_ok());
    assert!(check_modify(&pol, &dir(), ALICE, &ModifyRequest::default()).is_ok());
}

fn arb_job() -> impl Strategy<Value = (JobRequest, u32, Option<usize>)> {
    let classes = ["critical-training", "inference-baseline", "training", "inference", "agents", "nope"];
    let qos = ["op-critical-training", "op-inference-baseline", "op-training", "op-inference", "op-agents", "normal"];
    (
        proptest::option::of(0..classes.len()),
        proptest::option::of(0..qos.len()),
        proptest::option::of(prop_oneof![Just("gpu"), Just("gpu-flex"), Just("cpu")]),
        proptest::option::of(prop_oneof![Just("core-ml"), Just("other")]),
        0u64..20,
        proptest::option::of(0u64..(10 * 86400)),
        prop_oneof![Just(0u32), Just(1000u32), Just(1001u32), Just(4242u32)],
        proptest::option::of(0usize..3),
    )
        .prop_map(move |(c, q, p, a, gpus, t, uid, reclaim)| {
            let mut j = JobRequest {
                account: a.map(str::to_string),
                partition: p.map(str::to_string),
                qos: q.map(|i| qos[i].to_string()),
                gpus,
                time_limit: t.map(Duration::from_secs),
                ..Default::default()
            };
            j.annotation.workload = c.map(|i| classes[i].to_string());
            j.annotation.reclaim = reclaim.map(|i| ReclaimMode::ALL[i]);
            (j, uid, reclaim)
        })
}

proptest! {
    /// A placement into a protected QOS always belongs to an entitled user.
    #[test]
    fn no_unentitled_job_lands_in_a_protected_qos((j, uid, _) in arb_job()) {
        let pol = sample();
        let d = dir();
        let who = Submitter { uid, gid: uid };
        if let Verdict::Accept(p) = classify(&pol, &d, who, &j) {
            let class = pol.class_by_qos(&p.qos).unwrap();
            prop_assert_eq!(&class.name, &p.class);
            if class.is_protected() {
                prop_assert!(entitled(class.entitled.as_ref().unwrap(), &d, who, j.account.as_deref()));
            }
            // A flexible job is never put into a protected QOS.
            prop_assert_eq!(class.is_protected(), p.record.protected);
        }
    }

    /// An entitled user is never refused for entitlement.
    #[test]
    fn entitled_users_are_never_refused_for_entitlement((j, uid, _) in arb_job()) {
        let pol = sample();
        let d = dir();
        let who = Submitter { uid, gid: uid };
        if let (Ok(class), Verdict::Refuse(r)) = (pick_class(&pol, &j), classify(&pol, &d, who, &j)) {
            let is_entitled = class.entitled.as_ref().is_none_or(|e| entitled(e, &d, who, j.account.as_deref()));
            if is_entitled {
                prop_assert_ne!(r.rule, Rule::NotEntitled, "{}", r.message);
            }
        }
    }

    /// Same job, same decision.
    #[test]
    fn decisions_are_deterministic((j, uid, _) in arb_job()) {
        let pol = sample();
        let who = Submitter { uid, gid: uid };
        prop_assert_eq!(classify(&pol, &dir(), who, &j), classify(&pol, &dir(), who, &j));
    }

    /// Accepted jobs respect the class's GPU cap and time limit maximum.
    #[test]
    fn accepted_jobs_respect_caps((j, uid, _) in arb_job()) {
        let pol = sample();
        if let Verdict::Accept(p) = classify(&pol, &dir(), Submitter { uid, gid: uid }, &j) {
            let c = pol.class(&p.class).unwrap();
            if let Some(cap) = c.max_gpus_per_job { prop_assert!(j.gpus <= u64::from(cap)); }
            let t = j.time_limit.or(p.time_limit);
            if let (Some(max), Some(t)) = (c.time_limit.max, t) { prop_assert!(t <= max); }
            if c.time_limit.required { prop_assert!(j.time_limit.is_some()); }
        }
    }
}

/// Issue #25: `--exclusive` gets every GPU of its nodes, so it is counted
/// so against the class's cap; `--exclusive` within the cap, and any job
/// on a policy that does not say how many GPUs a node has, as asked.
#[test]
fn an_exclusive_job_is_counted_as_slurm_will_allocate_it() {
    let pol = sample();
    assert_eq!(pol.pool.gpus_per_node, Some(4));
    let mut j = job(Some("agents"));
    j.gpus = 1;
    j.exclusive = true;
    j.nodes = 1;
    assert_eq!(held_gpus(&pol, &j), 4);
    assert!(matches!(classify(&pol, &dir(), ALICE, &j), Verdict::Accept(_)), "4 GPUs: within agents' cap of 4");
    j.nodes = 2;
    let r = refused(classify(&pol, &dir(), ALICE, &j));
    assert_eq!(r.rule, Rule::GpuCap);
    assert!(
        r.message.starts_with(
            "onepool: class agents allows at most 4 GPUs per job and this --exclusive job gets every GPU of its 2 node(s), 8 (it asks for 1); drop --exclusive or ask for fewer nodes"
        ),
        "{}",
        r.message
    );
    // Not exclusive: as asked.
    j.exclusive = false;
    assert!(matches!(classify(&pol, &dir(), ALICE, &j), Verdict::Accept(_)));
    // A policy without gpus_per_node counts as asked, exclusive or not.
    let mut open = pol.clone();
    open.pool.gpus_per_node = None;
    j.exclusive = true;
    assert_eq!(held_gpus(&open, &j), 1);
}

#[test]
fn gpus_per_node_must_fit_the_pool() {
    let bad = SAMPLE.replace("gpus_per_node = 4", "gpus_per_node = 17");
    let l = load(&bad);
    assert!(l.policy.is_none());
    let text = l.diagnostics.iter().map(|d| d.render("p.toml", &bad)).collect::<Vec<_>>().join("\n");
    assert!(text.contains("gpus_per_node 17 is not between 1 and total_gpus (16)"), "{text}");
}
