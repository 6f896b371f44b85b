use super::*;
use onepool_router::backend_pool::Transport;
use onepool_slurm_commands::state::{JobInfo, StepInfo};

fn settings() -> ReplicaSettings {
    let c = crate::config::parse(
        "t.toml",
        r#"control_socket = "/tmp/x.sock"
[[endpoint]]
name = "llm"
listen = "127.0.0.1:0"
[endpoint.replicas]
command = "python3 /srv/server.py --model 'x y'"
gpus = 2
min = 1
max = 3
time_limit = "1h"
launcher = "/opt/onepool/bin/onepool"
port_range = "18000-18099"
transport = "plain"
"#,
    )
    .unwrap();
    c.endpoints[0].replicas.clone().unwrap()
}

fn job(id: u32, name: &str, uid: u32, comment: &str) -> JobInfo {
    let json = serde_json::json!({"jobs": [{
        "job_id": id, "job_state": "RUNNING", "name": name, "user_id": uid, "admin_comment": comment,
    }]});
    onepool_slurm_commands::state::parse_jobs(&json.to_string()).unwrap().remove(0)
}

#[test]
fn only_jobs_of_our_uid_name_and_record_are_owned() {
    let s = settings();
    let base = "onepool:class=inference-baseline;tier=protected;endpoint=llm";
    let supp = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=llm";
    assert_eq!(owned(&job(1, "onepool-llm-18000", 7, base), "llm", 7, &s), Some((18000, Kind::Baseline)));
    assert_eq!(owned(&job(2, "onepool-llm-18002", 7, supp), "llm", 7, &s), Some((18002, Kind::Supplemental)));
    // Another user's job, however it is named and annotated.
    assert_eq!(owned(&job(3, "onepool-llm-18000", 8, base), "llm", 7, &s), None);
    // No record (users can name jobs anything), another endpoint's record,
    // another class, a port outside the range.
    assert_eq!(owned(&job(4, "onepool-llm-18000", 7, ""), "llm", 7, &s), None);
    assert_eq!(owned(&job(5, "onepool-llm-18000", 7, &supp.replace("=llm", "=other")), "llm", 7, &s), None);
    assert_eq!(owned(&job(6, "onepool-llm-18000", 7, &supp.replace("=inference;", "=agents;")), "llm", 7, &s), None);
    assert_eq!(owned(&job(7, "onepool-llm-19000", 7, supp), "llm", 7, &s), None);
}

#[test]
fn sbatch_arguments() {
    let s = ReplicaSettings { transport: crate::config::ReplicaTransport::Tls, ..settings() };
    let a = sbatch_args("llm", &s, Kind::Supplemental, 18004, 1);
    assert_eq!(
        a,
        [
            "-J",
            "onepool-llm-18004",
            "--workload=inference",
            "--endpoint=llm",
            "--gpus=2",
            "-N1",
            "--no-requeue",
            "--dependency=singleton",
            "--signal=B:USR1@30",
            "--time=60",
            "-o",
            "/dev/null",
            "--wrap",
            "exec /opt/onepool/bin/onepool replica --listen node:0 --slot 18004 \
             --drain-timeout 30s --tls -- python3 /srv/server.py --model 'x y'",
        ]
    );
    // Clear HTTP to the replicas only when the endpoint says so.
    let plain = ReplicaSettings { transport: crate::config::ReplicaTransport::Plain, ..s.clone() };
    let a = sbatch_args("llm", &plain, Kind::Baseline, 18004, 1);
    assert!(a.last().unwrap().contains("--drain-timeout 30s -- python3"), "{a:?}");
    // Paths of the endpoint's own beyond the defaults go to the launcher.
    let own = ReplicaSettings { serve_paths: vec!["/v1/".into(), "/healthz".into(), "/metrics".into()], ..s.clone() };
    let a = sbatch_args("llm", &own, Kind::Supplemental, 18004, 1);
    assert!(a.last().unwrap().contains("--allow-path /v1/ --allow-path /healthz --allow-path /metrics --"), "{a:?}");
    // A class the policy reclaims immediately: its launcher cuts at
    // Slurm's SIGTERM; the baseline's protected class is not one.
    let agents = ReplicaSettings {
        supplemental_workload: "agents".into(),
        immediate_classes: vec!["agents".into()],
        ..s.clone()
    };
    let a = sbatch_args("llm", &agents, Kind::Supplemental, 18004, 1);
    assert!(a.last().unwrap().contains("--drain-timeout 30s --tls --reclaim immediate --"), "{a:?}");
    let a = sbatch_args("llm", &agents, Kind::Baseline, 18000, 1);
    assert!(!a.last().unwrap().contains("--reclaim"), "{a:?}");
    let a = sbatch_args("llm", &ReplicaSettings { launcher: "/a b/onepool".into(), ..s }, Kind::Baseline, 18000, 1);
    assert_eq!(a[2], "--workload=inference-baseline");
    assert!(a.last().unwrap().starts_with("exec '/a b/onepool' replica"), "{a:?}");
}

#[test]
fn bad_replica_settings_are_reported_at_their_place() {
    let src = r#"control_socket = "/tmp/x.sock"
[[endpoint]]
name = "llm"
listen = "127.0.0.1:0"
[endpoint.replicas]
command = "serve"
min = 3
max = 2
port_range = "9000"
target_per_replica = 0
poll_interval = "often"
"#;
    let e = crate::config::parse("t.toml", src).unwrap_err().to_string();
    for want in [
        "t.toml:8:7: error: replicas.max = 2 is below replicas.min = 3",
        "t.toml:9:14: error: port_range = \"9000\"",
        "t.toml:10:22: error: replicas.target_per_replica = 0",
        "t.toml:11:17: error: replicas.poll_interval",
    ] {
        assert!(e.contains(want), "{want:?} not in:\n{e}");
    }
    let s = settings();
    assert_eq!((s.baseline_workload.as_str(), s.supplemental_workload.as_str()), ("inference-baseline", "inference"));
    assert_eq!((s.poll_interval, s.output.as_str()), (Duration::from_secs(2), "/dev/null"));
}

/// Every Slurm call fails: for tests of what the controller does without Slurm.
struct NoSlurm;

impl Slurm for NoSlurm {
    fn submit(&self, _: &[&str]) -> Result<u32, SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
    fn cancel(&self, _: u32, _: Option<&str>) -> Result<(), SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
    fn update_job(&self, _: u32, _: &[(&str, &str)]) -> Result<(), SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
    fn nodes(&self) -> Result<Vec<onepool_slurm_commands::state::NodeInfo>, SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
    fn steps(&self, _: u32) -> Result<Vec<StepInfo>, SlurmError> {
        Err(SlurmError::NoJobId { cmd: "none".into(), output: "no Slurm in this test".into() })
    }
}

/// A cluster in memory for the controller's per-node logic: one running
/// job, its steps, and what the controller asked of it. (The same path
/// runs against the real cluster in tests/cluster/elastic.rs.)
#[derive(Default)]
struct ScriptedSlurm {
    jobs: Mutex<Vec<JobInfo>>,
    steps: Mutex<Vec<StepInfo>>,
    calls: Mutex<Vec<String>>,
    /// How often a user's jobs were read.
    reads: std::sync::atomic::AtomicUsize,
    /// What `scontrol show job` says of jobs that left the queue.
    ended: Mutex<HashMap<u32, onepool_slurm_commands::state::JobDetails>>,
    /// The id the next sbatch answers (100 when unset).
    next_id: Mutex<Option<u32>>,
}

