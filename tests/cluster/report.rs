//! `onepool report` against what really happened (issue #26): a graceful,
//! an immediate and a requeue reclaim and a crash-looping replica endpoint
//! on a real cluster, then `onepool report --json` over that period must
//! list exactly those reclaims (mode, victim, taker, a drained replica's
//! finished and cut requests) with times to capacity within 0.5 s of what
//! this test measured, and the crashed replica jobs as failures.
//!
//! Each reclaim runs alone: three jobs of one flexible class hold three
//! nodes' GPUs, and protected training for 8 GPUs (the free node and one
//! borrower's) makes Slurm pick one of them.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use onepool_tests::{build_dir, cluster, Cleanup, TestCluster, TEST_MIN_RUNTIME_SECS};
use serde_json::Value;

/// The dev cluster's stand-in model server (answers `GET /v1/x?sleep=S` after S seconds).
const SERVER: &str = include_str!("../../etc/dev-cluster/stand-in-model-server.py");
const KEY: &str = "report-test-replica-key-0123456789";
/// The slot the replicas' launchers write their notes under.
const SLOT: u16 = 7;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A GET through a launcher with the test's replica key (the harness's client).
fn get(port: u16, path: &str) -> Option<u16> {
    onepool_tests::elastic::request_with(port, "GET", path, "", &[(onepool_tests::elastic::REPLICA_KEY_FIELD, KEY)])
}

/// What the test saw of one reclaim.
struct Seen {
    victim: u32,
    taker: u32,
    /// Submission to RUNNING, measured around sbatch and squeue.
    ttc: f64,
}

/// Past the policy's minimum run time, every borrower may be reclaimed.
fn past_min_runtime() {
    std::thread::sleep(Duration::from_secs(TEST_MIN_RUNTIME_SECS + 1));
}

/// Protected training for 8 GPUs; the one of `borrowers` that yields.
fn reclaim(c: &TestCluster, borrowers: &[u32], expect_left: &[&str]) -> Seen {
    let t0 = Instant::now();
    let taker = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=8", "-N2", "--wrap", "sleep 300"]);
    c.wait_state(taker, "RUNNING", Duration::from_secs(60));
    let ttc = t0.elapsed().as_secs_f64();
    let victims: Vec<u32> = borrowers.iter().copied().filter(|j| c.state(*j).as_deref() != Some("RUNNING")).collect();
    assert_eq!(victims.len(), 1, "one borrower yields: {victims:?}");
    let state = c.state(victims[0]);
    assert!(
        state.as_deref().is_none_or(|s| expect_left.contains(&s)),
        "victim {} is {state:?}, expected one of {expect_left:?} or gone",
        victims[0]
    );
    eprintln!("reclaim: job {} yielded to job {taker}, RUNNING {ttc:.2} s after sbatch", victims[0]);
    Seen { victim: victims[0], taker, ttc }
}

