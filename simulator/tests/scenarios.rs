//! Hand-computable scenarios and properties of the simulation.

use std::path::PathBuf;
use std::sync::Arc;

use onepool_decisions::autoscale::ScalingPolicy;
use onepool_decisions::policy::{self, Policy};
use onepool_simulator::compare::{self, figures, Settings};
use onepool_simulator::engine::{Cancelled, Endpoint, Job, Req, Workload};
use onepool_simulator::fleet::Fleet;
use onepool_simulator::input::OnBadRow;
use onepool_simulator::scenario::{self, build_workload};
use proptest::prelude::*;

const TWO_FLEXIBLE: &str = r#"
[pool]
partitions = ["gpu"]
total_gpus = 16
default_class = "b"
min_runtime_before_reclaim = "2m"

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
"#;

fn policy(text: &str) -> Policy {
    policy::load(text).policy.expect("policy loads")
}

/// Writes files into a fresh folder and returns it.
fn folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onepool-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (f, text) in files {
        std::fs::write(dir.join(f), text).unwrap();
    }
    dir
}

#[test]
fn disjoint_peaks_need_the_larger_peak_not_the_sum() {
    // a: 4 one-GPU jobs in the first hour; b: 6 in the third. 2-GPU nodes.
    let mut jobs = String::from("submit,duration,gpus,class\n");
    for _ in 0..4 {
        jobs.push_str("0,1h,1,a\n");
    }
    for _ in 0..6 {
        jobs.push_str("7200,1h,1,b\n");
    }
    let scen = "policy = \"policy.toml\"\n[fleet]\nnodes = 8\ngpus_per_node = 2\n[targets]\nmax_p95_wait = \"0s\"\n[[jobs]]\nfile = \"jobs.csv\"\n";
    let dir = folder("disjoint", &[("policy.toml", TWO_FLEXIBLE), ("jobs.csv", &jobs), ("s.toml", scen)]);
    let sc = scenario::load(&dir.join("s.toml"), OnBadRow::Abort).unwrap();
    assert_eq!(sc.workload.jobs.len(), 10);
    let s = Settings { max_p95_wait_s: 0.0, ..Settings::default() };
    let (cmp, _) = compare::compare(&sc.workload, &sc.policy, &sc.fleet, &s, compare::Search::Always);
    assert_eq!(cmp.classes[0].separate_gpus_needed, Some(4));
    assert_eq!(cmp.classes[1].separate_gpus_needed, Some(6));
    assert_eq!(cmp.separate_gpus, Some(10));
    assert_eq!(cmp.shared_gpus_needed, Some(6));
    // On the 16-GPU fleet: 10 GPU-hours used, no waiting, nothing borrowed
    // (no protected class: every GPU is unprotected), nothing reclaimed.
    let a = &cmp.classes[0].shared;
    assert_eq!((a.gpu_hours_used, a.wait_p95_s, a.reclaims, a.peak_gpus), (4.0, 0.0, 0, 4));
    assert_eq!(cmp.classes[1].shared.gpu_hours_used, 6.0);
    assert_eq!(cmp.window_hours, 3.0);
    // Idle in the 3-hour window: islands 10*3 - 10 = 20; shared 16*3 - 10 = 38.
    assert!((cmp.separate_idle_gpu_hours - 20.0).abs() < 1e-9);
    assert!((cmp.shared_idle_gpu_hours - 38.0).abs() < 1e-9);
}

/// Records of a cluster that runs onepool (as `onepool report` writes
/// them) carry the class the plugin gave each job: a protected class an
/// anonymous submitter could not claim is kept, an unknown one is counted
/// as outside the pool.
#[test]
fn classified_records_keep_their_class() {
    let p = format!("{TWO_FLEXIBLE}\n[classes.guard]\ntier = \"protected\"\nqos = \"op-guard\"\nentitled = {{ accounts = [\"ml\"] }}\ncapacity = {{ lendable = 4, reserved = 0 }}\n");
    let jobs = "submit,duration,gpus,class,qos\n0,1h,2,guard,\n0,1h,1,,op-a\n0,1h,1,nope,\n";
    let scen = |classified: bool| {
        format!(
            "policy = \"policy.toml\"\n[fleet]\nnodes = 8\ngpus_per_node = 2\n[[jobs]]\nfile = \"jobs.csv\"\nclassified = {classified}\n"
        )
    };
    let dir = folder(
        "classified",
        &[("policy.toml", &p), ("jobs.csv", jobs), ("yes.toml", &scen(true)), ("no.toml", &scen(false))],
    );
    let sc = scenario::load(&dir.join("yes.toml"), OnBadRow::Abort).unwrap();
    let classes: Vec<&str> = sc.workload.jobs.iter().map(|j| sc.workload.classes[j.class].as_str()).collect();
    assert_eq!(classes, ["guard", "a"]);
    assert_eq!(sc.workload.jobs[0].reclaim, None, "protected: never reclaimed");
    assert_eq!(sc.workload.jobs[1].drain, Some(std::time::Duration::from_secs(60)), "class a's drain timeout");
    assert_eq!(sc.ignored, vec![("outside the pool (its class or QOS is no class of the policy)".to_string(), 1)]);
    // Classified again, the protected job is refused to an unentitled
    // submitter, and the unknown class too.
    let sc = scenario::load(&dir.join("no.toml"), OnBadRow::Abort).unwrap();
    assert_eq!(sc.workload.jobs.len(), 1);
    assert_eq!(sc.ignored.iter().map(|(_, n)| n).sum::<usize>(), 2, "{:?}", sc.ignored);
}

