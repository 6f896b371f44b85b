//! `onepool-devcluster`: a real Slurm cluster on one machine, for
//! development, the demo and the integration tests.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use onepool_dev_cluster::onepoold::{validation_config, Validation};
use onepool_dev_cluster::{Cluster, UpOptions};

#[derive(Parser)]
#[command(name = "onepool-devcluster", version, about)]
struct Cli {
    /// State folder of the cluster (everything it writes goes there).
    #[arg(long, env = "ONEPOOL_DEVCLUSTER_DIR", default_value = ".devcluster")]
    dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing, start every daemon, wait until all nodes are idle.
    Up {
        #[arg(long, default_value_t = 4)]
        nodes: u32,
        #[arg(long, default_value_t = 4)]
        gpus_per_node: u32,
        /// Folder with the built plugins (default: next to this binary).
        #[arg(long)]
        plugins: Option<PathBuf>,
        /// Fail instead of running apt-get for missing packages.
        #[arg(long)]
        no_install: bool,
        /// Policy file for the cluster (default: the shipped etc/onepool.toml).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Replace the JobSubmitPlugins list ("" = none), e.g. for benchmarks.
        #[arg(long)]
        job_submit_plugins: Option<String>,
        /// The site's job_submit.lua (default: etc/dev-cluster/job_submit.lua).
        #[arg(long)]
        job_submit_lua: Option<PathBuf>,
        /// slurm.conf lines replacing the template's settings of the same keys.
        #[arg(long)]
        site_conf: Option<PathBuf>,
        /// Start as the site before onepool: no onepool settings in
        /// slurm.conf, no SPANK plugin, no class QOS, no plugins copied (the
        /// deployment runbook's test starts here).
        #[arg(long)]
        before_onepool: bool,
        /// Track processes and constrain GPU devices by cgroup (cgroup v1),
        /// as production nodes do; fails naming what this machine lacks.
        #[arg(long)]
        cgroup: bool,
        /// Each node, a head host (slurmctld, slurmdbd, MariaDB), two service
        /// hosts and a client host in network namespaces of their own, each
        /// with its address on one bridge (docs/dev-cluster.md). Fixed at
        /// the folder's first `up`.
        #[arg(long)]
        hosts: bool,
    },
    /// Stop slurmctld and start it again on the configuration files as they are.
    RestartSlurmctld,
    /// Stop every process this cluster started.
    Down,
    /// Show which daemons run, and sinfo when slurmctld is up.
    Status,
    /// Print `export` lines for a shell: eval "$(onepool-devcluster env)".
    Env,
    /// Print the network namespace of a host of a hosts-mode cluster
    /// (`head`, `service`, `service2`, `client`, `nodeN`), for `ip netns exec NAME ...`.
    Netns { host: String },
    /// Print onepoold.toml for a simulator scenario's first endpoint, its
    /// replicas running the stand-in model server
    /// (bench/validate-simulator.sh).
    OnepooldConfig {
        /// The simulator scenario (TOML).
        scenario: PathBuf,
        /// The endpoint's address.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// The stand-in server's model load, seconds.
        #[arg(long)]
        model_load_seconds: f64,
        /// The stand-in model server.
        #[arg(long, default_value = "etc/dev-cluster/stand-in-model-server.py")]
        server: PathBuf,
        /// The `onepool` binary the replicas run under.
        #[arg(long)]
        launcher: PathBuf,
        /// Where the control socket and the replica logs go.
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onepool-devcluster: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> onepool_dev_cluster::Result<()> {
    if let Cmd::OnepooldConfig { scenario, listen, model_load_seconds, server, launcher, out } = &cli.cmd {
        let text = std::fs::read_to_string(scenario).map_err(|source| onepool_dev_cluster::Error::Io {
            what: format!("reading {}", scenario.display()),
            source,
        })?;
        let v = Validation {
            scenario,
            text: &text,
            listen: *listen,
            model_load_s: *model_load_seconds,
            server,
            launcher,
            out,
        };
        print!("{}", validation_config(&v).map_err(onepool_dev_cluster::Error::Setup)?.to_toml());
        return Ok(());
    }
    let cluster = Cluster::at(&cli.dir)?;
    let mut say = |m: &str| eprintln!("onepool-devcluster: {m}");
    match cli.cmd {
        Cmd::Up {
            nodes,
            gpus_per_node,
            plugins,
            no_install,
            policy,
            job_submit_plugins,
            job_submit_lua,
            site_conf,
            before_onepool,
            cgroup,
            hosts,
        } => {
            let plugin_source = plugins.or_else(|| std::env::current_exe().ok()?.parent().map(PathBuf::from));
            let opts = UpOptions {
                nodes,
                gpus_per_node,
                plugin_source,
                install_packages: !no_install,
                policy,
                job_submit_plugins,
                job_submit_lua,
                site_conf,
                before_onepool,
                cgroup,
                hosts,
            };
            let spec = cluster.up(&opts, &mut say)?;
            say(&format!(
                "cluster {} is up: {} nodes x {} GPUs; run: eval \"$({} --dir {} env)\"",
                spec.cluster,
                spec.nodes,
                spec.gpus_per_node,
                std::env::args().next().unwrap_or_default(),
                cluster.layout.root.display()
            ));
        }
        Cmd::RestartSlurmctld => cluster.restart_slurmctld(&mut say)?,
        Cmd::Down => cluster.down(&mut say)?,
        Cmd::Status => status(&cluster)?,
        Cmd::Env => {
            for (k, v) in cluster.env() {
                println!("export {k}={v}");
            }
        }
        Cmd::Netns { host } => println!("{}", namespace_of(&cluster, &host)?),
        // Printed above, without opening the cluster's folder.
        Cmd::OnepooldConfig { .. } => {}
    }
    Ok(())
}

/// Which daemons run, the hosts of a hosts-mode cluster, and sinfo when
/// slurmctld is up.
fn status(cluster: &Cluster) -> onepool_dev_cluster::Result<()> {
    let mut ctld_up = false;
    for (name, pid) in cluster.status() {
        match pid {
            Some(pid) => println!("{name:<16} running  pid {pid}"),
            None => println!("{name:<16} stopped"),
        }
        ctld_up |= name == "slurmctld" && pid.is_some();
    }
    if let Some(net) = cluster.hosts() {
        println!(
            "hosts on bridge {} ({}; this namespace is admin, {}):",
            net.bridge(),
            net.cidr(),
            net.admin_address()
        );
        for h in net.hosts(cluster.spec()?.nodes) {
            println!("  {:<10} {:<15} netns {}", h.name, h.address.to_string(), h.namespace);
        }
    }
    if ctld_up {
        print!("{}", cluster.run("sinfo", &["-N", "-o", "%N %P %t %G"])?);
    }
    Ok(())
}

/// The network namespace of `host` on a hosts-mode cluster.
fn namespace_of(cluster: &Cluster, host: &str) -> onepool_dev_cluster::Result<String> {
    let spec = cluster.spec()?;
    let Some(net) = spec.hosts else {
        return Err(onepool_dev_cluster::Error::Setup(format!(
            "the cluster in {} runs in one network namespace (bring it up with --hosts)",
            cluster.layout.root.display()
        )));
    };
    let hosts = net.hosts(spec.nodes);
    match hosts.iter().find(|h| h.name == host) {
        Some(h) => Ok(h.namespace.clone()),
        None => {
            let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
            Err(onepool_dev_cluster::Error::Setup(format!(
                "the cluster has no host {host}; its hosts: {}",
                names.join(", ")
            )))
        }
    }
}
