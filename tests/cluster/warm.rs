//! Warm headroom on the real cluster (issue #18), on a cluster of its own
//! whose policy takes in the sample's commented warm class: onepoold keeps
//! a warm replica loaded on GPUs nobody waits for, in the lowest-ranked
//! QOS, and the router sends it requests only when the others are full;
//! protected training that needs those GPUs gets them from Slurm's
//! preemption at once (the idle replica drains in no time), ahead of the
//! flexible work beside it; and while a job waits for GPUs, onepoold
//! withdraws its pending warm replica instead of queueing it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::config::WarmFile;
use onepool_tests::elastic::{daemon_config, replica_view, runtime, scratch, serving, start_daemon, wait};
use onepool_tests::{bench_cluster, output_dir, warm_policy_text, TestCluster};

const ENDPOINT: &str = "warm";

/// Takes the cluster down however the test ends.
struct Down<'a>(&'a TestCluster);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = self.0.cluster.down(&mut |_| {});
    }
}

fn warm_jobs(d: &onepool_elastic_daemon::daemon::Daemon) -> Vec<(u32, &'static str)> {
    replica_view(d, ENDPOINT)
        .jobs
        .iter()
        .filter(|j| j.kind.as_str() == "warm")
        .map(|j| (j.job, j.phase.as_str()))
        .collect()
}

#[test]
fn a_warm_replica_fills_idle_gpus_yields_them_first_and_never_waits_in_line() {
    let policy = output_dir().join("onepool-warm-policy.toml");
    std::fs::write(&policy, warm_policy_text()).unwrap();
    let c = bench_cluster(&output_dir().join("warm-cluster"), policy.clone());
    let _down = Down(&c);
    let dir = scratch("warm");
    let mut config = daemon_config(&c, &dir, ENDPOINT, |r| {
        r.warm = Some(WarmFile { workload: Some("inference-warm".into()), replicas: Some(1), fraction: None });
    });
    config.policy = Some(policy);
    let path = dir.join("onepoold.toml");
    config.write(&path).unwrap();
    let rt = runtime();
    let d = start_daemon(&rt, &path);

    // Nobody waits: the baseline replica and one warm replica serve, the
    // warm one in the lowest QOS.
    wait("a baseline and a warm replica serving", Duration::from_secs(90), || {
        serving(&d, ENDPOINT, "baseline").len() == 1 && serving(&d, ENDPOINT, "warm").len() == 1
    });
    let warm = serving(&d, ENDPOINT, "warm")[0];
    assert_eq!(c.job_fields(warm)["QOS"], "op-inference-warm");
    let v = replica_view(&d, ENDPOINT);
    assert_eq!((v.headroom, v.gpus_wanted), (Some(1), Some(false)), "{v:?}");
    // The router sends it requests only when the baseline is full.
    let snap = d.endpoint(ENDPOINT).unwrap().endpoint.snapshot();
    let spill: Vec<SocketAddr> = snap.replicas.iter().filter(|r| r.spill).map(|r| r.address).collect();
    let warm_address = v.jobs.iter().find(|j| j.job == warm).unwrap().address.unwrap();
    assert_eq!(spill, [warm_address]);

    // Flexible training takes the two free nodes; still nobody waits, the
    // warm replica stays.
    let bob = c.user("op-bob", "research");
    let sbatch = |args: &[&str]| -> u32 {
        let mut all = vec!["--parsable", "-o", "/dev/null", "--time=10"];
        all.extend_from_slice(args);
        let r = c.run_as(&bob, "sbatch", &all);
        assert!(r.ok, "sbatch {args:?}: {}{}", r.stdout, r.stderr);
        r.stdout.trim().split(';').next().unwrap().parse().unwrap()
    };
    let fill = sbatch(&["--workload=training", "-N2", "--gpus-per-node=4", "--wrap", "sleep 600"]);
    c.wait_state(fill, "RUNNING", Duration::from_secs(30));
    // Past the policy's minimum run time, after which Slurm may reclaim it.
    let since = Instant::now();
    wait("the warm replica past its exempt time", Duration::from_secs(30), || {
        since.elapsed() > Duration::from_secs(onepool_tests::TEST_MIN_RUNTIME_SECS + 2)
    });
    assert_eq!(c.state(warm).as_deref(), Some("RUNNING"));
    assert_eq!(serving(&d, ENDPOINT, "warm"), [warm], "kept while nobody waits");

    // Protected training needs a node: Slurm takes the warm replica's, not
    // the flexible training's, and the idle replica drains at once.
    let (training, ttc) = onepool_tests::elastic::protected_training(&c);
    eprintln!(
        "protected training {training} RUNNING {:.2} s after submission, warm replica {warm} in the way",
        ttc.as_secs_f64()
    );
    assert_ne!(c.state(warm).as_deref(), Some("RUNNING"), "the warm replica gave its node");
    assert_eq!(c.state(fill).as_deref(), Some("RUNNING"), "flexible training outranks warm headroom");
    assert!(ttc < Duration::from_secs(20), "the warm replica held its GPUs for its whole drain time: {ttc:?}");
    assert_eq!(serving(&d, ENDPOINT, "baseline").len(), 1);

    // No GPU is free. onepoold may put a warm replica in line while nobody
    // waits, but once a job waits it withdraws it and adds none.
    let waiting = sbatch(&["--workload=training", "-N1", "--gpus-per-node=4", "--wrap", "sleep 600"]);
    // A new job's reason is "None" until Slurm's scheduler has looked at it.
    wait("Slurm says the job waits for resources", Duration::from_secs(30), || {
        c.job_fields(waiting).get("Reason").is_some_and(|r| r == "Resources")
    });
    let round = replica_view(&d, ENDPOINT).rounds;
    wait("onepoold sees the waiting job", Duration::from_secs(30), || {
        let v = replica_view(&d, ENDPOINT);
        v.rounds > round + 1 && v.gpus_wanted == Some(true)
    });
    wait("no warm replica left in line", Duration::from_secs(30), || warm_jobs(&d).is_empty());
    let submitted = replica_view(&d, ENDPOINT).submitted.len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(replica_view(&d, ENDPOINT).submitted.len(), submitted, "nothing submitted while a job waits");
    assert_eq!(c.state(waiting).as_deref(), Some("PENDING"));
    for job in [training, fill] {
        assert_eq!(c.state(job).as_deref(), Some("RUNNING"), "job {job}");
    }
    rt.block_on(d.shutdown());
    c.cancel_all();
    let _ = std::fs::remove_dir_all(&dir);
}
