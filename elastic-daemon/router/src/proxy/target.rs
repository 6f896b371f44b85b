//! One endpoint as the proxy sees it: what every listener that routes to
//! it shares (its replicas, settings, metrics, body budget, access log and
//! what its answers need to move).

use std::sync::Arc;

use crate::access_log::AccessLog;
use crate::backend_pool::IDLE_TIMEOUT;
use crate::endpoint::Endpoint;
use crate::metrics::Metrics;
use crate::proxy::body_budget::BodyBudget;
use crate::proxy::resumable::MoveContext;
use crate::settings::ProxySettings;

/// One endpoint as the proxy sees it: shared by its own listener and by
/// every shared listener that routes to it (one backend connection pool
/// per replica).
pub struct Target {
    pub(super) endpoint: Arc<Endpoint>,
    pub(super) settings: ProxySettings,
    pub(super) metrics: Arc<Metrics>,
    pub(super) budget: Arc<BodyBudget>,
    pub(super) access: Option<Arc<AccessLog>>,
    /// With `[endpoint.resume]` on: what its answers need to move.
    pub(super) moves: Option<Arc<MoveContext>>,
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
