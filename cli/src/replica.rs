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
use onepool_decisions::annotation::ReclaimMode;
use onepool_launcher::access::Access;
use onepool_launcher::conventions::{REPLICA_KEY_DIGEST_ENV, REPLICA_KEY_ENV};
use onepool_launcher::launcher::{parse_reclaim, run, Front, FrontBounds, LauncherConfig, Outcome};
use onepool_launcher::node_address::{self, Listen};
use onepool_launcher::replica_group::{self, GroupConfig};
use onepool_launcher::report::Report;

#[derive(clap::Args)]
pub struct ReplicaArgs {
    /// Where the router reaches this replica: IP:PORT, or node:PORT for
    /// this node's address as Slurm knows it (its NodeAddr, what onepoold
    /// asks for and routes to); port 0: a free port the kernel chooses,
    /// reported in the job's comment (--report).
    #[arg(long, env = "ONEPOOL_REPLICA_LISTEN", default_value = "0.0.0.0:0")]
    pub listen: Listen,
    /// Where the model server listens (default: a free loopback port); it
    /// is told the port in ONEPOOL_BACKEND_PORT, and its own key in
    /// ONEPOOL_BACKEND_API_KEY (also LLAMA_API_KEY and VLLM_API_KEY).
    #[arg(long, env = "ONEPOOL_REPLICA_BACKEND")]
    pub backend: Option<SocketAddr>,
    /// This replica's slot (the number in its job's name, onepool-ENDPOINT-SLOT).
    #[arg(long, default_value_t = 0)]
    pub slot: u16,
    /// Where the listening port and the server's end are reported: the
    /// job's comment (the default inside a Slurm job), standard output
    /// (per-node steps), or nowhere.
    #[arg(long, value_enum)]
    pub report: Option<ReportTo>,
    /// The scontrol that writes the job's comment.
    #[arg(long, env = "ONEPOOL_SCONTROL", default_value = "scontrol")]
    pub scontrol: String,
    /// A path the replica serves (exact, or a prefix when it ends with
    /// '/'); repeat for more. Default: /v1/, /health and /metrics. Every
    /// other path (llama-server's /slots, /props) is answered 404.
    #[arg(long = "allow-path")]
    pub allow_paths: Vec<String>,
    /// The request head must arrive within this time.
    #[arg(long, default_value = "10s", value_parser = onepool_decisions::duration::parse)]
    pub header_read_timeout: Duration,
    #[arg(long, default_value_t = 16384)]
    pub max_header_bytes: usize,
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Open connections at most; one more is closed at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Longest drain after the notice (default: the job's --drain-timeout, else 30s).
    #[arg(long, env = "ONEPOOL_DRAIN_TIMEOUT", default_value = "30s", value_parser = onepool_decisions::duration::parse)]
    pub drain_timeout: Duration,
    /// Time the server gets between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = onepool_decisions::duration::parse)]
    pub stop_grace: Duration,
    /// The replica's class's `reclaim` in the policy: "graceful" (a
    /// SIGTERM drains, like the notice) or "immediate" (GraceTime 0: the
    /// SIGTERM is the preemption, and what is in flight is cut at once).
    #[arg(long, default_value = "graceful", value_parser = parse_reclaim)]
    pub reclaim: ReclaimMode,
    /// Serve the router over TLS: a key pair and self-signed certificate
    /// made at start (never written anywhere), the certificate's SHA-256
    /// reported with the port, and the router accepts only that one
    /// (onepoold passes it unless its endpoint's replicas.transport is
    /// "plain").
    #[arg(long)]
    pub tls: bool,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportTo {
    Comment,
    Stdout,
    None,
}

fn job_id() -> Option<u32> {
    std::env::var("SLURM_JOB_ID").ok().and_then(|j| j.parse().ok())
}

/// What checks onepoold's replica key, from the environment sbatch passed
/// on: its SHA-256 (what onepoold sends, so that the key never crosses the
/// network in a Slurm RPC), else the key itself (a replica run by hand).
/// Without either the replica would answer anyone who finds its port
/// (issue #25).
fn replica_key() -> anyhow::Result<[u8; 32]> {
    if let Ok(hex) = std::env::var(REPLICA_KEY_DIGEST_ENV) {
        return onepool_launcher::access::parse_digest(hex.trim())
            .ok_or_else(|| anyhow::anyhow!("{REPLICA_KEY_DIGEST_ENV} is not 64 hex digits (a SHA-256)"));
    }
    match std::env::var(REPLICA_KEY_ENV) {
        Ok(k) if k.len() >= 16 => Ok(onepool_launcher::access::digest(k.as_bytes())),
        Ok(_) => anyhow::bail!("{REPLICA_KEY_ENV} is shorter than 16 characters; onepoold makes a 64-character one"),
        Err(_) => anyhow::bail!(
            "neither {REPLICA_KEY_DIGEST_ENV} nor {REPLICA_KEY_ENV} is set: a replica answers only requests that \
             carry onepoold's replica key. onepoold passes the key's SHA-256 through sbatch's environment; to run \
             a replica by hand, set {REPLICA_KEY_ENV} to the key in onepoold's replica_key_file"
        ),
    }
}

pub fn run_replica(args: &ReplicaArgs) -> anyhow::Result<ExitCode> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).with_ansi(ansi).init();
    let key = replica_key()?;
    if args.per_node {
        return run_per_node(args);
    }
    let report = match (args.report, job_id()) {
        (Some(ReportTo::Stdout), _) => Report::Stdout { slot: args.slot },
        (Some(ReportTo::None), _) => Report::Off,
        (Some(ReportTo::Comment) | None, Some(job)) => {
            Report::Comment { scontrol: args.scontrol.clone(), job, slot: args.slot }
        }
        (Some(ReportTo::Comment), None) => {
            anyhow::bail!("--report comment runs in a Slurm job: SLURM_JOB_ID is not set")
        }
        (None, None) => Report::Off,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listen = rt.block_on(node_address::resolve(args.listen, &args.scontrol)).map_err(anyhow::Error::msg)?;
    let cfg = LauncherConfig {
        listen,
        backend: args.backend,
        drain_timeout: args.drain_timeout,
        stop_grace: args.stop_grace,
        reclaim: args.reclaim,
        command: args.command.clone(),
        access: Access::with_digest(Some(key), args.allow_paths.clone()),
        bounds: FrontBounds {
            header_read_timeout: args.header_read_timeout,
            max_header_bytes: args.max_header_bytes,
            max_body_bytes: args.max_body_bytes,
            max_connections: args.max_connections,
        },
        report,
        tls: args.tls,
    };
    let front = Arc::new(Front::default());
    let outcome = rt.block_on(run(cfg, front.clone())).context("onepool replica")?;
    // Streams the router continues on other replicas (issue #43).
    let moved = front.moved.load(std::sync::atomic::Ordering::SeqCst);
    match &outcome {
        Outcome::Drained { waited } => eprintln!(
            "onepool replica: drained in {:.1}s, {moved} stream(s) moved to other replicas; server stopped",
            waited.as_secs_f64()
        ),
        Outcome::TimedOut { in_flight } => eprintln!(
            "onepool replica: drain timed out with {in_flight} request(s) in flight, {moved} stream(s) moved; server stopped"
        ),
        Outcome::Cut { in_flight } => eprintln!(
            "onepool replica: reclaimed at once (immediate class); {in_flight} request(s) in flight, {moved} of them moved to other replicas; server stopped"
        ),
        Outcome::ServerExited(ended) => eprintln!("onepool replica: the model server {}", ended.report()),
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
        listen: args.listen,
        tls: args.tls,
        base_port: match (args.slot, args.listen) {
            (0, Listen::At(a)) => a.port(),
            (0, Listen::Node(p)) => p,
            (slot, _) => slot,
        },
        allow_paths: args.allow_paths.clone(),
        drain_timeout: args.drain_timeout,
        stop_grace: args.stop_grace,
        reclaim: args.reclaim,
        launcher: launcher.display().to_string(),
        srun: args.srun.clone(),
        scancel: args.scancel.clone(),
        scontrol: args.scontrol.clone(),
        job_id: job_id(),
        command: args.command.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = rt.block_on(replica_group::run(cfg)).context("onepool replica --per-node")?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
