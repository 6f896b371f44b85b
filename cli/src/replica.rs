//! `onepool replica -- CMD ...`: the main process of an inference replica's
//! batch script (see onepool_launcher::launcher). Submit replicas with
//! `--signal=B:USR1@<drain timeout>` in a QOS whose GraceTime covers it, and
//! `exec onepool replica ...` so the notice reaches this process.
//!
//! With `--per-node` it is the main process of a job hosting one replica
//! per node (onepool_launcher::replica_group): one `srun` step per node, each
//! running `onepool replica` on its own port pair from `--listen`'s port.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use onepool_launcher::launcher::{run, Front, LauncherConfig, Outcome};
use onepool_launcher::replica_group::{self, GroupConfig};

#[derive(clap::Args)]
pub struct ReplicaArgs {
    /// Where the router reaches this replica.
    #[arg(long, env = "ONEPOOL_REPLICA_LISTEN", default_value = "0.0.0.0:8000")]
    pub listen: SocketAddr,
    /// Where the model server listens; it is told the port in ONEPOOL_BACKEND_PORT.
    #[arg(long, env = "ONEPOOL_REPLICA_BACKEND", default_value = "127.0.0.1:8001")]
    pub backend: SocketAddr,
    /// Longest drain after the notice (default: the job's --drain-timeout, else 30s).
    #[arg(long, env = "ONEPOOL_DRAIN_TIMEOUT", default_value = "30s", value_parser = onepool_decisions::duration::parse)]
    pub drain_timeout: Duration,
    /// Time the server gets between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = onepool_decisions::duration::parse)]
    pub stop_grace: Duration,
    /// Host one replica per node of the job: one srun step each, the i-th
    /// node's listening on --listen's port + 2i (its server one above).
    #[arg(long)]
    pub per_node: bool,
    /// The srun that starts the steps (with --per-node).
    #[arg(long, env = "ONEPOOL_SRUN", default_value = "srun")]
    pub srun: String,
    /// The scancel that passes the notice to the steps (with --per-node).
    #[arg(long, env = "ONEPOOL_SCANCEL", default_value = "scancel")]
    pub scancel: String,
    /// The model server's command line.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run_replica(args: &ReplicaArgs) -> anyhow::Result<ExitCode> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).with_ansi(ansi).init();
    if args.per_node {
        return run_per_node(args);
    }
    let cfg = LauncherConfig {
        listen: args.listen,
        backend: args.backend,
        drain_timeout: args.drain_timeout,
        stop_grace: args.stop_grace,
        command: args.command.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let outcome = rt.block_on(run(cfg, Arc::new(Front::default()))).context("onepool replica")?;
    match &outcome {
        Outcome::Drained { waited } => {
            eprintln!("onepool replica: drained in {:.1}s; server stopped", waited.as_secs_f64())
        }
        Outcome::TimedOut { in_flight } => {
            eprintln!("onepool replica: drain timed out with {in_flight} request(s) in flight; server stopped")
        }
        Outcome::ServerExited(code) => eprintln!("onepool replica: the server exited ({code:?})"),
    }
    Ok(ExitCode::from(u8::try_from(outcome.exit_code()).unwrap_or(1)))
}

fn run_per_node(args: &ReplicaArgs) -> anyhow::Result<ExitCode> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .context("--per-node runs as a Slurm batch script: SLURM_JOB_NODELIST is not set")?;
    let nodes =
        onepool_decisions::hostlist::expand(&list).map_err(|e| anyhow::anyhow!("SLURM_JOB_NODELIST={list:?}: {e}"))?;
    let launcher = std::env::current_exe().context("finding this onepool binary for the steps")?;
    let cfg = GroupConfig {
        nodes,
        listen_ip: args.listen.ip(),
        base_port: args.listen.port(),
        drain_timeout: args.drain_timeout,
        stop_grace: args.stop_grace,
        launcher: launcher.display().to_string(),
        srun: args.srun.clone(),
        scancel: args.scancel.clone(),
        job_id: std::env::var("SLURM_JOB_ID").ok().and_then(|j| j.parse().ok()),
        command: args.command.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = rt.block_on(replica_group::run(cfg)).context("onepool replica --per-node")?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