impl Slurm for ScriptedSlurm {
    fn submit(&self, args: &[&str]) -> Result<u32, SlurmError> {
        self.calls.lock().unwrap().push(format!("sbatch {}", args.join(" ")));
        let mut next = self.next_id.lock().unwrap();
        let id = next.unwrap_or(100);
        if next.is_some() {
            *next = Some(id + 1);
        }
        Ok(id)
    }
    fn cancel(&self, job: u32, _: Option<&str>) -> Result<(), SlurmError> {
        self.calls.lock().unwrap().push(format!("scancel {job}"));
        Ok(())
    }
    fn update_job(&self, job: u32, settings: &[(&str, &str)]) -> Result<(), SlurmError> {
        let kv: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.calls.lock().unwrap().push(format!("scontrol update JobId={job} {}", kv.join(" ")));
        Ok(())
    }
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(self.jobs.lock().unwrap().clone())
    }
    fn user_jobs(&self, user: u32) -> Result<Vec<JobInfo>, SlurmError> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self.jobs.lock().unwrap().iter().filter(|j| j.user_id == user).cloned().collect())
    }
    fn nodes(&self) -> Result<Vec<onepool_slurm_commands::state::NodeInfo>, SlurmError> {
        let json = serde_json::json!({"nodes": (1..=4).map(|i| serde_json::json!({
            "name": format!("node{i}"), "state": "mixed", "address": "127.0.0.1",
        })).collect::<Vec<_>>()});
        Ok(onepool_slurm_commands::state::parse_nodes(&json.to_string()).unwrap())
    }
    fn steps(&self, _: u32) -> Result<Vec<StepInfo>, SlurmError> {
        Ok(self.steps.lock().unwrap().clone())
    }
    fn job_details(&self, job: u32) -> Result<Option<onepool_slurm_commands::state::JobDetails>, SlurmError> {
        if let Some(d) = self.ended.lock().unwrap().get(&job) {
            return Ok(Some(d.clone()));
        }
        let jobs = self.jobs.lock().unwrap();
        Ok(jobs.iter().find(|j| j.job_id == job).map(|j| onepool_slurm_commands::state::JobDetails {
            admin_comment: j.admin_comment.clone(),
            comment: j.comment.clone(),
            state: j.job_state.clone(),
            start_time: j.start_time,
            end_time: j.end_time,
            preempt_time: j.preempt_time,
            nodes: j.nodes.clone(),
            ..Default::default()
        }))
    }
}

fn running(id: u32, name: &str, nodes: &str, count: u32) -> JobInfo {
    let supp = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=llm";
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let uid = onepool_os::getuid();
    // Where each replica's launcher reported it listens (the slot's own
    // number here, so tests can tell replicas by port).
    let base = port_from_name("llm", name).unwrap_or(0);
    let mut note = onepool_launcher::conventions::ReplicaNote::default();
    for i in 0..count.max(1) {
        let slot = base + 2 * i as u16;
        note.set_port(slot, slot);
    }
    let json = serde_json::json!({"jobs": [{
        "job_id": id, "job_state": "RUNNING", "name": name, "user_id": uid,
        "admin_comment": supp, "comment": note.encode(), "nodes": nodes, "batch_host": "node1", "node_count": count,
        "start_time": now - 100, "time_limit": 60,
    }]});
    onepool_slurm_commands::state::parse_jobs(&json.to_string()).unwrap().remove(0)
}

/// An endpoint of up to 8 requests per replica, with metrics of its own.
fn test_endpoint(name: &str) -> Arc<onepool_router::endpoint::Endpoint> {
    onepool_router::endpoint::Endpoint::new(
        name,
        8,
        onepool_router::endpoint::QueueSettings { size: 10, timeout: Duration::from_secs(1) },
        Default::default(),
        Arc::new(onepool_router::metrics::Metrics::new()),
    )
}

fn step(job: u32, node: &str, port: u16) -> StepInfo {
    StepInfo {
        job_id: job,
        step: "0".into(),
        name: onepool_launcher::replica_group::step_name(port),
        nodes: node.into(),
    }
}

#[test]
fn member_ports_follow_the_steps_else_the_launcher_s_numbering() {
    let nodes: Vec<String> = ["node1", "node3"].iter().map(|s| s.to_string()).collect();
    // After a shrink released node2 (port 18002), the steps keep their ports.
    let steps = vec![("node1".to_string(), 18000), ("node3".to_string(), 18004)];
    assert_eq!(member_ports(18000, &nodes, &steps), [("node1".into(), 18000), ("node3".into(), 18004)]);
    // No steps yet: the launcher's numbering.
    assert_eq!(member_ports(18000, &nodes, &[]), [("node1".into(), 18000), ("node3".into(), 18002)]);
    // A node without a step never takes the port of one that has it.
    let steps = vec![("node3".to_string(), 18000)];
    assert_eq!(member_ports(18000, &nodes, &steps), [("node1".into(), 18002), ("node3".into(), 18000)]);
}

#[test]
fn a_per_node_job_scales_down_by_draining_one_replica_then_releasing_exactly_its_node() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.jobs.lock().unwrap() = vec![running(7, "onepool-llm-18000", "node[1-3]", 3)];
        *slurm.steps.lock().unwrap() = vec![step(7, "node1", 18000), step(7, "node2", 18002), step(7, "node3", 18004)];
        let s = ReplicaSettings {
            replicas_per_job: 3,
            min: 0,
            max: 3,
            target_per_replica: 4.0,
            // Short windows: the adopted replicas are kept only for the
            // first round, and the load below counts at once.
            scale_down_delay: Duration::from_millis(50),
            stable_window: Duration::from_millis(10),
            panic_window: Duration::from_millis(5),
            drain_timeout: Duration::from_millis(1),
            ..settings()
        };
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        assert!(c.jobs_view().iter().all(|j| j.phase == JobPhase::Serving), "{:?}", c.jobs_view());
        // Six requests in flight: two replicas' worth of three.
        let mut leases = Vec::new();
        for _ in 0..6 {
            leases.push(endpoint.acquire(&[]).await.unwrap());
        }
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(endpoint.snapshot().replicas.len(), 3, "one replica per node in the router");
        c.round().await.unwrap();
        let jobs = c.jobs_view();
        let draining: Vec<&ReplicaJob> = jobs.iter().filter(|j| j.phase == JobPhase::Draining).collect();
        assert_eq!(draining.len(), 1, "{jobs:?}");
        assert_ne!(draining[0].node.as_deref(), Some("node1"), "the batch host's replica goes last");
        let (port, node) = (draining[0].port, draining[0].node.clone().unwrap());
        // Its drain timed out (1 ms): the next round releases exactly its node.
        std::thread::sleep(Duration::from_millis(5));
        c.round().await.unwrap();
        let keep: Vec<&str> = ["node1", "node2", "node3"].into_iter().filter(|n| *n != node).collect();
        let calls = slurm.calls.lock().unwrap().clone();
        assert_eq!(calls, [format!("scontrol update JobId=7 NodeList={}", keep.join(","))]);
        assert!(!endpoint.snapshot().replicas.iter().any(|r| r.address.port() == port));
        // Slurm shrank the job: the replica leaves the controller's books.
        *slurm.jobs.lock().unwrap() = vec![running(7, "onepool-llm-18000", &keep.join(","), 2)];
        slurm.steps.lock().unwrap().retain(|s| s.nodes != node);
        c.round().await.unwrap();
        let left: Vec<u16> = c.jobs_view().iter().map(|j| j.port).collect();
        assert_eq!(left.len(), 2);
        assert!(!left.contains(&port));
        assert_eq!(view.lock().unwrap().shrunk, [(7, node)]);
        assert_eq!(slurm.calls.lock().unwrap().len(), 1, "nothing else was asked of Slurm");
        drop(leases);
    });
}