#[test]
fn higher_rank_reclaims_the_borrower_after_the_exempt_time() {
    // 2 GPUs on one node. b (rank 2) holds both from t=0 for 1h; a (rank 1)
    // asks for 2 at t=10. PreemptExemptTime is 2m: a waits
    // until b has run 120 s, then b (immediate) frees 0.5 s later.
    let p = policy(TWO_FLEXIBLE);
    let job = |submit: f64, class: usize, reclaim| Job {
        submit,
        duration: 3600.0,
        gpus: 2,
        per_node: 2,
        gpu_type: None,
        class,
        island: class,
        reclaim: Some(reclaim),
        drain: None,
    };
    use onepool_decisions::annotation::ReclaimMode::*;
    let w = build_workload(&p, vec![job(0.0, 1, Immediate), job(10.0, 0, Requeue)], vec![]);
    let s = Settings { job_log: true, ..Settings::default() };
    let r = compare::run_shared(&w, &p, &Fleet::uniform(1, 2), &s);
    assert_eq!(r.classes[1].reclaims, 1);
    assert_eq!(r.classes[0].waits, vec![110.5]);
    // b is resubmitted (cancelled: starts over) and runs after a; its
    // first run (2 GPUs x 120.5 s) is lost.
    assert_eq!(r.job_log.len(), 3);
    assert_eq!(r.job_log[0].end, 120.5);
    assert!(r.job_log[0].reclaimed);
    assert_eq!((r.job_log[2].start, r.job_log[2].end), (3720.5, 7320.5));
    assert_eq!((r.classes[1].lost_gpu_s, r.classes[1].dropped_jobs), (241.0, 0));
    assert_eq!(r.classes[1].used_gpu_s, 241.0 + 7200.0);

    // Dropped instead (what Slurm alone does): it ends at the reclaim.
    let mut w = w;
    w.victims[1].cancelled = Cancelled::Drop;
    let r = compare::run_shared(&w, &p, &Fleet::uniform(1, 2), &s);
    assert_eq!(r.classes[0].waits, vec![110.5]);
    assert_eq!(r.job_log.len(), 2);
    assert_eq!((r.job_log[0].end, r.job_log[0].reclaimed), (120.5, true));
    let b = &r.classes[1];
    assert_eq!((b.lost_gpu_s, b.dropped_jobs, b.dropped_gpu_s, b.used_gpu_s), (241.0, 1, 7200.0, 241.0));
    let f = figures(&w, &s, 1, b);
    assert_eq!((f.dropped_jobs, f.dropped_gpu_hours, f.jobs_started), (1, 2.0, 1));
}

/// A protected job reclaims a requeue borrower (1 node, 2 GPUs, exempt
/// time 2m, drain timeout 1m). The notice comes at t=200 when p asks;
/// with `release_after` 15 s the borrower checkpoints and requeues at 215,
/// p runs 215-315, and the borrower is held 121 s (Slurm's BeginTime after
/// a requeue), to 336, with the 800 s it had left at the notice. Nothing
/// else happens then, so it starts at Slurm's next periodic scheduling
/// pass, 360 (every 60 s); a submission at 350 starts it at 350. Without
/// `release_after` it holds the GPUs to its drain timeout (260).
#[test]
fn a_requeued_victim_gives_back_its_gpus_after_its_checkpoint_and_waits_out_begin_time() {
    use onepool_decisions::annotation::ReclaimMode::{Immediate, Requeue};
    let p = three_class_policy("2m", "requeue", 0);
    let job = |submit: f64, duration: f64, class: usize| Job {
        submit,
        duration,
        gpus: 2,
        per_node: 2,
        gpu_type: None,
        class,
        island: class,
        reclaim: [None, Some(Requeue), Some(Immediate)][class],
        drain: (class == 1).then_some(std::time::Duration::from_secs(60)),
    };
    let s = Settings { job_log: true, ..Settings::default() };
    let runs = |jobs: Vec<Job>, release_after_s: Option<f64>| {
        let mut w = build_workload(&p, jobs, vec![]);
        w.victims[1].release_after_s = release_after_s;
        let r = compare::run_shared(&w, &p, &Fleet::uniform(1, 2), &s);
        let log: Vec<(usize, f64, f64, bool)> =
            r.job_log.iter().map(|e| (e.job, e.start, e.end, e.reclaimed)).collect();
        (log, r.classes[1].lost_gpu_s, r.classes[1].time_to_capacity.clone())
    };
    let two = || vec![job(0.0, 1000.0, 1), job(200.0, 100.0, 0)];
    let (log, lost, ttc) = runs(two(), Some(15.0));
    assert_eq!(log, [(0, 0.0, 215.0, true), (1, 215.0, 315.0, false), (0, 360.0, 1160.0, false)]);
    assert_eq!(lost, 2.0 * 15.0);
    assert_eq!(ttc, [0.0, 145.0]);
    let (log, _, _) = runs([two(), vec![job(350.0, 10.0, 2)]].concat(), Some(15.0));
    assert_eq!(log[2], (0, 350.0, 1150.0, false));
    let (log, lost, _) = runs(two(), None);
    assert_eq!(log, [(0, 0.0, 260.0, true), (1, 260.0, 360.0, false), (0, 420.0, 1220.0, false)]);
    assert_eq!(lost, 2.0 * 60.0);
}

