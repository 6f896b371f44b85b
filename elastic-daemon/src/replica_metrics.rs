//! Replicas' own load, read from their Prometheus metrics (e.g. vLLM's
//! `vllm:num_requests_running` and `vllm:num_requests_waiting`) for
//! endpoints that configure `load_metrics`: a server that batches
//! internally knows better than the router how much work it holds. A
//! replica whose metrics cannot be read counts with the router's own
//! figure (its requests in flight), so a scrape failure never makes an
//! endpoint look idle.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use onepool_router::backend_pool::IdleConns;

/// The load gauges of the model servers onepool knows, as (server, what
/// it is decoding, what waits in it): `load_metrics = "auto"` sums them all,
/// and as each server exports only its own, a replica's load is what its
/// server holds. Names from each server's documentation of its /metrics
/// (llama.cpp's measured here: llama-server b1 of llama-cpp-python 0.3.36).
pub const KNOWN_SERVERS: [(&str, &str, &str); 4] = [
    ("llama.cpp", "llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ("vLLM", "vllm:num_requests_running", "vllm:num_requests_waiting"),
    ("SGLang", "sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ("TGI", "tgi_batch_current_size", "tgi_queue_size"),
];

/// Every metric name of [`KNOWN_SERVERS`].
pub fn known_load_metrics() -> Vec<String> {
    KNOWN_SERVERS.iter().flat_map(|(_, running, waiting)| [running.to_string(), waiting.to_string()]).collect()
}

/// Largest metrics page read; a bigger one is a misconfiguration.
const MAX_BODY: usize = 4 << 20;

/// Sum of every sample of the named metrics (any labels) in Prometheus
/// text format; `None` when none of the names has a sample.
pub fn sum_samples(text: &str, names: &[String]) -> Option<f64> {
    let mut sum = 0.0;
    let mut found = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(line.len());
        let name = &line[..name_end];
        if !names.iter().any(|n| n == name) {
            continue;
        }
        // The value follows the labels (which may hold spaces in quotes).
        let rest = &line[name_end..];
        let rest = match rest.strip_prefix('{') {
            Some(labels) => match closing_brace(labels) {
                Some(i) => &labels[i + 1..],
                None => continue,
            },
            None => rest,
        };
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if value.is_finite() {
            sum += value;
            found = true;
        }
    }
    found.then_some(sum)
}

/// Index of the `}` that closes a label set, skipping quoted values.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// Reads one replica's load on its own connections (`conns`: pinned to
/// its certificate like its requests, issue #36); the error says why (for
/// the logs).
pub async fn scrape(
    client: &Scraper,
    conns: &Arc<IdleConns>,
    address: SocketAddr,
    path: &str,
    names: &[String],
) -> Result<f64, String> {
    let (t, fields) = (client.timeout, &client.fields);
    let (status, body) = onepool_router::replica_client::get(conns, address, path, fields, t, t, MAX_BODY).await?;
    if !status.is_success() {
        return Err(format!("GET {address}{path}: {status}"));
    }
    let text = String::from_utf8_lossy(&body);
    sum_samples(&text, names).ok_or_else(|| format!("GET {address}{path}: no sample of {}", names.join(", ")))
}

/// How the controller scrapes: short timeouts (a scrape never holds up a
/// poll for long) and onepoold's replica key on every request (launchers
/// answer nothing without it).
#[derive(Clone, Debug)]
pub struct Scraper {
    pub timeout: Duration,
    pub fields: Vec<(HeaderName, HeaderValue)>,
}

pub fn client(timeout: Duration, replica_key: Option<&HeaderValue>) -> Scraper {
    Scraper {
        timeout,
        fields: replica_key.map(|k| (onepool_router::REPLICA_KEY_HEADER, k.clone())).into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What llama-server (llama-cpp-python 0.3.36's llama.cpp) served on
    /// /metrics with one request decoding and two deferred, trimmed.
    const LLAMA_CPP: &str = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
";

    #[test]
    fn auto_reads_whichever_known_server_answers() {
        let auto = known_load_metrics();
        assert_eq!(sum_samples(LLAMA_CPP, &auto), Some(3.0));
        assert_eq!(sum_samples(VLLM, &auto), Some(19.0));
        // A server onepool does not know: the router's count is used.
        assert_eq!(sum_samples("other_requests_running 4\n", &auto), None);
    }

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Meta-Llama-3-8B-Instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Meta-Llama-3-8B-Instruct"} 7.0
vllm:num_requests_waiting_total 99
vllm:gpu_cache_usage_perc{model_name="a } b"} 0.5
"#;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn samples_of_the_named_metrics_are_summed_whatever_their_labels() {
        assert_eq!(sum_samples(VLLM, &names(&["vllm:num_requests_waiting"])), Some(7.0));
        assert_eq!(sum_samples(VLLM, &names(&["vllm:num_requests_running", "vllm:num_requests_waiting"])), Some(19.0));
        // Same prefix, other metric; a quoted brace in a label.
        assert_eq!(sum_samples(VLLM, &names(&["vllm:num_requests_waiting_total"])), Some(99.0));
        assert_eq!(sum_samples(VLLM, &names(&["vllm:gpu_cache_usage_perc"])), Some(0.5));
        assert_eq!(sum_samples("a{x=\"1\"} 2 1700000000000\na{x=\"2\"} 3\n", &names(&["a"])), Some(5.0));
    }

    #[test]
    fn absent_names_and_garbage_give_nothing() {
        assert_eq!(sum_samples(VLLM, &names(&["vllm:nope"])), None);
        assert_eq!(sum_samples("a{x=\"1\" 2\na NaN\na\n", &names(&["a"])), None);
        assert_eq!(sum_samples("", &names(&["a"])), None);
    }

    #[test]
    fn a_replica_is_scraped_over_http_and_failures_say_why() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                loop {
                    let (mut s, _) = listener.accept().await.unwrap();
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap();
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    // A launcher answers only with onepoold's replica key.
                    let keyed = req.to_ascii_lowercase().contains("\r\nx-onepool-replica-key: k3y\r\n");
                    let (status, body) = match (req.starts_with("GET /metrics "), keyed) {
                        (_, false) => ("401 Unauthorized", ""),
                        (true, true) => ("200 OK", VLLM),
                        (false, true) => ("404 Not Found", ""),
                    };
                    let head =
                        format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                    s.write_all(head.as_bytes()).await.unwrap();
                    s.write_all(body.as_bytes()).await.unwrap();
                }
            });
            let n = names(&["vllm:num_requests_waiting"]);
            let conns = Arc::new(IdleConns::default());
            let keyless = client(Duration::from_secs(2), None);
            assert!(scrape(&keyless, &conns, address, "/metrics", &n).await.unwrap_err().contains("401"));
            let c = client(Duration::from_secs(2), Some(&http::HeaderValue::from_static("k3y")));
            assert_eq!(scrape(&c, &conns, address, "/metrics", &n).await, Ok(7.0));
            let e = scrape(&c, &conns, address, "/other", &n).await.unwrap_err();
            assert!(e.contains("/other: 404"), "{e}");
            let e = scrape(&c, &conns, address, "/metrics", &names(&["x"])).await.unwrap_err();
            assert!(e.ends_with("no sample of x"), "{e}");
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
            assert!(scrape(&c, &conns, closed, "/metrics", &n).await.is_err());
        });
    }
}