fn three(c: &TestCluster, args: &[&str]) -> Vec<u32> {
    let jobs: Vec<u32> = (0..3).map(|_| c.sbatch(args)).collect();
    for j in &jobs {
        c.wait_state(*j, "RUNNING", Duration::from_secs(30));
    }
    jobs
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn the_report_lists_each_reclaim_as_it_happened_and_failed_replicas_as_failures() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = std::env::temp_dir().join(format!("onepool-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = dir.join("server.py");
    std::fs::write(&server, SERVER).unwrap();
    let onepool = build_dir().join("onepool");
    c.cancel_all();
    // The period starts a whole second after now: `--from` has whole
    // seconds, and on a cluster that has just started, slurmctld's log
    // begins within this second (26.05 in CI: log from 21:37:30.4, `from`
    // 21:37:30), so the report rightly said the log did not cover it.
    std::thread::sleep(Duration::from_secs(1));
    let from = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    std::thread::sleep(Duration::from_secs(1));

    // Graceful: replicas under the launcher, Slurm's notice, a 3-second
    // request in flight on each.
    let mut ports = Vec::new();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let script = format!(
            "export ONEPOOL_REPLICA_KEY={KEY}; exec {} replica --listen 127.0.0.1:{port} --report comment --slot {SLOT} \
             --drain-timeout 30s -- python3 {}",
            onepool.display(),
            server.display()
        );
        let name = format!("--job-name=onepool-chat-{SLOT}");
        replicas.push(c.sbatch(&[
            "--workload=inference",
            &name,
            "--gpus=4",
            "-N1",
            "--signal=B:USR1@60",
            "--wrap",
            &script,
        ]));
        ports.push(port);
    }
    for (job, port) in replicas.iter().zip(&ports) {
        c.wait_state(*job, "RUNNING", Duration::from_secs(30));
        c.wait_until("the replica to answer", Duration::from_secs(30), || get(*port, "/v1/x") == Some(200));
    }
    past_min_runtime();
    let in_flight: Vec<_> = ports
        .iter()
        .map(|p| {
            let p = *p;
            std::thread::spawn(move || get(p, "/v1/x?sleep=3"))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let graceful = reclaim(c, &replicas, &["COMPLETING"]);
    for h in in_flight {
        assert_eq!(h.join().unwrap(), Some(200), "a request in flight was lost");
    }
    c.cancel_all();

    // Immediate: agents are cancelled at once.
    let agents = three(c, &["--workload=agents", "--gpus=4", "-N1", "--wrap", "sleep 300"]);
    past_min_runtime();
    let immediate = reclaim(c, &agents, &["COMPLETING"]);
    c.cancel_all();

    // Requeue: flexible training as the README tells users to write it
    // (etc/examples/requeue-training.sbatch: checkpoint on the notice,
    // requeue itself).
    let script = onepool_tests::workspace_root().join("etc/examples/requeue-training.sbatch");
    let ckpt = format!("--export=ALL,CKPT={}/ckpt", dir.display());
    let training = three(
        c,
        &["--workload=training", "--gpus=4", "-N1", "--requeue", "--signal=B:USR1@60", &ckpt, script.to_str().unwrap()],
    );
    past_min_runtime();
    let requeue = reclaim(c, &training, &["PENDING", "REQUEUED", "COMPLETING"]);
    c.cancel_all();

    // A crash loop: an endpoint whose server exits at once, three times.
    let mut crashed = Vec::new();
    for _ in 0..3 {
        let script = format!(
            "export ONEPOOL_REPLICA_KEY={KEY}; exec {} replica --listen 127.0.0.1:0 --report comment --slot 9 -- \
             sh -c 'echo cannot load the model >&2; exit 3'",
            onepool.display()
        );
        let job =
            c.sbatch(&["--workload=inference", "--job-name=onepool-broken-9", "--gpus=1", "-N1", "--wrap", &script]);
        c.wait_until("the broken replica to end", Duration::from_secs(30), || c.state(job).is_none());
        crashed.push(job);
    }
    for j in crashed.iter().chain([&graceful.victim, &immediate.victim, &requeue.victim]) {
        c.final_state(*j);
    }

    // A job whose comment was updated reads `Eligible=Unknown` in sacct
    // for a few seconds after it ends (measured on 22.05: 3.6 s), and
    // sacct's time window leaves such jobs out until then: a report over a
    // period that ends this very second would miss them.
    let ids: Vec<String> = crashed.iter().map(u32::to_string).collect();
    c.wait_until("accounting's eligible times", Duration::from_secs(60), || {
        !c.ok("sacct", &["-X", "-P", "-n", "-j", &ids.join(","), "--format=Eligible"]).contains("Unknown")
    });
    let policy = onepool_tests::test_policy();
    let saved_dir = dir.join("saved");
    let out = c
        .cmd(onepool.to_str().unwrap())
        .args(["report", "--json", "--from", &from, "--daemon-config", "/nonexistent/onepoold.toml", "--scenario"])
        .arg(&saved_dir)
        .arg(&policy)
        .output()
        .unwrap();
    assert!(out.status.success(), "onepool report: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&report["reclaims"]).unwrap());
    assert_eq!(report["reclaim_source"], "slurmctld's log", "{report}");
    let reclaims = report["reclaims"].as_array().unwrap();
    let got: Vec<(String, String, String)> = reclaims
        .iter()
        .map(|r| {
            (
                r["job"].as_str().unwrap().into(),
                r["mode"].as_str().unwrap().into(),
                r["for_job"].as_str().unwrap_or("-").into(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> =
        [(&graceful, "graceful"), (&immediate, "immediate"), (&requeue, "requeue")]
            .iter()
            .map(|(s, m)| (s.victim.to_string(), m.to_string(), s.taker.to_string()))
            .collect();
    assert_eq!(got, want, "exactly the test's reclaims, in order");
    for (r, seen) in reclaims.iter().zip([&graceful, &immediate, &requeue]) {
        let ttc = r["time_to_capacity_s"].as_f64().unwrap();
        eprintln!("job {}: report {ttc:.3} s, test {:.3} s", seen.victim, seen.ttc);
        assert!((ttc - seen.ttc).abs() <= 0.5, "job {}: report {ttc} s, test {} s", seen.victim, seen.ttc);
        assert_eq!(r["gpus_changed_hands"], 4, "{r}");
        assert!(r["source"].as_str().unwrap().starts_with("slurmctld log"), "{r}");
    }
    let g = &reclaims[0];
    assert_eq!((g["drained"].as_u64(), g["cut"].as_u64()), (Some(1), Some(0)), "the drained replica's note: {g}");
    assert!(reclaims[1]["drained"].is_null() && reclaims[2]["drained"].is_null());

    let failures = report["replica_failures"].as_array().unwrap();
    let broken: Vec<&Value> = failures.iter().filter(|f| f["endpoint"] == "broken").collect();
    assert_eq!(broken.len(), 1, "{failures:?}");
    assert_eq!(broken[0]["failed"], 3, "{}", broken[0]);
    let cause = broken[0]["last_cause"].as_str().unwrap();
    assert!(cause.contains("exited with code 3") && cause.contains("cannot load the model"), "{cause}");
    assert!(failures.iter().all(|f| f["endpoint"] != "chat"), "a drained replica is no failure: {failures:?}");

    // What the pool saved: the period's runs through the simulator, the
    // same figures `onepool simulate` prints on the scenario it kept.
    let saved = &report["saved"];
    eprintln!("saved: {saved}");
    assert!(saved["jobs"].as_u64().unwrap() >= 6, "the borrowers, the takers and the replica jobs: {saved}");
    let said = saved["assumptions"].to_string();
    assert!(said.contains("no endpoints: no /nonexistent/onepoold.toml"), "{said}");
    let out = c
        .cmd(onepool.to_str().unwrap())
        .args(["simulate", "--json"])
        .arg(saved_dir.join("scenario.toml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "onepool simulate: {}", String::from_utf8_lossy(&out.stderr));
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sim["comparison"]["separate_gpus"], saved["separate_islands_gpus"]);
    assert_eq!(sim["comparison"]["shared_gpus_needed"], saved["shared_pool_gpus"]);
    assert!(saved["separate_islands_gpus"].as_u64().is_some(), "the islands were sized: {saved}");
    let _ = std::fs::remove_dir_all(&dir);
}