/// A per-node replica whose server dies while its job runs on is a failed
/// start by the launcher's note (issue #35), whether a poll saw its step
/// first or not; a step that ends without such a note (its node left the
/// job) is not one.
#[test]
fn a_per_node_replica_whose_server_died_is_a_failed_start_by_its_note() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let mut job = running(7, "onepool-llm-18000", "node[1-3]", 3);
        // node3's server died before any poll saw its step or its port.
        job.comment = "op1;L18000=18000;L18002=18002;E18004=exited%20with%20code%201".into();
        *slurm.jobs.lock().unwrap() = vec![job.clone()];
        *slurm.steps.lock().unwrap() = vec![step(7, "node1", 18000), step(7, "node2", 18002)];
        let s = ReplicaSettings { replicas_per_job: 3, min: 0, max: 3, ..settings() };
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        c.round().await.unwrap();
        let f = c.start_failures_view();
        assert_eq!(f.total, 1, "{:?}", f.last);
        let cause = f.last.unwrap().cause;
        assert_eq!(
            cause,
            "job 7's replica on node3 (slot 18004) ended before it served: the model server exited with code 1"
        );
        // node2's step is seen, then gone, and its note says its server was
        // killed (the router took it at once: no health checks here).
        job.comment = format!("{};E18002=killed%20by%20SIGSEGV", job.comment);
        *slurm.jobs.lock().unwrap() = vec![job.clone()];
        slurm.steps.lock().unwrap().retain(|s| s.nodes != "node2");
        c.round().await.unwrap();
        let f = c.start_failures_view();
        assert_eq!(f.total, 2);
        assert!(f.last.unwrap().cause.contains(
            "on node2 (slot 18002) ended within its job's first minutes of serving: the model server killed by SIGSEGV"
        ));
        // node1's step ends with no note of its server's end: no failure.
        slurm.steps.lock().unwrap().clear();
        c.round().await.unwrap();
        assert_eq!(c.start_failures_view().total, 2);
    });
}

#[test]
fn a_replica_whose_server_crashed_after_a_shrink_keeps_its_port_and_leaves_the_router() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        // node2 was released earlier: node3's replica still listens on the
        // port the launcher gave the third node (18004), not the second's.
        let mut job = running(7, "onepool-llm-18000", "node[1,3]", 2);
        job.comment = "op1;L18000=18000;L18002=18002;L18004=18004".into();
        *slurm.jobs.lock().unwrap() = vec![job];
        *slurm.steps.lock().unwrap() = vec![step(7, "node1", 18000), step(7, "node3", 18004)];
        let s = ReplicaSettings { replicas_per_job: 3, min: 0, max: 3, ..settings() };
        // No health checks: nothing but the controller takes a replica out.
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        let ports = |c: &Controller| -> Vec<(u16, &'static str)> {
            c.jobs_view().iter().map(|j| (j.port, j.phase.as_str())).collect()
        };
        assert_eq!(ports(&c), [(18000, "serving"), (18004, "serving")]);
        // node3's server crashed: its step is gone, the node stays in the job.
        slurm.steps.lock().unwrap().retain(|s| s.nodes != "node3");
        c.round().await.unwrap();
        let routed: Vec<u16> = endpoint.snapshot().replicas.iter().map(|r| r.address.port()).collect();
        assert_eq!(routed, [18000], "only the live replica is routed to; no guess at node3:18002");
        assert!(ports(&c).iter().all(|(p, _)| *p != 18002), "{:?}", c.jobs_view());
    });
}

#[test]
fn preemptions_replica_phases_and_slurm_calls_are_exported() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let mut victim = running(7, "onepool-llm-18000", "node1", 1);
        victim.preempt_time = now;
        victim.end_time = now + 60;
        *slurm.jobs.lock().unwrap() = vec![running(8, "onepool-llm-18002", "node2", 1)];
        let s = ReplicaSettings { min: 0, max: 2, ..settings() };
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        let exported = |c: &Controller| {
            let v = ControllerView { jobs: c.jobs_view(), desired: 2, ..Default::default() };
            c.export(&v);
            endpoint.metrics().encode()
        };
        c.round().await.unwrap();
        slurm.jobs.lock().unwrap().push(victim.clone());
        // Picked as a victim: shown at once, counted from its record when
        // it ends (issue #35), however many polls saw it.
        c.round().await.unwrap();
        c.round().await.unwrap();
        let m = exported(&c);
        assert!(!m.contains("onepool_replica_preemptions_total{"), "counted before its end:\n{m}");
        for want in [
            r#"onepool_replica_slurm_calls_total{endpoint="llm",call="squeue",outcome="ok"} 3"#,
            r#"onepool_replica_jobs{endpoint="llm",kind="supplemental",phase="serving"} 1"#,
            // Out of the router at once, and left to its launcher: it got
            // Slurm's notice and ends the job when what it serves is done
            // (the router's count of 0 is only what the router sent it).
            r#"onepool_replica_jobs{endpoint="llm",kind="supplemental",phase="draining"} 1"#,
            r#"onepool_replica_jobs{endpoint="llm",kind="supplemental",phase="cancelled"} 0"#,
            r#"onepool_replica_jobs{endpoint="llm",kind="baseline",phase="serving"} 0"#,
            r#"onepool_replica_desired{endpoint="llm"} 2"#,
        ] {
            assert!(m.contains(want), "{want} not in:\n{m}");
        }
        assert!(!m.contains(r#"call="scancel""#), "no scancel of the victim:\n{m}");
        // It drained and ended: its record says Slurm picked it.
        slurm.jobs.lock().unwrap().retain(|j| j.job_id != 7);
        slurm.ended.lock().unwrap().insert(7, ended(&victim, "COMPLETED", now + 2));
        c.round().await.unwrap();
        c.round().await.unwrap();
        let m = exported(&c);
        for want in [
            r#"onepool_replica_preemptions_total{endpoint="llm"} 1"#,
            r#"onepool_replica_reclaims_total{endpoint="llm",mode="graceful"} 1"#,
        ] {
            assert!(m.contains(want), "{want} not in:\n{m}");
        }
        // A failed call is counted as such.
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, settings(), Arc::new(NoSlurm));
        assert!(c.round().await.is_err());
        let m = endpoint.metrics().encode();
        let want = r#"onepool_replica_slurm_calls_total{endpoint="llm",call="squeue",outcome="failed"} 1"#;
        assert!(m.contains(want), "{want} not in:\n{m}");
    });
}

#[test]
fn controllers_of_several_endpoints_poll_in_step_and_share_their_reads() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let inner = ScriptedSlurm::default();
        *inner.jobs.lock().unwrap() = vec![running(7, "onepool-llm-18000", "node1", 1)];
        let poll = Duration::from_millis(100);
        let slurm = Arc::new(onepool_slurm_commands::adapter::Coalesced::new(inner, poll / 4));
        let (tx, rx) = watch::channel(false);
        let mut views = Vec::new();
        let mut tasks = Vec::new();
        for name in ["llm", "chat", "code"] {
            let endpoint = test_endpoint(name);
            let s = ReplicaSettings { min: 0, max: 2, poll_interval: poll, ..settings() };
            let (c, view) = Controller::new(name, endpoint, false, s, slurm.clone());
            views.push(view);
            tasks.push(tokio::spawn(c.run(rx.clone())));
        }
        tokio::time::sleep(Duration::from_millis(1050)).await;
        tx.send(true).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let polls: u64 = views.iter().map(|v| v.lock().unwrap().rounds).sum();
        let reads = slurm.inner.reads.load(std::sync::atomic::Ordering::Relaxed) as u64;
        // ~11 beats of 3 controllers (fewer on a starved machine: missed
        // beats are skipped); one read per beat when in step.
        assert!(polls >= 15, "{polls} polls");
        assert!(reads * 2 <= polls, "{reads} reads of Slurm for {polls} polls: the controllers did not share");
    });
}

