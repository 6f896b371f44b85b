//! The drain after Slurm's notice: stop taking requests, let those in
//! flight finish up to the drain timeout (or cut them at once for an
//! immediate class), stop the server, and note what happened in the job's
//! comment.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use onepool_decisions::annotation::ReclaimMode;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::LauncherConfig;
use crate::conventions::{DrainNote, ReplicaNote};
use crate::front::Front;
use crate::outcome::{LauncherError, Outcome};
use crate::report::Patience;
use crate::server::stop;

/// How long the answers of requests cut off at the drain timeout get to
/// leave before the server is stopped.
const CUT_FLUSH: Duration = Duration::from_secs(1);
/// How long the front's connections get to write out their last bytes
/// after the drain (idle ones close at once).
const CONNECTIONS_CLOSE: Duration = Duration::from_secs(2);
/// How long a server stopped after a timed-out drain gets before SIGKILL.
const CUT_STOP_GRACE: Duration = Duration::from_secs(1);
/// How long a server whose streams all moved to other replicas gets
/// before SIGKILL: its slots generate for no one, and llama-server with
/// slots busy took the whole second above to exit on 24.11 and 26.05
/// (the protected job waited for it: 1.4 and 1.7 s to capacity, 0.55 s on
/// 22.05, whose llama-server exited at once).
const MOVED_STOP_GRACE: Duration = Duration::from_millis(250);

/// What Slurm's SIGTERM means to a replica whose class is reclaimed
/// `mode` (onepoold passes `--reclaim immediate` for an immediate class).
///
/// A graceful class gets GraceTime to drain, so a SIGTERM, whether the
/// grace's notice or an admin's scancel, drains the replica. An immediate
/// class has GraceTime 0: the SIGTERM *is* the preemption, the protected
/// job waits for these GPUs, and Slurm's SIGKILL follows after KillWait
/// (30 s by default). Draining then would only hold the GPUs until that
/// SIGKILL (CI measured 5.5 s with KillWait=5, the whole of it), so the
/// launcher cuts what is in flight at once, stops the server and exits.
fn cuts_at_sigterm(mode: ReclaimMode) -> bool {
    mode == ReclaimMode::Immediate
}

/// The signals that tell a replica to yield.
pub(crate) struct Notices {
    usr1: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    /// The notice of a replica in a per-node job (crate::replica_group):
    /// Slurm signals every process of a step, and SIGURG, unlike SIGUSR1,
    /// leaves a model server that does not handle it running.
    urg: tokio::signal::unix::Signal,
}

impl Notices {
    pub(crate) fn install() -> Result<Notices, LauncherError> {
        let on = |kind| signal(kind).map_err(LauncherError::Signals);
        Ok(Notices {
            usr1: on(SignalKind::user_defined1())?,
            term: on(SignalKind::terminate())?,
            int: on(SignalKind::interrupt())?,
            urg: on(SignalKind::from_raw(libc::SIGURG))?,
        })
    }

    /// The first notice to come, by name and number.
    pub(crate) async fn next(&mut self) -> (&'static str, libc::c_int) {
        tokio::select! {
            _ = self.usr1.recv() => ("SIGUSR1", libc::SIGUSR1),
            _ = self.term.recv() => ("SIGTERM", libc::SIGTERM),
            _ = self.int.recv() => ("SIGINT", libc::SIGINT),
            _ = self.urg.recv() => ("SIGURG", libc::SIGURG),
        }
    }
}

