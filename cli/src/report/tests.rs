use onepool_decisions::policy::{load, Policy};

use super::usage::{self, Run};
use super::*;

fn policy() -> Policy {
    load(
        r#"
[pool]
partitions = ["gpu"]
total_gpus = 8
default_class = "b"

[classes.p]
tier = "protected"
qos = "op-p"
capacity = { lendable = 4, reserved = 0 }
entitled = { accounts = ["p"], users = [], groups = [] }

[classes.a]
tier = "flexible"
rank = 1
qos = "op-a"
reclaim = "requeue"
drain_timeout = "1m"

[classes.b]
tier = "flexible"
rank = 2
qos = "op-b"
reclaim = "immediate"
"#,
    )
    .policy
    .expect("the test policy loads")
}

fn run(id: &str, qos: &str, state: &str, (submit, start, end): (f64, f64, f64), gpus: u32, nodes: &[&str]) -> Run {
    Run {
        id: id.into(),
        name: "x".into(),
        qos: qos.into(),
        state: state.into(),
        submit,
        start,
        end,
        gpus,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

/// One hour of an 8-GPU pool, 4 of them protected: a (4 GPUs) and b
/// (2 GPUs) share the 4 unprotected GPUs and 2 lent ones until b is
/// reclaimed at 1200 s for p, which was submitted at 1190 and ran at
/// 1200.5 on b's node; a job outside the pool holds 1 GPU throughout.
fn hour() -> Vec<Run> {
    vec![
        run("1", "op-a", "COMPLETED", (0.0, 0.0, 1800.0), 4, &["n1"]),
        run("2", "op-b", "PREEMPTED", (0.0, 0.0, 1200.0), 2, &["n2"]),
        run("3", "op-p", "COMPLETED", (1190.0, 1200.5, 3000.0), 4, &["n2", "n3"]),
        run("4", "normal", "RUNNING", (-100.0, -100.0, f64::INFINITY), 1, &["n4"]),
    ]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn gpu_hours_borrowed_idle_and_the_reclaim_by_hand() {
    let r = usage::compute(&hour(), &policy(), 0.0, 3600.0);
    let by = |n: &str| r.classes.iter().find(|c| c.class == n).unwrap().clone();
    let (a, b, p) = (by("a"), by("b"), by("p"));
    assert!(close(a.gpu_hours, 2.0) && close(b.gpu_hours, 2.0 * 1200.0 / 3600.0), "{a:?} {b:?}");
    assert!(close(p.gpu_hours, 4.0 * 1799.5 / 3600.0), "{p:?}");
    // 0-1200 s: 6 flexible GPUs on 4 unprotected: 2 borrowed, a 4/6 of them.
    assert!(close(a.borrowed_gpu_hours, 2.0 * 4.0 / 6.0 * 1200.0 / 3600.0), "{a:?}");
    assert!(close(b.borrowed_gpu_hours, 2.0 * 2.0 / 6.0 * 1200.0 / 3600.0), "{b:?}");
    assert_eq!(p.borrowed_gpu_hours, 0.0);
    assert!(close(r.outside_gpu_hours, 1.0), "a running job counts up to the period's end");
    assert!(close(r.idle_gpu_hours, 8.0 - a.gpu_hours - b.gpu_hours - p.gpu_hours), "{r:?}");
    assert_eq!(r.reclaims.len(), 1);
    let x = &r.reclaims[0];
    assert_eq!((x.job.as_str(), x.class.as_str(), x.mode.as_str()), ("2", "b", "immediate"));
    assert_eq!(
        (x.for_job.as_deref(), x.for_class.as_deref(), x.time_to_capacity_s),
        (Some("3"), Some("p"), Some(10.5))
    );
    assert!(close(x.run_gpu_hours, 2.0 * 1200.0 / 3600.0));
}

#[test]
fn a_requeued_run_is_a_reclaim_only_in_a_requeue_class_and_no_taker_is_said_so() {
    let runs = vec![
        run("5", "op-a", "REQUEUED", (0.0, 0.0, 600.0), 2, &["n1"]),
        run("6", "op-b", "REQUEUED", (0.0, 0.0, 600.0), 2, &["n2"]),
        run("7", "op-b", "PREEMPTED", (0.0, 0.0, 900.0), 2, &["n3"]),
    ];
    let r = usage::compute(&runs, &policy(), 0.0, 3600.0);
    let got: Vec<(&str, &str)> = r.reclaims.iter().map(|x| (x.job.as_str(), x.mode.as_str())).collect();
    assert_eq!(got, [("5", "requeue"), ("7", "immediate")], "scontrol requeue of a b job is no reclaim");
    assert_eq!(r.reclaims[1].for_job, None);
    let t = text(&r);
    assert!(t.contains("  job 7 (b, immediate) at +900 s: no job started on its nodes right after\n"), "{t}");
}

#[test]
fn sacct_lines_become_runs() {
    let out = "40|requeue-training.sbatch|op-training|REQUEUED|2026-12-04T08:13:28|2026-12-04T08:13:28|2026-12-04T08:13:40|billing=1,cpu=1,gres/gpu=4,node=1|node1\n\
               41|cpu-only|normal|COMPLETED|2026-12-04T08:13:28|2026-12-04T08:13:29|2026-12-04T08:13:40|billing=1,cpu=1,node=1|node2\n\
               42|pending|op-a|PENDING|2026-12-04T08:13:28|Unknown|Unknown|billing=1,cpu=1,gres/gpu=1,node=1|None assigned\n\
               43|runs|op-a|RUNNING|2026-12-04T08:13:28|2026-12-04T08:13:30|Unknown|billing=1,gres/gpu=8,node=2|node[3-4]\n\
               44|killed|op-b|CANCELLED by 0|2026-12-04T08:13:28|2026-12-04T08:13:30|2026-12-04T08:14:30|gres/gpu=1|node1\n";
    let runs = usage::parse_sacct(out).unwrap();
    let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["40", "43", "44"], "no GPUs or never started: skipped");
    assert_eq!(runs[0].end - runs[0].start, 12.0);
    assert_eq!(
        (runs[1].gpus, runs[1].nodes.clone(), runs[1].end),
        (8, vec!["node3".to_string(), "node4".to_string()], f64::INFINITY)
    );
    assert_eq!(runs[2].state, "CANCELLED");
    let e = usage::parse_sacct("1|x|q\n").unwrap_err();
    assert_eq!(
        e,
        "sacct line 1: 3 fields, expected 9 (JobIDRaw,JobName,QOS,State,Submit,Start,End,AllocTRES,NodeList)"
    );
}

#[test]
fn audit_lines_in_the_period_are_counted() {
    let log = "[2026-12-04T08:00:00.000] job_submit/onepool: audit: uid 1000: would place: class training qos op-training [v1]\n\
               [2026-12-04T09:00:00.000] job_submit/onepool: audit: uid 1000: would place: class training qos op-training [v1]\n\
               [2026-12-04T09:00:01.000] job_submit/onepool: audit: uid 1001: would place: class agents qos op-agents [v1]\n\
               [2026-12-04T09:00:02.000] job_submit/onepool: audit: uid 1001: would refuse: --workload=critical-training needs an entitlement\n\
               [2026-12-04T09:00:03.000] job_submit/onepool: audit: uid 1001: would refuse update of job 7: QOS is set by onepool\n\
               [2026-12-04T09:00:04.000] slurmctld: something else\n";
    let from = onepool_decisions::trace::parse_time("2026-12-04T08:30:00").unwrap();
    let a = usage::audit(log, from, from + 3600.0);
    assert_eq!(a.would_place.into_iter().collect::<Vec<_>>(), [("agents".to_string(), 1), ("training".to_string(), 1)]);
    assert_eq!(
        a.would_refuse.into_iter().collect::<Vec<_>>(),
        [("--workload=critical-training needs an entitlement".to_string(), 1)]
    );
    assert_eq!(a.would_refuse_updates, 1);
}

#[test]
fn times_relative_and_absolute() {
    let to = time("2026-12-04T08:13:28", None).unwrap();
    assert_eq!(format_time(to), "2026-12-04T08:13:28");
    assert_eq!(format_time(time("now-2days", Some(to)).unwrap()), "2026-12-02T08:13:28");
    assert_eq!(format_time(time("now-90minutes", Some(to)).unwrap()), "2026-12-04T06:43:28");
    assert_eq!(format_time(0.0), "1970-01-01T00:00:00");
    assert_eq!(format_time(time("2024-02-29T23:59:59", None).unwrap()), "2024-02-29T23:59:59");
    let e = time("now-2weeks", Some(to)).unwrap_err().to_string();
    assert!(e.contains("unknown unit \"weeks\""), "{e}");
    assert!(time("yesterday", None).is_err());
}

#[test]
fn text_and_chart_name_every_class_and_the_reclaim() {
    let r = usage::compute(&hour(), &policy(), 0.0, 3600.0);
    let t = text(&r);
    assert!(
        t.starts_with("onepool report 1970-01-01T00:00:00 to 1970-01-01T01:00:00 (1.0 h), pool of 8 GPUs\n"),
        "{t}"
    );
    assert!(t.contains("\na                          flexible       2.00           0.44      1\n"), "{t}");
    assert!(t.contains("  immediate: 1 (runs ended: 0.67 GPU-hours)\n"), "{t}");
    assert!(t.contains("  job 2 (b, immediate) at +1200 s: for job 3 (p), which ran 10.5 s after submission\n"), "{t}");
    let s = svg::chart(&r);
    assert!(s.starts_with("<svg ") && s.ends_with("</svg>\n"));
    for name in [">p<", ">a<", ">b<", ">idle<", "1 reclaim(s)"] {
        assert!(s.contains(name), "{name} missing:\n{s}");
    }
    assert_eq!(s.matches("<text").count(), s.matches("</text>").count());
}
