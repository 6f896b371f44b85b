//! What the onepoold tests on the real cluster share: an endpoint
//! configuration whose replicas run the dev cluster's stand-in model server
//! under `onepool replica`, HTTP clients that count what they got, and
//! reading onepoold's state (in-process or through its control socket).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::config::{ConfigFile, EndpointFile, HealthFile, ReplicasFile, RetryFile};
use onepool_elastic_daemon::controller::ControllerView;
use onepool_elastic_daemon::daemon::Daemon;
use onepool_elastic_daemon::tokio::runtime::Runtime;
use onepool_router::registry::ReplicaState;

use crate::{build_dir, workspace_root, TestCluster};

/// A runtime for onepoold in-process.
pub fn runtime() -> Runtime {
    onepool_elastic_daemon::tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

/// onepoold in-process, from a configuration file.
pub fn start_daemon(rt: &Runtime, config: &Path) -> Daemon {
    log_to_test_output();
    let cfg = onepool_elastic_daemon::config::load(config).unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(Daemon::start(cfg)).expect("onepoold starts")
}

/// onepoold's log goes to the test's captured output, so a failing test
/// (in CI above all) shows what the daemon saw. `ONEPOOL_TEST_LOG` sets the
/// filter (tracing's env-filter syntax; `info` by default).
fn log_to_test_output() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("ONEPOOL_TEST_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // Another subscriber may already be set (a test of its own): keep it.
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    });
}

/// What the endpoint's replica controller did so far.
pub fn replica_view(d: &Daemon, endpoint: &str) -> ControllerView {
    d.replica_view(endpoint).expect("the endpoint has a replica controller")
}

/// Slots (the number in the job's name, `ReplicaJob::port`) of the
/// replicas the router sends requests to. Since issue #25 a replica listens
/// on a port the kernel chose, so the router's addresses are matched to
/// the controller's view of its jobs.
pub fn ready_ports(d: &Daemon, endpoint: &str) -> BTreeSet<u16> {
    let snap = d.endpoint(endpoint).unwrap().endpoint.snapshot();
    let ready: BTreeSet<std::net::SocketAddr> =
        snap.replicas.iter().filter(|r| r.state == ReplicaState::Ready).map(|r| r.address).collect();
    replica_view(d, endpoint)
        .jobs
        .iter()
        .filter(|j| j.address.is_some_and(|a| ready.contains(&a)))
        .map(|j| j.port)
        .collect()
}

/// Jobs of `kind` ("baseline", "supplemental") the daemon serves from on
/// `endpoint`.
pub fn serving(d: &Daemon, endpoint: &str, kind: &str) -> Vec<u32> {
    let ready = ready_ports(d, endpoint);
    replica_view(d, endpoint)
        .jobs
        .iter()
        .filter(|j| {
            j.kind.as_str() == kind && j.phase == onepool_control::api::JobPhase::Serving && ready.contains(&j.port)
        })
        .map(|j| j.job)
        .collect()
}

/// Another user's protected job (4 GPUs) that no test may touch.
pub fn foreign_job(c: &TestCluster) -> u32 {
    let alice = c.user("op-alice", "core-ml");
    let r = c.run_as(
        &alice,
        "sbatch",
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "--account=core-ml",
            "--workload=critical-training",
            "--time=30:00",
            "--gpus=4",
            "-N1",
            "--wrap",
            "sleep 900",
        ],
    );
    assert!(r.ok, "sbatch as op-alice: {}{}", r.stdout, r.stderr);
    let id: u32 = r.stdout.trim().split(';').next().unwrap().parse().unwrap();
    c.wait_state(id, "RUNNING", Duration::from_secs(30));
    id
}

pub fn assert_untouched(c: &TestCluster, id: u32) {
    assert_eq!(c.state(id).as_deref(), Some("RUNNING"), "job {id} is not onepoold's and must keep running");
}

