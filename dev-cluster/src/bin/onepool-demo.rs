//! `onepool-demo`: the scenario behind `scripts/demo.sh`, on a dev cluster
//! that is up. onepoold runs one inference endpoint and keeps its replicas
//! as Slurm jobs itself: a baseline replica in the protected class, and
//! supplemental ones in the flexible class when the load (the Azure LLM
//! conversation trace, replayed) asks for them. A protected training job
//! then needs GPUs a supplemental replica holds: Slurm preempts it, its
//! launcher drains, the training starts; when the training ends, onepoold's
//! pending replica takes the GPUs back. The demo prints a timeline and the
//! requests sent, served and failed, and fails loudly (non-zero exit) when
//! a step does not happen or a request is lost. onepoold is stopped and the
//! demo's jobs are cancelled on every way out; the cluster keeps running.

use std::fs;
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use onepool_dev_cluster::model_server::{ModelServer, Slots, MODEL_NAME};
use onepool_dev_cluster::process::Tracked;
use onepool_dev_cluster::Cluster;
use onepool_elastic_daemon::config::{AccessLogFile, ConfigFile, EndpointFile, HealthFile, ReplicasFile, RetryFile};

#[path = "../demo/watch.rs"]
mod watch;

use onepool_dev_cluster::replay::{ChatShape, Load, Trace};
use watch::{Kind, Target, Timeline, Watch};

const ENDPOINT: &str = "chat";
/// GPUs per replica (one node of the dev cluster).
const GPUS: u32 = 4;
/// Trace seconds per wall second in the light and the heavy phase.
const LIGHT: f64 = 0.4;
const HEAVY: f64 = 1.0;
const LIGHT_SECS: u64 = 15;
/// The demo policy's min_runtime_before_reclaim (PreemptExemptTime).
const MIN_RUNTIME_SECS: f64 = 10.0;
const TRAINING_SECS: u64 = 20;
const SCALE_DOWN_DELAY_SECS: u64 = 20;
/// One replica's llama-server: one CPU thread (the machine has few), as
/// many requests at once as the endpoint sends it.
const SLOTS: Slots = Slots { parallel: 4, context: 256, threads: 1 };
/// The other user's job, which onepoold must leave alone.
const OTHER_USER: &str = "op-ana";
const OTHER_ACCOUNT: &str = "research";
const OTHER_JOB: &str = "research-finetune";
const TRAINING_JOB: &str = "critical-training";

static ABORT: AtomicBool = AtomicBool::new(false);

#[derive(Parser)]
#[command(name = "onepool-demo", about = "onepoold autoscaling and graceful reclaim on a dev cluster that is up")]
struct Args {
    /// The dev cluster's state folder (`onepool-devcluster --dir`).
    #[arg(long, env = "ONEPOOL_DEVCLUSTER_DIR", default_value = ".devcluster")]
    dir: PathBuf,
    /// Folder with onepoold and onepool (default: beside this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The Azure LLM inference trace to replay.
    #[arg(long, default_value = "data/azure-llm-inference-2023-conv.csv")]
    trace: PathBuf,
    /// The model server and model (scripts/model-server.sh makes them).
    #[arg(long, env = "ONEPOOL_MODEL_SERVER_DIR", default_value = "/var/cache/onepool/model-server")]
    model_server: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nonepool-demo: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn step(text: &str) {
    if std::io::stdout().is_terminal() {
        println!("\n\x1b[1m== {text}\x1b[0m");
    } else {
        println!("\n== {text}");
    }
    let _ = std::io::stdout().flush();
}

/// A Slurm client command (SLURM_CONF is in this process's environment).
fn slurm(program: &str, args: &[&str]) -> anyhow::Result<String> {
    onepool_slurm_commands::run(Command::new(program).args(args), Duration::from_secs(30))
        .with_context(|| format!("{program} {}", args.join(" ")))
}

fn uid_of(user: &str) -> Option<u32> {
    id_of(user, "-u")
}

fn gid_of(user: &str) -> Option<u32> {
    id_of(user, "-g")
}

fn id_of(user: &str, which: &str) -> Option<u32> {
    let out = Command::new("id").args([which, user]).stderr(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok().filter(|_| out.status.success())
}

/// `squeue -h -j JOB -o %T`: the job's state, `None` once it left the queue.
fn job_state(job: u32) -> Option<String> {
    let out = slurm("squeue", &["-h", "-j", &job.to_string(), "-o", "%T"]).ok()?;
    Some(out.trim().to_string()).filter(|s| !s.is_empty())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("picking a free port")?.local_addr()?.port())
}

struct Paths {
    root: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    pid_file: PathBuf,
    onepoold_log: PathBuf,
}

struct Demo {
    paths: Paths,
    rt: tokio::runtime::Runtime,
    onepoold: Option<Child>,
    watch: Option<Watch>,
    load: Option<Arc<Load>>,
    /// The demo's own uid (root: it submits the protected training).
    uid: u32,
    /// onepoold's service user: it owns the replica jobs.
    service: (u32, u32),
    cleaned: bool,
    /// Steps of the story that did not happen as told: each fails the demo
    /// at the end (after the summary shows what did happen).
    untold: Vec<String>,
}

impl Demo {
    /// Polls `ready` every 100 ms; fails after `timeout`, on Ctrl-C, or when
    /// onepoold exits. Returns how long it waited.
    fn wait(&mut self, what: &str, timeout: Duration, mut ready: impl FnMut(&Demo) -> bool) -> anyhow::Result<f64> {
        let t = Instant::now();
        let mut checked = Instant::now();
        loop {
            // A replica that cannot start will not serve however long the
            // demo waits (issue #24): say why at once.
            if checked.elapsed() >= Duration::from_secs(1) {
                checked = Instant::now();
                if let Some(why) = self.failed_start() {
                    bail!("{why}; the demo waited for {what}. onepoold's log: {}", self.paths.onepoold_log.display());
                }
            }
            if ABORT.load(Ordering::SeqCst) {
                bail!("interrupted while waiting for {what}");
            }
            if let Some(c) = self.onepoold.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.onepoold = None;
                    bail!(
                        "onepoold exited ({status}) while the demo waited for {what}; its log: {}",
                        self.paths.onepoold_log.display()
                    );
                }
            }
            if ready(self) {
                return Ok(t.elapsed().as_secs_f64());
            }
            if t.elapsed() > timeout {
                bail!(
                    "timed out after {} s waiting for {what}; see {} and {}/replica-*.out",
                    timeout.as_secs(),
                    self.paths.onepoold_log.display(),
                    self.paths.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// onepoold's state from its control socket; `None` when it does not
    /// answer within 2 s or answers with an error.
    fn daemon_state(&self) -> Option<serde_json::Value> {
        let socket = self.paths.socket.clone();
        let (status, state) = self
            .rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(2),
                    onepool_control::request(&socket, http::Method::GET, "/v1/state", None),
                )
                .await
            })
            .ok()?
            .ok()?;
        status.is_success().then_some(state)
    }

