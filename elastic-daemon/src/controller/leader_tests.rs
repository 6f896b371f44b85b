//! The controller under [`crate::leader::Leadership`]: a follower routes
//! what Slurm's records show and changes nothing in Slurm; the acting
//! instance acts; a stale lock stops the very next command.

use std::time::Duration;

use onepool_slurm_commands::state::{JobInfo, NodeInfo, StepInfo};

use super::*;
use crate::leader::Leadership;

/// Slurm in memory: the jobs it has, and every command that changes one.
#[derive(Default)]
struct Recorded {
    jobs: Mutex<Vec<JobInfo>>,
    changes: Mutex<Vec<String>>,
}

impl Slurm for Recorded {
    fn submit(&self, args: &[&str]) -> Result<u32, SlurmError> {
        self.changes.lock().unwrap().push(format!("sbatch {}", args[1]));
        Ok(500 + self.changes.lock().unwrap().len() as u32)
    }
    fn cancel(&self, job: u32, _: Option<&str>) -> Result<(), SlurmError> {
        self.changes.lock().unwrap().push(format!("scancel {job}"));
        Ok(())
    }
    fn update_job(&self, job: u32, _: &[(&str, &str)]) -> Result<(), SlurmError> {
        self.changes.lock().unwrap().push(format!("scontrol update {job}"));
        Ok(())
    }
    fn jobs(&self) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(self.jobs.lock().unwrap().clone())
    }
    fn nodes(&self) -> Result<Vec<NodeInfo>, SlurmError> {
        let json = serde_json::json!({"nodes": [{"name": "node1", "state": "mixed", "address": "127.0.0.1"}]});
        Ok(onepool_slurm_commands::state::parse_nodes(&json.to_string()).unwrap())
    }
    fn steps(&self, _: u32) -> Result<Vec<StepInfo>, SlurmError> {
        Ok(Vec::new())
    }
}

/// min 2, max 3; one supplemental replica job runs in slot 18000.
fn setup() -> (Controller, Arc<Endpoint>, Arc<Recorded>) {
    let c = crate::config::parse(
        "t.toml",
        r#"control_socket = "/tmp/x.sock"
[[endpoint]]
name = "llm"
listen = "127.0.0.1:0"
[endpoint.replicas]
command = "serve"
min = 2
max = 3
port_range = "18000-18099"
transport = "plain"
"#,
    )
    .unwrap();
    let settings = c.endpoints[0].replicas.clone().unwrap();
    let supp = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=llm";
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let mut note = onepool_launcher::conventions::ReplicaNote::default();
    note.set_port(18000, 41000);
    let json = serde_json::json!({"jobs": [{
        "job_id": 7, "job_state": "RUNNING", "name": "onepool-llm-18000", "user_id": onepool_os::getuid(),
        "admin_comment": supp, "comment": note.encode(), "nodes": "node1", "batch_host": "node1", "node_count": 1,
        "start_time": now - 100, "time_limit": 60,
    }]});
    let slurm = Arc::new(Recorded::default());
    *slurm.jobs.lock().unwrap() = onepool_slurm_commands::state::parse_jobs(&json.to_string()).unwrap();
    let endpoint = Endpoint::new(
        "llm",
        8,
        onepool_router::endpoint::QueueSettings { size: 10, timeout: Duration::from_secs(1) },
        Default::default(),
        Arc::new(Metrics::new()),
    );
    let (c, _) = Controller::new("llm", endpoint.clone(), false, settings, slurm.clone());
    (c, endpoint, slurm)
}

#[test]
fn a_follower_routes_every_replica_slurm_shows_and_changes_nothing_until_it_takes_over() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (mut c, endpoint, slurm) = setup();
        let leadership = Leadership::shared("b", Duration::from_secs(2), None);
        c.set_leadership(leadership.clone());
        for _ in 0..3 {
            c.round().await.unwrap();
        }
        let routed: Vec<SocketAddr> = endpoint.snapshot().replicas.iter().map(|r| r.address).collect();
        assert_eq!(routed, ["127.0.0.1:41000".parse::<SocketAddr>().unwrap()], "the follower routes the replica");
        assert!(slurm.changes.lock().unwrap().is_empty(), "a follower submits nothing: {:?}", slurm.changes);

        // Takes over: the next round acts (min = 2 wants another replica).
        leadership.acquired(Instant::now());
        c.round().await.unwrap();
        let changes = slurm.changes.lock().unwrap().clone();
        assert!(changes.iter().any(|c| c.starts_with("sbatch")), "{changes:?}");
    });
}

#[test]
fn a_confirmation_older_than_the_fence_stops_the_next_command_and_demotes() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (mut c, _, slurm) = setup();
        let leadership = Leadership::shared("a", Duration::from_secs(2), None);
        c.set_leadership(leadership.clone());
        // Took the lock, then heard nothing for longer than the fence (a
        // paused process, a cut link): the server may have given it away.
        leadership.acquired(Instant::now() - Duration::from_secs(3));
        c.round().await.unwrap();
        assert!(slurm.changes.lock().unwrap().is_empty(), "{:?}", slurm.changes);
        assert!(!leadership.acting());
        // The same below the round: each command asks for itself.
        leadership.acquired(Instant::now() - Duration::from_secs(3));
        let r = c.submit(Kind::Baseline, 1).await;
        assert!(matches!(r, Err(RoundError::NotActing)), "{r:?}");
        leadership.acquired(Instant::now() - Duration::from_secs(3));
        assert!(matches!(c.cancel(7).await, Err(RoundError::NotActing)));
        assert!(slurm.changes.lock().unwrap().is_empty(), "{:?}", slurm.changes);
        // Confirmed afresh: it acts.
        leadership.acquired(Instant::now());
        assert!(c.submit(Kind::Baseline, 1).await.unwrap());
        assert_eq!(slurm.changes.lock().unwrap().len(), 1);
    });
}
