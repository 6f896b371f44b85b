//! The shutdown signal every long-running task watches (listeners, health
//! checkers, replica controllers, the control socket): a `watch` channel
//! whose value turns true once, when the daemon stops.

use tokio::sync::watch;

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}