    /// The reclaims onepoold's status lists: (victim, taker, whole seconds
    /// from the taker's submission to its start).
    fn reclaims_seen(&self) -> Vec<(u64, Option<u64>, Option<u64>)> {
        let Some(state) = self.daemon_state() else { return Vec::new() };
        let endpoints = state["endpoints"].as_array().cloned().unwrap_or_default();
        endpoints
            .iter()
            .flat_map(|e| e["replica_jobs"]["reclaims"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| Some((r["job"].as_u64()?, r["taker"].as_u64(), r["time_to_capacity_s"].as_u64())))
            .collect()
    }

    /// The first failed start of a replica job onepoold reports, with its
    /// cause (the server's signal or code and last output lines).
    fn failed_start(&self) -> Option<String> {
        let state = self.daemon_state()?;
        state["endpoints"].as_array()?.iter().find_map(|e| {
            let f = &e["replica_jobs"]["start_failures"];
            (f["total"].as_u64()? > 0).then(|| {
                format!(
                    "a replica of endpoint {} failed to start ({} time(s)): {}",
                    e["name"].as_str().unwrap_or("?"),
                    f["total"],
                    f["last"]["cause"].as_str().unwrap_or("?")
                )
            })
        })
    }

    fn sleep(&mut self, what: &str, secs: f64) -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs_f64(secs);
        self.wait(what, Duration::from_secs_f64(secs + 5.0), |_| Instant::now() >= until).map(|_| ())
    }

    fn watch(&self) -> &Watch {
        self.watch.as_ref().expect("the watcher runs")
    }

    fn load(&self) -> &Arc<Load> {
        self.load.as_ref().expect("the load runs")
    }

    /// `onepool status`: the pool per class from Slurm, the endpoint from
    /// onepoold's control socket.
    fn show_status(&self) {
        let policy = self.paths.root.join("etc/onepool.toml");
        let out = Command::new(self.paths.bin.join("onepool"))
            .arg("status")
            .arg("--socket")
            .arg(&self.paths.socket)
            .arg("--policy")
            .arg(&policy)
            .output();
        match out {
            Ok(o) => {
                println!("$ onepool status");
                print!("{}", String::from_utf8_lossy(&o.stdout));
                if !o.status.success() {
                    eprint!("{}", String::from_utf8_lossy(&o.stderr));
                }
            }
            Err(e) => eprintln!("onepool-demo: cannot run onepool status: {e}"),
        }
    }

    fn show_queue(&self) {
        match slurm("squeue", &["-o", "%.6i %.20j %.7u %.22q %.9P %.8T %N"]) {
            Ok(q) => print!("$ squeue\n{q}"),
            Err(e) => eprintln!("onepool-demo: {e:#}"),
        }
    }

    fn start_onepoold(&mut self) -> anyhow::Result<()> {
        let log = fs::File::create(&self.paths.onepoold_log)
            .with_context(|| format!("creating {}", self.paths.onepoold_log.display()))?;
        // As its service user, as etc/systemd/onepoold.service runs it:
        // the replica jobs and their model servers then run as that user.
        let child = Command::new(self.paths.bin.join("onepoold"))
            .uid(self.service.0)
            .gid(self.service.1)
            .arg("--config")
            .arg(&self.paths.config)
            .env("ONEPOOLD_LOG", "info")
            // A log file, not a terminal: no colour codes.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.paths.bin.join("onepoold").display()))?;
        if let Some(t) = Tracked::of(child.id() as i32) {
            t.write(&self.paths.pid_file)?;
        }
        self.onepoold = Some(child);
        let socket = self.paths.socket.clone();
        let handle = self.rt.handle().clone();
        self.wait("onepoold's control socket", Duration::from_secs(15), |_| {
            handle.block_on(async {
                matches!(
                    tokio::time::timeout(
                        Duration::from_secs(1),
                        onepool_control::request(&socket, http::Method::GET, "/v1/state", None)
                    )
                    .await,
                    Ok(Ok((s, _))) if s.is_success()
                )
            })
        })?;
        Ok(())
    }

    /// SIGTERM to onepoold; it stops routing (its replica jobs keep running
    /// until the demo cancels them).
    fn stop_onepoold(&mut self) -> Option<String> {
        let mut child = self.onepoold.take()?;
        let pid = child.id() as i32;
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(status)) = child.try_wait() {
                let _ = fs::remove_file(&self.paths.pid_file);
                return Some(format!("onepoold stopped ({status}) {:.1} s after SIGTERM", t.elapsed().as_secs_f64()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_file(&self.paths.pid_file);
        Some("onepoold did not stop within 15 s of SIGTERM; killed".to_string())
    }

    /// Stops the load and onepoold and cancels the demo's jobs; idempotent.
    fn cleanup(&mut self, verbose: bool) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        if let Some(l) = &self.load {
            l.stop();
        }
        if let Some(msg) = self.stop_onepoold() {
            if verbose {
                println!("{msg}");
            }
        }
        if let Some(mut w) = self.watch.take() {
            w.stop();
        }
        match cancel_demo_jobs(self.uid, self.service.0) {
            Ok(0) => {}
            Ok(n) if verbose => println!("cancelled the demo's {n} job(s)"),
            Ok(_) => {}
            Err(e) => eprintln!("onepool-demo: cancelling the demo's jobs: {e:#}"),
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if !self.cleaned {
            eprintln!("onepool-demo: stopping onepoold and cancelling the demo's jobs");
        }
        self.cleanup(false);
    }
}

/// The demo's jobs still in the queue: onepoold's replicas of the demo
/// endpoint (the service user's), the training job (ours), the other
/// user's job.
fn demo_jobs(uid: u32, service_uid: u32) -> anyhow::Result<Vec<u32>> {
    let other = uid_of(OTHER_USER);
    let q = slurm("squeue", &["-h", "-o", "%i|%j|%U"])?;
    Ok(q.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            let (id, name, owner) = (f.first()?.parse::<u32>().ok()?, *f.get(1)?, f.get(2)?.parse::<u32>().ok()?);
            let replica =
                owner == service_uid && onepool_launcher::conventions::port_from_name(ENDPOINT, name).is_some();
            let ours = replica || (owner == uid && name == TRAINING_JOB) || (Some(owner) == other && name == OTHER_JOB);
            ours.then_some(id)
        })
        .collect())
}