/// How a reclaim test ends: the protected job still runs and the other
/// user's job was left alone; then both are cancelled, onepoold stops and
/// the test's scratch folder goes.
pub fn protected_ran_then_clean_up(c: &TestCluster, training: u32, foreign: u32, rt: &Runtime, d: Daemon, dir: &Path) {
    assert_eq!(c.state(training).as_deref(), Some("RUNNING"));
    assert_untouched(c, foreign);
    c.ok("scancel", &[&training.to_string(), &foreign.to_string()]);
    rt.block_on(d.shutdown());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Submits protected training for 4 GPUs; returns its id and how long it
/// took to run.
pub fn protected_training(c: &TestCluster) -> (u32, Duration) {
    let t0 = Instant::now();
    let id = c.sbatch(&["--workload=critical-training", "--time=10:00", "--gpus=4", "-N1", "--wrap", "sleep 600"]);
    c.wait_state(id, "RUNNING", Duration::from_secs(90));
    (id, t0.elapsed())
}

/// The dev cluster's stand-in model server: `POST {"max_tokens": N}` takes
/// N x `$ONEPOOL_SECONDS_PER_TOKEN` (0.001 s by default).
pub fn stand_in_server() -> PathBuf {
    workspace_root().join("etc/dev-cluster/stand-in-model-server.py")
}

/// A scratch folder for one test (removed by the test when it passes).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onepool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An onepoold configuration with one endpoint `name` whose replicas are
/// Slurm jobs running the stand-in server; `replicas` changes its
/// `[endpoint.replicas]` from the defaults below.
pub fn daemon_config(c: &TestCluster, dir: &Path, name: &str, replicas: impl FnOnce(&mut ReplicasFile)) -> ConfigFile {
    let slurm_conf = c.cluster.env().into_iter().find(|(k, _)| k == "SLURM_CONF").expect("SLURM_CONF").1;
    stand_in_config(dir, &slurm_conf, &build_dir().join("onepool"), name, replicas)
}

/// [`daemon_config`], given SLURM_CONF and the `onepool` binary.
pub fn stand_in_config(
    dir: &Path,
    slurm_conf: &str,
    launcher: &Path,
    name: &str,
    replicas: impl FnOnce(&mut ReplicasFile),
) -> ConfigFile {
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    let mut r = ReplicasFile {
        gpus: Some(4),
        min: Some(1),
        max: Some(3),
        target_per_replica: Some(4.0),
        drain_timeout: Some(secs(20)),
        startup_timeout: Some(secs(60)),
        port_range: Some((18500, 18599)),
        launcher: Some(launcher.display().to_string()),
        poll_interval: Some(onepool_dev_cluster::onepoold::poll_interval(millis(500))),
        stable_window: Some(secs(6)),
        panic_window: Some(secs(2)),
        scale_down_delay: Some(secs(60)),
        output: Some(format!("{}/replica-%j.log", dir.display())),
        ..ReplicasFile::new(format!("python3 {}", stand_in_server().display()))
    };
    replicas(&mut r);
    ConfigFile {
        shutdown_grace: Some(secs(1)),
        slurm_conf: Some(slurm_conf.into()),
        endpoints: vec![EndpointFile {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            replica_concurrency: Some(4),
            queue_size: Some(1000),
            queue_timeout: Some(secs(120)),
            request_timeout: Some(secs(120)),
            retry: Some(RetryFile { attempts: Some(3), ..RetryFile::default() }),
            health: Some(HealthFile {
                interval: Some(millis(500)),
                timeout: Some(secs(1)),
                healthy_after: Some(1),
                ..HealthFile::new("/health")
            }),
            replicas: Some(r),
            ..EndpointFile::new(name)
        }],
        replica_key_file: Some(dir.join("replica.key")),
        ..ConfigFile::new(dir.join("onepoold.sock"))
    }
}

/// The real model server (llama-server with SmolLM2-135M, from
/// scripts/model-server.sh) as the replicas' command: `slots` requests at
/// once, one CPU thread each replica.
pub fn llama_replicas(r: &mut ReplicasFile, slots: u32) {
    let server = onepool_dev_cluster::model_server::ModelServer::locate().unwrap_or_else(|e| panic!("{e}"));
    let slots = onepool_dev_cluster::model_server::Slots { parallel: slots, context: 512, threads: 1 };
    r.command = server.replica_command(slots);
    // A real model loads in seconds, more on a busy machine.
    r.startup_timeout = Some(Duration::from_secs(120));
}

/// How a chat completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chat {
    /// 2xx and whole (a stream up to `data: [DONE]`), with the text.
    Done(String),
    /// An HTTP status other than 2xx, with the body.
    Status(u16, String),
    /// The connection failed, or a stream ended without `[DONE]`.
    Cut(String),
}

