//! The submit-path decision, as slurmctld runs it for every job: read the
//! annotations from the SPANK environment, then classify. Baseline beside
//! it: the cheapest conceivable rule (map the requested QOS to a class),
//! so the ratio shows what the full policy costs.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use onepool_decisions::annotation::Annotation;
use onepool_decisions::classify::{classify, Directory, JobRequest, Submitter};
use onepool_decisions::policy::load;

struct NoDirectory;

impl Directory for NoDirectory {
    fn user_name(&self, _uid: u32) -> Option<&str> {
        None
    }
    fn in_group(&self, _uid: u32, _gid: u32, _group: &str) -> bool {
        false
    }
}

fn bench(c: &mut Criterion) {
    let policy = load(include_str!("../../etc/onepool.toml")).policy.expect("sample loads");
    let spank_env = [
        "SLURM_SPANK__SLURM_SPANK_OPTION_onepool_workload=inference".to_string(),
        "SLURM_SPANK_ONEPOOL_WORKLOAD=inference".to_string(),
        "SLURM_SPANK_ONEPOOL_ENDPOINT=llama-70b".to_string(),
        "SLURM_SPANK_ONEPOOL_DRAIN_TIMEOUT=30s".to_string(),
    ];
    let who = Submitter { uid: 1000, gid: 1000 };
    let mut g = c.benchmark_group("submit_decision");
    g.bench_function("baseline_qos_lookup", |b| {
        b.iter(|| black_box(policy.class_by_qos(black_box("op-inference")).map(|c| c.qos.len())))
    });
    g.bench_function("onepool_annotation_and_classify", |b| {
        b.iter(|| {
            let a = Annotation::from_spank_env(black_box(&spank_env).iter().map(String::as_str)).unwrap();
            let job = JobRequest {
                account: Some("research".into()),
                partition: None,
                qos: None,
                annotation: a,
                gpus: 2,
                gpu_type: None,
                time_limit: Some(Duration::from_secs(3600)),
                exclusive: false,
                nodes: 1,
            };
            black_box(classify(&policy, &NoDirectory, who, &job))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
