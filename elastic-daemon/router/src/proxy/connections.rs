//! The client connections of a listener: their per-IP and total caps,
//! the requests in flight on each, and the count graceful stop waits on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::Version;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{ListenerLabels, Metrics, RefusedLabels};
use crate::proxy::routes::Dispatch;
use crate::settings::ConnSettings;

/// A client connection as requests on it see it.
pub(super) struct ClientConn {
    pub(super) dispatch: Arc<Dispatch>,
    /// The client's address as `X-Forwarded-For` names it.
    pub(super) forwarded_for: HeaderValue,
    /// Requests received so far.
    pub(super) received: AtomicU64,
    /// Requests whose answer has gone out to its end (or was dropped).
    pub(super) done: AtomicU64,
    /// An HTTP/2 connection (its streams have no head timeout).
    pub(super) http2: AtomicBool,
    /// A graceful stop reached the lean path (`lean`): it closes the
    /// connection before its next request.
    pub(super) stop: AtomicBool,
    /// When the connection opened: [`idle_since`](Self::idle_since) counts
    /// from it.
    pub(super) opened: Instant,
    /// When its latest answer ended, in nanoseconds after `opened`
    /// (written before `done` counts the request): the head timeout of an
    /// idle connection runs from there ([`Guarded`]).
    pub(super) idle_since: AtomicU64,
}

impl ClientConn {
    pub(super) fn new(dispatch: Arc<Dispatch>, peer: IpAddr) -> Arc<ClientConn> {
        let forwarded_for =
            HeaderValue::from_str(&peer.to_string()).unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Arc::new(ClientConn {
            dispatch,
            forwarded_for,
            received: AtomicU64::new(0),
            done: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            opened: Instant::now(),
            idle_since: AtomicU64::new(0),
        })
    }

    /// When the latest answer ended ([`idle_since`](Self::idle_since)); read
    /// `done` (Acquire) first, so that its request's end is seen.
    pub(super) fn idle_since(&self) -> Instant {
        self.opened + Duration::from_nanos(self.idle_since.load(Ordering::Relaxed))
    }
}

/// One request's hold on its connection, from its head until its answer
/// has gone out (or was dropped): while one is held, no request head is
/// awaited, so the head timeout does not run; when it is let go, the
/// connection is idle from the answer's end.
pub(super) struct RequestHold {
    pub(super) client: Arc<ClientConn>,
    /// When the answer ended, if its body knew already (a replica's answer
    /// reads the clock as it ends, for its latency): a clock reading costs
    /// a sizeable part of a microsecond on some machines, and the lean
    /// path's whole request costs about nine.
    pub(super) ended: Option<Instant>,
}

impl RequestHold {
    pub(super) fn new(client: Arc<ClientConn>, version: Version) -> RequestHold {
        if version == Version::HTTP_2 {
            client.http2.store(true, Ordering::Relaxed);
        }
        client.received.fetch_add(1, Ordering::Relaxed);
        RequestHold { client, ended: None }
    }
}

impl Drop for RequestHold {
    fn drop(&mut self) {
        let c = &self.client;
        let ended = self.ended.unwrap_or_else(Instant::now).saturating_duration_since(c.opened);
        // The latest end, not the last written: HTTP/2 streams end in any
        // order.
        c.idle_since.fetch_max(u64::try_from(ended.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        c.done.fetch_add(1, Ordering::Release);
    }
}

/// A listener's connections: held to its caps as they come, and for a
/// graceful stop, each told to finish what it serves and close, the stop
/// waiting until all have.
pub(super) struct Connections {
    pub(super) stopping: AtomicBool,
    pub(super) open: Mutex<Open>,
    pub(super) next: AtomicU64,
    pub(super) all_closed: tokio::sync::Notify,
    pub(super) max: usize,
    pub(super) max_per_ip: usize,
    pub(super) gauge: Gauge,
    pub(super) refused_total: Counter,
    pub(super) refused_per_ip: Counter,
}

#[derive(Default)]
pub(super) struct Open {
    /// Each open connection's task, to wake it for the stop.
    pub(super) wakers: HashMap<u64, Option<Waker>>,
    /// Open connections by client address (none listed at zero).
    pub(super) per_ip: HashMap<IpAddr, usize>,
}

impl Connections {
    pub(super) fn new(conn: &ConnSettings, listener: &str, metrics: &Metrics) -> Connections {
        let refused = |reason: &str| {
            let labels = RefusedLabels { listener: listener.to_string(), reason: reason.to_string() };
            metrics.connections_refused.get_or_create(&labels).clone()
        };
        Connections {
            stopping: AtomicBool::new(false),
            open: Mutex::default(),
            next: AtomicU64::new(0),
            all_closed: tokio::sync::Notify::new(),
            max: conn.max_connections,
            max_per_ip: conn.max_connections_per_ip,
            gauge: metrics.connections.get_or_create(&ListenerLabels { listener: listener.to_string() }).clone(),
            refused_total: refused("max_connections"),
            refused_per_ip: refused("max_connections_per_ip"),
        }
    }

    pub(super) fn table(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection from `ip`, or `None` (counted) if it would pass
    /// the listener's cap or its client's.
    pub(super) fn add(&self, ip: IpAddr) -> Option<u64> {
        let mut open = self.table();
        let refused = if open.wakers.len() >= self.max {
            &self.refused_total
        } else if open.per_ip.get(&ip).is_some_and(|&n| n >= self.max_per_ip) {
            &self.refused_per_ip
        } else {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            open.wakers.insert(id, None);
            *open.per_ip.entry(ip).or_default() += 1;
            self.gauge.inc();
            return Some(id);
        };
        refused.inc();
        None
    }

    pub(super) fn remove(&self, id: u64, ip: IpAddr) {
        let mut open = self.table();
        open.wakers.remove(&id);
        if let Some(n) = open.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&ip);
            }
        }
        self.gauge.dec();
        if open.wakers.is_empty() {
            self.all_closed.notify_waiters();
        }
    }

    /// Tells every connection to close once its requests are answered, and
    /// waits until all have closed.
    pub(super) async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for w in self.table().wakers.values().flatten() {
            w.wake_by_ref();
        }
        loop {
            let closed = self.all_closed.notified();
            let mut closed = std::pin::pin!(closed);
            closed.as_mut().enable();
            if self.table().wakers.is_empty() {
                return;
            }
            closed.await;
        }
    }
}