/// Scale-down drains the replica with the fewest requests in flight (then
/// the youngest), as onepoold does. Two warm 1-slot replicas on 2 one-GPU
/// nodes; a 1 s request and a 500 s one at t=0 go to the older and the
/// younger replica (in the order they become ready); the load (1) then
/// wants one replica, and the older, idle one goes once the scale-down
/// delay (10 s) has passed, not the younger, busy one (which the model
/// drained before it followed onepoold); the younger serves its request to
/// the end.
#[test]
fn scale_down_drains_the_replica_with_the_fewest_requests_in_flight() {
    use onepool_decisions::annotation::ReclaimMode::Immediate;
    let p = policy(TWO_FLEXIBLE);
    let reqs: Arc<[Req]> = vec![Req { t: 0.0, service: 1.0 }, Req { t: 0.0, service: 500.0 }].into();
    let ep = Endpoint {
        name: "e".into(),
        class: 1,
        island: 1,
        gpus_per_replica: 1,
        gpu_type: None,
        max_concurrent: 1,
        startup_s: 30.0,
        slo_p99_s: 1.0,
        scaling: ScalingPolicy {
            target_per_replica: 1.0,
            min: 1,
            max: 2,
            stable_window: std::time::Duration::from_secs(4),
            panic_window: std::time::Duration::from_secs(2),
            scale_down_delay: std::time::Duration::from_secs(10),
            ..ScalingPolicy::default()
        },
        reclaim: Some(Immediate),
        drain: None,
        baseline: None,
        warm: None,
        latency: None,
        requests: reqs,
    };
    let w = build_workload(&p, vec![], vec![ep]);
    let s = Settings { job_log: true, ..Settings::default() };
    let r = compare::run_shared(&w, &p, &Fleet::uniform(2, 1), &s);
    let log: Vec<(usize, f64, f64)> = r.job_log.iter().map(|e| (e.job, e.start, e.end)).collect();
    assert_eq!(log.len(), 2, "{log:?}");
    // Both serve from the start; the one that had the 1 s request is
    // drained first, well before 500 s, and the other ends with its request.
    assert_eq!((log[0].1, log[1].1), (0.0, 0.0));
    assert_ne!(log[0].0, log[1].0);
    assert!(log[0].2 > 10.0 && log[0].2 < 30.0, "{log:?}");
    assert_eq!(log[1].2, 500.0, "{log:?}");
    assert_eq!(r.classes[1].failed_requests, 0);
}

/// A graceful victim whose work ends during its drain completes: it is
/// neither resubmitted nor counted as lost, and the protected job gets the
/// GPUs when it ends.
#[test]
fn a_victim_whose_work_ends_during_its_drain_completes() {
    use onepool_decisions::annotation::ReclaimMode::Graceful;
    let p = three_class_policy("2m", "graceful", 0);
    let job = |submit: f64, duration: f64, class: usize| Job {
        submit,
        duration,
        gpus: 2,
        per_node: 2,
        gpu_type: None,
        class,
        island: class,
        reclaim: (class == 1).then_some(Graceful),
        drain: (class == 1).then_some(std::time::Duration::from_secs(60)),
    };
    let w = build_workload(&p, vec![job(0.0, 230.0, 1), job(200.0, 100.0, 0)], vec![]);
    let s = Settings { job_log: true, ..Settings::default() };
    let r = compare::run_shared(&w, &p, &Fleet::uniform(1, 2), &s);
    let log: Vec<(usize, f64, f64, bool)> = r.job_log.iter().map(|e| (e.job, e.start, e.end, e.reclaimed)).collect();
    assert_eq!(log, [(0, 0.0, 230.0, false), (1, 230.0, 330.0, false)]);
    assert_eq!((r.classes[1].reclaims, r.classes[1].lost_gpu_s), (1, 0.0));
}

/// Per class idle in the shared pool: a protected class's capacity it did
/// not hold, and the reserved part of it. p has 4 GPUs (2 reserved) and
/// holds 1 for the first hour of a 2-hour window, then nothing.
#[test]
fn unused_capacity_of_a_protected_class() {
    let p = three_class_policy("2m", "requeue", 2);
    let job = |submit: f64, duration: f64, gpus: u32, class: usize| Job {
        submit,
        duration,
        gpus,
        per_node: gpus,
        gpu_type: None,
        class,
        island: class,
        reclaim: (class == 2).then_some(onepool_decisions::annotation::ReclaimMode::Immediate),
        drain: None,
    };
    let w = build_workload(&p, vec![job(0.0, 3600.0, 1, 0), job(0.0, 7200.0, 1, 2)], vec![]);
    let s = Settings::default();
    let r = compare::run_shared(&w, &p, &Fleet::uniform(2, 4), &s);
    let f = figures(&w, &s, 0, &r.classes[0]);
    // Capacity: 3 unused in hour 1, 4 in hour 2; reserved: 1 then 2.
    assert_eq!(f.unused_capacity_gpu_hours, Some(7.0));
    assert_eq!(f.unused_reserved_gpu_hours, Some(3.0));
    assert_eq!(figures(&w, &s, 2, &r.classes[2]).unused_capacity_gpu_hours, None);
    // Separate islands have no capacities.
    let alone = compare::run_separate(&w, 0, &Fleet::uniform(1, 4), &s);
    assert_eq!(figures(&w, &s, 0, &alone.classes[0]).unused_capacity_gpu_hours, None);
}