#[test]
fn a_per_node_job_asks_for_its_replicas_nodes_and_runs_one_step_each() {
    let s = ReplicaSettings { replicas_per_job: 4, transport: crate::config::ReplicaTransport::Tls, ..settings() };
    let a = sbatch_args("llm", &s, Kind::Supplemental, 18010, 3);
    let text = a.join(" ");
    for want in [
        "-N3",
        "--ntasks-per-node=1",
        "--gpus-per-node=2",
        "--no-kill",
        "--no-requeue",
        "--dependency=singleton",
        "--signal=B:URG@30",
    ] {
        assert!(a.iter().any(|x| x == want), "{want} not in {text}");
    }
    assert!(!text.contains("--gpus=2"), "{text}");
    assert!(
        a.last().unwrap().starts_with(
            "exec /opt/onepool/bin/onepool replica --per-node --listen node:0 --slot 18010 --drain-timeout 30s --tls -- "
        ),
        "{text}"
    );
}

#[test]
fn load_comes_from_the_replicas_metrics_where_readable_else_from_the_router() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // A replica whose metrics say 9 requests waiting + 3 running.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let with_metrics = listener.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let body = "vllm:num_requests_waiting{m=\"x\"} 9\nvllm:num_requests_running{m=\"x\"} 3\n";
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                s.write_all(head.as_bytes()).await.unwrap();
                s.write_all(body.as_bytes()).await.unwrap();
            }
        });
        // One that serves no metrics (nothing listens).
        let without = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let endpoint = test_endpoint("llm");
        endpoint.add(with_metrics, None, true).unwrap();
        endpoint.add(without, None, true).unwrap();
        // Two requests in flight on each, as the router counts them.
        let leases: Vec<_> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(endpoint.acquire(&[]).await.unwrap());
            }
            v
        };
        let s = ReplicaSettings {
            load_metrics: vec!["vllm:num_requests_waiting".into(), "vllm:num_requests_running".into()],
            poll_interval: Duration::from_millis(500),
            ..settings()
        };
        let (c, _) = Controller::new("llm", endpoint.clone(), false, s.clone(), Arc::new(NoSlurm));
        let snap = endpoint.snapshot();
        assert_eq!(c.load(&snap).await, (12.0 + 2.0, Some((1, 2))), "12 from the metrics, 2 from the router");
        // Without load_metrics: the router's count only.
        let (c, _) = Controller::new(
            "llm",
            endpoint.clone(),
            false,
            ReplicaSettings { load_metrics: vec![], ..s },
            Arc::new(NoSlurm),
        );
        assert_eq!(c.load(&snap).await, (4.0, None));
        drop(leases);
    });
}

/// In audit mode job_submit/onepool records nothing: the controller's own
/// job comes back unrecognised. It stops after one submission, says why,
/// and never submits again (the loop this replaces submitted every poll).
#[test]
fn a_submitted_job_that_comes_back_unrecognised_stops_replica_control() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let slurm = Arc::new(ScriptedSlurm::default());
        let s = ReplicaSettings { min: 1, max: 1, ..settings() };
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), false, s, slurm.clone());
        c.round().await.unwrap();
        let submitted = || slurm.calls.lock().unwrap().iter().filter(|c| c.starts_with("sbatch")).count();
        assert_eq!(submitted(), 1);
        // ScriptedSlurm answers job 100 to every sbatch; it now shows up
        // with no record at all.
        let mut j = running(100, "onepool-llm-18000", "node1", 1);
        j.admin_comment.clear();
        slurm.jobs.lock().unwrap().push(j);
        for _ in 0..5 {
            let e = c.round().await.unwrap_err();
            assert!(matches!(e, RoundError::Halted(_)) && !e.is_retryable(), "{e:?}");
            let e = e.to_string();
            assert!(e.contains("replica control stopped: job 100 that onepoold submitted came back without job_submit/onepool's record"), "{e}");
            assert!(e.contains("audit mode"), "{e}");
        }
        assert_eq!(submitted(), 1, "{:?}", slurm.calls.lock().unwrap());
    });
}

#[test]
fn a_replica_adopted_after_a_restart_is_not_replaced_for_having_started_long_ago() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        // Running for 100 s, far past startup_timeout: the model is loaded;
        // a restarted onepoold has not yet seen it pass a health check.
        *slurm.jobs.lock().unwrap() = vec![running(7, "onepool-llm-18000", "node1", 1)];
        let s = ReplicaSettings { min: 0, max: 1, startup_timeout: Duration::from_secs(10), ..settings() };
        // With health checks (none has run): the replica is "starting".
        let (mut c, _) = Controller::new("llm", endpoint.clone(), true, s, slurm.clone());
        for _ in 0..3 {
            c.round().await.unwrap();
        }
        assert_eq!(c.jobs_view().iter().map(|j| (j.job, j.phase.as_str())).collect::<Vec<_>>(), [(7, "starting")]);
        assert!(
            slurm.calls.lock().unwrap().is_empty(),
            "nothing cancelled or submitted: {:?}",
            slurm.calls.lock().unwrap()
        );
    });
}

fn queued(id: u32, name: &str, uid: u32, comment: &str, qos: &str, reason: &str) -> JobInfo {
    let json = serde_json::json!({"jobs": [{
        "job_id": id, "job_state": "PENDING", "name": name, "user_id": uid, "admin_comment": comment,
        "partition": "gpu", "qos": qos, "state_reason": reason,
    }]});
    onepool_slurm_commands::state::parse_jobs(&json.to_string()).unwrap().remove(0)
}

#[test]
fn warm_headroom_is_added_while_nobody_waits_and_withdrawn_when_a_job_does() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let uid = onepool_os::getuid();
        let base = "onepool:class=inference-baseline;tier=protected;endpoint=llm";
        let warm = "onepool:class=inference-warm;tier=flexible;reclaim=graceful;drain=30s;endpoint=llm";
        let baseline = JobInfo { start_time: 1, nodes: "node1".into(), ..job(7, "onepool-llm-18000", uid, base) };
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.jobs.lock().unwrap() = vec![baseline.clone()];
        let mut s = ReplicaSettings { max: 3, ..settings() };
        s.warm = Some(crate::config::WarmSettings {
            workload: "inference-warm".into(),
            spec: onepool_decisions::replicas::WarmSpec { replicas: 1, fraction: 0.0 },
            scope: crate::config::PoolScope {
                partitions: vec!["gpu".into()],
                warm_qos: vec!["op-inference-warm".into()],
            },
        });
        let endpoint = test_endpoint("llm");
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        // Another endpoint's warm replica waiting is nobody wanting GPUs.
        slurm.jobs.lock().unwrap().push(queued(8, "onepool-x-18000", uid, "", "op-inference-warm", "Resources"));
        c.round().await.unwrap();
        let calls = slurm.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(calls[0].starts_with("sbatch -J onepool-llm-18002 --workload=inference-warm "), "{calls:?}");
        let v = view.lock().unwrap().clone();
        assert_eq!((v.headroom, v.gpus_wanted), (Some(1), Some(false)));
        // Warm replicas are exported under their own kind.
        c.export(&ControllerView { jobs: c.jobs_view(), ..Default::default() });
        let m = endpoint.metrics().encode();
        for want in [
            r#"onepool_replica_jobs{endpoint="llm",kind="warm",phase="pending"} 1"#,
            r#"onepool_replica_jobs{endpoint="llm",kind="warm",phase="serving"} 0"#,
        ] {
            assert!(m.contains(want), "{want} not in:\n{m}");
        }
        // The warm job waits for GPUs, and now so does a training job: the
        // warm one is withdrawn and no other is submitted.
        let pending_warm = queued(100, "onepool-llm-18002", uid, warm, "op-inference-warm", "Resources");
        let training = queued(9, "train", uid + 1, "", "op-training", "Resources");
        *slurm.jobs.lock().unwrap() = vec![baseline.clone(), pending_warm.clone(), training];
        c.round().await.unwrap();
        assert_eq!(slurm.calls.lock().unwrap()[1..], ["scancel 100"]);
        assert_eq!(view.lock().unwrap().gpus_wanted, Some(true));
        // The training job started elsewhere; what waits now is held by a
        // dependency and wants no GPUs yet: the headroom comes back.
        let held = queued(10, "eval", uid + 1, "", "op-agents", "Dependency");
        *slurm.jobs.lock().unwrap() = vec![baseline, held];
        c.round().await.unwrap();
        let calls = slurm.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 3, "{calls:?}");
        // In the lowest free slot again: the withdrawn job's.
        assert!(calls[2].starts_with("sbatch -J onepool-llm-18002 --workload=inference-warm "), "{calls:?}");
    });
}

