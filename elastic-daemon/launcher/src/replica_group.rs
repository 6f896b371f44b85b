//! The batch script's main process for a job that hosts one independent
//! replica per node (`onepool replica --per-node`, endpoints with
//! `replicas_per_job` above 1). It starts one `srun` step per node of the
//! allocation, each running the ordinary launcher ([`crate::launcher`]) on
//! its own port pair, and forwards Slurm's preemption notice to them.
//!
//! Why steps: a shrink (`scontrol update JobId=.. NodeList=<rest>`) and a
//! node failure under `--no-kill` end only the steps on the nodes that
//! leave; the others keep serving (measured on 22.05). The step's name
//! (`replica-<port>`) is how onepoold finds which replica runs where,
//! also after a restart and after earlier shrinks renumbered nothing.
//!
//! Each step's launcher listens where the kernel chooses, on its own node's
//! address (`--listen node:0`, [`crate::node_address`]), and prints the
//! port on its standard output ([`crate::report::Report::Stdout`]); this
//! process reads those lines and writes every replica's port (and why a
//! server ended) into the job's comment, which onepoold reads (one writer:
//! several would overwrite each other).
//!
//! The notice is SIGURG (`--signal=B:URG@N`): on 22.05 the preemption
//! notice reached the steps' processes as well as the batch shell, model
//! servers included, and SIGUSR1 killed them with their requests in
//! flight; a server ignores SIGURG by default. This process also passes
//! any notice on with `scancel --signal=URG JOB` (to every process of
//! every step); only if scancel fails are the srun processes sent SIGUSR1
//! (they forward it), which drains too but may lose requests in flight.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;

use crate::conventions::ReplicaNote;
use crate::node_address::Listen;
use crate::report::Patience;
use onepool_decisions::annotation::ReclaimMode;

#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// The allocation's nodes in Slurm's order (SLURM_JOB_NODELIST); the
    /// replica on the i-th has slot `base_port + 2i` (its step's name).
    pub nodes: Vec<String>,
    /// Each step's `--listen` with port 0 (`node:0`: each on its own
    /// node's address, [`crate::node_address`]).
    pub listen: Listen,
    /// Each step's `--tls` ([`crate::hop_tls`]).
    pub tls: bool,
    pub base_port: u16,
    pub drain_timeout: Duration,
    pub stop_grace: Duration,
    /// Each step's `--reclaim` (its class's mode).
    pub reclaim: ReclaimMode,
    /// The `onepool` binary each step runs (this one).
    pub launcher: String,
    pub srun: String,
    pub scancel: String,
    /// The scontrol that writes the job's comment.
    pub scontrol: String,
    /// Each step's `--allow-path`s.
    pub allow_paths: Vec<String>,
    /// This job (SLURM_JOB_ID), whose steps get the notice.
    pub job_id: Option<u32>,
    pub command: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("no server command given (onepool replica --per-node [OPTIONS] -- CMD ARGS...)")]
    NoCommand,
    #[error("the job has no nodes: {0}")]
    NoNodes(String),
    #[error("{nodes} nodes from port {base} run past port 65535")]
    Ports { nodes: usize, base: u16 },
    #[error("cannot start `{cmd}`: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
}

/// The step name of the replica listening on `port`.
pub fn step_name(port: u16) -> String {
    format!("replica-{port}")
}