#[test]
fn the_victims_table_is_checked_with_file_and_line() {
    let jobs = "submit,duration,gpus,class\n0,1h,1,a\n";
    let base = "policy = \"policy.toml\"\n[fleet]\nnodes = 1\ngpus_per_node = 2\n[[jobs]]\nfile = \"jobs.csv\"\n";
    let cases = [
        ("[victims]\ncancelled = \"drop\"\n[victims.class.b]\ncancelled = \"resubmit\"\n", None),
        (
            "[victims]\ncancelled = \"dropped\"\n",
            Some((8, "victims.cancelled \"dropped\": use \"resubmit\" or \"drop\"")),
        ),
        ("[victims]\nrelease_after = \"soon\"\n", Some((8, "victims.release_after \"soon\" is not a duration"))),
        (
            "[victims.class.nosuch]\ncancelled = \"drop\"\n",
            Some((7, "victims.class.nosuch: the policy has no class \"nosuch\"")),
        ),
        ("[victims.class.a]\ncancelled = \"drop\"\n", Some((8, "victims.class.a.cancelled: its jobs are requeued"))),
        (
            "[victims.class.b]\nrelease_after = \"10s\"\n",
            Some((8, "victims.class.b.release_after: its jobs are reclaimed immediately")),
        ),
        (
            "[victims.class.a]\nrelease_after = \"2m\"\n",
            Some((8, "victims.class.a.release_after \"2m\" is longer than the class's drain timeout (60 s)")),
        ),
        ("[victims]\ncancel = \"drop\"\n", Some((8, "unknown field `cancel`"))),
    ];
    for (i, (victims, want)) in cases.iter().enumerate() {
        let scen = format!("{base}{victims}");
        let dir =
            folder(&format!("victims{i}"), &[("policy.toml", TWO_FLEXIBLE), ("jobs.csv", jobs), ("s.toml", &scen)]);
        let path = dir.join("s.toml");
        match (scenario::load(&path, OnBadRow::Abort), want) {
            (Ok(sc), None) => {
                use onepool_simulator::engine::VictimModel;
                let v = |cancelled| VictimModel { cancelled, release_after_s: None };
                // Classes in policy order: a (the table's default), b (its own).
                assert_eq!(sc.workload.victims, [v(Cancelled::Drop), v(Cancelled::Resubmit)]);
            }
            (Err(e), Some((line, msg))) => {
                let prefix = format!("{}:{line}: ", path.display());
                assert!(e.starts_with(&prefix) && e.contains(msg), "case {i}: {e}\nwant {prefix}...{msg}");
            }
            (got, _) => panic!("case {i}: {:?}", got.map(|s| s.workload.victims)),
        }
    }
}

fn gen_jobs(n: usize) -> impl Strategy<Value = Vec<(u32, u32, u32, usize)>> {
    // (submit minute, duration minutes, gpus 1..=4, class 0..2)
    proptest::collection::vec((0u32..240, 1u32..180, 1u32..=4, 0usize..2), 1..n)
}

fn workload(p: &Policy, jobs: &[(u32, u32, u32, usize)], ep: Option<(u32, f64)>) -> Workload {
    use onepool_decisions::annotation::ReclaimMode::*;
    let mut js: Vec<Job> = jobs
        .iter()
        .map(|&(s, d, g, c)| Job {
            submit: f64::from(s) * 60.0,
            duration: f64::from(d) * 60.0,
            gpus: g,
            per_node: g,
            gpu_type: None,
            class: c,
            island: c,
            reclaim: Some(if c == 0 { Requeue } else { Immediate }),
            drain: (c == 0).then(|| std::time::Duration::from_secs(60)),
        })
        .collect();
    js.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    let eps = ep
        .map(|(rate, service)| {
            let reqs: Arc<[Req]> = (0..rate * 60)
                .map(|i| Req { t: f64::from(i) / f64::from(rate) * 60.0, service: service as f32 })
                .collect();
            vec![one_gpu_endpoint(1, None, reqs)]
        })
        .unwrap_or_default();
    build_workload(p, js, eps)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// With sharing off (each class on its own island, all at once) every
    /// class does exactly what it does alone on an island of that size.
    #[test]
    fn sharing_disabled_equals_separate(jobs in gen_jobs(30), na in 1u32..6, nb in 1u32..6, rate in 1u32..40) {
        let p = policy(TWO_FLEXIBLE);
        let w = workload(&p, &jobs, Some((rate, 2.0)));
        let s = Settings::default();
        let islands = [Fleet::uniform(na, 4), Fleet::uniform(nb, 4)];
        let together = compare::run_islands(&w, &islands, &s);
        for (c, island) in islands.iter().enumerate() {
            let alone = compare::run_separate(&w, c, island, &s);
            let (x, y) = (&together.classes[c], &alone.classes[c]);
            prop_assert_eq!(&x.waits, &y.waits);
            prop_assert_eq!(&x.delays, &y.delays);
            prop_assert_eq!(&x.time_to_capacity, &y.time_to_capacity);
            prop_assert_eq!(x.peak_gpus, y.peak_gpus);
            prop_assert!((x.used_gpu_s - y.used_gpu_s).abs() <= 1e-6 * y.used_gpu_s.max(1.0));
            let (mut fx, mut fy) = (figures(&w, &s, c, x), figures(&w, &s, c, y));
            (fx.gpu_hours_used, fy.gpu_hours_used) = (0.0, 0.0);
            prop_assert_eq!(fx, fy);
        }
    }

    /// More GPUs never worsen a class's wait or queueing delay on its own
    /// island (first come first served, no preemption; jobs of 1-4 GPUs on
    /// 4-GPU nodes). Not proven: no counterexample in 3,000 cases
    /// (PROPTEST_CASES=3000), where the shared pool has them (below).
    #[test]
    fn more_gpus_never_worsen_service(jobs in gen_jobs(30), n in 1u32..6, rate in 1u32..40) {
        let p = policy(TWO_FLEXIBLE);
        let w = workload(&p, &jobs, Some((rate, 2.0)));
        let s = Settings::default();
        for c in 0..2 {
            let small = compare::run_separate(&w, c, &Fleet::uniform(n, 4), &s);
            let big = compare::run_separate(&w, c, &Fleet::uniform(n + 1, 4), &s);
            let (a, b) = (figures(&w, &s, c, &small.classes[c]), figures(&w, &s, c, &big.classes[c]));
            prop_assert!(b.wait_mean_s <= a.wait_mean_s + 1e-9, "{:?} vs {:?}", a, b);
            prop_assert!(b.wait_p95_s <= a.wait_p95_s + 1e-9);
            prop_assert!(b.p99_queue_delay_s <= a.p99_queue_delay_s + 1e-6, "{:?} vs {:?}", a, b);
            prop_assert!(b.unserved <= a.unserved && b.unstarted_jobs <= a.unstarted_jobs);
        }
    }
}

