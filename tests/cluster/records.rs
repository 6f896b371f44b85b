//! Reclaims are learned from Slurm's records, not from a poll that happened
//! to see them (issue #35). An idle replica drains in no time and an
//! immediate class's victim is gone at once: with a poll of 0.2 s or of
//! 5 s, onepoold must count each reclaim, with its mode, victim and taker,
//! and `onepool status` (the controller's view), the metrics and `onepool
//! report --json` must agree with each other and with what this test saw.
//!
//! Each poll interval runs three reclaims: a graceful one of an idle
//! replica (the load has stopped), a graceful one of a busy replica, and an
//! immediate one (the agents class, GraceTime 0) of a busy replica. Another
//! user's protected job runs throughout and is never touched, and protected
//! training gets its GPUs each time.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use onepool_control::api::{ControllerView, JobPhase, ReplicaState, State};
use onepool_tests::elastic::{assert_untouched, control_state, daemon_config, foreign_job, queue, scratch, wait, Load};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster, TEST_MIN_RUNTIME_SECS};
use serde_json::Value;

const ENDPOINT: &str = "chat";

/// One reclaim as the test saw it: (victim, mode, taker).
type Seen = (u32, &'static str, u32);

#[test]
fn reclaims_are_counted_from_slurm_s_records_at_a_0_2_s_poll() {
    reclaims_agree_everywhere(Duration::from_millis(200));
}

#[test]
#[ignore = "slow variant: scripts/test.sh runs it on 22.05 (--include-ignored)"]
fn reclaims_are_counted_from_slurm_s_records_at_a_5_s_poll() {
    reclaims_agree_everywhere(Duration::from_secs(5));
}

fn reclaims_agree_everywhere(poll: Duration) {
    let c = cluster();
    let _cleanup = Cleanup(c);
    c.cancel_all();
    let dir = scratch(&format!("records-{}ms", poll.as_millis()));
    // The period starts a whole second after now: `--from` has whole seconds.
    std::thread::sleep(Duration::from_secs(1));
    let from = c.ok("date", &["+%Y-%m-%dT%H:%M:%S"]).trim().to_string();
    let foreign = foreign_job(c);
    let mut seen = Vec::new();

    // Graceful (the inference class): an idle victim, then a busy one.
    let d = Onepoold::start(c, &dir.join("graceful"), poll, "inference");
    let load = two_supplementals(c, &d);
    let (_, statuses) = load.finish();
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200], "{statuses:?}");
    wait("nothing in flight", Duration::from_secs(30), || d.in_flight() == 0);
    seen.push(reclaim(c, &d, "graceful"));
    let load = two_supplementals(c, &d);
    wait("requests in flight on every replica", Duration::from_secs(30), || d.busy());
    seen.push(reclaim(c, &d, "graceful"));
    let (sent, statuses) = load.finish();
    assert_eq!(statuses.get(&200).copied(), Some(sent), "graceful reclaims lose nothing: {statuses:?}");
    let graceful_view = d.settled(2, poll);
    let graceful_metrics = d.metrics();
    // The report trusts a drain note only on a replica job of an endpoint
    // of the configuration it reads: the graceful replicas' (the
    // immediate reclaim is slurmctld's own log line).
    let config = d.config.clone();
    d.stop();
    cancel_all_but(c, foreign);

    // Immediate (the agents class, GraceTime 0): a busy victim.
    let d = Onepoold::start(c, &dir.join("immediate"), poll, "agents");
    let load = two_supplementals(c, &d);
    wait("requests in flight on every replica", Duration::from_secs(30), || d.busy());
    seen.push(reclaim(c, &d, "immediate"));
    let _ = load.finish();
    let immediate_view = d.settled(1, poll);
    let immediate_metrics = d.metrics();
    d.stop();
    assert_untouched(c, foreign);
    c.cancel_all();

    // onepool status (the controller's view) and the metrics.
    let status: Vec<(u32, String, Option<u32>)> = graceful_view
        .reclaims
        .iter()
        .chain(&immediate_view.reclaims)
        .map(|r| (r.job, r.mode.as_str().to_string(), r.taker))
        .collect();
    let want: Vec<(u32, String, Option<u32>)> = seen.iter().map(|(v, m, t)| (*v, m.to_string(), Some(*t))).collect();
    assert_eq!(status, want, "onepoold's status, poll {poll:?}");
    assert_eq!(reclaims_counted(&graceful_metrics, "graceful"), 2, "{graceful_metrics}");
    assert_eq!(reclaims_counted(&graceful_metrics, "immediate"), 0);
    assert_eq!(reclaims_counted(&immediate_metrics, "immediate"), 1, "{immediate_metrics}");

    // onepool report over the period: the same reclaims.
    let jobs: Vec<u32> = seen.iter().flat_map(|(v, _, t)| [*v, *t]).collect();
    let (report, records) = report(c, &from, &config, &jobs);
    let got: Vec<(u32, String, Option<u32>)> = report["reclaims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["job"].as_str().unwrap().parse().unwrap(),
                r["mode"].as_str().unwrap().to_string(),
                r["for_job"].as_str().and_then(|t| t.parse().ok()),
            )
        })
        .collect();
    assert_eq!(got, want, "onepool report, poll {poll:?}: {}\naccounting then:\n{records}", report["reclaims"]);
    let drained: Vec<Option<u64>> =
        report["reclaims"].as_array().unwrap().iter().map(|r| r["drained"].as_u64()).collect();
    assert_eq!(drained[0], Some(0), "the idle victim drained nothing: {}", report["reclaims"]);
    // The load's whole completions are movable (issue #51: a whole answer
    // is sent again whole whatever its shape): the drain sends those still
    // computing elsewhere at once, and finishes the rest.
    let handled = |r: &Value| r["drained"].as_u64().unwrap_or(0) + r["moved"].as_u64().unwrap_or(0);
    let busy = &report["reclaims"][1];
    assert!(handled(busy) > 0, "the busy victim drained or moved its requests: {}", report["reclaims"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// onepoold as its service user, as etc/systemd/onepoold.service runs it:
/// `onepool report` trusts a replica's drain note only on the service
/// user's jobs.
struct Onepoold {
    child: Child,
    socket: PathBuf,
    config: PathBuf,
    port: u16,
    metrics: SocketAddr,
}

impl Onepoold {
    fn start(c: &TestCluster, dir: &Path, poll: Duration, class: &str) -> Onepoold {
        let user = onepool_decisions::policy::SERVICE_USER;
        let id = |flag: &str| -> u32 { c.ok("id", &[flag, user]).trim().parse().unwrap() };
        let (uid, gid) = (id("-u"), id("-g"));
        std::fs::create_dir_all(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).unwrap();
        let (port, metrics) = (free_port(), SocketAddr::from(([127, 0, 0, 1], free_port())));
        let mut file = daemon_config(c, dir, ENDPOINT, |r| {
            r.poll_interval = Some(poll);
            // The supplemental replicas stay after the load stops: the idle victim.
            r.scale_down_delay = Some(Duration::from_secs(600));
            r.supplemental_workload = Some(class.into());
        });
        file.endpoints[0].listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
        file.metrics_address = Some(metrics);
        let config = dir.join("onepoold.toml");
        file.write(&config).unwrap();
        let log = std::fs::File::create(dir.join("onepoold.log")).unwrap();
        let child = Command::new(build_dir().join("onepoold"))
            .uid(uid)
            .gid(gid)
            .arg("--config")
            .arg(&config)
            .env("ONEPOOLD_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting onepoold");
        let d = Onepoold { child, socket: file.control_socket.clone(), config, port, metrics };
        wait("onepoold's control socket", Duration::from_secs(30), || control_state(&d.socket).is_some());
        d
    }

    fn state(&self) -> State {
        control_state(&self.socket).expect("onepoold answers on its control socket")
    }

    fn view(&self) -> ControllerView {
        self.state().endpoints.into_iter().find_map(|e| e.replica_jobs).expect("a replica controller")
    }

    /// Jobs of `kind` the router sends requests to.
    fn serving(&self, kind: &str) -> Vec<u32> {
        let state = self.state();
        let e = &state.endpoints[0];
        let ready: Vec<SocketAddr> =
            e.replicas.iter().filter(|r| r.state == ReplicaState::Ready).map(|r| r.address).collect();
        let jobs = e.replica_jobs.as_ref().map(|v| v.jobs.clone()).unwrap_or_default();
        jobs.iter()
            .filter(|j| j.kind.as_str() == kind && j.phase == JobPhase::Serving)
            .filter(|j| j.address.is_some_and(|a| ready.contains(&a)))
            .map(|j| j.job)
            .collect()
    }

    /// Requests in flight on the replicas, by the router's count.
    fn in_flight(&self) -> u64 {
        self.state().endpoints[0].replicas.iter().map(|r| u64::from(r.in_flight)).sum()
    }

    /// Every replica of the endpoint has a request in flight.
    fn busy(&self) -> bool {
        let replicas = &self.state().endpoints[0].replicas;
        replicas.len() == 3 && replicas.iter().all(|r| r.in_flight > 0)
    }

    /// onepoold's /metrics, as Prometheus reads it.
    fn metrics(&self) -> String {
        let mut s = TcpStream::connect(self.metrics).expect("onepoold's metrics listener");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: onepoold\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    /// Waits until the controller has counted `n` reclaims and found each
    /// one's taker (a few polls after the victims ended); its view then.
    fn settled(&self, n: usize, poll: Duration) -> ControllerView {
        let what = format!("{n} reclaim(s) with their takers in onepoold's status");
        wait(&what, Duration::from_secs(30) + 6 * poll, || {
            let v = self.view();
            v.reclaims.len() >= n && v.reclaims.iter().all(|r| r.taker.is_some())
        });
        self.view()
    }

    /// SIGTERM; the replica jobs stay for the next start to adopt.
    fn stop(mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Onepoold {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Load until two supplemental replicas serve, past the policy's minimum
/// run time: every one of them may then be reclaimed.
fn two_supplementals(c: &TestCluster, d: &Onepoold) -> Load {
    wait("the baseline replica to serve", Duration::from_secs(60), || d.serving("baseline").len() == 1);
    // 12 clients, 2 s completions: three replicas' worth, four at a time each.
    let load = Load::start(d.port, 12, 2.0);
    wait("two supplemental replicas to serve", Duration::from_secs(90), || d.serving("supplemental").len() == 2);
    let newest = d.serving("supplemental").into_iter().max().unwrap();
    assert!(queue(c).iter().any(|q| q.id == newest && q.state == "RUNNING"));
    std::thread::sleep(Duration::from_secs(TEST_MIN_RUNTIME_SECS + 1));
    load
}

/// Cancels every job but `keep` (the other user's) and waits until they
/// are gone: the next onepoold starts from its baseline alone.
fn cancel_all_but(c: &TestCluster, keep: u32) {
    let ids: Vec<String> = queue(c).iter().filter(|q| q.id != keep).map(|q| q.id.to_string()).collect();
    if ids.is_empty() {
        return;
    }
    let mut args = vec!["--quiet"];
    args.extend(ids.iter().map(String::as_str));
    let _ = c.run("scancel", &args);
    c.wait_until("the jobs to leave the queue", Duration::from_secs(60), || queue(c).iter().all(|q| q.id == keep));
}

/// Protected training takes one supplemental replica's GPUs; the training
/// is cancelled again once the victim is known, so that the next reclaim
/// starts from a full pool.
fn reclaim(c: &TestCluster, d: &Onepoold, mode: &'static str) -> Seen {
    let before: BTreeSet<u32> = d.serving("supplemental").into_iter().collect();
    let (training, took) = protected_training_of_another_user(c);
    let victims: Vec<u32> = before.iter().copied().filter(|j| c.state(*j).as_deref() != Some("RUNNING")).collect();
    assert_eq!(victims.len(), 1, "one supplemental replica yields its GPUs: {victims:?}");
    eprintln!("records: {mode} reclaim of job {} for job {training}, RUNNING {took:?} after sbatch", victims[0]);
    assert_eq!(c.state(training).as_deref(), Some("RUNNING"), "protected training got its GPUs");
    c.final_state(victims[0]);
    c.ok("scancel", &[&training.to_string()]);
    c.final_state(training);
    (victims[0], mode, training)
}

/// Protected training for 4 GPUs by another user than onepoold's (the
/// in-process onepoold runs as root, like this test): onepoold looks for
/// the taker among other users' jobs, so that its own next replica on the
/// victim's node is not taken for one.
fn protected_training_of_another_user(c: &TestCluster) -> (u32, Duration) {
    let alice = c.user("op-alice", "core-ml");
    let t0 = std::time::Instant::now();
    let args = [
        "--parsable",
        "-o",
        "/dev/null",
        "--account=core-ml",
        "--workload=critical-training",
        "--time=10:00",
        "--gpus=4",
        "-N1",
        "--wrap",
        "sleep 600",
    ];
    let r = c.run_as(&alice, "sbatch", &args);
    assert!(r.ok, "sbatch as op-alice: {}{}", r.stdout, r.stderr);
    let id: u32 = r.stdout.trim().split(';').next().unwrap().parse().unwrap();
    c.wait_state(id, "RUNNING", Duration::from_secs(90));
    (id, t0.elapsed())
}

/// `onepool_replica_reclaims_total{mode=..}` in the metrics' text.
fn reclaims_counted(metrics: &str, mode: &str) -> u64 {
    let want = format!("onepool_replica_reclaims_total{{endpoint=\"{ENDPOINT}\",mode=\"{mode}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&want)).map_or(0, |n| n.trim().parse().unwrap())
}

/// `onepool report --json` from `from` to now, once accounting has every
/// victim's and taker's times ([`TestCluster::wait_for_accounting`]); and
/// what accounting said of them then, for a failure's message.
fn report(c: &TestCluster, from: &str, daemon_config: &Path, jobs: &[u32]) -> (Value, String) {
    c.wait_for_accounting(jobs);
    let ids = jobs.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let format = "--format=JobID,State,QOS,Eligible,Submit,Start,End,AllocTRES,NodeList";
    let seen = c.ok("sacct", &["-X", "-P", "-n", "-j", &ids, format]);
    let onepool = build_dir().join("onepool");
    let out = c
        .cmd(onepool.to_str().unwrap())
        .args(["report", "--json", "--no-saved", "--from", from, "--daemon-config"])
        .arg(daemon_config)
        .arg(onepool_tests::test_policy())
        .output()
        .unwrap();
    assert!(out.status.success(), "onepool report: {}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), seen)
}
