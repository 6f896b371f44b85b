//! onepoold's Slurm side on the real cluster: the daemon (in-process)
//! submits its endpoint's baseline replica as a job, routes to it once it
//! runs and passes health checks, scales out with supplemental replicas
//! under load, and after a restart re-adopts its replica jobs instead of
//! submitting new ones. Jobs it does not own (another user's job named and
//! annotated like a replica, and one of our own uid without onepool's
//! endpoint record) are never touched.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::config::{ConfigFile, EndpointFile, HealthFile, ReplicasFile};
use onepool_elastic_daemon::controller::ControllerView;
use onepool_elastic_daemon::daemon::Daemon;
use onepool_elastic_daemon::tokio::runtime::Runtime;
use onepool_tests::elastic::{queue, wait};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster};

const SERVER: &str = r#"
import http.server, os, time, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        time.sleep(float(q.get("sleep", ["0"])[0]))
        body = b"ok\n"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["ONEPOOL_BACKEND_PORT"])), H).serve_forever()
"#;

const ENDPOINT: &str = "ctl";

/// Status of a GET, or None when the connection failed.
fn get(port: u16, path: &str) -> Option<u16> {
    onepool_tests::elastic::request(port, "GET", path, "")
}

fn config(dir: &Path, c: &TestCluster) -> ConfigFile {
    let slurm_conf = c.cluster.env().into_iter().find(|(k, _)| k == "SLURM_CONF").expect("SLURM_CONF").1;
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    ConfigFile {
        shutdown_grace: Some(secs(1)),
        slurm_conf: Some(slurm_conf.into()),
        endpoints: vec![EndpointFile {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            replica_concurrency: Some(4),
            queue_size: Some(1000),
            queue_timeout: Some(secs(120)),
            health: Some(HealthFile {
                interval: Some(millis(500)),
                timeout: Some(secs(1)),
                healthy_after: Some(1),
                ..HealthFile::new("/")
            }),
            replicas: Some(ReplicasFile {
                gpus: Some(1),
                min: Some(1),
                max: Some(3),
                target_per_replica: Some(4.0),
                drain_timeout: Some(secs(10)),
                // Short, so that the replicas are older than it when the
                // daemon restarts (below): a restart must not take that
                // for a model load that never finished.
                startup_timeout: Some(secs(8)),
                port_range: Some((18400, 18499)),
                launcher: Some(build_dir().join("onepool").display().to_string()),
                poll_interval: Some(millis(500)),
                stable_window: Some(secs(10)),
                panic_window: Some(secs(2)),
                scale_down_delay: Some(secs(60)),
                output: Some(format!("{}/replica-%j.log", dir.display())),
                ..ReplicasFile::new(format!("python3 {}/server.py", dir.display()))
            }),
            ..EndpointFile::new(ENDPOINT)
        }],
        // The test's own key, not the host's /var/lib/onepool (the deploy
        // test's throwaway root overlays the host).
        replica_key_file: Some(dir.join("replica.key")),
        ..ConfigFile::new(dir.join("onepoold.sock"))
    }
}

fn start(rt: &Runtime, config: &Path) -> Daemon {
    onepool_tests::elastic::start_daemon(rt, config)
}

fn view(d: &Daemon) -> ControllerView {
    onepool_tests::elastic::replica_view(d, ENDPOINT)
}

