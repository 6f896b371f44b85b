//! The replica launcher (`onepool replica -- CMD ...`): the batch script's
//! main process on a compute node. It runs the model server, fronts it with
//! a small proxy that counts requests in flight, and on Slurm's preemption
//! notice (the `--signal=B:USR1@N` the daemon submits replicas with) or a
//! SIGTERM it drains: new requests get 503 with `x-onepool-draining: 1`
//! (the router takes the replica out and retries them elsewhere, so no
//! unauthenticated call to the daemon is needed), requests in flight finish
//! up to the drain timeout (what is still in flight then is told why, see
//! [`Front::cut_off`]), then the server is stopped and the launcher
//! exits, so the job ends and Slurm hands the GPUs to the preemptor at once
//! instead of at its next periodic kill.
//!
//! Issue #25 closed its side doors: it listens where the kernel chooses
//! (a port in a known range could be taken first by any user's job) and
//! reports the port ([`crate::report`]); it answers only requests that
//! carry onepoold's replica key and ask for a path the endpoint serves
//! ([`crate::access`]); its front has the router's bounds (header read
//! timeout, header and body size, connections); and its server gets a key
//! of its own, so the server's loopback port answers nobody else on the
//! node. Issue #24: a server that ends by itself is named — signal, exit
//! code, the last lines it printed ([`crate::exit_cause`]).
//!
//! The parts, each in its file: the configuration ([`crate::config`]), the
//! keyed front and what it shares with the drain ([`crate::front`]), the
//! model server's process ([`crate::server`]), the drain ([`crate::drain`])
//! and how it all ends ([`crate::outcome`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::conventions::{ReplicaNote, BACKEND_KEY_ENV};
use crate::drain::{drain, Notices};
use crate::exit_cause;
use crate::server::{free_loopback_port, Server};

pub use crate::config::{parse_reclaim, LauncherConfig};
pub use crate::front::{serve_front, Front, FrontBounds, FrontConfig};
pub use crate::outcome::{Ended, LauncherError, Outcome};

/// A notice that comes this soon after the server ended was sent with the
/// signal that ended it (Slurm signals every process of the job at once).
const SIMULTANEOUS: Duration = Duration::from_millis(200);

/// Runs the server behind the front proxy until it exits or a notice
/// (SIGUSR1, SIGTERM, SIGINT) drains it.
pub async fn run(cfg: LauncherConfig, state: Arc<Front>) -> Result<Outcome, LauncherError> {
    let (program, args) = cfg.command.split_first().ok_or(LauncherError::NoCommand)?;
    let listener =
        TcpListener::bind(cfg.listen).await.map_err(|source| LauncherError::Listen { addr: cfg.listen, source })?;
    let listening = listener.local_addr().map_err(|source| LauncherError::Listen { addr: cfg.listen, source })?;
    let backend = match cfg.backend {
        Some(b) => b,
        None => free_loopback_port().map_err(LauncherError::BackendPort)?,
    };
    // The server's key: one given in the environment (a site or a
    // benchmark that talks to the server itself), else a new one.
    let backend_key = match std::env::var(BACKEND_KEY_ENV) {
        Ok(k) if k.len() >= 16 => k,
        _ => crate::access::random_key().map_err(LauncherError::Key)?,
    };
    let mut notices = Notices::install()?;
    let oom_before = exit_cause::oom_kills();
    // Made before the server starts: a launcher that cannot serve TLS
    // must not hold GPUs for a server nobody can reach.
    let identity = match cfg.tls {
        true => Some(crate::hop_tls::Identity::generate().map_err(LauncherError::Tls)?),
        false => None,
    };
    let mut server = Server::spawn(&cfg.command, program, args, backend, &backend_key)?;
    let front_cfg = Arc::new(FrontConfig {
        tls: identity.as_ref().map(|i| i.config.clone()),
        backend,
        access: cfg.access.clone(),
        backend_auth: http::HeaderValue::from_str(&format!("Bearer {backend_key}")).ok(),
        bounds: cfg.bounds,
    });
    let front_task = tokio::spawn(serve_front(listener, front_cfg, state.clone()));
    let pin = identity.map(|i| i.fingerprint);
    tracing::info!(%listening, %backend, tls = ?pin, "replica front listening; model server starting");
    let mut note = ReplicaNote::default();
    cfg.report.listening(&mut note, listening.port(), pin).await;
    let which = tokio::select! {
        status = server.child.wait() => {
            // Slurm's kill signals the server with this process, and the
            // server may go first: a notice already here makes it a
            // reclaim, not a server that ended by itself.
            match tokio::time::timeout(SIMULTANEOUS, notices.next()).await {
                Ok(which) => which,
                Err(_) => {
                    front_task.abort();
                    let ended = server.ended(status, oom_before).await;
                    tracing::error!(cause = %ended.cause, "the model server ended by itself");
                    cfg.report.ended(&mut note, &ended.report()).await;
                    return Ok(Outcome::ServerExited(ended));
                }
            }
        }
        which = notices.next() => which,
    };
    let outcome = drain(&cfg, &state, which, &mut notices, &mut server.child, &mut note).await;
    front_task.abort();
    Ok(outcome)
}