/// Issue #25: a replica is routed to where its launcher reported it
/// listens (the job's comment), never to the port in its name, and not at
/// all before the report.
#[test]
fn replicas_are_routed_where_their_launcher_reported_not_by_their_name() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let mut job = running(7, "onepool-llm-18000", "node1", 1);
        job.comment = String::new();
        job.admin_comment = "onepool:class=inference-baseline;tier=protected;endpoint=llm".into();
        *slurm.jobs.lock().unwrap() = vec![job.clone()];
        let s = ReplicaSettings { min: 1, max: 1, ..settings() };
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        assert!(endpoint.snapshot().replicas.is_empty(), "no report yet: not routed");
        assert_eq!(c.jobs_view()[0].phase, JobPhase::Starting);
        // A comment that is not a note (the job's user could write one by
        // hand) routes nothing either.
        job.comment = "listening on 18000".into();
        *slurm.jobs.lock().unwrap() = vec![job.clone()];
        c.round().await.unwrap();
        assert!(endpoint.snapshot().replicas.is_empty());
        job.comment = "op1;L18000=41234".into();
        *slurm.jobs.lock().unwrap() = vec![job.clone()];
        c.round().await.unwrap();
        let routed: Vec<u16> = endpoint.snapshot().replicas.iter().map(|r| r.address.port()).collect();
        assert_eq!(routed, [41234]);
        assert_eq!(c.jobs_view()[0].port, 18000, "the slot still names it");
        assert!(matches!(
            endpoint.conns_of(endpoint.snapshot().replicas[0].address).unwrap().transport(),
            Transport::Plain
        ));

        // With transport = "tls" (the default) a port without its
        // certificate's fingerprint routes nothing; with it, every
        // connection to the replica is pinned to that certificate.
        let endpoint = test_endpoint("llm");
        let s = ReplicaSettings { min: 1, max: 1, transport: crate::config::ReplicaTransport::Tls, ..settings() };
        let (mut c, _) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        assert!(endpoint.snapshot().replicas.is_empty(), "no fingerprint: not routed");
        let pin = onepool_launcher::hop_tls::Fingerprint([0x3c; 32]);
        job.comment = format!("op1;L18000=41234;F18000={pin}");
        *slurm.jobs.lock().unwrap() = vec![job];
        c.round().await.unwrap();
        let routed: Vec<_> = endpoint.snapshot().replicas.iter().map(|r| r.address).collect();
        assert_eq!(routed.iter().map(|a| a.port()).collect::<Vec<_>>(), [41234]);
        match endpoint.conns_of(routed[0]).unwrap().transport() {
            Transport::Pinned(client) => assert_eq!(client.pin, pin),
            other => panic!("{other:?}"),
        }
    });
}

/// Issue #24: replica jobs that die before serving are failed starts; the
/// endpoint backs off (no submission until the wait passed, then one probe
/// at a time), says why in its view and metrics, and a retry request ends
/// the wait at once.
#[test]
fn failed_starts_back_off_show_their_cause_and_end_on_request() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.next_id.lock().unwrap() = Some(100);
        let s = ReplicaSettings { min: 1, max: 1, ..settings() };
        // Health-checked (by nobody here): a routed replica stays "starting".
        let (mut c, view) = Controller::new("llm", endpoint.clone(), true, s, slurm.clone());
        let sbatches = |s: &ScriptedSlurm| s.calls.lock().unwrap().iter().filter(|c| c.starts_with("sbatch")).count();
        c.round().await.unwrap();
        assert_eq!(sbatches(&slurm), 1);
        let base = "onepool:class=inference-baseline;tier=protected;endpoint=llm";
        let mut j = running(100, "onepool-llm-18000", "node1", 1);
        j.admin_comment = base.into();
        *slurm.jobs.lock().unwrap() = vec![j];
        c.round().await.unwrap();
        // It dies of SIGSEGV before serving.
        slurm.jobs.lock().unwrap().clear();
        slurm.ended.lock().unwrap().insert(
            100,
            onepool_slurm_commands::state::JobDetails {
                admin_comment: base.into(),
                comment: "op1;L18000=18000;E18000=killed%20by%20SIGSEGV%3B%20last%20output%3A%0Aggml_backend_amx_mul_mat".into(),
                state: "FAILED".into(),
                exit_code: "139:0".into(),
                reason: "NonZeroExitCode".into(),
                ..Default::default()
            },
        );
        c.round().await.unwrap();
        c.round().await.unwrap();
        assert_eq!(sbatches(&slurm), 1, "no replacement during the back-off: {:?}", slurm.calls.lock().unwrap());
        let f = c.start_failures_view();
        assert_eq!((f.in_a_row, f.total, f.backing_off), (1, 1, true));
        let next = f.next_attempt.unwrap();
        assert!((9..=11).contains(&next.saturating_sub(unix_now())), "{next}");
        let cause = f.last.unwrap().cause;
        assert!(
            cause.starts_with("job 100 ended before it served: FAILED, exit code 139 (NonZeroExitCode); the model server killed by SIGSEGV; last output:\nggml_backend_amx_mul_mat"),
            "{cause}"
        );
        // A job that failed between two polls (never seen running) counts too.
        view.lock().unwrap().retry_requested = true;
        c.round().await.unwrap();
        assert_eq!(sbatches(&slurm), 2, "the retry ends the wait");
        slurm.ended.lock().unwrap().insert(
            101,
            onepool_slurm_commands::state::JobDetails { state: "FAILED".into(), exit_code: "1:0".into(), ..Default::default() },
        );
        c.round().await.unwrap();
        let f = c.start_failures_view();
        assert_eq!((f.in_a_row, f.total), (1, 2), "a retry starts the count again; the total stays");
        assert!(f.last.unwrap().cause.contains("its launcher never reported a port"));
        let text = endpoint.metrics().encode();
        assert!(text.contains("onepool_replica_failed_starts_total{endpoint=\"llm\"} 2"), "{text}");
    });
}

/// Slurm's record of a replica job that ended in `state` at `end`.
fn ended(j: &JobInfo, state: &str, end: u64) -> onepool_slurm_commands::state::JobDetails {
    onepool_slurm_commands::state::JobDetails {
        admin_comment: j.admin_comment.clone(),
        comment: j.comment.clone(),
        state: state.into(),
        exit_code: "0:0".into(),
        start_time: j.start_time,
        end_time: end,
        preempt_time: j.preempt_time,
        nodes: j.nodes.clone(),
        ..Default::default()
    }
}