thread_local! {
    /// Each test thread's client, on onepool's one client stack; its
    /// runtime is made once per thread, not once per request.
    static CLIENT: onepool_client::blocking::Client =
        onepool_client::blocking::Client::new(Duration::from_secs(180));
}

/// The most of an answer the tests read: a completion's stream or a
/// replica's metrics are far smaller.
const ANSWER_LIMIT: usize = 16 << 20;

/// One request on a connection of its own (`connection: close`, as clients
/// that come and go would): a test that restarts or reclaims must not
/// depend on a connection kept from before.
pub(crate) fn send(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    fields: &[(&str, &str)],
) -> Result<onepool_client::Answer, onepool_client::ClientError> {
    let mut headers = vec![("connection", "close")];
    headers.extend_from_slice(fields);
    let method = onepool_elastic_daemon::http::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
    CLIENT.with(|c| c.request(method, &format!("http://{address}{path}"), body, &headers, ANSWER_LIMIT))
}

pub(crate) fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One chat completion for the real model through `port`, streamed or not,
/// over its own connection.
pub fn chat(port: u16, prompt: &str, max_tokens: u32, stream: bool) -> Chat {
    let body = serde_json::json!({
        "model": onepool_dev_cluster::model_server::MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string();
    let answer = match send(local(port), "POST", "/v1/chat/completions", Some(&body), &[]) {
        Ok(a) => a,
        Err(e) => return Chat::Cut(e.to_string()),
    };
    let body = answer.text();
    match answer.status.as_u16() {
        200..=299 if !stream || body.contains("data: [DONE]") => Chat::Done(body),
        200..=299 => {
            Chat::Cut(format!("the stream ended before [DONE]: ...{}", &body[body.len().saturating_sub(200)..]))
        }
        status => Chat::Status(status, body),
    }
}

/// SIGKILLs the model server of the replica the router reaches at
/// `address` (found by its job's id in the process's environment, as
/// every process of a job has it); its pid.
pub fn kill_model_server(d: &Daemon, endpoint: &str, address: SocketAddr) -> u32 {
    let job = replica_view(d, endpoint).jobs.iter().find(|j| j.address == Some(address)).expect("a replica job").job;
    let mark = format!("SLURM_JOB_ID={job}\0");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let program = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        if !program.ends_with(b"llama-server") {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.windows(mark.len()).any(|w| w == mark.as_bytes()) {
            // SAFETY: kill(2) on a pid read just above; no memory is involved.
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0, "kill {pid}");
            return pid;
        }
    }
    panic!("no llama-server of job {job} found");
}

/// `onepool_router_streams_moved_total` by reason (issue #43).
pub fn moved_streams(d: &Daemon) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for l in d.metrics.encode().lines().filter(|l| l.starts_with("onepool_router_streams_moved_total{")) {
        let reason = l.split("reason=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
        let n: f64 = l.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *by.entry(reason.to_string()).or_insert(0) += n as u64;
    }
    by
}

pub fn moves_failed(d: &Daemon) -> u64 {
    d.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("onepool_router_stream_moves_failed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The value of a Prometheus metric (its samples summed) on `port`'s /metrics
/// (a replica's llama-server: the launcher's port + 1).
pub fn metric(port: u16, name: &str) -> Option<f64> {
    metric_at(local(port), name, None)
}

/// [`metric`] of a replica's model server, read through its launcher with
/// onepoold's replica key (the launcher answers nothing without it, and
/// the server's own port is known to the launcher alone), on the transport
/// onepoold's router has for it (TLS pinned to its certificate, issue #36).
pub fn replica_metric(d: &Daemon, endpoint: &str, job: u32, name: &str) -> Option<f64> {
    let address = replica_view(d, endpoint).jobs.iter().find(|j| j.job == job)?.address?;
    let e = &d.endpoint(endpoint)?.endpoint;
    let fields = [(onepool_router::REPLICA_KEY_HEADER, e.replica_key()?.clone())];
    // Connections of this call's own: the router's belong to its runtime.
    let conns = Arc::new(onepool_router::backend_pool::IdleConns::new(e.conns_of(address)?.transport().clone()));
    let rt = onepool_elastic_daemon::tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    let t = Duration::from_secs(5);
    let get = onepool_router::replica_client::get(&conns, address, "/metrics", &fields, t, t, 1 << 20);
    let (status, body) = rt.block_on(get).ok()?;
    let text = String::from_utf8_lossy(&body);
    status.is_success().then(|| onepool_elastic_daemon::replica_metrics::sum_samples(&text, &[name.to_string()]))?
}

fn metric_at(address: SocketAddr, name: &str, key: Option<&str>) -> Option<f64> {
    let fields: Vec<(&str, &str)> = key.map(|k| (REPLICA_KEY_FIELD, k)).into_iter().collect();
    let answer = send(address, "GET", "/metrics", None, &fields).ok()?;
    onepool_elastic_daemon::replica_metrics::sum_samples(&answer.text(), &[name.to_string()])
}

/// The header a launcher wants onepoold's replica key in.
pub const REPLICA_KEY_FIELD: &str = "x-onepool-replica-key";

/// Status of one request, or `None` when the connection failed.
pub fn request(port: u16, method: &str, path: &str, body: &str) -> Option<u16> {
    request_with(port, method, path, body, &[])
}

/// [`request`] with header `fields` beside the client's, e.g. a replica key.
pub fn request_with(port: u16, method: &str, path: &str, body: &str, fields: &[(&str, &str)]) -> Option<u16> {
    request_at(local(port), method, path, body, fields)
}

/// [`request_with`] to `address`, e.g. a launcher at its node's address in
/// the hosts mode.
pub fn request_at(address: SocketAddr, method: &str, path: &str, body: &str, fields: &[(&str, &str)]) -> Option<u16> {
    let body = (!body.is_empty()).then_some(body);
    send(address, method, path, body, fields).ok().map(|a| a.status.as_u16())
}

/// A completion request that takes `secs` on the stand-in server.
pub fn completion(port: u16, secs: f64) -> Option<u16> {
    completion_with(port, secs, &[])
}

/// [`completion`] with header `fields`, e.g. a replica key.
pub fn completion_with(port: u16, secs: f64, fields: &[(&str, &str)]) -> Option<u16> {
    let tokens = (secs * 1000.0).round() as u64;
    request_with(port, "POST", "/v1/completions", &format!("{{\"model\": \"m\", \"max_tokens\": {tokens}}}"), fields)
}

/// [`completion`] streamed with `best_of: 2`: an answer the router does
/// not follow, so a replica's drain waits for it rather than move it (a
/// whole answer is movable: sent again whole elsewhere; several choices
/// move by being generated again, issue #51).
pub fn held_completion(port: u16, secs: f64) -> Option<u16> {
    let tokens = (secs * 1000.0).round() as u64;
    let body =
        format!("{{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": {tokens}, \"best_of\": 2, \"stream\": true}}");
    request_with(port, "POST", "/v1/completions", &body, &[])
}

/// Clients sending completions back to back until stopped; every answer
/// is counted by status (0: the connection failed).
pub struct Load {
    stop: Arc<AtomicBool>,
    pub sent: Arc<AtomicU64>,
    pub statuses: Arc<Mutex<BTreeMap<u16, u64>>>,
    clients: Vec<JoinHandle<()>>,
}

impl Load {
    /// Completions of `secs` each on the stand-in server.
    pub fn start(port: u16, clients: usize, secs: f64) -> Load {
        Load::with(clients, move || completion(port, secs))
    }

    /// As [`Load::start`], each answer one a drain waits for
    /// ([`held_completion`]).
    pub fn held(port: u16, clients: usize, secs: f64) -> Load {
        Load::with(clients, move || held_completion(port, secs))
    }

    /// As [`Load::start`], with clients that retry a request whose
    /// connection failed before any answer, twice, after 0.5 s then 1 s:
    /// what the official openai client does by default (`max_retries=2`,
    /// connection errors retried). `retried` counts the retries.
    pub fn retrying(port: u16, clients: usize, secs: f64, retried: Arc<AtomicU64>) -> Load {
        Load::with(clients, move || {
            let mut wait = Duration::from_millis(500);
            for _ in 0..2 {
                if let Some(status) = completion(port, secs) {
                    return Some(status);
                }
                retried.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(wait);
                wait *= 2;
            }
            completion(port, secs)
        })
    }

    /// Streamed chat completions of `max_tokens` for the real model; a
    /// stream cut off counts as 0.
    pub fn streams(port: u16, clients: usize, max_tokens: u32) -> Load {
        Load::with(clients, move || match chat(port, "Tell me about sharing GPUs.", max_tokens, true) {
            Chat::Done(_) => Some(200),
            Chat::Status(s, _) => Some(s),
            Chat::Cut(_) => None,
        })
    }

    /// `clients` threads calling `one` back to back (`None`: the request
    /// failed without a status).
    pub fn with(clients: usize, one: impl Fn() -> Option<u16> + Send + Sync + 'static) -> Load {
        let one = Arc::new(one);
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let statuses = Arc::new(Mutex::new(BTreeMap::new()));
        let clients = (0..clients)
            .map(|_| {
                let (stop, sent, statuses, one) = (stop.clone(), sent.clone(), statuses.clone(), one.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        sent.fetch_add(1, Ordering::SeqCst);
                        let status = one().unwrap_or(0);
                        if status == 0 {
                            // Nothing listens (the router is down): do not spin.
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        *statuses.lock().unwrap().entry(status).or_default() += 1;
                    }
                })
            })
            .collect();
        Load { stop, sent, statuses, clients }
    }

    /// Stops sending, waits for every answer, returns (sent, statuses).
    pub fn finish(self) -> (u64, BTreeMap<u16, u64>) {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            c.join().unwrap();
        }
        let statuses = self.statuses.lock().unwrap().clone();
        (self.sent.load(Ordering::SeqCst), statuses)
    }

    /// Answers other than 200 so far.
    pub fn failed(&self) -> u64 {
        self.statuses.lock().unwrap().iter().filter(|(s, _)| **s != 200).map(|(_, n)| n).sum()
    }
}

/// Polls `f` every 200 ms; panics with `what` after `timeout`.
pub fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    t0.elapsed()
}

