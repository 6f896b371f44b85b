//! onepoold: the inference router. Reads its TOML configuration, serves
//! every endpoint, and on SIGTERM or SIGINT stops accepting and lets
//! in-flight requests finish up to `shutdown_grace`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use onepool_daemon::config;
use onepool_daemon::daemon::Daemon;
use tokio::signal::unix::{signal, SignalKind};

const DEFAULT_CONFIG: &str = "/etc/slurm/onepoold.toml";

fn usage() -> String {
    format!("usage: onepoold [--config FILE]   (default {DEFAULT_CONFIG}, or $ONEPOOL_DAEMON_CONFIG)")
}

fn config_path() -> Result<PathBuf, String> {
    let mut args = std::env::args().skip(1);
    let mut path = std::env::var_os("ONEPOOL_DAEMON_CONFIG").map(PathBuf::from);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" | "-c" => path = Some(args.next().ok_or_else(usage)?.into()),
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument {other:?}; {}", usage())),
        }
    }
    Ok(path.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG)))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Colour codes only on a terminal: logs usually go to files/journald.
        .with_ansi(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONEPOOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let path = match config_path() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("onepoold: not started: fix the configuration above");
            return ExitCode::FAILURE;
        }
    };
    let findings = onepool_daemon::policy_check::check(&config);
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
        let daemon = match Daemon::start(config).await {
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