/// The demo's failure (issue #35): an idle victim that Slurm picked and
/// that drained and ended between two polls, never seen being preempted,
/// and a taker that also ran and ended between two polls. Both are found
/// from Slurm's records, whatever the poll interval; a job that ended
/// without a pick (completed, cancelled by its user) is no reclaim.
#[test]
fn a_reclaim_no_poll_saw_is_counted_from_the_victim_s_record_with_its_taker() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let idle = running(7, "onepool-llm-18000", "node2", 1);
        let other = running(8, "onepool-llm-18002", "node3", 1);
        *slurm.jobs.lock().unwrap() = vec![idle.clone(), other.clone()];
        let s = ReplicaSettings { min: 0, max: 2, ..settings() };
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        // Between two polls: Slurm picks 7, it drains in no time and ends
        // COMPLETED; the taker starts on its node, runs and ends too. 8
        // ends on its own.
        let mut picked = idle.clone();
        picked.preempt_time = now;
        let mut record = ended(&picked, "COMPLETED", now);
        record.comment = format!("{};D18000={}000,10,0,0,0,2", record.comment, now);
        slurm.ended.lock().unwrap().insert(7, record);
        slurm.ended.lock().unwrap().insert(8, ended(&other, "CANCELLED", now));
        let mut taker = running(10, "training", "node2", 1);
        (taker.user_id, taker.submit_time, taker.eligible_time, taker.start_time, taker.job_state) =
            (idle.user_id + 1, now - 3, now - 3, now, "COMPLETED".into());
        // Issue #52: another user's job that depends on the replica job,
        // on its node, starts in the same second: released by the victim's
        // end, it became eligible only then, after the taker.
        let mut dependent = running(9, "timed", "node2", 1);
        (dependent.user_id, dependent.submit_time, dependent.eligible_time, dependent.start_time) =
            (idle.user_id + 2, now - 100, now, now);
        *slurm.jobs.lock().unwrap() = vec![dependent, taker];
        c.round().await.unwrap();
        c.round().await.unwrap();
        let v = view.lock().unwrap();
        assert_eq!(v.reclaims.len(), 1, "{:?}", v.reclaims);
        let r = &v.reclaims[0];
        assert_eq!(
            (r.job, r.mode, r.at, r.released_after_s, r.taker, r.time_to_capacity_s),
            (7, ReclaimMode::Graceful, now, 0.0, Some(10), Some(3)),
            "{r:?}"
        );
        let m = endpoint.metrics().encode();
        for want in [
            r#"onepool_replica_reclaims_total{endpoint="llm",mode="graceful"} 1"#,
            r#"onepool_replica_reclaim_time_to_capacity_seconds_count{endpoint="llm",mode="graceful"} 1"#,
        ] {
            assert!(m.contains(want), "{want} not in:\n{m}");
        }
        assert_eq!(c.start_failures_view().total, 0, "a reclaim is no failed start");
    });
}

/// A record that cannot be read yet (slurmctld busy) delays the count to a
/// later poll; it is not lost.
#[test]
fn an_ended_job_s_record_that_cannot_be_read_is_read_at_a_later_poll() {
    struct Flaky {
        inner: ScriptedSlurm,
        fail: std::sync::atomic::AtomicBool,
    }
    impl Slurm for Flaky {
        fn submit(&self, a: &[&str]) -> Result<u32, SlurmError> {
            self.inner.submit(a)
        }
        fn cancel(&self, j: u32, s: Option<&str>) -> Result<(), SlurmError> {
            self.inner.cancel(j, s)
        }
        fn update_job(&self, j: u32, s: &[(&str, &str)]) -> Result<(), SlurmError> {
            self.inner.update_job(j, s)
        }
        fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
            self.inner.jobs()
        }
        fn nodes(&self) -> Result<Vec<onepool_slurm_commands::state::NodeInfo>, SlurmError> {
            self.inner.nodes()
        }
        fn steps(&self, u: u32) -> Result<Vec<StepInfo>, SlurmError> {
            self.inner.steps(u)
        }
        fn job_details(&self, job: u32) -> Result<Option<onepool_slurm_commands::state::JobDetails>, SlurmError> {
            if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(SlurmError::NoJobId { cmd: "scontrol".into(), output: "slurmctld busy".into() });
            }
            self.inner.job_details(job)
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(Flaky { inner: ScriptedSlurm::default(), fail: false.into() });
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let victim = running(7, "onepool-llm-18000", "node2", 1);
        *slurm.inner.jobs.lock().unwrap() = vec![victim.clone()];
        let s = ReplicaSettings { min: 0, max: 1, ..settings() };
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        let mut picked = victim.clone();
        picked.preempt_time = now;
        slurm.inner.ended.lock().unwrap().insert(7, ended(&picked, "PREEMPTED", now));
        slurm.inner.jobs.lock().unwrap().clear();
        slurm.fail.store(true, std::sync::atomic::Ordering::Relaxed);
        c.round().await.unwrap();
        c.round().await.unwrap();
        assert!(view.lock().unwrap().reclaims.is_empty());
        slurm.fail.store(false, std::sync::atomic::Ordering::Relaxed);
        c.round().await.unwrap();
        let v = view.lock().unwrap();
        assert_eq!(v.reclaims.iter().map(|r| (r.job, r.mode)).collect::<Vec<_>>(), [(7, ReclaimMode::Graceful)]);
    });
}

/// A reclaimed replica's taker (issue #26): the first job of another user
/// that started on its nodes after Slurm's pick, with its time from
/// submission to start; a job of onepoold's own, or one that started
/// before the pick, is not it.
#[test]
fn the_job_that_took_a_reclaimed_replicas_gpus_is_found_with_its_time_to_capacity() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let mut victim = running(7, "onepool-llm-18000", "node2", 1);
        victim.preempt_time = now;
        victim.end_time = now + 30;
        slurm.ended.lock().unwrap().insert(7, ended(&victim, "COMPLETED", now + 1));
        let mut before = running(8, "someone-elses", "node2", 1);
        (before.user_id, before.submit_time, before.start_time) = (victim.user_id + 1, now - 500, now - 400);
        *slurm.jobs.lock().unwrap() = vec![victim.clone(), before.clone()];
        let s = ReplicaSettings { min: 0, max: 1, ..settings() };
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        // The victim is gone; onepoold's own next replica and the taker
        // started on its node.
        let mut ours = running(9, "onepool-llm-18002", "node2", 1);
        (ours.submit_time, ours.start_time) = (now - 1, now + 1);
        let mut taker = running(10, "training", "node2", 1);
        (taker.user_id, taker.submit_time, taker.start_time) = (victim.user_id + 2, now - 2, now + 2);
        *slurm.jobs.lock().unwrap() = vec![before, ours, taker];
        c.round().await.unwrap();
        let v = view.lock().unwrap();
        assert_eq!(v.reclaims.len(), 1, "{:?}", v.reclaims);
        let r = &v.reclaims[0];
        assert_eq!(
            (r.job, r.mode, r.taker, r.time_to_capacity_s),
            (7, ReclaimMode::Graceful, Some(10), Some(4)),
            "{r:?}"
        );
    });
}

