use super::*;

pub(crate) const SAMPLE: &str = include_str!("../../../etc/onepool.toml");

fn errors_of(src: &str) -> Vec<String> {
    let l = load(src);
    l.render("p.toml", src)
}

fn with_class(extra: &str) -> String {
    format!(
        "[pool]\npartitions=[\"gpu\"]\ntotal_gpus=8\ndefault_class=\"agents\"\n\n[classes.agents]\ntier=\"flexible\"\nrank=9\nqos=\"op-agents\"\n\n{extra}"
    )
}

#[test]
fn the_shipped_sample_is_clean() {
    let l = load(SAMPLE);
    assert!(l.diagnostics.is_empty(), "{:#?}", l.render("etc/onepool.toml", SAMPLE));
    let p = l.policy.unwrap();
    assert_eq!(p.class_names(), ["critical-training", "inference-baseline", "training", "inference", "agents"]);
    assert_eq!(p.reserved_gpus(), 4);
    assert_eq!(p.flexible_cap(), 12);
    let inf = p.class("inference").unwrap();
    assert_eq!(
        inf.tier,
        Tier::Flexible {
            rank: 2,
            reclaim: ReclaimMode::Graceful,
            drain_timeout: Duration::from_secs(60),
            grace_time: Duration::from_secs(60)
        }
    );
}

#[test]
fn unknown_key_is_reported_with_its_place() {
    let src = with_class("[classes.x]\ntier=\"flexible\"\nrank=1\nqos=\"q\"\ncolour=\"red\"\n");
    let e = errors_of(&src);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("p.toml:15:1: error: unknown field `colour`"), "{}", e[0]);
    assert!(e[0].contains("remove the key or fix its spelling"), "{}", e[0]);
}

#[test]
fn wrong_type_is_reported_with_its_place() {
    let src = "[pool]\npartitions=[\"gpu\"]\ntotal_gpus=\"many\"\ndefault_class=\"a\"\n[classes]\n";
    let e = errors_of(src);
    assert!(e[0].starts_with("p.toml:3:12: error: invalid type: string \"many\", expected u32"), "{e:?}");
}

#[test]
fn protected_capacity_beyond_the_pool_is_an_error() {
    let src = with_class(
        "[classes.a]\ntier=\"protected\"\nqos=\"qa\"\nentitled={users=[\"u\"]}\ncapacity={lendable=6}\n\n[classes.b]\ntier=\"protected\"\nqos=\"qb\"\nentitled={users=[\"u\"]}\ncapacity={lendable=3}\n",
    );
    let e = errors_of(&src);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with(
            "p.toml:21:10: error: protected capacity adds up to 9 GPUs (up to class b), more than the pool's 8 GPUs"
        ),
        "{}",
        e[0]
    );
}

#[test]
fn a_grace_time_shorter_than_the_drain_is_an_error() {
    let src = with_class("[classes.inf]\ntier=\"flexible\"\nrank=2\nqos=\"qi\"\nreclaim=\"graceful\"\ndrain_timeout=\"90s\"\ngrace_time=\"30s\"\n");
    let e = errors_of(&src);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("error: class inf: grace_time 30s cannot honour drain_timeout 1m30s"), "{}", e[0]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let src = with_class(
        "[classes.a]\ntier=\"flexible\"\nrank=9\nqos=\"op-agents\"\nreclaim=\"later\"\n\n[classes.b]\ntier=\"protected\"\nqos=\"qb\"\ncapacity={lendable=1}\ndrain_timeout=\"5x\"\n\n[classes.c]\ntier=\"flexible\"\nqos=\"qc\"\nreclaim=\"graceful\"\ntime_limit={max=\"5x\"}\n",
    );
    let e = errors_of(&src);
    let joined = e.join("\n");
    for want in [
        "is used by two classes",
        "rank 9 is used by classes",
        "\"later\" is not a reclaim mode",
        "invalid duration \"5x\"",
        "protected, so `drain_timeout` does not apply",
        "protected class b does not say who is entitled",
        "flexible class c has no rank",
        "has no drain_timeout",
    ] {
        assert!(joined.contains(want), "missing {want:?} in:\n{joined}");
    }
    // Sorted by place in the file.
    let lines: Vec<usize> = e.iter().map(|l| l.split(':').nth(1).unwrap().parse().unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{lines:?}");
}

#[test]
fn unknown_default_class_lists_the_defined_ones() {
    let src = "[pool]\npartitions=[\"gpu\"]\ntotal_gpus=8\ndefault_class=\"nope\"\n[classes.a]\ntier=\"flexible\"\nrank=1\nqos=\"q\"\n";
    let e = errors_of(src);
    assert_eq!(e, vec!["p.toml:4:15: error: default_class \"nope\" is not a defined class; use one of: a".to_string()]);
}

#[test]
fn reserved_capacity_needs_a_flexible_partition() {
    let src = with_class(
        "[classes.base]\ntier=\"protected\"\nqos=\"qb\"\nentitled={users=[\"root\"]}\ncapacity={reserved=2}\n",
    );
    let e = errors_of(&src);
    assert!(e.iter().any(|l| l.contains("2 GPUs are reserved, but the pool has no flexible_partition")), "{e:?}");
}

#[test]
fn warnings_do_not_stop_the_policy() {
    let src = with_class("[classes.base]\ntier=\"protected\"\nqos=\"qb\"\nentitled={}\ncapacity={lendable=2}\n");
    let l = load(&src);
    assert!(l.policy.is_some());
    assert_eq!(l.diagnostics.len(), 1);
    assert!(l.render("p.toml", &src)[0].contains("warning: protected class base entitles nobody"));
}

#[test]
fn the_flexible_partition_qos_name_is_not_a_class_qos() {
    let src = with_class("[classes.x]\ntier=\"flexible\"\nrank=1\nqos=\"onepool-flexible-cap\"\n");
    let e = errors_of(&src);
    assert_eq!(
        e,
        vec!["p.toml:14:5: error: QOS \"onepool-flexible-cap\" is onepool's own partition QOS of the flexible partition; give the class another QOS".to_string()]
    );
}

#[test]
fn a_flexible_cap_beyond_what_flexible_work_may_hold_is_a_warning() {
    let src = SAMPLE.replace(
        "max_gpus_per_job = 12\ntime_limit = { default = \"1d\" }",
        "max_gpus_per_job = 16\ntime_limit = { default = \"1d\" }",
    );
    assert_ne!(src, SAMPLE);
    let e = errors_of(&src);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("warning: class training allows 16 GPUs per job, but flexible work may hold at most 12 GPUs together (4 are reserved): larger jobs would never start; lower max_gpus_per_job to 12 or less"), "{}", e[0]);
}
