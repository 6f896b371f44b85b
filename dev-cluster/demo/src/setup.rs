//! Before the story: the cluster and the build checked, the pool cleared
//! and shown.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use onepool_dev_cluster::model_server::ModelServer;
use onepool_dev_cluster::process::Tracked;
use onepool_dev_cluster::Cluster;
use onepool_loadgen::Trace;

use crate::commands::{gid_of, slurm, uid_of};
use crate::demo::{step, Paths};
use crate::scenario::Pace;
use crate::settings::{Args, GPUS};
use crate::users::cancel_demo_jobs;

/// What the demo found and prepared before its scenario starts.
pub(crate) struct Setup {
    pub(crate) cluster: Cluster,
    pub(crate) spec: onepool_dev_cluster::Spec,
    pub(crate) slurm_conf: String,
    pub(crate) trace: Trace,
    pub(crate) service: (u32, u32),
    pub(crate) uid: u32,
    pub(crate) server: ModelServer,
    pub(crate) paths: Paths,
}

/// Checks the cluster and the build, and lays out the demo's folder.
pub(crate) fn setup(args: &Args) -> anyhow::Result<Setup> {
    let uid = onepool_os::geteuid();
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
        service_host: spec.hosts.map(|net| net.service()),
        bridge: spec.hosts.map(|net| net.bridge()),
        log: replica_logs,
        root: root.clone(),
        bin,
    };
    Ok(Setup { cluster, spec, slurm_conf, trace, service, uid, server, paths })
}

/// Stops a onepoold and cancels the jobs an interrupted run left behind;
/// fails when other jobs hold GPUs (the scenario fills the pool exactly).
pub(crate) fn clear_the_pool(paths: &Paths, uid: u32, service: (u32, u32)) -> anyhow::Result<()> {
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
pub(crate) fn show_the_pool(cluster: &Cluster, spec: &onepool_dev_cluster::Spec) -> anyhow::Result<()> {
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
