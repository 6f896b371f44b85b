//! onepoold: the inference router. Reads its TOML configuration, serves
//! every endpoint, and on SIGTERM or SIGINT stops accepting and lets
//! in-flight requests finish up to `shutdown_grace`.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use onepool_elastic_daemon::config;
use onepool_elastic_daemon::daemon::Daemon;
use tokio::signal::unix::{signal, SignalKind};

/// mimalloc rather than glibc's malloc: the forward path makes and frees a
/// handful of small blocks per request (hyper's header maps and buffers,
/// each request's head), and mimalloc's per-thread free lists make those
/// cheaper; see bench/RESULTS.md (router, issue #28 item 5).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEFAULT_CONFIG: &str = "/etc/slurm/onepoold.toml";

/// onepoold's command line; also the source of onepoold(8).
#[derive(clap::Parser)]
#[command(
    name = "onepoold",
    version,
    about = "onepool's inference router and replica controller",
    long_about = "onepoold serves every endpoint of its configuration (one stable address each, least-outstanding \
                  routing, a bounded queue, retries, graceful drain) and, for endpoints with [endpoint.replicas], \
                  keeps their replicas as Slurm jobs: a baseline in the protected class, supplemental ones in a \
                  flexible class as the request load asks, drained when Slurm reclaims them. On SIGTERM or SIGINT it \
                  stops accepting and lets requests in flight finish up to shutdown_grace."
)]
struct Args {
    /// The configuration file
    #[arg(long, short = 'c', env = "ONEPOOL_DAEMON_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Run replica control as root (development clusters only: replica jobs and their model servers then run as root)
    #[arg(long)]
    allow_root: bool,
    /// Check the configuration (and its replica settings against the policy) and exit: 0 fit, 1 not
    #[arg(long, conflicts_with = "preflight")]
    check: bool,
    /// With --check: check the secret files as onepoold's user USER would find them [default: the user running it; as root, the service user onepool]
    #[arg(long, value_name = "USER", requires = "check")]
    user: Option<String>,
    /// Submit one replica of ENDPOINT as onepoold would, wait until it answers a chat completion, cancel it; 0 served, 1 not
    #[arg(long, value_name = "ENDPOINT")]
    preflight: Option<String>,
    /// Write onepoold(8) and onepoold.toml(5) under DIR/man8 and DIR/man5, and exit
    #[arg(long, value_name = "DIR", hide = true)]
    man: Option<PathBuf>,
}

/// The commented sample configuration, the reference onepoold.toml(5) quotes.
const SAMPLE_CONFIG: &str = include_str!("../../etc/onepoold.toml");

fn man_pages(dir: &std::path::Path) -> std::io::Result<()> {
    use clap::CommandFactory;
    let (man8, man5) = (dir.join("man8"), dir.join("man5"));
    std::fs::create_dir_all(&man8)?;
    std::fs::create_dir_all(&man5)?;
    let cmd = Args::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd).section("8").render(&mut page)?;
    std::fs::write(man8.join("onepoold.8"), page)?;
    let page = onepool_decisions::manpage::config_page(
        "onepoold.toml",
        "onepoold's configuration: endpoints, listeners, auth, replicas",
        DEFAULT_CONFIG,
        "onepoold reads this file at start and refuses to start on any error, each named with its line and \
         column; onepoold --check checks it, and its replica settings against the policy, without starting. \
         The sample below, installed as the file itself, is the reference: every key with its default and why.",
        SAMPLE_CONFIG,
        "onepoold(8), onepool(1), onepool.toml(5)",
    );
    std::fs::write(man5.join("onepoold.toml.5"), page)
}

