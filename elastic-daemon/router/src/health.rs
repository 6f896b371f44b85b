//! Active health checks: every interval, and at once after a replica
//! failed a request, a GET to each replica's health path; the registry
//! turns consecutive results into state changes.

use std::sync::Arc;

use tokio::sync::watch;

use crate::endpoint::Endpoint;
use crate::settings::HealthCheck;

/// Largest health answer read (its body says nothing the status does not).
const MAX_HEALTH_BYTES: usize = 64 * 1024;

/// Checks `endpoint`'s replicas until `shutdown` turns true.
pub async fn run(endpoint: Arc<Endpoint>, check: HealthCheck, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(check.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    endpoint.eject_on_failure();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // A replica just failed a request: check it now, so a replica
            // that only lost one connection is back within one probe.
            _ = endpoint.probe_requested() => {}
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
        let key = endpoint.replica_key().cloned();
        let probes = endpoint.health_targets().into_iter().map(|(id, address, conns)| {
            let path = check.path.clone();
            let fields: Vec<_> = key.iter().map(|k| (crate::REPLICA_KEY_HEADER, k.clone())).collect();
            async move {
                // On the replica's own connections: pinned like its requests.
                let answer = crate::replica_client::get(
                    &conns,
                    address,
                    &path,
                    &fields,
                    check.timeout,
                    check.timeout,
                    MAX_HEALTH_BYTES,
                )
                .await;
                let ok = matches!(answer, Ok((status, _)) if status.is_success());
                (id, address, ok, answer.is_ok())
            }
        });
        // Probed together so one slow replica does not delay the others.
        for (id, address, ok, answered) in futures_join_all(probes).await {
            endpoint.reach_result(id, answered);
            if let Some(t) = endpoint.health_result(id, ok) {
                tracing::info!(endpoint = %endpoint.name(), %address, from = ?t.from, to = ?t.to, "replica health changed");
            }
        }
    }
}

async fn futures_join_all<F: std::future::Future + Send + 'static>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}
