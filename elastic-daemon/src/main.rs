//! onepoold: the inference router. Reads its TOML configuration, serves
//! every endpoint, and on SIGTERM or SIGINT stops accepting and lets
//! in-flight requests finish up to `shutdown_grace`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use onepool_elastic_daemon::config;
use onepool_elastic_daemon::daemon::Daemon;
use tokio::signal::unix::{signal, SignalKind};

const DEFAULT_CONFIG: &str = "/etc/slurm/onepoold.toml";

fn usage() -> String {
    format!(
        "usage: onepoold [--config FILE] [--allow-root] [--check | --preflight ENDPOINT]   (default {DEFAULT_CONFIG}, or $ONEPOOL_DAEMON_CONFIG)\n\
         --allow-root: run replica control as root (development clusters only: replica jobs and their model servers then run as root)\n\
         --check: check the configuration (and its replica settings against the policy) and exit: 0 fit, 1 not\n\
         --preflight ENDPOINT: submit one replica of ENDPOINT as onepoold would, wait until it answers a chat completion, cancel it; 0 served, 1 not"
    )
}

struct Args {
    config: PathBuf,
    allow_root: bool,
    check: bool,
    preflight: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut path = std::env::var_os("ONEPOOL_DAEMON_CONFIG").map(PathBuf::from);
    let mut allow_root = false;
    let mut check = false;
    let mut preflight = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" | "-c" => path = Some(args.next().ok_or_else(usage)?.into()),
            "--allow-root" => allow_root = true,
            "--check" => check = true,
            "--preflight" => preflight = Some(args.next().ok_or_else(usage)?),
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other:?}; {}", usage())),
        }
    }
    Ok(Args { config: path.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG)), allow_root, check, preflight })
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
    let Args { config: path, allow_root, check, preflight } = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("onepoold: not started: fix the configuration above");
            return ExitCode::FAILURE;
        }
    };
    if check {
        return check_only(&path, &mut config);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
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
    let findings = onepool_elastic_daemon::policy_check::check(&config);
    for w in &findings.warnings {
        tracing::warn!("{w}");
    }
    if !findings.errors.is_empty() {
        for e in &findings.errors {
            eprintln!("error: {e}");
        }
        eprintln!("onepoold: not started: the replica settings do not fit the policy");
        return ExitCode::FAILURE;
    }
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
/// (`onepool doctor` runs it).
fn check_only(path: &std::path::Path, config: &mut config::Config) -> ExitCode {
    let findings = onepool_elastic_daemon::policy_check::check(config);
    let mut errors = findings.errors;
    if let Err(e) = onepool_elastic_daemon::policy_check::resolve_warm(config) {
        errors.push(e);
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
