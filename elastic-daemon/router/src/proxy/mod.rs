//! The reverse proxy: a listener per endpoint, or a shared listener that
//! picks the endpoint by `Host`, path prefix or the OpenAI `model` field;
//! HTTP/1.1 and HTTP/2 (h2c prior knowledge) from clients, HTTP/1.1 to
//! replicas. Response bodies
//! stream through frame by frame; the replica's lease ends with the last
//! frame (or when the client goes away), so drains wait for streams too.

mod answers;
mod body;
mod body_budget;
mod connections;
mod dispatch;
mod graceful;
mod lean;
mod leased;
mod resumable;
mod serve;
mod to_replica;
mod watched;
mod whole;

pub use body::ProxyBody;
pub use body_budget::BodyBudget;
pub use dispatch::{Dispatch, Routed};
use leased::LeasedBody;
pub use serve::serve;
#[allow(unused_imports)]
use {
    answers::*, body::*, body_budget::*, connections::*, dispatch::*, graceful::*, resumable::*, serve::*,
    to_replica::*,
};

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use onepool_launcher::conventions::{DRAINING_HEADER, MOVABLE_HEADER, SERVER_FAILED_HEADER};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::access_log::{AccessLog, Refused, RequestFacts, ServedBy, Tap};
use crate::backend_pool::{self, BackendBody, SendError, HOP_BY_HOP, IDLE_TIMEOUT};
use crate::classes::CLASS_HEADER;
use crate::endpoint::{AcquireError, Endpoint, Lease, Rank, Want};
use crate::metrics::{ClassEvent, ListenerLabels, Metrics, RefusedLabels, RequestCounters, Unavailable};
use crate::prefix::prefix_key;
use crate::registry::ReplicaId;
use crate::settings::{ConnSettings, ProxySettings, Routes, MODEL_PATHS};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// One endpoint as the proxy sees it: shared by its own listener and by
/// every shared listener that routes to it (one backend connection pool
/// per replica).
pub struct Target {
    endpoint: Arc<Endpoint>,
    settings: ProxySettings,
    metrics: Arc<Metrics>,
    budget: Arc<BodyBudget>,
    access: Option<Arc<AccessLog>>,
    /// With `[endpoint.resume]` on: what its answers need to move.
    moves: Option<Arc<MoveContext>>,
}

impl Target {
    pub fn new(
        endpoint: Arc<Endpoint>,
        settings: ProxySettings,
        metrics: Arc<Metrics>,
        budget: Arc<BodyBudget>,
        access: Option<Arc<AccessLog>>,
    ) -> Arc<Target> {
        // Closes keep-alive connections left unused (by a replica that is
        // no longer busy, or after a burst), until the endpoint is gone.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let endpoint = Arc::downgrade(&endpoint);
            rt.spawn(async move {
                let mut tick = tokio::time::interval(IDLE_TIMEOUT / 2);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match endpoint.upgrade() {
                        Some(e) => e.prune_idle(IDLE_TIMEOUT),
                        None => break,
                    }
                }
            });
        }
        if let Some(prefix) = settings.prefix {
            endpoint.set_prefix_routing(prefix);
        }
        if let Some(r) = settings.resume {
            endpoint.set_resume(r);
        }
        if let Some(c) = &settings.classes {
            endpoint.set_classes(c.clone());
        }
        let moves = settings.resume.map(|r| {
            Arc::new(MoveContext { endpoint: endpoint.clone(), settings: settings.clone(), max_moves: r.max_moves })
        });
        Arc::new(Target { endpoint, settings, metrics, budget, access, moves })
    }
}
