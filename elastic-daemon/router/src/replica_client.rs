//! The router's own calls to replicas (health checks, `/v1/models`
//! listings), on onepool's one client stack ([`onepool_client`]). Proxied
//! requests use the replicas' own connections ([`crate::backend_pool`]).
//! Its own module so that the proxy, the health checks and the listings
//! all depend on it and not on one another.

use std::time::Duration;

pub type ReplicaClient = onepool_client::Pooled;

pub fn replica_client(connect_timeout: Duration) -> ReplicaClient {
    onepool_client::pooled(onepool_client::Settings::with_connect_timeout(connect_timeout))
}