#[test]
fn an_advisory_endpoint_says_each_decision_once_and_asks_nothing_of_slurm() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let s = ReplicaSettings {
            advisory: true,
            min: 1,
            max: 3,
            target_per_replica: 4.0,
            scale_down_delay: Duration::from_millis(1),
            stable_window: Duration::from_millis(10),
            panic_window: Duration::from_millis(5),
            ..settings()
        };
        let dir = std::env::temp_dir().join(format!("onepool-advisory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("decisions.jsonl");
        let _ = std::fs::remove_file(&path);
        let metrics = endpoint.metrics().clone();
        let log = onepool_router::line_log::LineLog::start(
            "decision log",
            onepool_router::line_log::LineLogSettings { path: path.clone(), max_file_bytes: 1 << 20, keep_files: 1 },
            metrics.decision_log_dropped.clone(),
        )
        .unwrap();
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.set_decision_log(log);
        assert!(view.lock().unwrap().advisory);
        let counted = |action: &str, mode: &str| {
            let l = onepool_router::metrics::DecisionLabels {
                endpoint: "llm".into(),
                action: action.into(),
                mode: mode.into(),
            };
            metrics.decisions.get_or_create(&l).get()
        };

        // Nothing serves: min wants a baseline replica, every round, said once.
        for _ in 0..3 {
            c.round().await.unwrap();
        }
        assert_eq!(view.lock().unwrap().advised, ["submit baseline: min = 1 baseline replicas, 0 live"]);
        assert_eq!(counted("submit", "advisory"), 1);

        // The admin's own replica serves: it counts as the baseline.
        endpoint.add("10.0.0.9:8000".parse().unwrap(), None, true).unwrap();
        c.round().await.unwrap();
        assert!(view.lock().unwrap().advised.is_empty(), "{:?}", view.lock().unwrap().advised);

        // Eight requests on it: two replicas' worth; each wanted once more.
        let mut leases = Vec::new();
        for _ in 0..8 {
            leases.push(endpoint.acquire(&[]).await.unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
        c.round().await.unwrap();
        c.round().await.unwrap();
        let advised = view.lock().unwrap().advised.clone();
        assert_eq!(advised, ["submit supplemental: the load wants 2 replicas, 1 live (1 serving)"]);
        assert_eq!(counted("submit", "advisory"), 2);
        assert_eq!(counted("submit", "act"), 0);
        assert!(slurm.calls.lock().unwrap().is_empty(), "nothing asked of Slurm: {:?}", slurm.calls.lock().unwrap());

        // The decision log has both, as the report reads them.
        drop(c);
        let mut text = String::new();
        for _ in 0..100 {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let entries: Vec<onepool_decisions::decision_log::DecisionEntry> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(entries.len(), 2, "{text}");
        assert_eq!((entries[0].kind.as_str(), entries[1].kind.as_str()), ("baseline", "supplemental"));
        assert!(entries.iter().all(|e| e.mode == onepool_decisions::decision_log::DecisionMode::Advisory));
        assert_eq!((entries[1].desired, entries[1].serving), (2, 1));
        drop(leases);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_request_at_zero_replicas_submits_the_first_without_waiting_for_the_poll() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        // A poll a minute: only the request can explain a submission soon.
        let s = ReplicaSettings { min: 0, max: 2, poll_interval: Duration::from_secs(60), ..settings() };
        let (c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        let (stop, stopped) = watch::channel(false);
        let run = tokio::spawn(c.run(stopped));
        // The first beat polls at once; then nothing is wanted.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(slurm.calls.lock().unwrap().is_empty(), "{:?}", slurm.calls.lock().unwrap());
        let e = endpoint.clone();
        let waiting = tokio::spawn(async move { e.acquire(&[]).await.is_ok() });
        let t = Instant::now();
        while !slurm.calls.lock().unwrap().iter().any(|c| c.starts_with("sbatch")) {
            let v = view.lock().unwrap().clone();
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "no submission within 5 s of the request: {} rounds, desired {}, load {}, error {:?}",
                v.rounds,
                v.desired,
                v.load,
                v.last_error
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sbatches = || slurm.calls.lock().unwrap().iter().filter(|c| c.starts_with("sbatch")).count();
        assert_eq!(sbatches(), 1);
        // Slurm has it, waiting for GPUs.
        let mut pending = running(100, "onepool-llm-18000", "", 1);
        pending.job_state = "PENDING".into();
        *slurm.jobs.lock().unwrap() = vec![pending];
        // The job is pending: more requests wake nobody, and nothing more is submitted.
        for _ in 0..3 {
            let e = endpoint.clone();
            tokio::spawn(async move { e.acquire(&[]).await.is_ok() });
        }
        // While they wait, polls come once a second (a quarter of the
        // poll interval, at most 1 s), not once a minute, and not more.
        let reads = || slurm.reads.load(std::sync::atomic::Ordering::Relaxed);
        let before = reads();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let polls = reads() - before;
        assert!((2..=3).contains(&polls), "{polls} polls in 2.5 s while requests wait at zero replicas");
        assert_eq!(sbatches(), 1, "{:?}", slurm.calls.lock().unwrap());
        stop.send(true).unwrap();
        run.await.unwrap();
        waiting.abort();
    });
}

#[test]
fn a_missed_time_to_first_byte_target_adds_a_replica_the_in_flight_rule_would_not() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = test_endpoint("llm");
        let slurm = Arc::new(ScriptedSlurm::default());
        let mut baseline = running(7, "onepool-llm-18000", "node1", 1);
        baseline.admin_comment = "onepool:class=inference-baseline;tier=protected;endpoint=llm".into();
        *slurm.jobs.lock().unwrap() = vec![baseline];
        let mut s = ReplicaSettings { min: 1, max: 3, target_per_replica: 8.0, ..settings() };
        s.latency = Some(onepool_decisions::latency::LatencyTargets {
            ttft_p99: Some(Duration::from_millis(500)),
            ..Default::default()
        });
        let (mut c, view) = Controller::new("llm", endpoint.clone(), false, s, slurm.clone());
        c.round().await.unwrap();
        assert_eq!(endpoint.snapshot().replicas.len(), 1, "the baseline replica serves: {:?}", endpoint.snapshot());
        // One request at a time (the in-flight rule wants one replica), but
        // each waits 2 s for its first byte.
        assert!(slurm.calls.lock().unwrap().is_empty(), "{:?}", slurm.calls.lock().unwrap());
        for i in 0..20 {
            let lease = endpoint.acquire(&[]).await.unwrap_or_else(|e| panic!("request {i}: {e:?}"));
            lease.first_byte(Duration::from_secs(2));
        }
        c.round().await.unwrap();
        let v = view.lock().unwrap().clone();
        assert_eq!(v.desired, 2, "{v:?}");
        assert_eq!(v.latency.as_deref(), Some("ttft p99 2.0 s > target 500 ms over 20 requests: 1 -> 2"));
        let calls = slurm.calls.lock().unwrap().clone();
        assert!(calls.len() == 1 && calls[0].starts_with("sbatch -J onepool-llm-"), "{calls:?}");
        let labels = onepool_router::metrics::LatencyLabels { endpoint: "llm".into(), what: "ttft".into() };
        assert_eq!(endpoint.metrics().latency_p99.get_or_create(&labels).get(), 2.0);
    });
}

const BASELINE: &str = "onepool:class=inference-baseline;tier=protected;endpoint=llm";
const SUPPLEMENTAL: &str = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=llm";

/// A replica job running in `slot` with `record`, serving once routed.
fn running_in(id: u32, slot: u16, record: &str) -> JobInfo {
    JobInfo { admin_comment: record.into(), ..running(id, &format!("onepool-llm-{slot}"), "node1", 1) }
}

/// A replica job of ours waiting in `slot`: for GPUs, or (`Dependency`)
/// behind another job of its name.
fn pending_in(id: u32, slot: u16, record: &str, reason: &str) -> JobInfo {
    queued(id, &format!("onepool-llm-{slot}"), onepool_os::getuid(), record, "op-inference", reason)
}

fn scancels(slurm: &ScriptedSlurm) -> Vec<String> {
    slurm.calls.lock().unwrap().iter().filter(|c| c.starts_with("scancel")).cloned().collect()
}

fn sbatches(slurm: &ScriptedSlurm) -> Vec<String> {
    slurm.calls.lock().unwrap().iter().filter(|c| c.starts_with("sbatch")).cloned().collect()
}

/// Issue #37: a second onepoold acting at once (or one that lost its
/// state) puts a second job in a slot. Slurm's singleton dependency holds
/// it; the controller keeps the running job, else the oldest, cancels the
/// other pending ones, and never cancels a running one for this alone.
#[test]
fn a_second_job_in_a_slot_is_cancelled_and_the_running_one_kept() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // The other instance's job waits behind the running one.
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.jobs.lock().unwrap() =
            vec![running_in(7, 18000, BASELINE), pending_in(9, 18000, BASELINE, "Dependency")];
        let s = ReplicaSettings { min: 1, max: 1, ..settings() };
        // Advisory: said, never done.
        let advisory = ReplicaSettings { advisory: true, ..s.clone() };
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), false, advisory, slurm.clone());
        c.round().await.unwrap();
        assert!(slurm.calls.lock().unwrap().is_empty(), "{:?}", slurm.calls.lock().unwrap());
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), false, s.clone(), slurm.clone());
        c.round().await.unwrap();
        assert_eq!(slurm.calls.lock().unwrap()[..], ["scancel 9"]);
        // It left the queue, cancelled: no failed start, nothing submitted.
        let gone = pending_in(9, 18000, BASELINE, "Dependency");
        slurm.ended.lock().unwrap().insert(9, ended(&gone, "CANCELLED", unix_now()));
        *slurm.jobs.lock().unwrap() = vec![running_in(7, 18000, BASELINE)];
        for _ in 0..3 {
            c.round().await.unwrap();
        }
        assert_eq!(slurm.calls.lock().unwrap()[..], ["scancel 9"]);
        assert_eq!(c.start_failures_view().total, 0);
        assert_eq!(c.jobs_view().iter().map(|j| j.job).collect::<Vec<_>>(), [7]);

        // Two running in one slot (jobs submitted without the dependency)
        // both stay; a third, pending, goes.
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.jobs.lock().unwrap() = vec![
            running_in(7, 18000, BASELINE),
            running_in(8, 18000, BASELINE),
            pending_in(12, 18000, BASELINE, "Dependency"),
        ];
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), false, s, slurm.clone());
        c.round().await.unwrap();
        assert_eq!(slurm.calls.lock().unwrap()[..], ["scancel 12"]);

        // Two pending in one slot: the older is kept (Slurm starts it
        // first), and the newer is neither counted nor kept as a replica to
        // come: the restarted controller holds its two replicas (adopted),
        // not three.
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.jobs.lock().unwrap() = vec![
            running_in(7, 18000, BASELINE),
            pending_in(10, 18002, SUPPLEMENTAL, "Resources"),
            pending_in(11, 18002, SUPPLEMENTAL, "Dependency"),
        ];
        let s = ReplicaSettings { min: 1, max: 3, scale_down_delay: Duration::from_secs(600), ..settings() };
        let (mut c, view) = Controller::new("llm", test_endpoint("llm"), false, s, slurm.clone());
        c.round().await.unwrap();
        assert_eq!(slurm.calls.lock().unwrap()[..], ["scancel 11"]);
        *slurm.jobs.lock().unwrap() =
            vec![running_in(7, 18000, BASELINE), pending_in(10, 18002, SUPPLEMENTAL, "Resources")];
        c.round().await.unwrap();
        assert_eq!(slurm.calls.lock().unwrap()[..], ["scancel 11"]);
        assert_eq!(view.lock().unwrap().desired, 2);
    });
}

