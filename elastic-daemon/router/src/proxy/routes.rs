//! How a listener picks the endpoint for a request: an endpoint's own
//! listener, or a shared one's routes by host, path prefix or model.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use http::Response;

use crate::metrics::RequestCounters;
use crate::proxy::body_budget::BodyBudget;
use crate::proxy::target::Target;
use crate::settings::Routes;

/// How a listener picks the endpoint for a request.
pub enum Dispatch {
    /// An endpoint's own listener.
    Single(Arc<Target>),
    /// A shared listener.
    Routed(Box<Routed>),
}

/// A shared listener's routes, and its count of the requests it answered
/// itself (refused: no such host, path or model; bad request), under
/// `endpoint=""` (no endpoint chosen).
pub struct Routed {
    pub(super) by: By,
    pub(super) answered: Option<RequestCounters>,
}

pub(super) enum By {
    /// By `Host` (or HTTP/2 `:authority`), lower case, port ignored.
    Host(HashMap<String, Arc<Target>>),
    /// By path prefix on whole segments, longest first.
    Path(Vec<(String, bool, Arc<Target>)>),
    /// By the `model` field of POSTs to [`MODEL_PATHS`].
    Model { max_body: usize, body_timeout: Duration, models: BTreeMap<String, Arc<Target>>, budget: Arc<BodyBudget> },
}

impl Dispatch {
    /// Builds a shared listener's dispatch; every route's endpoint must be
    /// in `targets` (the configuration checked that).
    pub fn routed(routes: &Routes, targets: &HashMap<String, Arc<Target>>, budget: &Arc<BodyBudget>) -> Dispatch {
        let t = |name: &str| targets.get(name).expect("routes name configured endpoints").clone();
        let by = match routes {
            Routes::Host(r) => By::Host(r.iter().map(|(h, e)| (h.clone(), t(e))).collect()),
            Routes::Path(r) => {
                let mut v: Vec<_> = r.iter().map(|p| (p.prefix.clone(), p.strip, t(&p.endpoint))).collect();
                v.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
                By::Path(v)
            }
            Routes::Model { max_body, body_timeout, routes } => By::Model {
                max_body: *max_body,
                body_timeout: *body_timeout,
                models: routes.iter().map(|(m, e)| (m.clone(), t(e))).collect(),
                budget: budget.clone(),
            },
        };
        // Every target shares the daemon's metrics.
        let answered = targets.values().next().map(|t| t.metrics.request_counters("", ""));
        Dispatch::Routed(Box::new(Routed { by, answered }))
    }

    pub(super) fn name(&self) -> &str {
        match self {
            Dispatch::Single(t) => t.endpoint.name(),
            Dispatch::Routed(r) => match r.by {
                By::Host(_) => "(by host)",
                By::Path(_) => "(by path)",
                By::Model { .. } => "(by model)",
            },
        }
    }
}

impl Routed {
    /// Counts an answer the listener gave itself.
    pub(super) fn listener_answer<B>(&self, r: Response<B>) -> Response<B> {
        if let Some(c) = &self.answered {
            c.count(r.status().as_u16());
        }
        r
    }
}