fn main() -> ExitCode {
    // Before any thread starts: it reads and clears the environment.
    let inherited = onepool_elastic_daemon::inherited::Inherited::take();
    tracing_subscriber::fmt()
        // Colour codes only on a terminal: logs usually go to files/journald.
        .with_ansi(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONEPOOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // clap answers --help and --version itself, and exits 2 on a bad argument.
    let Args { config: path, allow_root, check, user, preflight, man } = <Args as clap::Parser>::parse();
    if let Some(dir) = man {
        return match man_pages(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("onepoold: writing the manual pages in {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    let mut config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("onepoold: not started: fix the configuration above");
            return ExitCode::FAILURE;
        }
    };
    if check {
        return check_only(&path, &mut config, user.as_deref());
    }
    let root = onepool_os::geteuid() == 0;
    if let Some(endpoint) = preflight {
        // As root, the replica would run as root, and the replica key
        // file made here would be root's, which onepoold's user cannot read.
        if root && !allow_root {
            eprintln!(
                "onepoold: no preflight as root: the replica job would run as root; run it as onepoold's user: \
                 runuser -u {} -- onepoold --config {} --preflight {endpoint}",
                onepool_decisions::policy::SERVICE_USER,
                path.display()
            );
            return ExitCode::from(2);
        }
        return preflight_only(&config, &endpoint);
    }
    // Replica jobs run as the user that submits them: as root, every model
    // server would too.
    if root && config.endpoints.iter().any(|e| e.replicas.is_some()) && !allow_root {
        eprintln!(
            "onepoold: not started: running as root, replica jobs and their model servers would run as root; \
             run it as the service user {} (etc/systemd/onepoold.service), or pass --allow-root on a development cluster",
            onepool_decisions::policy::SERVICE_USER
        );
        return ExitCode::FAILURE;
    }
    if !fits_policy(&config) {
        return ExitCode::FAILURE;
    }
    serve(config, inherited)
}

/// The replica settings checked against the policy: warnings logged,
/// errors printed; `false` when onepoold must not start.
fn fits_policy(config: &config::Config) -> bool {
    let findings = onepool_elastic_daemon::policy_check::check(config);
    for w in &findings.warnings {
        tracing::warn!("{w}");
    }
    if !findings.errors.is_empty() {
        for e in &findings.errors {
            eprintln!("error: {e}");
        }
        eprintln!("onepoold: not started: the replica settings do not fit the policy");
        return false;
    }
    true
}

/// Serves until SIGTERM or SIGINT, then lets in-flight requests finish.
fn serve(config: config::Config, inherited: onepool_elastic_daemon::inherited::Inherited) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("onepoold: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let daemon = match Daemon::start_with(config, inherited).await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("onepoold: {e}");
                return ExitCode::FAILURE;
            }
        };
        for (name, e) in &daemon.router.endpoints {
            match e.listen {
                Some(listen) => tracing::info!(endpoint = %name, %listen, "serving"),
                None => tracing::info!(endpoint = %name, "serving on shared listeners only"),
            }
        }
        for listen in &daemon.listeners {
            tracing::info!(%listen, "serving routed requests");
        }
        let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(t), Ok(i)) => (t, i),
            _ => {
                eprintln!("onepoold: cannot install signal handlers");
                return ExitCode::FAILURE;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down: no new connections; waiting for in-flight requests");
        daemon.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// `--preflight ENDPOINT`: one replica through Slurm, followed until it
/// serves, then cancelled (onepool_elastic_daemon::preflight).
fn preflight_only(config: &config::Config, endpoint: &str) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("onepoold: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(onepool_elastic_daemon::preflight::run(config, endpoint, None)) {
        Ok(p) => {
            print!("{}", p.report(endpoint));
            if p.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("onepoold: preflight of endpoint {endpoint}: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--check`: what a start would refuse or warn about, without starting
/// (`onepool doctor` runs it); `user`: whose the secret files must be.
fn check_only(path: &std::path::Path, config: &mut config::Config, user: Option<&str>) -> ExitCode {
    let findings = onepool_elastic_daemon::policy_check::check(config);
    let mut errors = findings.errors;
    // The start's rules on the files it reads (issue #42): "fits" means
    // onepoold will start.
    let uid = match onepool_elastic_daemon::start_files::owner(user) {
        Ok((uid, who)) => {
            println!("secret files and class entitlements checked as onepoold's user {who}");
            errors.extend(onepool_elastic_daemon::start_files::problems(config, uid));
            uid
        }
        Err(e) => {
            errors.push(e);
            onepool_os::getuid()
        }
    };
    if let Err(e) = onepool_elastic_daemon::policy_check::resolve_from_policy_as(config, uid) {
        errors.push(e);
    }
    // How each endpoint's answers continue elsewhere (issue #43), and its
    // request classes (issue #44).
    for e in &config.endpoints {
        println!("resume: {}", onepool_elastic_daemon::config::resume_summary(&e.name, e.proxy.resume));
        if let Some(c) = &e.proxy.classes {
            let lower = e.replicas.as_ref().and_then(|r| r.lower_workload.as_deref());
            println!(
                "classes: endpoint {:?}: a request whose key names no class is {}; replicas only lower classes ask for: {}",
                e.name,
                c.own(),
                lower.map_or_else(|| "none".to_string(), |w| format!("class {w}"))
            );
            println!("headroom: {}", onepool_elastic_daemon::policy_check::headroom_summary(&e.name, c));
            println!("priority: {}", onepool_elastic_daemon::engine_priority::summary(e, c));
        }
    }
    for w in &findings.warnings {
        println!("warning: {w}");
    }
    for e in &errors {
        println!("error: {e}");
    }
    if errors.is_empty() {
        println!(
            "{}: fits ({} endpoint(s), {} warning(s))",
            path.display(),
            config.endpoints.len(),
            findings.warnings.len()
        );
        ExitCode::SUCCESS
    } else {
        println!("{}: onepoold would not start ({} error(s))", path.display(), errors.len());
        ExitCode::FAILURE
    }
}