/// After a notice: stops routing new requests, lets those in flight finish
/// up to the drain timeout (an immediate class: not at all, see
/// [`cuts_at_sigterm`]), stops the server, and records the drain in the job's
/// comment.
pub(crate) async fn drain(
    cfg: &LauncherConfig,
    state: &Front,
    which: (&'static str, libc::c_int),
    notices: &mut Notices,
    child: &mut tokio::process::Child,
    note: &mut ReplicaNote,
) -> Outcome {
    let notice = (std::time::SystemTime::now(), Instant::now());
    state.start_draining();
    let in_flight_at_notice = state.in_flight();
    let immediate = cuts_at_sigterm(cfg.reclaim);
    let outcome = if immediate && which.1 == libc::SIGTERM {
        tracing::info!(signal = which.0, in_flight = in_flight_at_notice, "reclaimed at once (immediate class)");
        cut_now(state).await
    } else {
        tracing::info!(signal = which.0, in_flight = in_flight_at_notice, "notice received: draining");
        // What the router can continue elsewhere goes now; the drain waits
        // only for the rest.
        state.move_off();
        // An immediate class drains a time-limit notice, but Slurm's
        // SIGTERM during that drain is a preemption all the same.
        let killed = async {
            match immediate {
                true => notices.term.recv().await,
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            waited = state.wait_idle(cfg.drain_timeout) => match waited {
                Ok(waited) => Outcome::Drained { waited },
                Err(in_flight) => {
                    // Tell what is left why it ends, and give those answers
                    // a moment to leave before the server (and this
                    // process) goes.
                    state.cut_off();
                    let _ = state.wait_idle(CUT_FLUSH).await;
                    Outcome::TimedOut { in_flight }
                }
            },
            _ = killed => {
                tracing::info!("SIGTERM during the drain: reclaimed at once (immediate class)");
                cut_now(state).await
            }
        }
    };
    tracing::info!(
        ?outcome,
        turned_away = state.turned_away.load(Ordering::SeqCst),
        "drain finished; stopping the server"
    );
    // After a cut nothing is left for the server to finish, and either the
    // job's GraceTime is nearly spent or there is none: a server that does
    // not exit at once is killed. (llama-server stopped with its slots
    // still generating hung until the 10 s SIGKILL on 24.11, and the
    // protected job waited for it.)
    // Streams moved to other replicas leave their slots generating for
    // no one: the server is stopped as after a cut.
    let moved = state.moved.load(Ordering::SeqCst) > 0;
    let all_moved = moved && state.cut_short.load(Ordering::SeqCst) == 0;
    let (grace, close, patience) = match outcome {
        Outcome::Cut { .. } if all_moved => (cfg.stop_grace.min(MOVED_STOP_GRACE), CUT_FLUSH, Patience::AtKill),
        Outcome::Cut { .. } => (cfg.stop_grace.min(CUT_STOP_GRACE), CUT_FLUSH, Patience::AtKill),
        Outcome::TimedOut { .. } => (cfg.stop_grace.min(CUT_STOP_GRACE), CONNECTIONS_CLOSE, Patience::Retry),
        _ if moved => (cfg.stop_grace.min(MOVED_STOP_GRACE), CUT_FLUSH, Patience::Retry),
        _ => (cfg.stop_grace, CONNECTIONS_CLOSE, Patience::Retry),
    };
    // What the front still writes to the router leaves before the server
    // and this process go.
    state.close_connections(close).await;
    // The record of the drain goes into the job's comment while the server
    // stops (one scontrol call; the GPUs wait for the server, not for it).
    let cut = match outcome {
        Outcome::TimedOut { .. } | Outcome::Cut { .. } => {
            state.cut_short.load(Ordering::SeqCst).min(in_flight_at_notice)
        }
        _ => 0,
    };
    let drain = DrainNote {
        notice_ms: notice.0.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        signal: which.1,
        in_flight: in_flight_at_notice,
        cut,
        moved: state.moved.load(Ordering::SeqCst).min(in_flight_at_notice - cut),
        turned_away: state.turned_away.load(Ordering::SeqCst),
        took_ms: notice.1.elapsed().as_millis() as u64,
    };
    tokio::join!(stop(child, grace), cfg.report.drained(note, drain, patience));
    outcome
}

/// Cuts what is in flight now (each told why, [`Front::cut_off`]) and
/// gives those answers a moment to leave.
async fn cut_now(state: &Front) -> Outcome {
    let in_flight = state.in_flight();
    state.cut_off();
    let _ = state.wait_idle(CUT_FLUSH).await;
    Outcome::Cut { in_flight }
}
