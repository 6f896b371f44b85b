//! The router's own calls to replicas (health checks, `/v1/models`
//! listings): a pooled HTTP client. Proxied requests use the replicas' own
//! connections ([`crate::backend_pool`]). Its own module so that the
//! proxy, the health checks and the listings all depend on it and not on
//! one another.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type ReplicaClient = Client<HttpConnector, Full<Bytes>>;

pub fn replica_client(connect_timeout: Duration) -> ReplicaClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector)
}
