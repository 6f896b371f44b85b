//! The demo's running state: its paths, onepoold as its child, the load,
//! the watcher, and what it asks of Slurm and onepoold along the way;
//! everything it started is stopped on every way out.

use std::fs;
use std::io::{IsTerminal, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use onepool_dev_cluster::process::Tracked;
use onepool_loadgen::Load;

use crate::commands::slurm;
use crate::settings::ABORT;
use crate::users::cancel_demo_jobs;
use crate::watch::Watch;

pub(crate) fn step(text: &str) {
    if std::io::stdout().is_terminal() {
        println!("\n\x1b[1m== {text}\x1b[0m");
    } else {
        println!("\n== {text}");
    }
    let _ = std::io::stdout().flush();
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("picking a free port")?.local_addr()?.port())
}

pub(crate) struct Paths {
    pub(crate) root: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) pid_file: PathBuf,
    pub(crate) onepoold_log: PathBuf,
    /// The hosts mode's service host (`up --hosts`): onepoold runs in its
    /// network namespace and listens on its address. `None`: one namespace.
    pub(crate) service_host: Option<onepool_dev_cluster::hosts::Host>,
    /// The hosts mode's bridge, which the demo captures (`None`: one
    /// namespace, no network between the hosts).
    pub(crate) bridge: Option<String>,
}

pub(crate) struct Demo {
    pub(crate) paths: Paths,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) onepoold: Option<Child>,
    pub(crate) watch: Option<Watch>,
    pub(crate) load: Option<Arc<Load>>,
    /// The demo's own uid (root: it submits the protected training).
    pub(crate) uid: u32,
    /// onepoold's service user: it owns the replica jobs.
    pub(crate) service: (u32, u32),
    pub(crate) cleaned: bool,
    /// Steps of the story that did not happen as told: each fails the demo
    /// at the end (after the summary shows what did happen).
    pub(crate) untold: Vec<String>,
}

impl Demo {
    /// Polls `ready` every 100 ms; fails after `timeout`, on Ctrl-C, or when
    /// onepoold exits. Returns how long it waited.
    pub(crate) fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&Demo) -> bool,
    ) -> anyhow::Result<f64> {
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
    pub(crate) fn daemon_state(&self) -> Option<onepool_control::api::State> {
        let control = onepool_control::Control::new(&self.paths.socket, Duration::from_secs(2));
        self.rt.block_on(control.state()).ok()
    }

    /// The reclaims onepoold's status lists: (victim, taker, whole seconds
    /// from the taker's submission to its start).
    pub(crate) fn reclaims_seen(&self) -> Vec<(u64, Option<u64>, Option<u64>)> {
        let Some(state) = self.daemon_state() else { return Vec::new() };
        state
            .endpoints
            .iter()
            .flat_map(|e| e.replica_jobs.iter().flat_map(|v| &v.reclaims))
            .map(|r| (u64::from(r.job), r.taker.map(u64::from), r.time_to_capacity_s))
            .collect()
    }

    /// The first failed start of a replica job onepoold reports, with its
    /// cause (the server's signal or code and last output lines).
    pub(crate) fn failed_start(&self) -> Option<String> {
        let state = self.daemon_state()?;
        state.endpoints.iter().find_map(|e| {
            let f = &e.replica_jobs.as_ref()?.start_failures;
            (f.total > 0).then(|| {
                format!(
                    "a replica of endpoint {} failed to start ({} time(s)): {}",
                    e.name,
                    f.total,
                    f.last.as_ref().map_or("?", |l| l.cause.as_str())
                )
            })
        })
    }

    pub(crate) fn sleep(&mut self, what: &str, secs: f64) -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs_f64(secs);
        self.wait(what, Duration::from_secs_f64(secs + 5.0), |_| Instant::now() >= until).map(|_| ())
    }

    pub(crate) fn watch(&self) -> &Watch {
        self.watch.as_ref().expect("the watcher runs")
    }

    pub(crate) fn load(&self) -> &Arc<Load> {
        self.load.as_ref().expect("the load runs")
    }

    /// `onepool status`: the pool per class from Slurm, the endpoint from
    /// onepoold's control socket.
    pub(crate) fn show_status(&self) {
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

    pub(crate) fn show_queue(&self) {
        match slurm("squeue", &["-o", "%.6i %.20j %.7u %.22q %.9P %.8T %N"]) {
            Ok(q) => print!("$ squeue\n{q}"),
            Err(e) => eprintln!("onepool-demo: {e:#}"),
        }
    }

    pub(crate) fn start_onepoold(&mut self) -> anyhow::Result<()> {
        let log = fs::File::create(&self.paths.onepoold_log)
            .with_context(|| format!("creating {}", self.paths.onepoold_log.display()))?;
        // As its service user, as etc/systemd/onepoold.service runs it:
        // the replica jobs and their model servers then run as that user.
        let onepoold = self.paths.bin.join("onepoold");
        let mut command = match &self.paths.service_host {
            // setns needs root: `ip netns exec` enters the service host's
            // namespace, then setpriv becomes the service user, both by
            // exec, so the child's pid is onepoold's.
            Some(host) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &host.namespace, "setpriv"])
                    .arg(format!("--reuid={}", self.service.0))
                    .arg(format!("--regid={}", self.service.1))
                    .arg("--clear-groups")
                    .arg(&onepoold);
                c
            }
            None => {
                let mut c = Command::new(&onepoold);
                c.uid(self.service.0).gid(self.service.1);
                c
            }
        };
        let child = command
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
        let control = onepool_control::Control::new(&self.paths.socket, Duration::from_secs(1));
        let handle = self.rt.handle().clone();
        self.wait("onepoold's control socket", Duration::from_secs(15), |_| handle.block_on(control.state()).is_ok())?;
        Ok(())
    }

    /// SIGTERM to onepoold; it stops routing (its replica jobs keep running
    /// until the demo cancels them).
    pub(crate) fn stop_onepoold(&mut self) -> Option<String> {
        let mut child = self.onepoold.take()?;
        let pid = child.id() as i32;
        // Our own child, not yet reaped.
        let _ = onepool_os::signal(pid as u32, onepool_os::SIGTERM);
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
    pub(crate) fn cleanup(&mut self, verbose: bool) {
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