#[test]
fn malformed_rows_are_reported_with_file_and_line_then_skipped_or_abort() {
    let jobs = "submit,duration,gpus,class\n0,1h,1,a\n10,1h,two,a\n20,1h,1,nosuch\n";
    let trace = "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,10\n1,x,10\n";
    let scen = "policy = \"policy.toml\"\n[fleet]\nnodes = 2\ngpus_per_node = 2\n[[jobs]]\nfile = \"jobs.csv\"\n\
        [[endpoints]]\nname = \"e\"\ntrace = \"t.csv\"\nclass = \"b\"\ngpus_per_replica = 1\nmax_concurrent = 4\n\
        prefill_tokens_per_s = 1000\ndecode_tokens_per_s = 10\nstartup = \"30s\"\nslo_p99 = \"1s\"\n";
    let dir = folder("bad", &[("policy.toml", TWO_FLEXIBLE), ("jobs.csv", jobs), ("t.csv", trace), ("s.toml", scen)]);
    let sc = scenario::load(&dir.join("s.toml"), OnBadRow::Skip).unwrap();
    let bad: Vec<String> = sc.bad_rows.iter().map(|b| b.to_string()).collect();
    let j = dir.join("jobs.csv").display().to_string();
    let t = dir.join("t.csv").display().to_string();
    assert_eq!(
        bad,
        [
            format!("{j}:3: gpus \"two\" is not a whole number"),
            format!("{t}:3: ContextTokens \"x\" is not a whole number")
        ]
    );
    assert_eq!(sc.workload.jobs.len(), 1);
    // The unknown class is refused by the classifier, counted with its reason.
    assert_eq!(sc.ignored.len(), 1);
    assert!(sc.ignored[0].0.contains("--workload=nosuch is not a workload class"), "{:?}", sc.ignored);
    let e = scenario::load(&dir.join("s.toml"), OnBadRow::Abort).unwrap_err();
    assert!(e.starts_with(&format!("{j}:3: ")), "{e}");
}

/// A protected class p (4 GPUs, `reserved` of them reserved), flexible a
/// (rank 1, `a_mode`) and b (rank 2, immediate).
fn three_class_policy(exempt: &str, a_mode: &str, reserved: u32) -> Policy {
    let drain = if a_mode == "immediate" { "" } else { "drain_timeout = \"1m\"" };
    policy(&format!(
        r#"
[pool]
partitions = ["gpu"]
total_gpus = 16
default_class = "b"
min_runtime_before_reclaim = "{exempt}"
flexible_partition = "gpu-flex"

[classes.p]
tier = "protected"
qos = "op-p"
capacity = {{ lendable = {lendable}, reserved = {reserved} }}
entitled = {{ accounts = ["p"], users = [], groups = [] }}

[classes.a]
tier = "flexible"
rank = 1
qos = "op-a"
reclaim = "{a_mode}"
{drain}

[classes.b]
tier = "flexible"
rank = 2
qos = "op-b"
reclaim = "immediate"
"#,
        lendable = 4 - reserved
    ))
}

/// Batch jobs of the three classes of [`three_class_policy`], reclaim modes from the policy.
fn three_class_jobs(p: &Policy, jobs: &[(u32, u32, u32, usize)]) -> Vec<Job> {
    let mut js: Vec<Job> = jobs
        .iter()
        .map(|&(s, d, g, c)| {
            let (reclaim, drain) = match &p.classes[c].tier {
                onepool_decisions::policy::Tier::Protected { .. } => (None, None),
                onepool_decisions::policy::Tier::Flexible { reclaim, drain_timeout, .. } => {
                    (Some(*reclaim), (!drain_timeout.is_zero()).then_some(*drain_timeout))
                }
            };
            Job {
                submit: f64::from(s) * 60.0,
                duration: f64::from(d) * 60.0,
                gpus: g,
                per_node: g,
                gpu_type: None,
                class: c,
                island: c,
                reclaim,
                drain,
            }
        })
        .collect();
    js.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    js
}