/// Issue #37: the slot is the lowest free one, so that two instances
/// with the same view of Slurm name the same replica alike (and Slurm's
/// singleton dependency serialises them), whatever each did before.
#[test]
fn two_controllers_with_the_same_view_submit_into_the_same_slot() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.next_id.lock().unwrap() = Some(100);
        let s = ReplicaSettings { min: 2, max: 2, ..settings() };
        let (mut a, _) = Controller::new("llm", test_endpoint("llm"), false, s.clone(), slurm.clone());
        a.round().await.unwrap();
        let first = sbatches(&slurm);
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(
            first[0].starts_with("sbatch -J onepool-llm-18000 ")
                && first[1].starts_with("sbatch -J onepool-llm-18002 ")
        );
        // Job 101 was cancelled before it ran (by an admin): its slot is free.
        let j101 = pending_in(101, 18002, BASELINE, "Resources");
        slurm.ended.lock().unwrap().insert(101, ended(&j101, "CANCELLED", unix_now()));
        *slurm.jobs.lock().unwrap() = vec![running_in(100, 18000, BASELINE)];
        // `a` replaces it; `b`, started now, sees the same and does the same.
        a.round().await.unwrap();
        let (mut b, _) = Controller::new("llm", test_endpoint("llm"), false, s, slurm.clone());
        b.round().await.unwrap();
        let next: Vec<String> =
            sbatches(&slurm)[2..].iter().map(|c| c.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(next, ["sbatch -J onepool-llm-18002", "sbatch -J onepool-llm-18002"]);
    });
}

/// A job of onepoold's user that carries a slot's name without being one
/// of this endpoint's replicas (submitted by hand, or by an older
/// configuration) is left alone, and its slot is not free: Slurm's
/// singleton dependency would hold a new replica of that name behind it
/// for as long as it runs (seen on the real cluster: tests/cluster/
/// controller.rs's job of our uid named like a replica).
#[test]
fn a_slot_named_by_another_job_of_our_user_is_not_free() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.next_id.lock().unwrap() = Some(100);
        // Our uid, the slot's name, no onepool record for this endpoint.
        *slurm.jobs.lock().unwrap() = vec![running_in(7, 18000, "")];
        let s = ReplicaSettings { min: 1, max: 1, ..settings() };
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), false, s, slurm.clone());
        c.round().await.unwrap();
        let submitted: Vec<String> =
            sbatches(&slurm).iter().map(|c| c.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(submitted, ["sbatch -J onepool-llm-18002"]);
        assert!(scancels(&slurm).is_empty(), "the other job is not ours to cancel");
    });
}

/// A replica job held by its slot's singleton dependency (Reason
/// Dependency) is a replica to come like any pending one: never released
/// for its start taking long (that counts from when it runs), nothing else
/// submitted for it, and its cancellation by the instance that keeps the
/// slot's other job is no failed start, with or without Slurm's record.
#[test]
fn a_job_held_by_its_singleton_dependency_is_no_failed_start_and_no_start_timeout() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let slurm = Arc::new(ScriptedSlurm::default());
        *slurm.next_id.lock().unwrap() = Some(100);
        let s = ReplicaSettings { min: 1, max: 1, startup_timeout: Duration::from_millis(100), ..settings() };
        let (mut c, _) = Controller::new("llm", test_endpoint("llm"), true, s, slurm.clone());
        c.round().await.unwrap();
        assert_eq!(sbatches(&slurm).len(), 1);
        *slurm.jobs.lock().unwrap() = vec![pending_in(100, 18000, BASELINE, "Dependency")];
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            c.round().await.unwrap();
        }
        assert_eq!(slurm.calls.lock().unwrap().len(), 1, "{:?}", slurm.calls.lock().unwrap());
        assert_eq!(c.jobs_view().iter().map(|j| (j.job, j.phase.as_str())).collect::<Vec<_>>(), [(100, "pending")]);
        // Cancelled by the other instance: submitted again at once.
        slurm.jobs.lock().unwrap().clear();
        let gone = pending_in(100, 18000, BASELINE, "Dependency");
        slurm.ended.lock().unwrap().insert(100, ended(&gone, "CANCELLED", unix_now()));
        c.round().await.unwrap();
        assert_eq!(sbatches(&slurm).len(), 2, "{:?}", slurm.calls.lock().unwrap());
        // Gone with no record left (MinJobAge): no failure either.
        *slurm.jobs.lock().unwrap() = vec![pending_in(101, 18000, BASELINE, "Dependency")];
        c.round().await.unwrap();
        slurm.jobs.lock().unwrap().clear();
        c.round().await.unwrap();
        let f = c.start_failures_view();
        assert_eq!((f.total, f.backing_off), (0, false), "{:?}", f.last);
        assert_eq!(sbatches(&slurm).len(), 3);
        assert!(scancels(&slurm).is_empty(), "{:?}", slurm.calls.lock().unwrap());
    });
}

/// Issue #44: the lower request classes' part of the load is theirs by
/// the router's counts, the same share of a load the replicas reported.
#[test]
fn the_lower_classes_part_of_the_load_is_their_share_of_the_router_s_counts() {
    use onepool_control::api::ClassState;
    let class = |name: &str, lower, queued, in_flight| ClassState {
        name: name.into(),
        lower,
        queued,
        in_flight,
        ..ClassState::default()
    };
    let classes = [class("inference", false, 0, 4), class("agents", true, 8, 4)];
    // The router's own count: 12 of 16.
    assert_eq!(super::act::lower_part(&classes, 16.0), 12.0);
    // The replicas reported 8 (their engines batch): the same 3/4.
    assert_eq!(super::act::lower_part(&classes, 8.0), 6.0);
    assert_eq!(super::act::lower_part(&[class("inference", false, 0, 0)], 5.0), 0.0);
    assert_eq!(super::act::lower_part(&[], 5.0), 0.0);
}
