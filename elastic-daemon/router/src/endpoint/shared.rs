//! What the requests to one replica share beside its counters in the
//! pool.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::backend_pool::IdleConns;
use crate::metrics::ReplicaMetrics;

/// What the requests to one replica share beside its counters in the
/// pool: its metric handles (no label look-up per request) and its idle
/// keep-alive connections. Requests hold it through their lease, so a
/// removed replica's connections close when its last request ends.
pub struct ReplicaShared {
    pub address: SocketAddr,
    pub metrics: ReplicaMetrics,
    pub conns: Arc<IdleConns>,
    /// The connections of the router's own calls (health checks, model
    /// lists, onepoold's scrapes), on the same transport but apart from the
    /// requests' (as when those calls had a client of their own): a check
    /// never hands a request a connection the replica may be closing.
    pub own_conns: Arc<IdleConns>,
    /// Whether its health checks get any answer ([`crate::reach`]).
    pub reach: crate::reach::Reach,
}
