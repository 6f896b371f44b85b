//! Graceful reclaim through Slurm's own preemption, with the real replica
//! launcher: supplemental replicas (submitted with `--signal=B:USR1@N` in
//! the flexible inference QOS) hold the flexible GPUs; a protected job
//! arrives; Slurm picks a victim and sends the notice; the victim's launcher
//! turns new requests away, lets the one in flight finish, stops the server
//! and exits; the protected job starts without waiting for GraceTime.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use onepool_tests::{build_dir, cluster, Cleanup};

/// The dev cluster's stand-in model server (answers `GET /v1/x?sleep=S` after S seconds).
const SERVER: &str = include_str!("../../etc/dev-cluster/stand-in-model-server.py");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The replica key the test hands its launchers, as onepoold would.
const KEY: &str = "reclaim-test-replica-key-0123456789";

/// Status of a GET through a launcher at `address`, or None when the
/// connection failed.
fn get(address: SocketAddr, path: &str) -> Option<u16> {
    onepool_tests::elastic::request_at(address, "GET", path, "", &[(onepool_tests::elastic::REPLICA_KEY_FIELD, KEY)])
}

#[test]
fn a_protected_job_gets_a_gracefully_drained_replica_s_gpus_at_once_and_no_request_is_lost() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = std::env::temp_dir().join(format!("onepool-reclaim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = dir.join("server.py");
    std::fs::write(&server, SERVER).unwrap();
    let launcher = build_dir().join("onepool");
    let base = c.sbatch(&["--workload=inference-baseline", "--gpus=4", "-N1", "--wrap", "sleep 600"]);
    let mut replicas = Vec::new();
    for i in 0..3 {
        let port = free_port();
        let backend = free_port();
        let log = dir.join(format!("replica-{i}.log"));
        let script = format!(
            "export ONEPOOL_REPLICA_KEY={KEY}; exec {} replica --listen {}:{port} --backend 127.0.0.1:{backend} --report none --drain-timeout 30s -- python3 {}",
            launcher.display(),
            c.replica_listen_ip(),
            server.display()
        );
        let job = c.sbatch_with_output(
            &["--workload=inference", "--endpoint=llm", "--gpus=4", "-N1", "--signal=B:USR1@60", "--wrap", &script],
            &log,
        );
        replicas.push((job, port, log));
    }
    // Where each launcher is reached: its node's address (the hosts mode).
    let mut at = Vec::new();
    for (job, port, _) in &replicas {
        c.wait_state(*job, "RUNNING", Duration::from_secs(30));
        let address = SocketAddr::new(c.job_address(*job), *port);
        c.wait_until("the replica to answer", Duration::from_secs(30), || get(address, "/v1/x") == Some(200));
        at.push(address);
    }
    c.wait_state(base, "RUNNING", Duration::from_secs(30));
    // Past the policy's minimum run time, every replica may be reclaimed.
    std::thread::sleep(Duration::from_secs(onepool_tests::TEST_MIN_RUNTIME_SECS + 1));
    // A 3-second request in flight on every replica.
    let in_flight: Vec<_> = at.iter().copied().map(|a| std::thread::spawn(move || get(a, "/v1/x?sleep=3"))).collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let owner = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=4", "-N1", "--wrap", "sleep 60"]);
    let took = c.wait_state(owner, "RUNNING", Duration::from_secs(60));
    eprintln!("protected job running {took:?} after submission (the victim drained a 3 s request first)");
    let answers: Vec<Option<u16>> = in_flight.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(answers.iter().all(|a| *a == Some(200)), "a request in flight was lost: {answers:?}");
    let victims: Vec<&(u32, u16, std::path::PathBuf)> =
        replicas.iter().filter(|(j, _, _)| c.state(*j).is_none()).collect();
    assert_eq!(victims.len(), 1, "one replica yields its 4 GPUs");
    let (victim, _, log) = victims[0];
    c.wait_until("the victim's log", Duration::from_secs(10), || {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains("drained in"))
    });
    eprintln!("victim {victim}: {}", std::fs::read_to_string(log).unwrap().trim());
    // Graceful and fast: well before GraceTime (60 s) and Slurm's periodic kill.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(t0.elapsed() >= Duration::from_secs(2), "the in-flight request was allowed to finish first");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Requeue: flexible training (etc/examples/requeue-training.sbatch, the
/// pattern the README gives users) gets the notice, saves a checkpoint,
/// requeues itself and releases the GPUs at once; run again, it resumes
/// from the checkpoint.
#[test]
fn reclaimed_flexible_training_checkpoints_on_the_notice_is_requeued_and_resumes() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = std::env::temp_dir().join(format!("onepool-requeue-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = onepool_tests::workspace_root().join("etc/examples/requeue-training.sbatch");
    let mut jobs = Vec::new();
    for i in 0..3 {
        let ckpt = format!("--export=ALL,CKPT={}/ckpt-{i}", dir.display());
        let log = dir.join(format!("train-{i}.log"));
        let job = c.sbatch_with_output(
            &[
                "--workload=training",
                "--gpus=4",
                "-N1",
                "--requeue",
                "--signal=B:USR1@60",
                "--open-mode=append",
                &ckpt,
                script.to_str().unwrap(),
            ],
            &log,
        );
        jobs.push((job, log));
    }
    for (job, _) in &jobs {
        c.wait_state(*job, "RUNNING", Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_secs(onepool_tests::TEST_MIN_RUNTIME_SECS + 1));
    // 8 GPUs of protected training: one free node and one borrower's.
    let owner = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=8", "-N2", "--wrap", "sleep 8"]);
    let took = c.wait_state(owner, "RUNNING", Duration::from_secs(60));
    eprintln!("requeue: protected job running {took:?} after submission");
    assert!(took < Duration::from_secs(10), "the victim requeued itself at the notice: {took:?}");
    let victims: Vec<&(u32, std::path::PathBuf)> =
        jobs.iter().filter(|(j, _)| c.state(*j).as_deref() != Some("RUNNING")).collect();
    assert_eq!(victims.len(), 1, "one borrower yields");
    let (victim, log) = victims[0];
    c.wait_state(*victim, "PENDING", Duration::from_secs(10));
    let f = c.job_fields(*victim);
    assert_eq!(f.get("Restarts").map(String::as_str), Some("1"), "{f:?}");
    let text = std::fs::read_to_string(log).unwrap();
    let step: u64 = text
        .lines()
        .find_map(|l| l.split("checkpoint at step ").nth(1)?.split(';').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in the victim's log:\n{text}"));
    assert!(step > 0, "{text}");
    // Slurm holds a requeued batch job ~2 minutes (BeginTime: the node's
    // credentials must expire first); the test does not wait for that.
    assert_eq!(f.get("Reason").map(String::as_str), Some("BeginTime"), "{f:?}");
    c.ok("scontrol", &["update", &format!("JobId={victim}"), "StartTime=now"]);
    // It runs again once the protected job (8 s) ends, from its checkpoint.
    c.wait_state(*victim, "RUNNING", Duration::from_secs(60));
    c.wait_until("the resumed run's first line", Duration::from_secs(20), || {
        std::fs::read_to_string(log).is_ok_and(|t| t.contains(&format!("start: step {step}, restart 1")))
    });
    eprintln!("requeue: victim {victim} checkpointed at step {step}, requeued, resumed from it");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Streams outlive their replica's graceful reclaim (issue #43): the
/// victim's launcher ends its streams at once (the router continues them
/// on the other replicas) instead of waiting for them, and the protected
/// job gets the GPUs within 2 s of its submission though the victim's
/// streams had 20 s or more left. Every answer ends whole, agents' calls
/// with a tool list among them (issue #51).
#[test]
fn a_graceful_reclaim_moves_long_streams_and_the_protected_job_runs_within_two_seconds() {
    use onepool_tests::answers::{long_chat_body, timed_chat, tool_list};
    use onepool_tests::elastic::{
        daemon_config, foreign_job, llama_replicas, moved_streams, moves_failed, protected_training, runtime, scratch,
        serving, start_daemon, wait, Load,
    };
    const LONG_TOKENS: u64 = 600;
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("reclaim-moves");
    let config = dir.join("onepoold.toml");
    daemon_config(c, &dir, "chat", |r| {
        llama_replicas(r, 4);
        let server = onepool_dev_cluster::model_server::ModelServer::locate().unwrap();
        r.command =
            server.replica_command(onepool_dev_cluster::model_server::Slots { parallel: 4, context: 1024, threads: 1 });
        // Longer than any stream here: waiting for them would show.
        r.drain_timeout = Some(Duration::from_secs(120));
    })
    .write(&config)
    .unwrap();
    let foreign = foreign_job(c);
    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let port = d.endpoint("chat").unwrap().listen.unwrap().port();
    wait("the baseline replica to serve", Duration::from_secs(150), || serving(&d, "chat", "baseline").len() == 1);
    let load = Load::streams(port, 16, 48);
    wait("two supplemental replicas to serve", Duration::from_secs(180), || {
        serving(&d, "chat", "supplemental").len() == 2
    });
    let (_, statuses) = load.finish();
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), vec![200], "{statuses:?}");
    let supplemental = serving(&d, "chat", "supplemental");
    std::thread::sleep(Duration::from_secs(onepool_tests::TEST_MIN_RUNTIME_SECS + 1));

    // The odd ones are agents' calls with a tool list (issue #51: followed,
    // and moved like the others).
    let answers: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut body = long_chat_body(&format!("Tell a long story, part {i}."), LONG_TOKENS, i != 3);
                if i % 2 == 1 {
                    (body["tools"], body["tool_choice"]) = (tool_list(), serde_json::json!("auto"));
                }
                timed_chat(port, &body).answer
            })
        })
        .collect();
    wait("every replica serving answers", Duration::from_secs(60), || {
        let snap = d.endpoint("chat").unwrap().endpoint.snapshot();
        snap.replicas.len() == 3 && snap.replicas.iter().all(|r| r.in_flight >= 2)
    });
    std::thread::sleep(Duration::from_secs(3));
    let submitted = Instant::now();
    let (training, took) = protected_training(c);
    eprintln!("graceful: protected training RUNNING {took:?} after submission");
    let victims: Vec<u32> =
        supplemental.iter().copied().filter(|j| c.state(*j).as_deref() != Some("RUNNING")).collect();
    assert_eq!(victims.len(), 1, "{victims:?}");
    let mut least_left = Duration::MAX;
    for (i, a) in answers.into_iter().map(|h| h.join().unwrap()).enumerate() {
        let left = a.ended.saturating_duration_since(submitted);
        least_left = least_left.min(left);
        eprintln!("answer {i}: {} bytes, ended {left:.1?} after the protected job's submission", a.text.len());
        assert_eq!(a.flaw(LONG_TOKENS), None, "answer {i}");
    }
    let moved = moved_streams(&d);
    eprintln!("graceful: streams moved {moved:?}; the shortest answer ended {least_left:.1?} after the submission");
    assert!(moved.get("reclaimed").copied().unwrap_or(0) >= 1, "the victim's streams moved: {moved:?}");
    assert_eq!(moves_failed(&d), 0);
    assert!(least_left >= Duration::from_secs(20), "the streams in flight had 20 s or more left");
    assert!(took <= Duration::from_secs(2), "time to capacity {took:?}");
    assert_eq!(c.state(training).as_deref(), Some("RUNNING"));
    onepool_tests::elastic::assert_untouched(c, foreign);
    c.ok("scancel", &[&training.to_string(), &foreign.to_string()]);
    rt.block_on(d.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}
