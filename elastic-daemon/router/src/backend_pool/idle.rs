//! Each replica's idle connections, and how new ones are made
//! (its transport).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use onepool_launcher::hop_tls::PinnedClient;
use tokio::time::Instant;

use crate::backend_pool::conn::BackendConn;
use crate::backend_pool::limits::IDLE_TIMEOUT;

/// A replica's idle connections, the most recently used first out, and
/// how new ones are made.
#[derive(Default)]
pub struct IdleConns {
    pub(super) idle: Mutex<Vec<BackendConn>>,
    pub(super) transport: Transport,
}

/// How the router reaches one replica.
#[derive(Default, Clone, Debug)]
pub enum Transport {
    /// Clear HTTP (`[endpoint.replicas] transport = "plain"`, or a replica
    /// added by hand).
    #[default]
    Plain,
    /// TLS, accepting only the certificate its launcher reported.
    Pinned(PinnedClient),
    /// No connection at all: a replica whose transport is not known.
    Refused,
}

impl IdleConns {
    pub fn new(transport: Transport) -> IdleConns {
        IdleConns { idle: Mutex::default(), transport }
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Vec<BackendConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection used last (connections unused for long are closed
    /// by `prune` and by `put`).
    pub(super) fn pop(&self) -> Option<BackendConn> {
        loop {
            let mut c = self.lock().pop()?;
            if c.still_idle() {
                return Some(c);
            }
        }
    }

    /// Keeps a connection whose last exchange ended cleanly at `now`.
    pub(super) fn put(&self, mut c: BackendConn, now: Instant) {
        if !c.buf.is_empty() {
            return;
        }
        c.idle_since = now;
        let mut idle = self.lock();
        // The oldest are at the bottom; drop the ones past their time.
        let stale = idle.iter().take_while(|c| now.duration_since(c.idle_since) >= IDLE_TIMEOUT).count();
        idle.drain(..stale);
        idle.push(c);
    }

    /// Closes the connections unused for `max_idle` or more.
    pub fn prune(&self, max_idle: Duration) {
        let now = Instant::now();
        self.lock().retain(|c| now.duration_since(c.idle_since) < max_idle);
    }

    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }
}