/// One line of squeue: id, name, QOS, state.
#[derive(Debug, Clone)]
pub struct Queued {
    pub id: u32,
    pub name: String,
    pub qos: String,
    pub state: String,
}

pub fn queue(c: &TestCluster) -> Vec<Queued> {
    c.ok("squeue", &["-h", "-o", "%i|%j|%q|%T"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            Some(Queued {
                id: f.first()?.parse().ok()?,
                name: f.get(1)?.to_string(),
                qos: f.get(2)?.to_string(),
                state: f.get(3)?.to_string(),
            })
        })
        .collect()
}

/// onepoold's `/v1/state` through its control socket.
pub fn control_state(socket: &Path) -> Option<onepool_control::api::State> {
    onepool_control::blocking::Control::new(socket, Duration::from_secs(5)).ok()?.state().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_config_loads_with_its_changes() {
        let dir = Path::new("/tmp/onepool-x");
        let launcher = Path::new("/src/target/debug/onepool");
        let c = stand_in_config(dir, "/c/etc/slurm.conf", launcher, "chat", |r| r.min = Some(0))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.control_socket, dir.join("onepoold.sock"));
        let r = c.endpoints[0].replicas.as_ref().unwrap();
        assert_eq!((r.min, r.max, r.gpus, r.port_range), (0, 3, 4, (18500, 18599)));
        assert_eq!(r.output, "/tmp/onepool-x/replica-%j.log");
    }
}
