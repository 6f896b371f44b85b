//! The endpoints the daemon serves, in one table: built by
//! [`crate::daemon::Daemon::start`], read by the control socket
//! ([`crate::control`]) and by the daemon's callers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use onepool_router::endpoint::Endpoint;

use crate::controller::ControllerView;

pub struct RoutedEndpoint {
    pub endpoint: Arc<Endpoint>,
    /// Replicas start as "starting" and wait for health checks when true.
    pub health_checked: bool,
    /// The address the endpoint's own listener is bound to (the
    /// configured port, or the one the kernel chose for port 0); `None`
    /// when only shared listeners reach it.
    pub listen: Option<SocketAddr>,
    /// The replica controller's view (endpoints with `[endpoint.replicas]`).
    pub replica_jobs: Option<Arc<Mutex<ControllerView>>>,
}

pub struct Router {
    pub endpoints: BTreeMap<String, RoutedEndpoint>,
    /// Whether this instance acts on Slurm ([`crate::leader`]).
    pub leadership: Arc<crate::leader::Leadership>,
}