fn ready_ports(d: &Daemon) -> BTreeSet<u16> {
    onepool_tests::elastic::ready_ports(d, ENDPOINT)
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn the_daemon_runs_scales_and_re_adopts_its_replica_jobs_and_touches_nothing_else() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = std::env::temp_dir().join(format!("onepool-controller-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("server.py"), SERVER).unwrap();
    let config_path = dir.join("onepoold.toml");
    config(&dir, c).write(&config_path).unwrap();

    // Jobs the daemon must never touch: another user's job named and
    // annotated like one of its replicas, and one of our own uid named
    // like a replica but without the endpoint in onepool's record.
    let bob = c.user("op-bob", "research");
    let r = c.run_as(
        &bob,
        "sbatch",
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "-J",
            &format!("onepool-{ENDPOINT}-18400"),
            "--workload=inference",
            &format!("--endpoint={ENDPOINT}"),
            "--gpus=1",
            "--wrap",
            "sleep 900",
        ],
    );
    assert!(r.ok, "sbatch as op-bob: {}{}", r.stdout, r.stderr);
    let foreign: u32 = r.stdout.trim().split(';').next().unwrap().parse().unwrap();
    let unannotated = c.sbatch(&[
        "-J",
        &format!("onepool-{ENDPOINT}-18402"),
        "--workload=inference",
        "--gpus=1",
        "--wrap",
        "sleep 900",
    ]);
    let untouched = [foreign, unannotated];

    let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let d = start(&rt, &config_path);
    let listen = d.endpoint(ENDPOINT).unwrap().listen.unwrap().port();

    // One baseline replica job, in the protected inference QOS.
    wait("the baseline replica job", Duration::from_secs(30), || !view(&d).submitted.is_empty());
    let baseline = view(&d).submitted[0];
    let q = queue(c);
    let b = q.iter().find(|j| j.id == baseline).expect("the baseline job is in squeue");
    assert_eq!(b.qos, "op-inference-baseline", "{b:?}");
    assert!(b.name.starts_with(&format!("onepool-{ENDPOINT}-")), "{b:?}");
    c.wait_state(baseline, "RUNNING", Duration::from_secs(60));
    let port = view(&d).jobs.iter().find(|j| j.job == baseline).unwrap().port;
    assert_eq!(b.name, format!("onepool-{ENDPOINT}-{port}"), "the port is in the job's name");
    let joined = wait("the baseline replica to be ready in the router", Duration::from_secs(60), || {
        ready_ports(&d).contains(&port)
    });
    eprintln!("baseline job {baseline} serving {:?} after the daemon started", t0.elapsed());
    let _ = joined;
    assert_eq!(get(listen, "/"), Some(200));

    // Load: 40 clients sending 2 s requests back to back.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, served) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..40)
        .map(|_| {
            let (stop, sent, served) = (stop.clone(), sent.clone(), served.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    sent.fetch_add(1, Ordering::SeqCst);
                    if get(listen, "/?sleep=2") == Some(200) {
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let load_start = Instant::now();
    let took = wait("a supplemental replica job", Duration::from_secs(30), || {
        let v = view(&d);
        let q = queue(c);
        v.submitted.iter().any(|id| q.iter().any(|j| j.id == *id && j.qos == "op-inference"))
    });
    eprintln!("first supplemental replica submitted {took:?} after the load began");
    let supplemental: Vec<u32> = view(&d).submitted.iter().copied().filter(|id| *id != baseline).collect();
    assert!(!supplemental.is_empty() && supplemental.len() <= 2, "max = 3: {supplemental:?}");
    let scaled = wait("the supplemental replicas to serve", Duration::from_secs(60), || {
        let v = view(&d);
        let ready = ready_ports(&d);
        supplemental.iter().all(|id| v.jobs.iter().any(|j| j.job == *id && ready.contains(&j.port)))
    });
    eprintln!("{} supplemental replica(s) serving {:?} after the load began", supplemental.len(), load_start.elapsed());
    let _ = scaled;
    // Keep the load on a while: the new replicas take their share.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(load_start.elapsed()));
    let snap = d.endpoint(ENDPOINT).unwrap().endpoint.snapshot();
    let v = view(&d);
    for id in &supplemental {
        let a = v.jobs.iter().find(|j| j.job == *id).unwrap().address;
        let r = snap.replicas.iter().find(|r| Some(r.address) == a).expect("in the router");
        eprintln!("supplemental job {id} at {}: {} requests served", r.address, r.served);
        assert!(r.served > 0, "supplemental replica {id} took no requests");
    }
    stop.store(true, Ordering::SeqCst);
    for h in clients {
        h.join().unwrap();
    }
    let (sent, served) = (sent.load(Ordering::SeqCst), served.load(Ordering::SeqCst));
    eprintln!("load: {sent} requests sent, {served} served");
    assert_eq!(sent, served, "every request under load was served");

    // Restart: the new daemon re-adopts every replica job, each older than
    // startup_timeout (8 s) by now.
    std::thread::sleep(Duration::from_secs(9));
    let before: BTreeSet<u32> =
        view(&d).jobs.iter().filter(|j| j.phase.as_str() != "cancelled").map(|j| j.job).collect();
    assert!(before.contains(&baseline) && supplemental.iter().all(|s| before.contains(s)), "{before:?}");
    rt.block_on(d.shutdown());
    let d = start(&rt, &config_path);
    let listen = d.endpoint(ENDPOINT).unwrap().listen.unwrap().port();
    let adopted = wait("the new daemon to route to every adopted replica", Duration::from_secs(30), || {
        let v = view(&d);
        let ready = ready_ports(&d);
        before.iter().all(|id| v.jobs.iter().any(|j| j.job == *id && j.address.is_some() && ready.contains(&j.port)))
    });
    eprintln!("restarted daemon routes to its {} replica job(s) after {adopted:?}", before.len());
    // A few more polls: still nothing new submitted, nothing duplicated.
    let rounds = view(&d).rounds;
    wait("more polls", Duration::from_secs(10), || view(&d).rounds >= rounds + 4);
    let v = view(&d);
    assert!(v.submitted.is_empty(), "the restarted daemon submitted {:?}", v.submitted);
    let now: BTreeSet<u32> = v.jobs.iter().map(|j| j.job).collect();
    assert_eq!(now, before, "the same replica jobs, none added");
    let baselines = queue(c).iter().filter(|j| j.qos == "op-inference-baseline").count();
    assert_eq!(baselines, 1, "one baseline job");
    assert_eq!(get(listen, "/"), Some(200));
    rt.block_on(d.shutdown());

    for id in untouched {
        let state = c.state(id);
        assert!(matches!(state.as_deref(), Some("PENDING" | "RUNNING")), "job {id} not owned by onepoold: {state:?}");
        assert!(!now.contains(&id) && !before.contains(&id));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
