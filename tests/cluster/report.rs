//! `onepool report` against what really happened (issue #26): a graceful,
//! an immediate and a requeue reclaim and a crash-looping replica endpoint
//! on a real cluster, then `onepool report --json` over that period must
//! list exactly those reclaims (mode, victim, taker, a drained replica's
//! finished and cut requests) with times to capacity within accounting's
//! second of what this test measured, and the crashed replica jobs as
//! failures.
//!
//! Each reclaim runs alone: three jobs of one flexible class hold three
//! nodes' GPUs, and protected training for 8 GPUs (the free node and one
//! borrower's) makes Slurm pick one of them. The replicas are onepoold's
//! as it submits them: its service user's jobs, recorded by
//! job_submit/onepool for their endpoint.
//!
//! Then an ordinary user's attacks (issues #35, #42): text with line breaks
//! and forged slurmctld lines through every option and `scontrol update`
//! field that takes text, a flood of early-stamped lines, job names that
//! break lines, a replica's note on their own job: the report must still
//! be exactly what happened.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use onepool_decisions::policy::{SERVICE_ACCOUNT, SERVICE_USER};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster, User, TEST_MIN_RUNTIME_SECS};
use serde_json::Value;

/// The dev cluster's stand-in model server (answers `GET /v1/x?sleep=S` after S seconds).
const SERVER: &str = include_str!("../../etc/dev-cluster/stand-in-model-server.py");
const KEY: &str = "report-test-replica-key-0123456789";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A GET through a launcher at `address` with the test's replica key (the
/// harness's client).
fn get(address: SocketAddr, path: &str) -> Option<u16> {
    onepool_tests::elastic::request_at(address, "GET", path, "", &[(onepool_tests::elastic::REPLICA_KEY_FIELD, KEY)])
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

/// `sbatch --parsable ARGS` as `user`; returns the job id.
fn sbatch_as(c: &TestCluster, user: &User, args: &[&str]) -> u32 {
    let mut all = vec!["--parsable", "-o", "/dev/null"];
    all.extend_from_slice(args);
    let r = c.run_as(user, "sbatch", &all);
    assert!(r.ok, "sbatch {args:?} as {}: {}{}", user.name, r.stdout, r.stderr);
    r.stdout.trim().split(';').next().unwrap().parse().unwrap_or_else(|_| panic!("sbatch printed {:?}", r.stdout))
}

/// The test's folder, the stand-in server in it, and the `onepool` binary.
fn scratch(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("onepool-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = dir.join("server.py");
    std::fs::write(&server, SERVER).unwrap();
    (dir, server, build_dir().join("onepool"))
}

/// The start of the period: a whole second after now (`--from` has whole
/// seconds, as sacct does), so nothing before the test counts.
fn period_start(c: &TestCluster) -> String {
    std::thread::sleep(Duration::from_secs(1));
    let from = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    std::thread::sleep(Duration::from_secs(1));
    from
}

/// A graceful reclaim: three replicas of `endpoint` as onepoold runs them
/// (its service user's jobs under the launcher, `--endpoint` for
/// job_submit/onepool's record, named for their `slots`), a 3-second
/// request in flight on each, and Slurm's notice to the one that yields.
fn graceful_reclaim(c: &TestCluster, onepool: &Path, server: &Path, endpoint: &str, slots: [u16; 3]) -> Seen {
    let service = c.user(SERVICE_USER, SERVICE_ACCOUNT);
    let mut ports = Vec::new();
    let mut replicas = Vec::new();
    for slot in slots {
        let port = free_port();
        let script = format!(
            "export ONEPOOL_REPLICA_KEY={KEY}; exec {} replica --listen {}:{port} --report comment --slot {slot} \
             --drain-timeout 30s -- python3 {}",
            onepool.display(),
            c.replica_listen_ip(),
            server.display()
        );
        let name = format!("--job-name=onepool-{endpoint}-{slot}");
        let endpoint = format!("--endpoint={endpoint}");
        replicas.push(sbatch_as(
            c,
            &service,
            &["--workload=inference", &endpoint, &name, "--gpus=4", "-N1", "--signal=B:USR1@60", "--wrap", &script],
        ));
        ports.push(port);
    }
    // Where each launcher is reached: its node's address (the hosts mode).
    let mut at = Vec::new();
    for (job, port) in replicas.iter().zip(&ports) {
        c.wait_state(*job, "RUNNING", Duration::from_secs(30));
        let address = SocketAddr::new(c.job_address(*job), *port);
        c.wait_until("the replica to answer", Duration::from_secs(30), || get(address, "/v1/x") == Some(200));
        at.push(address);
    }
    past_min_runtime();
    let in_flight: Vec<_> = at.iter().copied().map(|a| std::thread::spawn(move || get(a, "/v1/x?sleep=3"))).collect();
    std::thread::sleep(Duration::from_millis(300));
    let graceful = reclaim(c, &replicas, &["COMPLETING"]);
    for h in in_flight {
        assert_eq!(h.join().unwrap(), Some(200), "a request in flight was lost");
    }
    graceful
}

/// The report's time to capacity is accounting's whole seconds (within a
/// second of the truth); the test's is sbatch to the poll that saw RUNNING
/// (at most the poll later than the truth).
fn within_accounting_s_second(report: f64, seen: &Seen) {
    assert!(
        report > seen.ttc - 1.5 && report < seen.ttc + 1.0,
        "job {}: report {report} s, test {} s",
        seen.victim,
        seen.ttc
    );
}

/// `onepool report --json ARGS POLICY`.
fn report(c: &TestCluster, onepool: &Path, args: &[&str]) -> Value {
    let out = c
        .cmd(onepool.to_str().unwrap())
        .args(["report", "--json"])
        .args(args)
        .arg(onepool_tests::test_policy())
        .output()
        .unwrap();
    assert!(out.status.success(), "onepool report: {}", String::from_utf8_lossy(&out.stderr));
    // What it set aside and why (shown when an assertion fails).
    eprintln!("onepool report's messages:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn the_report_lists_each_reclaim_as_it_happened_and_failed_replicas_as_failures() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let (dir, server, onepool) = scratch("report");
    c.cancel_all();
    let from = period_start(c);

    let graceful = graceful_reclaim(c, &onepool, &server, "chat", [7, 8, 9]);
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
    let service = c.user(SERVICE_USER, SERVICE_ACCOUNT);
    let mut crashed = Vec::new();
    for _ in 0..3 {
        let script = format!(
            "export ONEPOOL_REPLICA_KEY={KEY}; exec {} replica --listen 127.0.0.1:0 --report comment --slot 9 -- \
             sh -c 'echo cannot load the model >&2; exit 3'",
            onepool.display()
        );
        let args = ["--workload=inference", "--endpoint=broken", "--job-name=onepool-broken-9", "--gpus=1", "-N1"];
        let job = sbatch_as(c, &service, &[&args[..], &["--wrap", &script]].concat());
        c.wait_until("the broken replica to end", Duration::from_secs(30), || c.state(job).is_none());
        crashed.push(job);
    }
    for j in [&graceful.victim, &immediate.victim, &requeue.victim] {
        c.final_state(*j);
    }
    let takers = [graceful.taker, immediate.taker, requeue.taker];
    c.wait_for_accounting(&[&crashed[..], &takers[..]].concat());
    let saved_dir = dir.join("saved");
    let saved_arg = saved_dir.display().to_string();
    // Without onepoold.toml: any endpoint the service user's recorded jobs name.
    let args = ["--from", &from, "--daemon-config", "/nonexistent/onepoold.toml", "--scenario", &saved_arg];
    let report = report(c, &onepool, &args);
    eprintln!("{}", serde_json::to_string_pretty(&report["reclaims"]).unwrap());
    assert!(report["reclaim_source"].as_str().unwrap().starts_with("accounting"), "{report}");
    let replica_jobs = report["replica_jobs"].as_str().unwrap();
    assert!(replica_jobs.contains("any endpoint (no /nonexistent/onepoold.toml"), "{replica_jobs}");
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
    // A graceful victim that drained in time ends COMPLETED on 22.05 (its
    // replica's note says it was a reclaim) and PREEMPTED on 24.11 (Slurm's
    // state says so, as for the others).
    let sources = [&["replica drain note", "accounting"][..], &["accounting"], &["accounting"]];
    for ((r, seen), source) in reclaims.iter().zip([&graceful, &immediate, &requeue]).zip(sources) {
        let ttc = r["time_to_capacity_s"].as_f64().unwrap();
        eprintln!("job {}: report {ttc:.3} s, test {:.3} s", seen.victim, seen.ttc);
        within_accounting_s_second(ttc, seen);
        assert_eq!(r["gpus_changed_hands"], 4, "{r}");
        assert!(source.contains(&r["source"].as_str().unwrap_or("")), "{r}");
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

/// Every option of sbatch, salloc and srun that takes text (Slurm's own
/// and ours), whether this release logs it, parses it or refuses it: the
/// attack below sends a line break and forged slurmctld lines through each.
/// Options a release does not know are refused by the command itself, which
/// is the same to the report.
const TEXT_OPTIONS: &[&str] = &[
    "--job-name",
    "--comment",
    "--reservation",
    "--partition",
    "--account",
    "--qos",
    "--licenses",
    "--mcs-label",
    "--wckey",
    "--chdir",
    "--output",
    "--error",
    "--input",
    "--constraint",
    "--cluster-constraint",
    "--gres",
    "--dependency",
    "--nodelist",
    "--exclude",
    "--mail-user",
    "--network",
    "--container",
    "--prefer",
    "--extra",
    "--burst-buffer",
    "--acctg-freq",
    "--profile",
    "--hint",
    "--distribution",
    "--gpu-bind",
    "--mem-bind",
    "--cpu-freq",
    "--begin",
    "--deadline",
    "--workload",
    "--endpoint",
];

/// Every field of `scontrol update job` that takes text.
const TEXT_FIELDS: &[&str] = &[
    "Name",
    "Comment",
    "AdminComment",
    "Extra",
    "WorkDir",
    "StdOut",
    "StdErr",
    "Partition",
    "QOS",
    "Account",
    "Reservation",
    "Licenses",
    "Features",
    "Prefer",
    "Gres",
    "TresPerNode",
    "Dependency",
    "MailUser",
    "WCKey",
    "NodeList",
    "ReqNodeList",
    "ExcNodeList",
    "MCSLabel",
    "ClusterFeatures",
    "BurstBuffer",
    "StartTime",
    "Deadline",
];

/// The report reads only records no ordinary user can write (issues #35,
/// #42). An ordinary user, op-ana, around one real graceful reclaim of
/// onepoold's replicas and one real immediate reclaim of op-ana's own
/// agents jobs:
/// - sends a line break and slurmctld lines naming made-up reclaims (of
///   their jobs, of the real victims, for their own job) through every
///   option of sbatch, salloc and srun, and every field of `scontrol
///   update`, that takes text ([`TEXT_OPTIONS`], [`TEXT_FIELDS`]);
/// - floods the log with lines stamped before the real reclaims (ten
///   refused submissions of 35 lines each);
/// - names its GPU jobs with line breaks, the old delimiter and quotes
///   (the immediate reclaim's victim among them), renames a running one;
/// - cancels a running job of theirs under a forged preemption line;
/// - puts a replica's drain and end note on a job named like a replica.
///
/// The report must list exactly the two real reclaims with their takers,
/// count every GPU job op-ana ran, read every record, and name no job of
/// op-ana's as a reclaim or a failure; then protected work still gets its
/// GPUs.
#[test]
#[allow(clippy::too_many_lines, reason = "one attack on a real cluster, read top to bottom")]
fn the_report_counts_only_what_users_cannot_write() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let (dir, server, onepool) = scratch("report-forged");
    let config = dir.join("onepoold.toml");
    onepool_tests::elastic::daemon_config(c, &dir, "chat", |_| {}).write(&config).unwrap();
    let ana = c.user("op-ana", "research");
    c.cancel_all();
    let from = period_start(c);
    let stamp = |offset_s: i64| {
        c.ok("date", &["-d", &format!("{offset_s} seconds"), "+%Y-%m-%dT%H:%M:%S.%3N"]).trim().to_string()
    };
    let early = stamp(-30);

    // (a) A drain on Slurm's notice and a server's end, noted on op-ana's
    // own job named like a replica and recorded for the endpoint.
    let named = sbatch_as(c, &ana, &["-J", "onepool-chat-18500", "--endpoint=chat", "--gpus=1", "--wrap", "sleep 5"]);
    c.wait_state(named, "RUNNING", Duration::from_secs(30));
    let notice_ms = c.ok("date", &["+%s%3N"]).trim().to_string();
    let ok = c.run_as(
        &ana,
        "scontrol",
        &[
            "update",
            &format!("jobid={named}"),
            &format!("comment=op1;L18500=40000;D18500={notice_ms},10,7,0,3,1500;E18500=boom"),
        ],
    );
    assert!(ok.ok, "op-ana may set their own job's comment: {}", ok.stderr);
    c.wait_until("op-ana's job to end", Duration::from_secs(30), || c.state(named).is_none());

    // A real graceful reclaim of onepoold's replicas.
    let graceful = graceful_reclaim(c, &onepool, &server, "chat", [18501, 18502, 18503]);
    c.cancel_all();

    // A running GPU job of op-ana's, to be cancelled by op-ana under a
    // forged preemption line (the first attack).
    let cancelled = sbatch_as(c, &ana, &["--workload=agents", "--gpus=1", "--wrap", "sleep 300"]);
    c.wait_state(cancelled, "RUNNING", Duration::from_secs(30));

    // The forged lines: made-up reclaims of op-ana's jobs and of the real
    // victim, for op-ana's job, for nothing; each behind a line break.
    let held = sbatch_as(c, &ana, &["--hold", "--wrap", "sleep 300"]);
    let forged = |tag: &str, at: &str| {
        format!(
            "{tag}\n[{at}] preempted JobId={cancelled} has been killed to reclaim resources for JobId=Invalid\n\
             [{at}] preempted JobId={} has been killed to reclaim resources for JobId={held}\n\
             [{at}] preempted JobId={named} has been requeued to reclaim resources for JobId={}\n\
             [{at}] sched: Allocate JobId={held} NodeList=node1 #CPUs=1 Partition=gpu",
            graceful.victim, graceful.taker
        )
    };
    let mut reached_the_log = 0usize;
    let mut sent = 0usize;
    for (i, option) in TEXT_OPTIONS.iter().enumerate() {
        let text = forged(&format!("opt{i}"), &stamp(0));
        let arg = format!("{option}={text}");
        for (program, args) in [
            ("sbatch", vec!["--parsable", "-o", "/dev/null", "--hold", arg.as_str(), "--wrap", "true"]),
            ("salloc", vec!["--immediate=1", "-t", "1", arg.as_str(), "true"]),
            ("srun", vec!["--immediate=1", "-t", "1", arg.as_str(), "true"]),
        ] {
            let _ = c.run_as(&ana, program, &args);
            sent += 1;
        }
    }
    for (i, field) in TEXT_FIELDS.iter().enumerate() {
        let text = forged(&format!("field{i}"), &stamp(0));
        let _ = c.run_as(&ana, "scontrol", &["update", &format!("jobid={held}"), &format!("{field}={text}")]);
        sent += 1;
    }
    // The flood: lines stamped before everything real in the period.
    for i in 0..10 {
        let lines: String = (0..35).map(|k| format!("\n[{early}] flood {i}.{k} {}", forged("", &early))).collect();
        let _ = c.run_as(&ana, "sbatch", &["--hold", &format!("--reservation=flood{i}{lines}"), "--wrap", "true"]);
        sent += 1;
    }
    let log = c.log("slurmctld");
    for line in log.lines() {
        if line.contains(&format!("reclaim resources for JobId={held}")) {
            reached_the_log += 1;
        }
    }
    eprintln!("{sent} submissions and updates with forged lines; {reached_the_log} forged line(s) in slurmctld's log");
    assert!(reached_the_log > 0, "no forged line reached slurmctld's log: the attack proves nothing");
    // The first attack: op-ana cancels their own job.
    c.ok("scancel", &[&cancelled.to_string()]);
    c.cancel_all();

    // A real immediate reclaim of op-ana's agents jobs, named with line
    // breaks, the old delimiter and quotes; one renamed while it runs.
    let names = ["v\nw", "a|b \"q\"", "x\n[2020-01-01T00:00:00.000] preempted JobId=1"];
    let agents: Vec<u32> = names
        .iter()
        .map(|n| {
            let name = format!("--job-name={n}");
            sbatch_as(c, &ana, &["--workload=agents", "--gpus=4", "-N1", &name, "--wrap", "sleep 300"])
        })
        .collect();
    for j in &agents {
        c.wait_state(*j, "RUNNING", Duration::from_secs(30));
    }
    let renamed = c.run_as(&ana, "scontrol", &["update", &format!("jobid={}", agents[0]), "name=k\nm"]);
    eprintln!("rename with a line break: ok={} {}", renamed.ok, renamed.stderr.trim());
    past_min_runtime();
    let immediate = reclaim(c, &agents, &["COMPLETING"]);
    c.cancel_all();
    for j in [cancelled, immediate.victim, graceful.victim] {
        c.final_state(j);
    }
    let ran = [named, cancelled, immediate.victim, immediate.taker, graceful.victim, graceful.taker];
    c.wait_for_accounting(&ran);

    let to = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    let config_arg = config.display().to_string();
    let args = ["--from", &from, "--to", &to, "--no-saved", "--daemon-config", &config_arg];
    let report = report(c, &onepool, &args);
    eprintln!("{}", serde_json::to_string_pretty(&report["reclaims"]).unwrap());
    let reclaims = report["reclaims"].as_array().unwrap();
    let got: Vec<(String, &str, Option<&str>)> = reclaims
        .iter()
        .map(|r| (r["job"].as_str().unwrap().to_string(), r["mode"].as_str().unwrap(), r["for_job"].as_str()))
        .collect();
    let (gt, it) = (graceful.taker.to_string(), immediate.taker.to_string());
    assert_eq!(
        got,
        [
            (graceful.victim.to_string(), "graceful", Some(gt.as_str())),
            (immediate.victim.to_string(), "immediate", Some(it.as_str()))
        ],
        "exactly the two real reclaims"
    );
    assert_eq!(reclaims[0]["drained"], 1, "{}", reclaims[0]);
    for (r, seen) in reclaims.iter().zip([&graceful, &immediate]) {
        within_accounting_s_second(r["time_to_capacity_s"].as_f64().unwrap(), seen);
    }
    assert_eq!(report["replica_failures"], serde_json::json!([]), "a forged end note is no failure");
    assert_eq!(report["unreadable"]["count"], 0, "every record read: {}", report["unreadable"]);
    // Every GPU job op-ana ran in the agents class: the cancelled one, the
    // job named like a replica (agents by default) and the three named
    // with line breaks; the held ones never ran.
    let agents_class = report["classes"].as_array().unwrap().iter().find(|k| k["class"] == "agents").unwrap();
    assert_eq!(agents_class["jobs"], 5, "{agents_class}");
    let replica_jobs = report["replica_jobs"].as_str().unwrap();
    assert!(replica_jobs.contains("onepoold's endpoints in") && replica_jobs.ends_with("(chat)"), "{replica_jobs}");

    // And protected work still gets its GPUs.
    let protected =
        c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=8", "-N2", "--wrap", "sleep 30"]);
    c.wait_state(protected, "RUNNING", Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Slurm's release, as `scontrol --version` prints it: (major, minor).
fn slurm_release(c: &TestCluster) -> (u32, u32) {
    let out = c.ok("scontrol", &["--version"]);
    let v = out.split_whitespace().nth(1).unwrap_or_default();
    let mut parts = v.split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// A victim on two nodes (`-N2`, 2 GPUs each) of op-ana's agents; op-ana's
/// training job on `decoy_node` that depends on it (`afterany`), so it
/// starts the moment the victim ends; protected training on `taker_node`
/// that needs the victim's GPUs there. Returns the victim, the decoy and
/// what the test saw of the real taker.
fn dependency_timed(c: &TestCluster, ana: &User, taker_node: &str, decoy_node: &str) -> (Seen, u32) {
    let both = format!("-w{taker_node},{decoy_node}");
    let victim = sbatch_as(c, ana, &["--workload=agents", "-N2", &both, "--gpus-per-node=2", "--wrap", "sleep 600"]);
    c.wait_state(victim, "RUNNING", Duration::from_secs(30));
    let after = format!("--dependency=afterany:{victim}");
    let decoy_at = format!("-w{decoy_node}");
    let decoy =
        sbatch_as(c, ana, &["--workload=training", "-N1", &decoy_at, "--gpus=4", &after, "--wrap", "sleep 400"]);
    past_min_runtime();
    let t0 = Instant::now();
    let at = format!("-w{taker_node}");
    let taker =
        c.sbatch(&["--workload=critical-training", "--time=10:00", "-N1", &at, "--gpus=4", "--wrap", "sleep 300"]);
    c.wait_state(taker, "RUNNING", Duration::from_secs(60));
    let ttc = t0.elapsed().as_secs_f64();
    c.wait_state(decoy, "RUNNING", Duration::from_secs(60));
    eprintln!("dependency-timed: victim {victim} yielded to job {taker} on {taker_node} ({ttc:.2} s); decoy {decoy} on {decoy_node}");
    (Seen { victim, taker, ttc }, decoy)
}

/// Issue #52: an ordinary user times jobs around a reclaim.
/// - (a) The case: op-ana's training job depends on op-ana's own
///   two-node agents job and asks for its second node, so it starts in
///   the same second as the protected job Slurm preempted the agents for,
///   on the first node.
/// - (b) The same with the nodes swapped: the real taker on the victim's
///   second node.
/// - (c) op-ana requeues their own training job (a requeue class) while a
///   protected job waits for its node (inside the policy's minimum run
///   time, so Slurm may not preempt it yet).
///
/// The report must name the protected job as the taker of (a) and (b),
/// with its time to capacity within accounting's second, and from Slurm
/// 24.05 list no reclaim for (c) (before 24.05 a requeue reclaim is the
/// victim's own requeue on the notice, and (c) looks the same: docs/report.md).
/// Then protected work still gets its GPUs.
#[test]
fn a_user_timing_jobs_around_a_reclaim_changes_neither_taker_nor_reclaims() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let (dir, _server, onepool) = scratch("report-timed");
    let ana = c.user("op-ana", "research");
    c.cancel_all();
    let from = period_start(c);
    let (a, decoy_a) = dependency_timed(c, &ana, "node3", "node4");
    c.cancel_all();
    let (b, decoy_b) = dependency_timed(c, &ana, "node2", "node1");
    c.cancel_all();

    // (c) The timed own requeue.
    let own = sbatch_as(c, &ana, &["--workload=training", "-N1", "--gpus=4", "--requeue", "--wrap", "sleep 600"]);
    c.wait_state(own, "RUNNING", Duration::from_secs(30));
    let node = c.job_fields(own)["NodeList"].clone();
    let at = format!("-w{node}");
    let waiting =
        c.sbatch(&["--workload=critical-training", "--time=10:00", "-N1", &at, "--gpus=4", "--wrap", "sleep 300"]);
    std::thread::sleep(Duration::from_secs(1));
    let requeued = c.run_as(&ana, "scontrol", &["requeue", &own.to_string()]);
    assert!(requeued.ok, "op-ana may requeue their own job: {}", requeued.stderr);
    c.wait_state(waiting, "RUNNING", Duration::from_secs(60));
    c.cancel_all();

    for j in [a.victim, b.victim, own] {
        c.final_state(j);
    }
    c.wait_for_accounting(&[a.victim, a.taker, decoy_a, b.victim, b.taker, decoy_b, own, waiting]);
    let to = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    let report = report(c, &onepool, &["--from", &from, "--to", &to, "--no-saved"]);
    eprintln!("{}", serde_json::to_string_pretty(&report["reclaims"]).unwrap());
    let reclaims = report["reclaims"].as_array().unwrap();
    for seen in [&a, &b] {
        let victim = seen.victim.to_string();
        let r = reclaims.iter().find(|r| r["job"].as_str() == Some(&victim));
        let r = r.unwrap_or_else(|| panic!("victim {} is listed: {reclaims:?}", seen.victim));
        assert_eq!(r["for_job"], seen.taker.to_string(), "the job Slurm preempted for, not the decoy: {r}");
        assert_eq!(r["for_class"], "critical-training", "{r}");
        within_accounting_s_second(r["time_to_capacity_s"].as_f64().unwrap(), seen);
    }
    let own_id = own.to_string();
    let listed = reclaims.iter().any(|r| r["job"].as_str() == Some(&own_id));
    if slurm_release(c) >= (24, 5) {
        assert!(!listed, "op-ana's own requeue is no reclaim: {reclaims:?}");
    } else {
        eprintln!("Slurm before 24.05: op-ana's own requeue {} listed: {listed} (docs/report.md)", own);
    }
    assert_eq!(reclaims.len(), 2 + usize::from(listed), "only the two real reclaims: {reclaims:?}");

    // Protected work still gets its GPUs.
    let protected =
        c.sbatch(&["--workload=critical-training", "--time=10:00", "-N1", "--gpus=4", "--wrap", "sleep 30"]);
    c.wait_state(protected, "RUNNING", Duration::from_secs(30));
    c.cancel_all();
    let _ = std::fs::remove_dir_all(&dir);
}