/// An endpoint of one-GPU replicas in `class` (its own island), 4
/// requests at once each, reclaimed immediately.
fn one_gpu_endpoint(class: usize, baseline: Option<(usize, u32)>, requests: Arc<[Req]>) -> Endpoint {
    Endpoint {
        name: "e".into(),
        class,
        island: class,
        gpus_per_replica: 1,
        gpu_type: None,
        max_concurrent: 4,
        startup_s: 30.0,
        slo_p99_s: 1.0,
        scaling: ScalingPolicy { target_per_replica: 3.0, ..ScalingPolicy::default() },
        reclaim: Some(onepool_decisions::annotation::ReclaimMode::Immediate),
        drain: None,
        baseline,
        warm: None,
        latency: None,
        requests,
    }
}

/// One generated workload of one-GPU jobs (and an endpoint), run on `n`
/// and `n + k` nodes of the shared pool.
#[derive(Debug, Clone)]
struct PoolCase {
    jobs: Vec<(u32, u32, u32, usize)>,
    exempt: &'static str,
    a_mode: &'static str,
    reserved: u32,
    drop: bool,
    load: Option<Vec<u32>>,
    baseline: bool,
    n: u32,
    k: u32,
}

/// Each class's figures on the smaller and the larger pool, and how many
/// jobs the two runs dropped in all.
fn small_and_big(case: &PoolCase) -> (Vec<(compare::ClassFigures, compare::ClassFigures)>, u64) {
    use onepool_simulator::engine::VictimModel;
    let p = three_class_policy(case.exempt, case.a_mode, case.reserved);
    let eps = case.load.as_ref().map(|rates| {
        // Requests per minute in each half hour, evenly spaced.
        let mut reqs = Vec::new();
        for (h, &r) in rates.iter().enumerate() {
            for i in 0..r * 30 {
                reqs.push(Req { t: h as f64 * 1800.0 + f64::from(i) * 60.0 / f64::from(r), service: 2.0 });
            }
        }
        vec![one_gpu_endpoint(2, case.baseline.then_some((0, 1)), reqs.into())]
    });
    let mut w = build_workload(&p, three_class_jobs(&p, &case.jobs), eps.unwrap_or_default());
    let cancelled = if case.drop { Cancelled::Drop } else { Cancelled::Resubmit };
    w.victims = vec![VictimModel { cancelled, release_after_s: Some(20.0) }; 3];
    let s = Settings::default();
    let small = compare::run_shared(&w, &p, &Fleet::uniform(case.n, 4), &s);
    let big = compare::run_shared(&w, &p, &Fleet::uniform(case.n + case.k, 4), &s);
    let dropped: u64 = small.classes.iter().chain(&big.classes).map(|c| c.dropped_jobs).sum();
    let figures =
        (0..3).map(|c| (figures(&w, &s, c, &small.classes[c]), figures(&w, &s, c, &big.classes[c]))).collect();
    (figures, dropped)
}

proptest! {
    // A fixed seed: the claim below does not hold for every workload (see
    // `a_flexible_job_can_wait_longer_on_more_gpus`), and CI must not fail
    // on the one draw in a hundred runs that finds such a case. A change to
    // the model that breaks the claim on these 256 workloads still fails.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(28),
        ..ProptestConfig::default()
    })]

    /// The shared pool with more GPUs is no worse on any service figure
    /// of any class (batch wait mean and p95, jobs never started, time to
    /// capacity mean and max, p99 queueing delay, requests never served)
    /// when every job and replica holds ONE GPU, on these 256 workloads:
    /// protected, requeued, drained and cancelled work, exempt time,
    /// reserved GPUs, a baseline, cancelled work resubmitted, or dropped
    /// where neither pool dropped any. Not for every workload: 400 runs of
    /// random seeds (102,400 workloads) found four where a class waited
    /// longer on more GPUs, by 0.5 s to 60 s at its p95 (one is pinned
    /// in `a_flexible_job_can_wait_longer_on_more_gpus`). With jobs of
    /// several GPUs it fails more often and by more (placement; see
    /// `more_gpus_can_delay_a_protected_job_when_jobs_span_several_gpus`).
    /// Not claimed either: lost GPU-hours and requests cut off by an
    /// immediate reclaim. More room lets more work borrow, and borrowers
    /// get reclaimed: one found case, 1 node against 2, has a borrowed
    /// replica cut off 1 request on 2 nodes, where on 1 node the replica
    /// never ran and the requests queued for up to an hour instead.
    #[test]
    fn shared_pool_more_gpus_never_worse_with_one_gpu_jobs(
        jobs in proptest::collection::vec((0u32..240, 1u32..180, Just(1u32), 0usize..3), 1..24),
        exempt in prop_oneof![Just("0s"), Just("2m")],
        a_mode in prop_oneof![Just("requeue"), Just("graceful"), Just("immediate")],
        reserved in 0u32..3,
        drop in any::<bool>(),
        load in proptest::option::of(proptest::collection::vec(0u32..40, 1..8)),
        baseline in any::<bool>(),
        n in 1u32..5,
        k in 1u32..3,
    ) {
        let case = PoolCase { jobs, exempt, a_mode, reserved, drop, load, baseline, n, k };
        let (classes, dropped) = small_and_big(&case);
        // Cancelled work that is dropped is work the pool no longer runs:
        // the pools ran different work, and the one that dropped more
        // waits less for it. Found case (2 nodes against 3): on 2 nodes
        // four of class b's long jobs were reclaimed and dropped, and
        // the GPUs they left let b's last job start 10 minutes sooner
        // than on 3 nodes, where they ran to their end. Nothing to compare.
        prop_assume!(dropped == 0);
        for (c, (a, b)) in classes.iter().enumerate() {
            let why = format!("class {c}, {n} vs {} nodes:\n{a:?}\n{b:?}", n + k);
            prop_assert!(b.wait_mean_s <= a.wait_mean_s + 1e-6, "{}", why);
            prop_assert!(b.wait_p95_s <= a.wait_p95_s + 1e-6, "{}", why);
            prop_assert!(b.unstarted_jobs <= a.unstarted_jobs, "{}", why);
            prop_assert!(b.time_to_capacity_mean_s <= a.time_to_capacity_mean_s + 1e-6, "{}", why);
            prop_assert!(b.time_to_capacity_max_s <= a.time_to_capacity_max_s + 1e-6, "{}", why);
            prop_assert!(b.p99_queue_delay_s <= a.p99_queue_delay_s + 1e-6, "{}", why);
            prop_assert!(b.unserved <= a.unserved, "{}", why);
        }
    }
}