/// Cancels the demo's jobs and waits (up to 30 s) until they left the queue.
fn cancel_demo_jobs(uid: u32, service_uid: u32) -> anyhow::Result<usize> {
    let jobs = demo_jobs(uid, service_uid)?;
    if jobs.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = jobs.iter().map(u32::to_string).collect();
    let mut args = vec!["--quiet"];
    args.extend(ids.iter().map(String::as_str));
    // scancel fails for a job that ended meanwhile; what is left is checked below.
    let _ = slurm("scancel", &args);
    let t = Instant::now();
    loop {
        let left = demo_jobs(uid, service_uid)?;
        if left.is_empty() {
            return Ok(jobs.len());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("jobs {left:?} are still in the queue 30 s after scancel");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The other user (created like the integration tests create theirs) and
/// their Slurm association.
fn ensure_other_user() -> anyhow::Result<()> {
    if uid_of(OTHER_USER).is_none() {
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", OTHER_USER])
            .output()
            .context("useradd")?;
        // 9: created meanwhile.
        if !out.status.success() && out.status.code() != Some(9) {
            bail!("useradd {OTHER_USER}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    let accounts = slurm("sacctmgr", &["-n", "-P", "show", "account", "format=account"])?;
    if !accounts.lines().any(|a| a.trim() == OTHER_ACCOUNT) {
        slurm("sacctmgr", &["-i", "add", "account", OTHER_ACCOUNT, "Description=demo", "Organization=demo"])?;
    }
    let assocs = slurm("sacctmgr", &["-n", "-P", "show", "assoc", "format=account,user"])?;
    if !assocs.lines().any(|l| l.trim() == format!("{OTHER_ACCOUNT}|{OTHER_USER}")) {
        slurm("sacctmgr", &["-i", "add", "user", OTHER_USER, &format!("Account={OTHER_ACCOUNT}")])?;
    }
    Ok(())
}

/// sbatch as the other user; slurmctld may need a moment to learn a new
/// association from slurmdbd, so a refusal is retried for 15 s.
fn submit_as_other_user(slurm_conf: &str, args: &[&str]) -> anyhow::Result<u32> {
    let t = Instant::now();
    loop {
        let out = Command::new("runuser")
            .args(["-u", OTHER_USER, "--", "env", &format!("SLURM_CONF={slurm_conf}"), "sbatch", "--parsable"])
            .args(args)
            .current_dir("/tmp")
            .output()
            .context("runuser sbatch")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            return stdout
                .trim()
                .split(';')
                .next()
                .and_then(|s| s.parse().ok())
                .with_context(|| format!("sbatch printed {stdout:?}, not a job id"));
        }
        if t.elapsed() > Duration::from_secs(15) || ABORT.load(Ordering::SeqCst) {
            bail!("sbatch as {OTHER_USER}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn config(p: &Paths, listen: SocketAddr, slurm_conf: &str, server: &ModelServer) -> ConfigFile {
    let command = server.replica_command(SLOTS);
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    ConfigFile {
        comment: Some("Written by onepool-demo: one endpoint whose replicas onepoold runs as Slurm jobs.".into()),
        shutdown_grace: Some(secs(5)),
        slurm_conf: Some(slurm_conf.into()),
        endpoints: vec![EndpointFile {
            listen: Some(listen),
            replica_concurrency: Some(SLOTS.parallel),
            queue_size: Some(2000),
            queue_timeout: Some(secs(60)),
            request_timeout: Some(secs(120)),
            retry: Some(RetryFile { attempts: Some(2), ..RetryFile::default() }),
            health: Some(HealthFile {
                interval: Some(millis(500)),
                timeout: Some(secs(1)),
                healthy_after: Some(1),
                unhealthy_after: Some(3),
                ..HealthFile::new("/health")
            }),
            replicas: Some(ReplicasFile {
                gpus: Some(GPUS),
                min: Some(1),
                max: Some(3),
                target_per_replica: Some(3.0),
                // The server's own count of what it decodes and defers.
                load_metrics: Some(vec!["llamacpp:requests_processing".into(), "llamacpp:requests_deferred".into()]),
                drain_timeout: Some(secs(30)),
                startup_timeout: Some(secs(60)),
                baseline_workload: Some("inference-baseline".into()),
                supplemental_workload: Some("inference".into()),
                port_range: Some((19400, 19499)),
                launcher: Some(p.bin.join("onepool").display().to_string()),
                poll_interval: Some(millis(500)),
                stable_window: Some(secs(10)),
                panic_window: Some(secs(2)),
                scale_down_delay: Some(secs(SCALE_DOWN_DELAY_SECS)),
                output: Some(p.log.join("replica-%j.out").display().to_string()),
                ..ReplicasFile::new(command)
            }),
            ..EndpointFile::new(ENDPOINT)
        }],
        replica_key_file: Some(p.socket.with_file_name("replica.key")),
        // The report's "what the pool saved" replays what the router served.
        access_log: Some(AccessLogFile { path: p.socket.with_file_name("access.jsonl"), ..AccessLogFile::default() }),
        ..ConfigFile::new(&p.socket)
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let Setup { cluster, spec, slurm_conf, trace, service, uid, server, paths } = setup(args)?;
    // The period `onepool report` reads at the end, in the cluster's clock.
    let report_from = onepool_decisions::trace::format_time(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()) - 1.0,
    );
    let root = cluster.layout.root.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        ABORT.store(true, Ordering::SeqCst);
    });
    clear_the_pool(&paths, uid, service)?;
    let tl = Arc::new(Timeline::new());
    let mut d =
        Demo { paths, rt, onepoold: None, watch: None, load: None, uid, service, cleaned: false, untold: Vec::new() };
    let watch = Watch::start(
        tl.clone(),
        Target {
            endpoint: ENDPOINT.to_string(),
            socket: d.paths.socket.clone(),
            slurm_conf: slurm_conf.clone(),
            uid: service.0,
        },
        d.rt.handle().clone(),
    );
    d.watch = Some(watch);

    show_the_pool(&cluster, &spec)?;
    let other = someone_elses_job(&mut d, &tl, &slurm_conf)?;
    let listen = onepoold_starts(&mut d, &tl, &slurm_conf, &server)?;
    let trace_name = trace_name(&args.trace);
    let load = load_light_then_heavy(&mut d, &tl, trace, &trace_name, listen)?;
    let (training, time_to_capacity) = protected_training_arrives(&mut d, &tl)?;
    training_ends(&mut d, &tl, training)?;
    load_ends(&mut d, &tl, &load)?;
    let other_state = job_state(other);
    let onepoold_saw = onepoold_names_the_taker(&d, training, time_to_capacity);
    summary(&d, &tl, &load, training, time_to_capacity, other, other_state.as_deref());
    let (sent, served, failed) = load.totals();

    step("Cleaning up: onepoold stops (SIGTERM), the demo's jobs are cancelled; the cluster keeps running");
    d.cleanup(true);
    let dc = d.paths.bin.join("onepool-devcluster");
    println!(
        "cluster: {}   (eval \"$({} --dir {} env)\" to use it; '{} --dir {} down' to stop it)",
        root.display(),
        dc.display(),
        root.display(),
        dc.display(),
        root.display()
    );
    let mut problems = std::mem::take(&mut d.untold);
    problems.extend(onepoold_saw.err());
    step("What Slurm's records say: onepool report over the demo's period");
    if let Err(e) = the_report_agrees(&cluster, &d.paths, &report_from, training, time_to_capacity) {
        problems.push(format!("onepool report: {e:#}"));
    }
    println!("demo wall time {:.0} s", started.elapsed().as_secs_f64());

    if failed > 0 {
        problems.push(format!("{failed} request(s) failed; under graceful reclaim none may"));
    }
    if sent == 0 || served + failed != sent {
        problems.push(format!("{sent} sent but {served} served and {failed} failed"));
    }
    if other_state.as_deref() != Some("RUNNING") {
        problems.push(format!("{OTHER_USER}'s job {other} is {other_state:?}, not RUNNING: it must be left alone"));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}

/// onepoold's status must name the training job as the taker of the
/// replica it reclaimed, with the time to capacity the demo measured (to
/// squeue's whole seconds).
fn onepoold_names_the_taker(d: &Demo, training: u32, time_to_capacity: f64) -> Result<(), String> {
    let seen = d.reclaims_seen();
    let Some((victim, _, ttc)) = seen.iter().find(|(_, taker, _)| *taker == Some(u64::from(training))) else {
        return Err(format!("onepoold's status names no taker {training} among its reclaims: {seen:?}"));
    };
    let ttc = ttc.unwrap_or(u64::MAX);
    println!(
        "onepoold: job {training} took reclaimed replica {victim}'s GPUs {ttc} s after its submission (squeue's whole seconds; the demo measured {time_to_capacity:.1} s)"
    );
    if (ttc as f64 - time_to_capacity).abs() > 1.5 {
        return Err(format!("onepoold's time to capacity {ttc} s is not the demo's {time_to_capacity:.1} s"));
    }
    Ok(())
}

/// `onepool report` over the demo's period must list the reclaim the demo
/// watched, for the training job, with the time to capacity it printed
/// (issue #26: the report once counted no graceful reclaim at all).
fn the_report_agrees(
    cluster: &onepool_dev_cluster::Cluster,
    paths: &Paths,
    from: &str,
    training: u32,
    time_to_capacity: f64,
) -> anyhow::Result<()> {
    let onepool = paths.bin.join("onepool");
    let policy = cluster.layout.policy();
    let saved_dir = paths.socket.with_file_name("saved");
    let deadline = Instant::now() + Duration::from_secs(30);
    // slurmdbd records a job whose comment was updated a few seconds late
    // for a windowed query: ask again until the reclaim is there.
    loop {
        let out = cluster
            .command(&onepool.to_string_lossy())
            .args(["report", "--json", "--from", from, "--daemon-config"])
            .arg(&paths.config)
            .arg("--scenario")
            .arg(&saved_dir)
            .arg(&policy)
            .output()
            .with_context(|| format!("running {}", onepool.display()))?;
        anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr).trim());
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let training = training.to_string();
        let found = report["reclaims"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["for_job"].as_str() == Some(training.as_str()));
        if let Some(r) = found {
            let ttc = r["time_to_capacity_s"].as_f64().unwrap_or(f64::NAN);
            let drained = match (r["drained"].as_u64(), r["cut"].as_u64()) {
                (Some(d), Some(c)) => format!(", {d} request(s) drained and {c} cut"),
                _ => String::new(),
            };
            println!(
                "reclaim of job {} ({}, {}) for job {training}: time to capacity {ttc:.1} s (the demo measured {time_to_capacity:.1} s){drained}; source: {}",
                r["job"].as_str().unwrap_or("?"),
                r["class"].as_str().unwrap_or("?"),
                r["mode"].as_str().unwrap_or("?"),
                r["source"].as_str().unwrap_or("?"),
            );
            anyhow::ensure!(
                (ttc - time_to_capacity).abs() <= 0.5,
                "the report's time to capacity {ttc:.2} s is not the demo's {time_to_capacity:.2} s"
            );
            return the_saved_figure_is_the_simulators(cluster, &onepool, &report["saved"], &saved_dir);
        }
        if Instant::now() > deadline {
            anyhow::bail!("no reclaim for the training job {training} in the report: {}", report["reclaims"]);
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The report's "what the pool saved" must be what `onepool simulate`
/// prints for the scenario the report kept (issue #26: the same records,
/// the same numbers), and must have replayed the demo's requests.
fn the_saved_figure_is_the_simulators(
    cluster: &onepool_dev_cluster::Cluster,
    onepool: &Path,
    saved: &serde_json::Value,
    dir: &Path,
) -> anyhow::Result<()> {
    let gpus = |v: &serde_json::Value| v.as_u64().map_or("unmet or not searched".to_string(), |g| g.to_string());
    println!(
        "what the pool saved ({} job run(s), {} request(s)): separate islands {} GPUs, one shared pool {} GPUs; this pool {}",
        saved["jobs"],
        saved["requests"],
        gpus(&saved["separate_islands_gpus"]),
        gpus(&saved["shared_pool_gpus"]),
        saved["pool_gpus"]
    );
    for a in saved["assumptions"].as_array().into_iter().flatten() {
        println!("  - {}", a.as_str().unwrap_or("?"));
    }
    anyhow::ensure!(saved["requests"].as_u64().unwrap_or(0) > 0, "the saved figure replayed no request: {saved}");
    let out = cluster
        .command(&onepool.to_string_lossy())
        .args(["simulate", "--json"])
        .arg(dir.join("scenario.toml"))
        .output()
        .with_context(|| format!("running {}", onepool.display()))?;
    anyhow::ensure!(out.status.success(), "onepool simulate: {}", String::from_utf8_lossy(&out.stderr).trim());
    let sim: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let c = &sim["comparison"];
    anyhow::ensure!(
        (&c["separate_gpus"], &c["shared_gpus_needed"])
            == (&saved["separate_islands_gpus"], &saved["shared_pool_gpus"]),
        "onepool simulate {} gives separate {} and shared {}, the report {} and {}",
        dir.join("scenario.toml").display(),
        c["separate_gpus"],
        c["shared_gpus_needed"],
        saved["separate_islands_gpus"],
        saved["shared_pool_gpus"]
    );
    println!("onepool simulate {} gives the same figures", dir.join("scenario.toml").display());
    Ok(())
}

/// What the demo found and prepared before its scenario starts.
struct Setup {
    cluster: Cluster,
    spec: onepool_dev_cluster::Spec,
    slurm_conf: String,
    trace: Trace,
    service: (u32, u32),
    uid: u32,
    server: ModelServer,
    paths: Paths,
}

/// Checks the cluster and the build, and lays out the demo's folder.
fn setup(args: &Args) -> anyhow::Result<Setup> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        bail!("run the demo as root (it submits protected jobs and adds a demo user), as README.md says");
    }
    let cluster = Cluster::at(&args.dir)?;
    let spec = cluster.spec()?;
    if (spec.nodes, spec.gpus_per_node) != (4, GPUS) {
        bail!(
            "the scenario is sized for 4 nodes x {GPUS} GPUs (one replica per node); this cluster has {} x {}",
            spec.nodes,
            spec.gpus_per_node
        );
    }
    let root = cluster.layout.root.clone();
    let slurm_conf = cluster
        .env()
        .into_iter()
        .find(|(k, _)| k == "SLURM_CONF")
        .map(|(_, v)| v)
        .context("the cluster names no SLURM_CONF")?;
    // Every Slurm command below (and onepool status) talks to this cluster.
    std::env::set_var("SLURM_CONF", &slurm_conf);
    slurm("scontrol", &["ping"]).context("slurmctld does not answer; bring the cluster up first")?;
    let bin = match &args.bin_dir {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.parent().map(Path::to_path_buf).context("no folder for this binary")?,
    };
    for b in ["onepoold", "onepool"] {
        if !bin.join(b).is_file() {
            bail!("{} is missing; build first: cargo build --workspace", bin.join(b).display());
        }
    }
    let trace = Trace::load(&args.trace)?;
    // A trace the demo cannot use is refused before any cluster starts.
    Pace::fit(&trace).with_context(|| format!("the trace {}", args.trace.display()))?;
    let service_user = onepool_decisions::policy::SERVICE_USER;
    let service = uid_of(service_user).zip(gid_of(service_user)).with_context(|| {
        format!("the service user {service_user} is missing: bring the cluster up first (onepool-devcluster up)")
    })?;
    // onepoold (its control socket) and its replica jobs (their logs) write
    // here as the service user.
    let demo_dir = root.join("demo");
    let replica_logs = demo_dir.join("replicas");
    fs::create_dir_all(&replica_logs).with_context(|| format!("creating {}", replica_logs.display()))?;
    for d in [&demo_dir, &replica_logs] {
        std::os::unix::fs::chown(d, Some(service.0), Some(service.1))
            .with_context(|| format!("handing {} to {service_user}", d.display()))?;
    }
    let server = ModelServer::at(&args.model_server)?;
    let paths = Paths {
        socket: demo_dir.join("onepoold.sock"),
        config: demo_dir.join("onepoold.toml"),
        pid_file: demo_dir.join("onepoold.pid"),
        onepoold_log: cluster.layout.log().join("onepoold.log"),
        log: replica_logs,
        root: root.clone(),
        bin,
    };
    Ok(Setup { cluster, spec, slurm_conf, trace, service, uid, server, paths })
}

/// Stops a onepoold and cancels the jobs an interrupted run left behind;
/// fails when other jobs hold GPUs (the scenario fills the pool exactly).
fn clear_the_pool(paths: &Paths, uid: u32, service: (u32, u32)) -> anyhow::Result<()> {
    // A onepoold left over from an interrupted run would re-adopt its jobs.
    if let Some(t) = Tracked::read(&paths.pid_file) {
        t.stop(Duration::from_secs(10));
        let _ = fs::remove_file(&paths.pid_file);
    }
    let leftover = cancel_demo_jobs(uid, service.0)?;
    if leftover > 0 {
        println!("cancelled {leftover} job(s) left over from an earlier run of the demo");
    }
    // The scenario needs every GPU: its jobs fill the pool exactly.
    let others = slurm("squeue", &["-h", "-o", "%i %j %u %T"])?;
    if !others.trim().is_empty() {
        bail!(
            "the cluster runs other jobs; the demo needs all its GPUs (cancel them, or use another --dir):\n{}",
            others.trim_end()
        );
    }
    Ok(())
}

/// Phase 1: The pool.
fn show_the_pool(cluster: &Cluster, spec: &onepool_dev_cluster::Spec) -> anyhow::Result<()> {
    let policy_text = fs::read_to_string(cluster.layout.policy())
        .with_context(|| format!("reading {}", cluster.layout.policy().display()))?;
    let policy = onepool_decisions::policy::load(&policy_text).policy.context("the cluster's policy has errors")?;
    step(&format!(
        "The pool: {} nodes x {} GPUs; flexible work runs in gpu-flex, capped at {} GPUs so the {} reserved stay free",
        spec.nodes,
        spec.gpus_per_node,
        policy.flexible_cap(),
        policy.reserved_gpus()
    ));
    print!("$ sinfo\n{}", slurm("sinfo", &["-o", "%P %D %t %G"])?);

    Ok(())
}

/// Phase 2: Someone else's job, which onepoold must leave alone.
fn someone_elses_job(d: &mut Demo, tl: &Timeline, slurm_conf: &str) -> anyhow::Result<u32> {
    step(&format!("{OTHER_USER} (account {OTHER_ACCOUNT}) runs a flexible training job on one node"));
    ensure_other_user()?;
    let other = submit_as_other_user(
        slurm_conf,
        &["--workload=training", "--gpus=4", "-N1", "-J", OTHER_JOB, "-o", "/dev/null", "--wrap", "sleep 1800"],
    )?;
    d.watch().follow(other, &format!("{OTHER_USER}'s training job {other}"), false);
    tl.note(format!("{OTHER_USER} submitted training job {other} (class training, 4 GPUs)"));
    d.wait(&format!("{OTHER_USER}'s job {other} to run"), Duration::from_secs(60), |_| {
        job_state(other).as_deref() == Some("RUNNING")
    })?;

    Ok(other)
}

/// Phase 3: onepoold starts with one baseline replica.
fn onepoold_starts(d: &mut Demo, tl: &Timeline, slurm_conf: &str, server: &ModelServer) -> anyhow::Result<SocketAddr> {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    config(&d.paths, listen, slurm_conf, server)
        .write(&d.paths.config)
        .with_context(|| format!("writing {}", d.paths.config.display()))?;
    step(&format!(
        "onepoold starts: endpoint {ENDPOINT:?} at http://{listen}, 1 baseline replica (protected, reserved GPUs), up to 2 supplemental (flexible, idle GPUs), {GPUS} GPUs each"
    ));
    println!(
        "config {}; log {}; replicas' logs {}/replica-JOB.out",
        d.paths.config.display(),
        d.paths.onepoold_log.display(),
        d.paths.log.display()
    );
    d.start_onepoold()?;
    tl.note(format!("onepoold started (pid {})", d.onepoold.as_ref().map(|c| c.id()).unwrap_or(0)));
    d.wait("the baseline replica to serve", Duration::from_secs(90), |d| {
        !d.watch().seen().serving(Kind::Baseline).is_empty()
    })?;

    Ok(listen)
}

/// The wall-clock pace the story needs in its heavy minute: what the
/// shipped conversation trace brings from its start at 1x (3.7 requests/s,
/// checked by a test); a trace whose first minute brings less is replayed
/// from its busiest minute, sped up to this (issue #24: a lighter public
/// trace timed out waiting for two supplemental replicas).
const HEAVY_RATE: f64 = 3.7;
/// The fastest a trace is replayed: beyond it the recorded pattern would
/// be a different trace, and the demo refuses it instead.
const MAX_SPEED: f64 = 20.0;

/// Where in the trace and how fast the demo replays it.
#[derive(Debug, Clone, PartialEq)]
struct Pace {
    /// Trace seconds skipped (the light phase ends where the heavy minute starts).
    offset: f64,
    light: f64,
    heavy: f64,
    /// Why the trace is not replayed from its start at the usual speeds.
    fitted: Option<String>,
}

impl Pace {
    fn fit(trace: &Trace) -> anyhow::Result<Pace> {
        let light_end = LIGHT_SECS as f64 * LIGHT;
        let own = trace.rate(light_end, light_end + 60.0 * HEAVY) * HEAVY;
        if own >= 0.8 * HEAVY_RATE {
            return Ok(Pace { offset: 0.0, light: LIGHT, heavy: HEAVY, fitted: None });
        }
        let (start, n) = trace.busiest(60.0);
        let busiest = n as f64 / 60.0;
        let heavy = HEAVY_RATE / busiest.max(1e-9);
        if heavy > MAX_SPEED {
            bail!(
                "the trace brings at most {n} requests in any minute ({busiest:.2} requests/s); the demo needs about {HEAVY_RATE} requests/s in its heavy minute, which would mean replaying it {heavy:.0}x faster than recorded (at most {MAX_SPEED}x): give a trace with at least {} requests in some minute",
                (HEAVY_RATE * 60.0 / MAX_SPEED).ceil()
            );
        }
        let light = heavy * LIGHT / HEAVY;
        let offset = (start - LIGHT_SECS as f64 * light).max(0.0);
        let fitted = format!(
            "the trace's first minute brings {own:.1} requests/s, less than the {HEAVY_RATE} the demo needs: replayed from {offset:.0} s, its busiest minute ({n} requests from {start:.0} s) at {heavy:.2}x, the light phase before it at {light:.2}x"
        );
        Ok(Pace { offset, light, heavy, fitted: Some(fitted) })
    }
}

/// Phase 4: Load: light, then heavy, until two supplemental replicas serve and
/// may be reclaimed.
fn load_light_then_heavy(
    d: &mut Demo,
    tl: &Timeline,
    trace: Trace,
    trace_name: &str,
    listen: SocketAddr,
) -> anyhow::Result<Arc<Load>> {
    step(&format!("Load: {trace_name} replayed as chat completions"));
    let shape = ChatShape::DEMO;
    println!(
        "each row is a chat completion for {MODEL_NAME} on llama-server, every other one streamed: ContextTokens/{} prompt words \
         ({}-{}), max_tokens GeneratedTokens/{} ({}-{}), scaled down for a few CPU cores; \
         onepoold asks for one replica per 3 requests the servers process or defer",
        shape.prompt_div, shape.prompt_words.0, shape.prompt_words.1, shape.answer_div, shape.answer_tokens.0, shape.answer_tokens.1
    );
    let pace = Pace::fit(&trace)?;
    if let Some(why) = &pace.fitted {
        println!("{why}");
    }
    let trace = trace.from(pace.offset);
    let (light, heavy) = (pace.light, pace.heavy);
    let light_end = LIGHT_SECS as f64 * light;
    let light_rate = trace.rate(0.0, light_end) * light;
    let heavy_rate = trace.rate(light_end, light_end + 60.0 * heavy) * heavy;
    let load = Load::start(d.rt.handle(), trace, listen, MODEL_NAME, shape, tl.t0);
    d.load = Some(load.clone());
    load.phase("light", light);
    tl.note(format!("load: light, the trace at {light:.2}x (~{light_rate:.1} requests/s): the baseline replica copes"));
    d.sleep("the light phase", LIGHT_SECS as f64)?;
    load.phase("heavy", heavy);
    tl.note(format!("load: heavy, the trace at {heavy:.2}x (~{heavy_rate:.0} requests/s)"));
    d.wait("two supplemental replicas to serve", Duration::from_secs(90), |d| {
        d.watch().seen().serving(Kind::Supplemental).len() >= 2
    })?;
    // Past the policy's minimum run time, a supplemental replica may be reclaimed.
    let reclaimable_at = {
        let s = d.watch().seen();
        s.serving(Kind::Supplemental).iter().filter_map(|j| j.running).fold(0.0, f64::max) + MIN_RUNTIME_SECS + 1.0
    };
    let until = (reclaimable_at - tl.now()).max(2.0);
    d.sleep("the replicas' minimum run time", until)?;
    println!();
    d.show_queue();
    println!();
    d.show_status();

    Ok(load)
}

/// Phase 5: Protected training arrives; Slurm preempts a supplemental replica,
/// which drains. Returns the training job and its time to capacity.
fn protected_training_arrives(d: &mut Demo, tl: &Timeline) -> anyhow::Result<(u32, f64)> {
    step("Critical training (protected, 4 GPUs) arrives; every GPU is taken");
    let t_submit = Instant::now();
    let training = slurm(
        "sbatch",
        &[
            "--parsable",
            "--workload=critical-training",
            "--time=10",
            "--gpus=4",
            "-N1",
            "-J",
            TRAINING_JOB,
            "-o",
            "/dev/null",
            "--wrap",
            &format!("sleep {TRAINING_SECS}"),
        ],
    )?
    .trim()
    .split(';')
    .next()
    .and_then(|s| s.parse::<u32>().ok())
    .context("sbatch printed no job id")?;
    d.watch().follow(training, &format!("critical training job {training}"), true);
    tl.note(format!("critical training job {training} submitted ({GPUS} GPUs, class critical-training)"));
    d.wait("the training job to run", Duration::from_secs(90), |_| job_state(training).as_deref() == Some("RUNNING"))?;
    let time_to_capacity = t_submit.elapsed().as_secs_f64();
    let node = slurm("squeue", &["-h", "-j", &training.to_string(), "-o", "%N"]).unwrap_or_default();
    tl.note(format!(
        "critical training job {training} RUNNING on {} {time_to_capacity:.1} s after submission",
        node.trim()
    ));
    let preempted = |d: &Demo| -> Vec<(u32, Kind, String)> {
        let s = d.watch().seen();
        s.jobs.values().filter(|j| j.preempted.is_some()).map(|j| (j.id, j.kind, j.label.clone())).collect()
    };
    d.wait("the victim Slurm preempted", Duration::from_secs(10), |d| !preempted(d).is_empty())
        .context("the training job runs, but no job was seen being preempted (were GPUs free?)")?;
    let (victim, victim_kind, victim_label) = preempted(d)[0].clone();
    println!();
    d.show_status();
    if victim_kind != Kind::Supplemental {
        bail!("Slurm preempted {victim_label}, not a supplemental replica");
    }
    d.wait(&format!("{victim_label} to end"), Duration::from_secs(45), |d| {
        d.watch().seen().job(victim).is_some_and(|j| j.ended.is_some())
    })?;
    let victim_log = d.paths.log.join(format!("replica-{victim}.out"));
    println!("{victim_label}'s launcher ({}):", victim_log.display());
    for line in fs::read_to_string(&victim_log).unwrap_or_default().lines() {
        // Without the timestamp: the timeline has the times.
        let line = match line.split_once("Z ") {
            Some((stamp, rest)) if stamp.len() < 40 && stamp.starts_with("20") => rest.trim_start(),
            _ => line,
        };
        println!("    {line}");
    }
    // What onepoold decided about the victim, beside what its launcher did.
    let ours = format!("job={victim}");
    let decided: Vec<String> = fs::read_to_string(&d.paths.onepoold_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == ours))
        .map(|l| l.split_once("Z ").map_or(l, |(_, rest)| rest.trim_start()).to_string())
        .collect();
    println!("onepoold about job {victim} ({}):", d.paths.onepoold_log.display());
    for line in decided {
        println!("    {line}");
    }

    Ok((training, time_to_capacity))
}

/// Phase 6: Training ends; the replicas expand again.
fn training_ends(d: &mut Demo, tl: &Timeline, training: u32) -> anyhow::Result<()> {
    step(&format!(
        "Training runs {TRAINING_SECS} s and ends; onepoold's pending supplemental replica takes the GPUs back"
    ));
    d.wait("the training job to end", Duration::from_secs(TRAINING_SECS + 60), |d| {
        d.watch().seen().job(training).is_some_and(|j| j.ended.is_some())
    })?;
    d.wait("two supplemental replicas to serve again", Duration::from_secs(90), |d| {
        d.watch().seen().serving(Kind::Supplemental).len() >= 2
    })?;
    let s = d.watch().seen();
    let ended = s.job(training).and_then(|j| j.ended).unwrap_or(0.0);
    let successors: Vec<(f64, f64, String)> = s
        .replicas()
        .filter(|j| j.kind == Kind::Supplemental && j.running.is_some_and(|r| r >= ended))
        .map(|j| (j.running.unwrap_or(0.0), j.seen, j.label.clone()))
        .collect();
    drop(s);
    if let Some(untold) = taken_back(ended, &successors) {
        tl.note(format!("not as told: {untold}"));
        d.untold.push(untold);
    }
    d.sleep("the load on three replicas", 5.0)?;

    Ok(())
}

/// Whether a supplemental replica that was already pending when the
/// training ended (at `ended`) got its GPUs back; otherwise what happened
/// instead. `successors`: (running since, submitted, label) of the
/// supplemental replicas that started after it ended.
fn taken_back(ended: f64, successors: &[(f64, f64, String)]) -> Option<String> {
    let first = successors.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
    if first.1 < ended {
        return None;
    }
    Some(format!(
        "no pending replica took the GPUs back when the training ended at {ended:.1}s: {} was submitted {:.1} s after it and ran at {:.1}s",
        first.2,
        first.1 - ended,
        first.0
    ))
}

/// The heading's name of the replayed trace: the shipped one by its
/// source, any other by its path.
fn trace_name(path: &Path) -> String {
    match path.file_name().and_then(|f| f.to_str()) {
        Some("azure-llm-inference-2023-conv.csv") => {
            "the Azure LLM conversation trace (2023, CC-BY 4.0, see data/NOTICE.md)".to_string()
        }
        _ => format!("the trace {}", path.display()),
    }
}

/// Phase 7: The load ends; onepoold scales back to the baseline.
fn load_ends(d: &mut Demo, tl: &Timeline, load: &Load) -> anyhow::Result<()> {
    step(&format!(
        "The load ends; {SCALE_DOWN_DELAY_SECS} s later (scale_down_delay) onepoold drains the supplemental replicas"
    ));
    load.pause();
    tl.note("load: stopped; waiting for the requests in flight");
    d.wait("the requests in flight", Duration::from_secs(150), |d| d.load().in_flight() == 0)?;
    tl.note("load: every request answered");
    d.wait("onepoold to scale back to the baseline", Duration::from_secs(SCALE_DOWN_DELAY_SECS + 60), |d| {
        let s = d.watch().seen();
        let scaled_back = s.replicas().all(|j| j.kind == Kind::Baseline || j.ended.is_some());
        scaled_back
    })?;
    Ok(())
}

/// Phase 8: Summary: the timeline, the replica jobs, the requests.
fn summary(
    d: &Demo,
    tl: &Timeline,
    load: &Load,
    training: u32,
    time_to_capacity: f64,
    other: u32,
    other_state: Option<&str>,
) {
    step("Timeline (seconds since the demo started)");
    for (t, e) in tl.events() {
        println!("  {t:>6.1}s  {e}");
    }
    step("onepoold's replica jobs");
    println!(
        "  {:>6}  {:<12} {:<6} {:>9} {:>8} {:>8} {:>8}  {:<10} {:>7}",
        "JOB", "KIND", "NODE", "SUBMITTED", "RUNNING", "SERVING", "ENDED", "STATE", "ROUTED"
    );
    {
        let s = d.watch().seen();
        let t = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
        for j in s.replicas() {
            println!(
                "  {:>6}  {:<12} {:<6} {:>9} {:>8} {:>8} {:>8}  {:<10} {:>7}",
                j.id,
                if j.kind == Kind::Baseline { "baseline" } else { "supplemental" },
                j.node,
                format!("{:.1}", j.seen),
                t(j.running),
                t(j.serving),
                t(j.ended),
                if j.ended.is_some() { j.state.as_str() } else { "live" },
                j.served
            );
        }
    }
    step("Requests");
    println!(
        "  {:<7} {:>6} {:>12} {:>6} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}",
        "PHASE", "SPEED", "SECONDS", "SENT", "SERVED", "FAILED", "P50_S", "P99_S", "TTFT_P50", "TTFT_P99"
    );
    for p in load.phases() {
        let lat = |q| seconds(p.latency(q));
        let ttft = |q| seconds(p.ttft(q));
        println!(
            "  {:<7} {:>5}x {:>12} {:>6} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}",
            p.name,
            p.speed,
            format!("{:.1}-{:.1}", p.start, p.end.unwrap_or(p.start)),
            p.sent,
            p.served,
            p.failed,
            lat(0.5),
            lat(0.99),
            ttft(0.5),
            ttft(0.99)
        );
    }
    let (sent, served, failed) = load.totals();
    println!("\nrequests sent {sent}, served (2xx) {served}, failed {failed}");
    for (why, n) in load.failures() {
        println!("  failed: {n} x {why}");
    }
    let s = d.watch().seen();
    let started = s.job(training).and_then(|j| j.running);
    let victim = s.replicas().filter(|j| j.preempted.is_some()).map(|j| (j.label.clone(), j.draining, j.ended)).next();
    let how = match (victim, started) {
        (Some((label, Some(_), Some(end))), Some(run)) if end <= run => {
            format!("{label} drained and ended {:.1} s before", run - end)
        }
        (Some((label, _, end)), _) => {
            format!("{label} ended at {}", end.map_or("-".to_string(), |e| format!("{e:.1}s")))
        }
        (None, _) => "no victim was seen".to_string(),
    };
    drop(s);
    println!(
        "time to capacity: critical training job {training} RUNNING {time_to_capacity:.1} s after submission ({how})"
    );
    println!("{OTHER_USER}'s job {other}: {}", other_state.unwrap_or("gone"));
}

fn seconds(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_story_of_the_gpus_taken_back_is_checked_not_told() {
        let pending = (94.0, 67.7, "supplemental replica 6".to_string());
        assert_eq!(taken_back(93.8, std::slice::from_ref(&pending)), None);
        // Cancelled while the load dropped; a new one came 35 s later.
        let late = (130.0, 128.8, "supplemental replica 9".to_string());
        let told = taken_back(93.8, &[late]).unwrap();
        assert!(told.contains("supplemental replica 9 was submitted 35.0 s after it"), "{told}");
        assert_eq!(taken_back(93.8, &[]), None);
    }

    #[test]
    fn the_shipped_trace_keeps_its_pace_a_lighter_one_is_fitted_and_a_sparse_one_refused() {
        let shipped = Trace::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/azure-llm-inference-2023-conv.csv"),
        )
        .unwrap();
        let light_end = LIGHT_SECS as f64 * LIGHT;
        let own = shipped.rate(light_end, light_end + 60.0) * HEAVY;
        assert!((HEAVY_RATE * 0.99..HEAVY_RATE * 1.05).contains(&own), "HEAVY_RATE is the shipped trace's: {own}");
        assert_eq!(Pace::fit(&shipped).unwrap(), Pace { offset: 0.0, light: LIGHT, heavy: HEAVY, fitted: None });
        // One request every 2 s, and a busier minute from 600 s: 1 a second.
        let mut rows: Vec<(f64, u32, u32)> = (0..300).map(|i| (f64::from(i) * 2.0, 100, 10)).collect();
        rows.extend((0..60).map(|i| (600.0 + f64::from(i) + 0.5, 100, 10)));
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let p = Pace::fit(&Trace { rows }).unwrap();
        assert!((p.heavy - HEAVY_RATE).abs() < 0.1, "{p:?}");
        assert!((p.offset - (600.0 - LIGHT_SECS as f64 * p.light)).abs() < 1.0, "{p:?}");
        assert!(p.fitted.unwrap().contains("its busiest minute"));
        // Two requests a minute at most: refused, with what would do.
        let sparse = Trace { rows: (0..100).map(|i| (f64::from(i) * 30.0, 100, 10)).collect() };
        let e = Pace::fit(&sparse).unwrap_err().to_string();
        assert!(e.contains("at most 2 requests in any minute") && e.contains("at least 12 requests"), "{e}");
    }

    #[test]
    fn the_heading_names_the_trace_replayed() {
        assert!(trace_name(Path::new("data/azure-llm-inference-2023-conv.csv")).contains("conversation trace"));
        assert_eq!(trace_name(Path::new("/tmp/bursty.csv")), "the trace /tmp/bursty.csv");
    }

    #[test]
    fn the_demo_config_loads() {
        let demo = PathBuf::from("/c/demo");
        let p = Paths {
            root: "/c".into(),
            log: demo.join("replicas"),
            bin: "/src/target/debug".into(),
            socket: demo.join("onepoold.sock"),
            config: demo.join("onepoold.toml"),
            pid_file: demo.join("onepoold.pid"),
            onepoold_log: "/c/log/onepoold.log".into(),
        };
        let listen: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let dir = std::env::temp_dir().join(format!("onepool-demo-config-{}", std::process::id()));
        for f in ["bin/llama-server", "models/SmolLM2-135M-Instruct.Q4_1.gguf"] {
            fs::create_dir_all(dir.join(f).parent().unwrap()).unwrap();
            fs::write(dir.join(f), "").unwrap();
        }
        let server = ModelServer::at(&dir).unwrap();
        let c = config(&p, listen, "/c/etc/slurm.conf", &server).build().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.control_socket, c.slurm_conf), (p.socket.clone(), Some("/c/etc/slurm.conf".into())));
        let e = &c.endpoints[0];
        assert_eq!((e.name.as_str(), e.listen, e.replica_concurrency, e.proxy.retries), (ENDPOINT, Some(listen), 4, 2));
        let r = e.replicas.as_ref().unwrap();
        assert_eq!(r.command, server.replica_command(SLOTS));
        assert_eq!(r.load_metrics, ["llamacpp:requests_processing", "llamacpp:requests_deferred"]);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!((r.gpus, r.min, r.max, r.port_range), (GPUS, 1, 3, (19400, 19499)));
        assert_eq!(r.scale_down_delay, Duration::from_secs(SCALE_DOWN_DELAY_SECS));
        assert_eq!(
            (r.launcher.as_str(), r.output.as_str()),
            ("/src/target/debug/onepool", "/c/demo/replicas/replica-%j.out")
        );
    }
}
