//! `onepool report` against what really happened (issue #26): a graceful,
//! an immediate and a requeue reclaim and a crash-looping replica endpoint
//! on a real cluster, then `onepool report --json` over that period must
//! list exactly those reclaims (mode, victim, taker, a drained replica's
//! finished and cut requests) with times to capacity within 0.5 s of what
//! this test measured, and the crashed replica jobs as failures.
//!
//! Each reclaim runs alone: three jobs of one flexible class hold three
//! nodes' GPUs, and protected training for 8 GPUs (the free node and one
//! borrower's) makes Slurm pick one of them. The replicas are onepoold's
//! as it submits them: its service user's jobs, recorded by
//! job_submit/onepool for their endpoint.
//!
//! Then an ordinary user's forgeries (issue #35): a replica's note on
//! their own job named like one, and slurmctld log lines written through
//! a job's comment, must change nothing in the report.

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

/// The start of the period: a whole second after now. `--from` has whole
/// seconds, and on a cluster that has just started, slurmctld's log
/// begins within this second (26.05 in CI: log from 21:37:30.4, `from`
/// 21:37:30), so the report rightly said the log did not cover it.
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

/// A job whose comment was updated reads `Eligible=Unknown` in sacct for
/// a few seconds after it ends (measured on 22.05: 3.6 s), and sacct's
/// time window leaves such jobs out until then: a report over a period
/// that ends this very second would miss them.
fn wait_for_accounting(c: &TestCluster, jobs: &[u32]) {
    for j in jobs {
        c.final_state(*j);
    }
    let ids: Vec<String> = jobs.iter().map(u32::to_string).collect();
    c.wait_until("accounting's eligible times", Duration::from_secs(60), || {
        !c.ok("sacct", &["-X", "-P", "-n", "-j", &ids.join(","), "--format=Eligible"]).contains("Unknown")
    });
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
    wait_for_accounting(c, &crashed);
    let saved_dir = dir.join("saved");
    let saved_arg = saved_dir.display().to_string();
    // Without onepoold.toml: any endpoint the service user's recorded jobs name.
    let args = ["--from", &from, "--daemon-config", "/nonexistent/onepoold.toml", "--scenario", &saved_arg];
    let report = report(c, &onepool, &args);
    eprintln!("{}", serde_json::to_string_pretty(&report["reclaims"]).unwrap());
    assert_eq!(report["reclaim_source"], "slurmctld's log", "{report}");
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
    // Slurm names the victim it cancels at once; at info level neither a
    // graceful one nor one that requeues itself in its grace time. The
    // replicas' notes and the launchers' late updates around its line
    // must not hide it.
    let sources = ["slurmctld log (taker by node and time)", "slurmctld log", "slurmctld log (taker by node and time)"];
    for ((r, seen), source) in reclaims.iter().zip([&graceful, &immediate, &requeue]).zip(sources) {
        let ttc = r["time_to_capacity_s"].as_f64().unwrap();
        eprintln!("job {}: report {ttc:.3} s, test {:.3} s", seen.victim, seen.ttc);
        assert!((ttc - seen.ttc).abs() <= 0.5, "job {}: report {ttc} s, test {} s", seen.victim, seen.ttc);
        assert_eq!(r["gpus_changed_hands"], 4, "{r}");
        assert_eq!(r["source"], source, "{r}");
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

/// The report trusts only what users cannot write (issue #35): an ordinary
/// user (a) puts a replica's drain and end note on a job of their own
/// named like a replica and recorded for the endpoint, (b) writes a
/// slurmctld line through a line break in a comment naming an invented
/// reclaim, and (c) one naming a real graceful victim with their own job as
/// the taker, right after the reclaim, once as the issue did and once
/// ending where Slurm appends ` for JobId=OWN` (which then reads exactly as
/// slurmctld's line). The report over the period must be the report over
/// the same log without the attacks' lines, and name none of their jobs.
#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn the_report_trusts_only_what_users_cannot_write() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let (dir, server, onepool) = scratch("report-forged");
    let config = dir.join("onepoold.toml");
    onepool_tests::elastic::daemon_config(c, &dir, "chat", |_| {}).write(&config).unwrap();
    let ana = c.user("op-ana", "research");
    c.cancel_all();
    let from = period_start(c);
    let as_ana = |args: &[&str]| {
        let r = c.run_as(&ana, "scontrol", args);
        assert!(r.ok, "scontrol {args:?} as op-ana: {}{}", r.stdout, r.stderr);
    };
    let now_ms = || c.ok("date", &["+%Y-%m-%dT%H:%M:%S.%3N"]).trim().to_string();

    // (a) A drain on Slurm's notice and a server's end, noted on op-ana's own job.
    let named = sbatch_as(c, &ana, &["-J", "onepool-chat-18500", "--endpoint=chat", "--gpus=1", "--wrap", "sleep 5"]);
    c.wait_state(named, "RUNNING", Duration::from_secs(30));
    let notice_ms = c.ok("date", &["+%s%3N"]).trim().to_string();
    as_ana(&[
        "update",
        &format!("jobid={named}"),
        &format!("comment=op1;L18500=40000;D18500={notice_ms},10,7,0,3,1500;E18500=boom"),
    ]);
    c.wait_until("op-ana's job to end", Duration::from_secs(30), || c.state(named).is_none());

    // A real graceful reclaim of onepoold's replicas (slots in the configured port_range).
    let graceful = graceful_reclaim(c, &onepool, &server, "chat", [18501, 18502, 18503]);
    // (b), (c): through the comment of a job op-ana holds.
    let own = sbatch_as(c, &ana, &["--hold", "--wrap", "sleep 300"]);
    let forged = [
        format!(
            "[{}] preempted JobId={named} has been killed to reclaim resources for JobId={}",
            now_ms(),
            graceful.taker
        ),
        format!(
            "[{}] preempted JobId={} has been killed to reclaim resources for JobId={own}",
            now_ms(),
            graceful.victim
        ),
        format!("[{}] preempted JobId={} has been killed to reclaim resources", now_ms(), graceful.victim),
    ];
    for (i, line) in forged.iter().enumerate() {
        as_ana(&["update", &format!("jobid={own}"), &format!("comment=forged-{i}\n{line}")]);
    }
    // What the attacks rely on: slurmctld wrote the text as its own lines.
    let log = c.log("slurmctld");
    for line in &forged {
        assert!(log.lines().any(|l| l.starts_with(line.as_str())), "slurmctld's log has no line {line:?}");
    }
    let full = format!("{} for JobId={own}", forged[2]);
    assert!(log.lines().any(|l| l == full), "Slurm appends ` for JobId={own}`: {full:?}");
    c.cancel_all();
    wait_for_accounting(c, &[named, graceful.victim]);

    // The same period over the log without the attacks' lines.
    let to = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    let clean: String = c
        .log("slurmctld")
        .lines()
        .filter(|l| !l.contains("setting comment to forged-") && !forged.iter().any(|f| l.starts_with(f.as_str())))
        .map(|l| format!("{l}\n"))
        .collect();
    let clean_log = dir.join("slurmctld-without-the-attacks.log");
    std::fs::write(&clean_log, clean).unwrap();
    // The forged lines carry the stamps op-ana read before writing them,
    // a little before slurmctld's own line for the update, so they are
    // also out of order. An attacker who stamped them in order (here: as
    // the update's own line) is left to the rule on a comment's lines.
    let mut previous_stamp = String::new();
    let in_order: String = c
        .log("slurmctld")
        .lines()
        .map(|l| {
            let stamp = l.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(s, _)| s.to_string());
            match (forged.iter().any(|f| l.starts_with(f.as_str())), stamp) {
                (true, Some(s)) => format!("[{previous_stamp}]{}\n", &l[s.len() + 2..]),
                (false, Some(s)) => {
                    previous_stamp = s;
                    format!("{l}\n")
                }
                (_, None) => format!("{l}\n"),
            }
        })
        .collect();
    let in_order_log = dir.join("slurmctld-forged-in-order.log");
    std::fs::write(&in_order_log, in_order).unwrap();
    let config_arg = config.display().to_string();
    let args = ["--from", &from, "--to", &to, "--no-saved", "--daemon-config", &config_arg];
    let attacked = report(c, &onepool, &args);
    let clean_arg = clean_log.display().to_string();
    let without = report(c, &onepool, &[&args[..], &["--log", &clean_arg]].concat());
    eprintln!("{}", serde_json::to_string_pretty(&attacked["reclaims"]).unwrap());
    assert_eq!(attacked["reclaims"], without["reclaims"], "the forged log lines changed the reclaims");
    assert_eq!(attacked["replica_failures"], without["replica_failures"], "the forged lines changed the failures");
    let in_order_arg = in_order_log.display().to_string();
    let ordered = report(c, &onepool, &[&args[..], &["--log", &in_order_arg]].concat());
    assert_eq!(ordered["reclaims"], without["reclaims"], "forged log lines in order changed the reclaims");

    // And that report is the truth: the one reclaim, no failure, no job of op-ana's.
    let reclaims = attacked["reclaims"].as_array().unwrap();
    let got: Vec<(&str, &str, Option<&str>)> = reclaims
        .iter()
        .map(|r| (r["job"].as_str().unwrap(), r["mode"].as_str().unwrap(), r["for_job"].as_str()))
        .collect();
    let (victim, taker) = (graceful.victim.to_string(), graceful.taker.to_string());
    assert_eq!(got, [(victim.as_str(), "graceful", Some(taker.as_str()))], "{reclaims:?}");
    assert_eq!(reclaims[0]["drained"], 1, "{}", reclaims[0]);
    assert_eq!(attacked["replica_failures"], serde_json::json!([]), "a forged end note is no failure");
    let replica_jobs = attacked["replica_jobs"].as_str().unwrap();
    assert!(replica_jobs.contains("onepoold's endpoints in") && replica_jobs.ends_with("(chat)"), "{replica_jobs}");
    let _ = std::fs::remove_dir_all(&dir);
}