/// One of the four workloads a random search found where more GPUs made
/// a class wait longer (one-GPU jobs, nothing dropped): on 2 nodes one of
/// class a's two jobs waited 60 s, on 1 node neither waited a second.
/// Pinned so that the claim above stays a claim about the 256 workloads
/// it is checked on; if a change to the model removes this case, the
/// property's comment is due a look.
#[test]
fn a_flexible_job_can_wait_longer_on_more_gpus() {
    let jobs = vec![
        (18, 133, 1, 2),
        (230, 1, 1, 1),
        (30, 121, 1, 2),
        (109, 28, 1, 2),
        (109, 8, 1, 0),
        (109, 122, 1, 2),
        (0, 158, 1, 0),
        (109, 94, 1, 2),
        (109, 80, 1, 2),
        (109, 73, 1, 2),
        (127, 44, 1, 1),
        (196, 35, 1, 2),
        (99, 59, 1, 0),
        (109, 10, 1, 0),
        (144, 14, 1, 0),
        (77, 81, 1, 0),
    ];
    let case = PoolCase {
        jobs,
        exempt: "0s",
        a_mode: "graceful",
        reserved: 2,
        drop: false,
        load: None,
        baseline: false,
        n: 1,
        k: 1,
    };
    let (classes, dropped) = small_and_big(&case);
    assert_eq!(dropped, 0);
    let (one_node, two_nodes) = &classes[1];
    assert_eq!(one_node.jobs_started, two_nodes.jobs_started);
    assert!(two_nodes.wait_p95_s > one_node.wait_p95_s + 30.0, "{one_node:?}\n{two_nodes:?}");
}

/// More GPUs can make a protected job wait, when jobs span several GPUs
/// (so it holds on Slurm too: the model follows its placement and
/// PreemptExemptTime). On one 4-GPU node, p1 holds 3 GPUs until t=1000;
/// a3 (3 GPUs, t=900) does not fit, and a2 (1 GPU, t=950) waits behind it
/// (first come first served within a QOS); p2 (4 GPUs, t=1000) gets the
/// node as p1 ends: no wait. With a second node, a3 starts there at 900
/// and a2 on node 1's free GPU at 950; at 1000 no node has 4 free GPUs and
/// both borrowers are inside PreemptExemptTime (2 min), so p2 waits until
/// a3 (node 2) may be reclaimed at 1020 and gets its GPUs 0.5 s later.
#[test]
fn more_gpus_can_delay_a_protected_job_when_jobs_span_several_gpus() {
    let p = three_class_policy("2m", "immediate", 0);
    let jobs = three_class_jobs(&p, &[]);
    assert!(jobs.is_empty());
    let job = |submit: f64, duration: f64, gpus: u32, class: usize| Job {
        submit,
        duration,
        gpus,
        per_node: gpus,
        gpu_type: None,
        class,
        island: class,
        reclaim: (class > 0).then_some(onepool_decisions::annotation::ReclaimMode::Immediate),
        drain: None,
    };
    let w = build_workload(
        &p,
        vec![job(0.0, 1000.0, 3, 0), job(900.0, 3000.0, 3, 1), job(950.0, 3000.0, 1, 1), job(1000.0, 100.0, 4, 0)],
        vec![],
    );
    let s = Settings::default();
    let one = compare::run_shared(&w, &p, &Fleet::uniform(1, 4), &s);
    let two = compare::run_shared(&w, &p, &Fleet::uniform(2, 4), &s);
    assert_eq!(one.classes[0].waits, vec![0.0, 0.0]);
    assert_eq!(two.classes[0].waits, vec![0.0, 20.5]);
    assert_eq!((one.classes[1].reclaims, two.classes[1].reclaims), (0, 1));
}

const WARM_POLICY: &str = r#"
[pool]
partitions = ["gpu"]
total_gpus = 4
default_class = "train"
min_runtime_before_reclaim = "0s"

[classes.inf]
tier = "flexible"
rank = 1
qos = "op-inf"
reclaim = "graceful"
drain_timeout = "1m"

[classes.train]
tier = "flexible"
rank = 2
qos = "op-train"
reclaim = "immediate"

[classes.warm]
tier = "flexible"
rank = 3
qos = "op-warm"
reclaim = "graceful"
drain_timeout = "1m"
"#;

