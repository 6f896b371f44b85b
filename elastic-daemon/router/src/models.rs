//! `GET /v1/models` on an endpoint: the models its ready replicas list
//! themselves, merged, rather than whichever one replica the request would
//! reach (during a rolling change of model, replicas differ).

use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{HeaderValue, StatusCode};
use serde_json::Value;

use crate::endpoint::Endpoint;

/// Longest wait for one replica's list.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest list read from one replica.
const MAX_LIST_BYTES: usize = 1 << 20;

/// The merged list as an OpenAI `list` object, or why there is none
/// (status and sentence).
/// `authorization`, the client's where the endpoint has no keys of its
/// own, goes to each replica as it would with the request itself: replicas
/// that check keys of their own (vLLM's `--api-key`, llama-server's
/// `--api-key-file`) list their models to it.
pub(crate) async fn list(
    endpoint: &Endpoint,
    connect_timeout: Duration,
    authorization: Option<HeaderValue>,
) -> Result<Value, (StatusCode, String)> {
    let ready = endpoint.ready_conns();
    if ready.is_empty() {
        return Err((StatusCode::SERVICE_UNAVAILABLE, "no replica is ready to list its models; retry later".into()));
    }
    let mut fields = Vec::new();
    if let Some(a) = authorization {
        fields.push((AUTHORIZATION, a));
    }
    if let Some(k) = endpoint.replica_key() {
        fields.push((crate::REPLICA_KEY_HEADER, k.clone()));
    }
    // Asked together, so one slow replica does not delay the answer more
    // than LIST_TIMEOUT.
    let mut asks = tokio::task::JoinSet::new();
    for (i, (address, conns)) in ready.iter().cloned().enumerate() {
        let fields = fields.clone();
        asks.spawn(async move {
            // On the replica's own connections: pinned like its requests.
            let answer = crate::replica_client::get(
                &conns,
                address,
                "/v1/models",
                &fields,
                connect_timeout,
                LIST_TIMEOUT,
                MAX_LIST_BYTES,
            );
            let list = match answer.await {
                Ok((status, body)) if status.is_success() => serde_json::from_slice::<Value>(&body).ok(),
                _ => None,
            };
            (i, list)
        });
    }
    // In the replicas' order, whichever answers first; a task that failed
    // counts as a replica that did not answer.
    let mut lists = vec![None; ready.len()];
    while let Some(r) = asks.join_next().await {
        if let Ok((i, list)) = r {
            lists[i] = list;
        }
    }
    let lists: Vec<Value> = lists.into_iter().flatten().collect();
    if lists.is_empty() {
        return Err((StatusCode::BAD_GATEWAY, format!("none of the {} ready replicas listed its models", ready.len())));
    }
    Ok(serde_json::json!({ "object": "list", "data": merge(&lists) }))
}

/// The `data` entries of OpenAI model lists, each `id` once (the first
/// replica's entry for it), in the order first seen.
pub(crate) fn merge(lists: &[Value]) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    lists
        .iter()
        .filter_map(|l| l.get("data").and_then(Value::as_array))
        .flatten()
        .filter(|m| m.get("id").and_then(Value::as_str).is_some_and(|id| seen.insert(id.to_string())))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_model_is_listed_once_in_the_order_first_seen() {
        let a = json!({"object": "list", "data": [{"id": "llama-3-8b", "owned_by": "a"}, {"id": "e5"}]});
        let b = json!({"object": "list", "data": [{"id": "llama-3-8b", "owned_by": "b"}, {"id": "llama-3-8b-v2"}]});
        let odd = json!({"models": ["x"], "data": [{"name": "no id"}]});
        let ids: Vec<_> = merge(&[a, odd, b]).iter().map(|m| (m["id"].clone(), m["owned_by"].clone())).collect();
        assert_eq!(
            ids,
            vec![(json!("llama-3-8b"), json!("a")), (json!("e5"), Value::Null), (json!("llama-3-8b-v2"), Value::Null)]
        );
    }
}
