//! Hand-computable scenarios and properties of the simulation.

use std::path::PathBuf;
use std::sync::Arc;

use onepool_decisions::autoscale::ScalingPolicy;
use onepool_decisions::policy::{self, Policy};
use onepool_simulator::compare::{self, figures, Settings};
use onepool_simulator::engine::{Endpoint, Job, Req, Workload};
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
    let (cmp, _) = compare::compare(&sc.workload, &sc.policy, &sc.fleet, &s, true);
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
    // b is resubmitted (cancelled: starts over) and runs after a.
    assert_eq!(r.job_log.len(), 3);
    assert_eq!(r.job_log[0].end, 120.5);
    assert!(r.job_log[0].reclaimed);
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
            vec![Endpoint {
                name: "e".into(),
                class: 1,
                island: 1,
                gpus_per_replica: 1,
                gpu_type: None,
                max_concurrent: 4,
                startup_s: 30.0,
                slo_p99_s: 1.0,
                scaling: ScalingPolicy { target_per_replica: 3.0, ..ScalingPolicy::default() },
                reclaim: Some(Immediate),
                drain: None,
                baseline: None,
                requests: reqs,
            }]
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
    /// island (first come first served; one job size per node keeps
    /// first-fit packing out of the way).
    #[test]
    fn more_gpus_never_worsen_service(jobs in gen_jobs(30), n in 1u32..6, rate in 1u32..40) {
        let p = policy(TWO_FLEXIBLE);
        let w = workload(&p, &jobs, Some((rate, 2.0)));
        let s = Settings::default();
        for c in 0..2 {
            let small = compare::run_separate(&w, c, &Fleet::uniform(n * 4, 1), &s);
            let big = compare::run_separate(&w, c, &Fleet::uniform(n * 4 + 1, 1), &s);
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