/// The warm-headroom scenario: 4 one-GPU nodes; requests of 10 s, one at
/// 0, two at once at 100 (the burst), one at 300; training for 3 GPUs at
/// 200. `warm` is added to the endpoint's table.
fn warm_scenario(name: &str, warm: &str) -> Result<scenario::Scenario, String> {
    let scen = format!(
        "policy = \"policy.toml\"\n[fleet]\nnodes = 4\ngpus_per_node = 1\n\
         [[jobs]]\nfile = \"jobs.csv\"\nkeep_times = true\n\
         [[endpoints]]\nname = \"chat\"\ntrace = \"trace.csv\"\nkeep_times = true\nclass = \"inf\"\n\
         gpus_per_replica = 1\nmax_concurrent = 1\nprefill_tokens_per_s = 1e12\ndecode_tokens_per_s = 1\n\
         startup = \"30s\"\nslo_p99 = \"1s\"\nmin_replicas = 1\nmax_replicas = 3\ntarget_per_replica = 1\n\
         scale_down_delay = \"20s\"\n{warm}\n"
    );
    let dir = folder(
        name,
        &[
            ("policy.toml", WARM_POLICY),
            ("jobs.csv", "submit,duration,gpus,gpus_per_node,class\n200,1h,3,1,train\n"),
            ("trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,0,10\n100,0,10\n100,0,10\n300,0,10\n"),
            ("s.toml", &scen),
        ],
    );
    scenario::load(&dir.join("s.toml"), OnBadRow::Abort)
}

/// Warm headroom as onepoold keeps it (the same `reconcile`): the burst's
/// second request lands on the warm replica at once instead of waiting
/// for the first; training that needs the warm replica's GPU gets it as
/// soon as the idle warm replica is taken back (0.5 s, an immediate free);
/// while training waits no warm replica is submitted, and once nobody
/// waits one is submitted again (and pends: no GPU is free).
#[test]
fn warm_headroom_serves_the_burst_at_once_and_yields_to_training() {
    let s = Settings { job_log: true, ..Settings::default() };
    let reactive = warm_scenario("reactive", "").unwrap();
    let r = compare::run_shared(&reactive.workload, &reactive.policy, &reactive.fleet, &s);
    let (inf, train, warm) = (0, 1, 2);
    let delays = |r: &onepool_simulator::engine::RunResult| r.request_log.iter().map(|x| x.2).collect::<Vec<_>>();
    assert_eq!(delays(&r), vec![0.0, 0.0, 10.0, 0.0], "without headroom the burst's second request waits");
    assert_eq!(r.classes[train].waits, vec![0.0]);
    assert_eq!(r.classes[warm].used_gpu_s, 0.0);

    let sc = warm_scenario("warm", "warm_class = \"warm\"\nwarm_replicas = 1").unwrap();
    let r = compare::run_shared(&sc.workload, &sc.policy, &sc.fleet, &s);
    assert_eq!(delays(&r), vec![0.0, 0.0, 0.0, 0.0], "{:?}", r.request_log);
    assert_eq!(r.classes[warm].reclaims, 1);
    assert_eq!(r.classes[train].waits, vec![0.5]);
    let warm_jobs: Vec<_> =
        r.job_log.iter().filter(|e| e.class == warm).map(|e| (e.start, e.end, e.reclaimed)).collect();
    assert_eq!(warm_jobs, vec![(0.0, 200.5, true)]);
    assert_eq!(r.replicas_submitted, vec![1], "one warm replica submitted after the training started");
    assert_eq!(r.classes[inf].failed_requests, 0);
}

#[test]
fn warm_headroom_settings_are_checked() {
    let err = |name: &str, warm: &str| warm_scenario(name, warm).unwrap_err();
    assert_eq!(err("w1", "warm_replicas = 1"), "endpoint chat: warm_replicas and warm_fraction need warm_class");
    assert!(err("w2", "warm_class = \"nope\"\nwarm_replicas = 1")
        .starts_with("endpoint chat: warm_class = \"nope\" is not a class of the policy (classes: inf, train, warm)"));
    assert_eq!(
        err("w3", "warm_class = \"train\"\nwarm_replicas = 1"),
        "endpoint chat: warm_class = \"train\" (rank 2) is not ranked below flexible class(es) warm: their jobs could not take a warm replica's GPUs; give train the highest rank number"
    );
    assert_eq!(
        err("w4", "warm_class = \"warm\""),
        "endpoint chat: warm_class is set but warm_replicas and warm_fraction ask for no headroom"
    );
    assert_eq!(
        err("w5", "warm_class = \"warm\"\nwarm_replicas = 3"),
        "endpoint chat: warm_replicas = 3 leaves no room for the load's replicas under max_replicas = 3"
    );
    assert_eq!(
        err("w6", "warm_class = \"inf\"\nwarm_replicas = 1"),
        "endpoint chat: warm_class = \"inf\" (rank 1) is not ranked below flexible class(es) train, warm: their jobs could not take a warm replica's GPUs; give inf the highest rank number"
    );
}

#[test]
fn latency_target_settings_are_read_and_checked() {
    let sc = warm_scenario("l1", "latency_queue_p99 = \"1s\"\nlatency_window = \"30s\"").unwrap();
    let l = sc.workload.endpoints[0].latency.clone().unwrap();
    assert_eq!(
        (l.queue_p99, l.ttft_p99, l.window, l.min_samples),
        (Some(std::time::Duration::from_secs(1)), None, std::time::Duration::from_secs(30), 20)
    );
    assert!(warm_scenario("l2", "").unwrap().workload.endpoints[0].latency.is_none());
    assert_eq!(
        warm_scenario("l3", "latency_window = \"30s\"").unwrap_err(),
        "endpoint chat: latency_window and latency_min_samples need latency_ttft_p99 or latency_queue_p99"
    );
    assert_eq!(
        warm_scenario("l4", "latency_ttft_p99 = \"soon\"").unwrap_err(),
        "endpoint chat: latency_ttft_p99 \"soon\" is not a duration"
    );
}