/// The port in a replica step's name; `None` for any other step.
pub fn port_from_step_name(name: &str) -> Option<u16> {
    let port = name.strip_prefix("replica-")?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// The port of the replica on the `index`-th node.
pub fn port_of(base: u16, index: usize) -> Option<u16> {
    u16::try_from(usize::from(base) + 2 * index).ok().filter(|p| *p < u16::MAX)
}

/// srun's command line for the replica on `node`, listening on `port`.
pub fn srun_argv(cfg: &GroupConfig, node: &str, port: u16) -> Vec<String> {
    let secs = |d: Duration| onepool_decisions::duration::format(Duration::from_secs(d.as_secs_f64().ceil() as u64));
    let mut argv = vec![
        cfg.srun.clone(),
        "-N1".into(),
        "-n1".into(),
        format!("--nodelist={node}"),
        format!("--job-name={}", step_name(port)),
        // Each step is one independent replica: one ending says nothing of the others.
        "--kill-on-bad-exit=0".into(),
        cfg.launcher.clone(),
        "replica".into(),
        "--listen".into(),
        match cfg.listen {
            Listen::At(a) => std::net::SocketAddr::new(a.ip(), 0).to_string(),
            Listen::Node(_) => Listen::Node(0).to_string(),
        },
        "--slot".into(),
        port.to_string(),
        "--report".into(),
        "stdout".into(),
        "--drain-timeout".into(),
        secs(cfg.drain_timeout),
        "--stop-grace".into(),
        secs(cfg.stop_grace),
        "--reclaim".into(),
        cfg.reclaim.as_str().into(),
    ];
    if cfg.tls {
        argv.push("--tls".into());
    }
    for p in &cfg.allow_paths {
        argv.extend(["--allow-path".to_string(), p.clone()]);
    }
    argv.push("--".into());
    argv.extend(cfg.command.iter().cloned());
    argv
}

/// Passes the notice to every step: `scancel --signal=URG JOB`, else
/// SIGUSR1 to the srun processes.
async fn notify_steps(cfg: &GroupConfig, children: &[(String, Option<u32>)]) {
    if let Some(job) = cfg.job_id {
        let out = Command::new(&cfg.scancel).args(["--signal=URG", &job.to_string()]).output();
        match tokio::time::timeout(Duration::from_secs(5), out).await {
            Ok(Ok(o)) if o.status.success() => return,
            Ok(Ok(o)) => tracing::warn!(
                status = %o.status,
                stderr = %String::from_utf8_lossy(&o.stderr).trim(),
                "scancel --signal=URG failed; sending SIGUSR1 through srun"
            ),
            Ok(Err(e)) => tracing::warn!("cannot run {}: {e}; sending SIGUSR1 through srun", cfg.scancel),
            Err(_) => tracing::warn!("scancel did not answer in 5 s; sending SIGUSR1 through srun"),
        }
    }
    forward(children, libc::SIGUSR1);
}

fn forward(children: &[(String, Option<u32>)], sig: libc::c_int) {
    for (node, pid) in children {
        if let Some(pid) = pid {
            // A child of ours: a pid that already exited and was reaped is
            // not reused before we stop caring.
            if let Err(e) = onepool_os::signal(*pid, sig) {
                tracing::debug!(node, pid, "forwarding the notice: {e}");
            }
        }
    }
}

/// Runs one step per node until all have ended; the exit code is 0 when
/// every step still running at the notice drained cleanly, else the last
/// failed step's (a step ended by a shrink is expected and only logged).
pub async fn run(cfg: GroupConfig) -> Result<i32, GroupError> {
    if cfg.command.is_empty() {
        return Err(GroupError::NoCommand);
    }
    if cfg.nodes.is_empty() {
        return Err(GroupError::NoNodes("SLURM_JOB_NODELIST is empty".into()));
    }
    let ports: Vec<u16> = (0..cfg.nodes.len())
        .map(|i| port_of(cfg.base_port, i))
        .collect::<Option<_>>()
        .ok_or(GroupError::Ports { nodes: cfg.nodes.len(), base: cfg.base_port })?;
    let mut usr1 = signal(SignalKind::user_defined1()).map_err(GroupError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(GroupError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(GroupError::Signals)?;
    let mut urg = signal(SignalKind::from_raw(libc::SIGURG)).map_err(GroupError::Signals)?;
    let mut pids = Vec::new();
    let mut steps: JoinSet<(String, u16, std::io::Result<ExitStatus>)> = JoinSet::new();
    let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel::<String>();
    for (node, port) in cfg.nodes.iter().zip(&ports) {
        let argv = srun_argv(&cfg, node, *port);
        let mut child: Child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| GroupError::Spawn { cmd: argv.join(" "), source })?;
        tracing::info!(node, port, "started the replica step");
        pids.push((node.clone(), child.id()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(step_output(out, notes_tx.clone()));
        }
        let (node, port) = (node.clone(), *port);
        steps.spawn(async move { (node, port, child.wait().await) });
    }
    drop(notes_tx);
    let mut note = ReplicaNote::default();
    let mut notes_open = true;
    let mut noticed = false;
    let mut code = 0;
    loop {
        tokio::select! {
            entry = notes.recv(), if notes_open => {
                let Some(entry) = entry else { notes_open = false; continue };
                if merge(&mut note, &entry) {
                    if let Some(job) = cfg.job_id {
                        // An immediate class's job being killed waits for nobody's record.
                        let patience = match noticed && cfg.reclaim == ReclaimMode::Immediate {
                            true => Patience::AtKill,
                            false => Patience::Retry,
                        };
                        crate::report::write_comment(&cfg.scontrol, job, &note, patience).await;
                    }
                }
            }
            done = steps.join_next() => {
                let Some(done) = done else { break };
                let Ok((node, port, status)) = done else { continue };
                let exit = status.as_ref().ok().and_then(|s| s.code());
                pids.retain(|(n, _)| *n != node);
                if noticed {
                    tracing::info!(node, port, ?exit, "replica step ended after the notice");
                    if exit != Some(0) {
                        code = exit.unwrap_or(1);
                    }
                } else {
                    // Its node was released (shrink, node failure) or its server stopped.
                    tracing::warn!(node, port, ?exit, left = pids.len(), "replica step ended");
                    if pids.is_empty() {
                        code = exit.unwrap_or(1);
                    }
                }
            }
            _ = usr1.recv() => { noticed = true; tracing::info!("notice (SIGUSR1): draining every replica"); notify_steps(&cfg, &pids).await }
            _ = term.recv() => { noticed = true; tracing::info!("SIGTERM: draining every replica"); notify_steps(&cfg, &pids).await }
            _ = urg.recv() => { noticed = true; tracing::info!("notice (SIGURG): draining every replica"); notify_steps(&cfg, &pids).await }
            _ = int.recv() => { noticed = true; tracing::info!("SIGINT: draining every replica"); notify_steps(&cfg, &pids).await }
        }
    }
    Ok(code)
}

/// Passes a step's output on, except the lines that report to this
/// process.
async fn step_output(out: tokio::process::ChildStdout, notes: tokio::sync::mpsc::UnboundedSender<String>) {
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match crate::report::step_entry(&line) {
            Some(entry) => {
                let _ = notes.send(entry.to_string());
            }
            None => println!("{line}"),
        }
    }
}

/// Adds a step's entry to the job's note; false when it says nothing new
/// (or is not an entry).
fn merge(note: &mut ReplicaNote, entry: &str) -> bool {
    let Some(one) = ReplicaNote::decode(&format!("op1;{entry}")) else { return false };
    let before = note.clone();
    for (slot, port) in one.listening {
        note.set_port(slot, port);
    }
    for (slot, pin) in one.pins {
        note.set_pin(slot, pin);
    }
    for (slot, cause) in one.ended {
        note.set_ended(slot, &cause);
    }
    for (slot, drain) in one.drained {
        note.set_drained(slot, drain);
    }
    *note != before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> GroupConfig {
        GroupConfig {
            nodes: vec!["gpu01".into(), "gpu02".into()],
            listen: Listen::Node(0),
            tls: false,
            base_port: 18500,
            drain_timeout: Duration::from_millis(29_500),
            stop_grace: Duration::from_secs(10),
            reclaim: ReclaimMode::Graceful,
            launcher: "/opt/onepool/bin/onepool".into(),
            srun: "srun".into(),
            scancel: "/nonexistent/scancel".into(),
            scontrol: "/nonexistent/scontrol".into(),
            allow_paths: Vec::new(),
            job_id: Some(7),
            command: vec!["python3".into(), "-m".into(), "server".into()],
        }
    }

    #[test]
    fn each_node_gets_its_own_step_and_port_pair() {
        assert_eq!(
            srun_argv(&cfg(), "gpu02", 18502).join(" "),
            "srun -N1 -n1 --nodelist=gpu02 --job-name=replica-18502 --kill-on-bad-exit=0 \
             /opt/onepool/bin/onepool replica --listen node:0 --slot 18502 --report stdout \
             --drain-timeout 30s --stop-grace 10s --reclaim graceful -- python3 -m server"
        );
        let tls = GroupConfig { tls: true, ..cfg() };
        assert!(srun_argv(&tls, "gpu01", 18500).join(" ").contains(" --reclaim graceful --tls -- python3"));
        assert_eq!(port_of(18500, 3), Some(18506));
        assert_eq!(port_of(65530, 3), None);
    }

    #[test]
    fn a_step_s_port_and_pin_reach_the_job_s_note_together() {
        let mut note = ReplicaNote::default();
        let pin = crate::hop_tls::Fingerprint([7; 32]);
        assert!(merge(&mut note, &format!("L18502=40001;F18502={pin}")));
        assert_eq!((note.port(18502), note.pin(18502)), (Some(40001), Some(pin)));
        assert!(!merge(&mut note, &format!("L18502=40001;F18502={pin}")));
    }

    #[test]
    fn step_names_carry_the_port() {
        assert_eq!(port_from_step_name(&step_name(18504)), Some(18504));
        assert_eq!(port_from_step_name("batch"), None);
        assert_eq!(port_from_step_name("replica-"), None);
        assert_eq!(port_from_step_name("replica-+1"), None);
        assert_eq!(port_from_step_name("replica-99999"), None);
    }

    /// The steps here are shell scripts standing in for srun, and scancel
    /// cannot be run: the notice still reaches every step through srun, and
    /// the group ends with them. (scancel's path runs on the dev cluster.)
    #[tokio::test]
    async fn the_notice_is_forwarded_to_every_step_and_the_group_ends_with_them() {
        let dir = std::env::temp_dir().join(format!("onepool-group-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("srun");
        // Exits 0 on SIGUSR1, after writing which node it was.
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\nnode=$(echo \"$3\" | cut -d= -f2)\ntrap 'echo $node >> {0}/noticed; exit 0' USR1\n\
                 echo $node >> {0}/ready\nwhile :; do sleep 0.05; done\n",
                dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let c = GroupConfig { srun: fake.display().to_string(), ..cfg() };
        let group = tokio::spawn(run(c));
        // Signalled before both steps set their trap, a step would die of
        // the signal instead (seen once on a loaded machine with a fixed wait).
        let ready = dir.join("ready");
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&ready).map_or(0, |s| s.lines().count()) < 2 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the steps did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Our own process; run() has its handlers installed.
        onepool_os::signal(std::process::id(), onepool_os::SIGUSR1).unwrap();
        let code = tokio::time::timeout(Duration::from_secs(10), group).await.unwrap().unwrap().unwrap();
        assert_eq!(code, 0);
        let mut noticed: Vec<String> =
            std::fs::read_to_string(dir.join("noticed")).unwrap().lines().map(String::from).collect();
        noticed.sort();
        assert_eq!(noticed, ["gpu01", "gpu02"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
