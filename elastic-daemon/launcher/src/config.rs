//! What `onepool replica` is told: where to listen, the server's command,
//! the class's reclaim mode and the drain's bounds.

use std::net::SocketAddr;
use std::time::Duration;

use onepool_decisions::annotation::ReclaimMode;

use crate::access::Access;
use crate::front::FrontBounds;
use crate::report::Report;

/// `--reclaim`: the two modes a replica's class may have.
pub fn parse_reclaim(s: &str) -> Result<ReclaimMode, String> {
    match ReclaimMode::parse(s) {
        Some(m @ (ReclaimMode::Graceful | ReclaimMode::Immediate)) => Ok(m),
        _ => Err(format!("{s:?} is neither \"graceful\" nor \"immediate\"")),
    }
}

#[derive(Debug, Clone)]
pub struct LauncherConfig {
    /// Where the router reaches this replica; port 0 (what onepoold asks
    /// for): a port the kernel chooses, reported through `report`.
    pub listen: SocketAddr,
    /// Where the model server listens (on this node); `None`: a free
    /// loopback port chosen at start.
    pub backend: Option<SocketAddr>,
    /// Longest drain after the notice; Slurm's GraceTime must cover it.
    pub drain_timeout: Duration,
    /// How long the server gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// The class's reclaim mode: a SIGTERM drains, or cuts at once
    /// ([`crate::drain`]).
    pub reclaim: ReclaimMode,
    /// The model server's command line.
    pub command: Vec<String>,
    /// Who may send what.
    pub access: Access,
    pub bounds: FrontBounds,
    /// Where the listening port and the server's end are reported.
    pub report: Report,
    /// Serve the front over TLS with a certificate made at start, its
    /// fingerprint reported with the port ([`crate::hop_tls`]).
    pub tls: bool,
}
