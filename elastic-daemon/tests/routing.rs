//! Shared listeners: requests routed to an endpoint by Host, by path
//! prefix or by the OpenAI `model` field, from configurations parsed like
//! the daemon's own; and every routing configuration error with its place.

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use onepool_elastic_daemon::config;
use onepool_elastic_daemon::daemon::Daemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Two endpoints, "chat" and "embed", reached only through one shared
/// listener configured by `listener` (its `[[listener]]` table and routes).
async fn start_routed(listener: &str) -> Daemon {
    let socket = socket_path();
    let src = format!(
        r#"control_socket = "{}"
shutdown_grace = "2s"

[[endpoint]]
name = "chat"
max_request_body = 512

[[endpoint]]
name = "embed"

{listener}"#,
        socket.display()
    );
    let cfg = config::parse("routing.toml", &src).unwrap();
    Daemon::start(cfg).await.unwrap()
}

struct Two {
    daemon: Daemon,
    chat: Backend,
    embed: Backend,
    url: String,
}

async fn two(listener: &str) -> Two {
    let daemon = start_routed(listener).await;
    let (chat, embed) = (backend(Mode::Normal).await, backend(Mode::Normal).await);
    daemon.endpoint("chat").unwrap().endpoint.add(chat.addr, None, true).unwrap();
    daemon.endpoint("embed").unwrap().endpoint.add(embed.addr, None, true).unwrap();
    assert_eq!(daemon.endpoint("chat").unwrap().listen, None, "no listener of its own");
    let url = format!("http://{}", daemon.listeners[0]);
    Two { daemon, chat, embed, url }
}

async fn request(
    c: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (StatusCode, HeaderMap, String) {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c.request(b.body(Full::new(body.into())).unwrap()).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn served_by(b: &Backend) -> String {
    b.addr.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_routing_picks_the_endpoint_by_host_header() {
    let t = two(r#"[[listener]]
listen = "127.0.0.1:0"
by = "host"
[[listener.route]]
host = "chat.example"
endpoint = "chat"
[[listener.route]]
host = "Embed.Example"
endpoint = "embed"
[[listener.route]]
host = "127.0.0.1"
endpoint = "embed"
"#)
    .await;
    let c = client();
    let url = format!("{}/ok", t.url);
    let (s, _, body) = request(&c, "GET", &url, &[("host", "chat.example:8080")], "").await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.chat)));
    let (s, _, body) = request(&c, "GET", &url, &[("host", "EMBED.example")], "").await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.embed)));
    // HTTP/2 names the host in :authority, not in a Host header.
    let h2: HttpClient = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let (s, _, body) = request(&h2, "GET", &url, &[], "").await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.embed)));
    let (s, _, body) = request(&c, "GET", &url, &[("host", "other.example")], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("\"other.example\""), "{body}");
    assert_eq!((t.chat.stats.served(), t.embed.stats.served()), (1, 2));
    t.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_routing_strips_the_prefix_or_keeps_it() {
    let t = two(r#"[[listener]]
listen = "127.0.0.1:0"
by = "path"
[[listener.route]]
path = "/chat/"
strip_prefix = true
endpoint = "chat"
[[listener.route]]
path = "/embed"
endpoint = "embed"
"#)
    .await;
    let c = client();
    let (s, h, body) = request(&c, "GET", &format!("{}/chat/v1/ok?x=1", t.url), &[], "").await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.chat)));
    assert_eq!(h["x-seen-path"], "/v1/ok?x=1");
    let (s, h, _) = request(&c, "GET", &format!("{}/chat", t.url), &[], "").await;
    assert_eq!((s, h["x-seen-path"].to_str().unwrap()), (StatusCode::OK, "/"));
    let (s, h, body) = request(&c, "POST", &format!("{}/embed/v1/ok", t.url), &[], "abc").await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.embed)));
    assert_eq!(h["x-seen-path"], "/embed/v1/ok", "kept without strip_prefix");
    assert_eq!(h["x-seen-body-bytes"], "3");
    // Prefixes match whole segments only.
    let (s, _, body) = request(&c, "GET", &format!("{}/chatty", t.url), &[], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("[\"/embed\", \"/chat\"]") || body.contains("[\"/chat\", \"/embed\"]"), "{body}");
    assert_eq!((t.chat.stats.served(), t.embed.stats.served()), (2, 1));
    t.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_path_prefix_wins_and_root_catches_the_rest() {
    let t = two(r#"[[listener]]
listen = "127.0.0.1:0"
by = "path"
[[listener.route]]
path = "/"
endpoint = "chat"
[[listener.route]]
path = "/v1/embeddings"
endpoint = "embed"
"#)
    .await;
    let c = client();
    let (_, _, body) = request(&c, "POST", &format!("{}/v1/embeddings", t.url), &[], "{}").await;
    assert_eq!(body, served_by(&t.embed));
    let (_, _, body) = request(&c, "POST", &format!("{}/v1/chat/completions", t.url), &[], "{}").await;
    assert_eq!(body, served_by(&t.chat));
    t.daemon.shutdown().await;
}

const MODEL_LISTENER: &str = r#"[[listener]]
listen = "127.0.0.1:0"
by = "model"
max_model_body = 1024
[[listener.route]]
model = "llama-3-8b"
endpoint = "chat"
[[listener.route]]
model = "e5-large"
endpoint = "embed"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_routing_reads_the_body_and_forwards_it_whole() {
    let t = two(MODEL_LISTENER).await;
    let c = client();
    let chat = r#"{"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "stream": false}"#;
    let (s, h, body) = request(&c, "POST", &format!("{}/v1/chat/completions", t.url), &[], chat).await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.chat)));
    assert_eq!(h["x-seen-path"], "/v1/chat/completions");
    assert_eq!(h["x-seen-body-bytes"], chat.len().to_string().as_str());
    let (s, _, body) =
        request(&c, "POST", &format!("{}/v1/completions", t.url), &[], r#"{"model":"llama-3-8b"}"#).await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.chat)));
    let emb = r#"{"input": "x", "model": "e5-large"}"#;
    let (s, _, body) = request(&c, "POST", &format!("{}/v1/embeddings", t.url), &[], emb).await;
    assert_eq!((s, body), (StatusCode::OK, served_by(&t.embed)));
    // OpenAI clients list the models first.
    let (s, _, body) = request(&c, "GET", &format!("{}/v1/models", t.url), &[], "").await;
    assert_eq!(s, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["e5-large", "llama-3-8b"]);
    assert_eq!((t.chat.stats.served(), t.embed.stats.served()), (2, 1));
    t.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_routing_answers_413_404_400_405_without_reaching_a_replica() {
    let t = two(MODEL_LISTENER).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", t.url);
    let err = |body: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
        v["error"]["message"].as_str().unwrap().to_string()
    };
    let big = format!(r#"{{"model": "llama-3-8b", "prompt": "{}"}}"#, "a".repeat(2000));
    let (s, _, body) = request(&c, "POST", &url, &[], big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(err(&body).contains("larger than 1024 bytes") && body.contains("max_model_body"), "{body}");
    let (s, _, body) = request(&c, "POST", &url, &[], r#"{"model": "gpt-9"}"#).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(err(&body).contains("\"gpt-9\" is not served here"), "{body}");
    assert!(err(&body).contains("\"e5-large\", \"llama-3-8b\""), "{body}");
    let (s, _, body) = request(&c, "POST", &url, &[], r#"{"messages": []}"#).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(err(&body).contains("names no \"model\"") && err(&body).contains("\"llama-3-8b\""), "{body}");
    let (s, _, body) = request(&c, "POST", &url, &[], r#"{"model": "llama-3-8b", "#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(err(&body).contains("not a JSON object"), "{body}");
    let (s, _, body) = request(&c, "POST", &url, &[], r#"{"model": 7}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(err(&body).contains("must be a string"), "{body}");
    let (s, h, _) = request(&c, "GET", &url, &[], "").await;
    assert_eq!((s, h["allow"].to_str().unwrap()), (StatusCode::METHOD_NOT_ALLOWED, "POST"));
    let (s, _, body) = request(&c, "POST", &format!("{}/v1/images", t.url), &[], r#"{"model":"llama-3-8b"}"#).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(err(&body).contains("/v1/chat/completions"), "{body}");
    // The body fits max_model_body but not the endpoint's max_request_body.
    let mid = format!(r#"{{"model": "llama-3-8b", "prompt": "{}"}}"#, "a".repeat(900));
    let (s, _, body) = request(&c, "POST", &url, &[], mid).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body.contains("larger than 512 bytes"), "{body}");
    assert_eq!((t.chat.stats.served(), t.embed.stats.served()), (0, 0));
    // Other requests are unaffected.
    let (s, _, _) = request(&c, "POST", &url, &[], r#"{"model": "llama-3-8b"}"#).await;
    assert_eq!(s, StatusCode::OK);
    t.daemon.shutdown().await;
}

/// The value of one `onepool_router_requests_total` series, 0 if absent.
fn requests_total(daemon: &Daemon, endpoint: &str, replica: &str, class: &str) -> u64 {
    let series =
        format!("onepool_router_requests_total{{endpoint=\"{endpoint}\",replica=\"{replica}\",class=\"{class}\"}} ");
    let text = daemon.metrics.encode();
    text.lines().find_map(|l| l.strip_prefix(series.as_str())).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_answers_and_refusals_are_counted_in_the_metrics() {
    let t = two(MODEL_LISTENER).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", t.url);
    let (s, _, _) = request(&c, "POST", &url, &[], r#"{"model": "gpt-9"}"#).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = request(&c, "GET", &url, &[], "").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _, _) = request(&c, "POST", &url, &[], r#"{"model": 7}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _, _) = request(&c, "POST", &url, &[], format!(r#"{{"prompt": "{}"}}"#, "a".repeat(2000))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    let (s, _, _) = request(&c, "GET", &format!("{}/v1/models", t.url), &[], "").await;
    assert_eq!(s, StatusCode::OK);
    // No endpoint was chosen for these: endpoint="" and replica="".
    assert_eq!(requests_total(&t.daemon, "", "", "4xx"), 4);
    assert_eq!(requests_total(&t.daemon, "", "", "2xx"), 1);
    // Routed, then refused by the endpoint (its max_request_body): the endpoint's.
    let mid = format!(r#"{{"model": "llama-3-8b", "prompt": "{}"}}"#, "a".repeat(900));
    assert_eq!(request(&c, "POST", &url, &[], mid).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(requests_total(&t.daemon, "chat", "", "4xx"), 1);
    assert_eq!(request(&c, "POST", &url, &[], r#"{"model": "llama-3-8b"}"#).await.0, StatusCode::OK);
    assert_eq!(requests_total(&t.daemon, "chat", &t.chat.addr.to_string(), "2xx"), 1);
    assert_eq!(requests_total(&t.daemon, "", "", "4xx"), 4);
    t.daemon.shutdown().await;

    let t = two(r#"[[listener]]
listen = "127.0.0.1:0"
by = "host"
[[listener.route]]
host = "chat.example"
endpoint = "chat"
[[listener.route]]
host = "embed.example"
endpoint = "embed"
"#)
    .await;
    let (s, _, _) = request(&c, "GET", &format!("{}/ok", t.url), &[("host", "other.example")], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // HTTP/1.0 without a Host header: 400.
    let mut stream = tokio::net::TcpStream::connect(t.daemon.listeners[0]).await.unwrap();
    stream.write_all(b"GET /ok HTTP/1.0\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
    assert_eq!(requests_total(&t.daemon, "", "", "4xx"), 2);
    t.daemon.shutdown().await;

    let t = two(r#"[[listener]]
listen = "127.0.0.1:0"
by = "path"
[[listener.route]]
path = "/chat"
endpoint = "chat"
[[listener.route]]
path = "/embed"
endpoint = "embed"
"#)
    .await;
    let (s, _, _) = request(&c, "GET", &format!("{}/other/ok", t.url), &[], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(requests_total(&t.daemon, "", "", "4xx"), 1);
    assert_eq!((t.chat.stats.served(), t.embed.stats.served()), (0, 0));
    t.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_keeps_its_own_listener_beside_a_shared_one() {
    let socket = socket_path();
    let src = format!(
        r#"control_socket = "{}"
[[endpoint]]
name = "chat"
listen = "127.0.0.1:0"

[[listener]]
listen = "127.0.0.1:0"
by = "path"
[[listener.route]]
path = "/chat"
strip_prefix = true
endpoint = "chat"
"#,
        socket.display()
    );
    let daemon = Daemon::start(config::parse("both.toml", &src).unwrap()).await.unwrap();
    let a = backend(Mode::Normal).await;
    let ep = daemon.endpoint("chat").unwrap();
    ep.endpoint.add(a.addr, None, true).unwrap();
    let own: SocketAddr = ep.listen.unwrap();
    let c = client();
    let (s, body) = get(&c, &format!("http://{own}/ok")).await;
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    let (s, body) = get(&c, &format!("http://{}/chat/ok", daemon.listeners[0])).await;
    assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()));
    // One replica pool behind both listeners.
    assert_eq!(ep.endpoint.snapshot().replicas[0].served, 2);
    daemon.shutdown().await;
}

/// The configuration errors of shared listeners, each at its line and column.
#[test]
fn routing_config_errors_name_file_line_and_column() {
    let src = r#"control_socket = "/tmp/x.sock"

[[endpoint]]
name = "chat"
listen = "127.0.0.1:8000"

[[endpoint]]
name = "lonely"

[[listener]]
listen = "127.0.0.1:8000"
by = "model"
[[listener.route]]
model = "llama"
endpoint = "chat"
[[listener.route]]
model = "llama"
endpoint = "chat"
[[listener.route]]
model = "mistral"
endpoint = "nope"
[[listener.route]]
host = "chat.example"
endpoint = "chat"

[[listener]]
listen = "127.0.0.1:8001"
by = "path"
max_model_body = 10
[[listener.route]]
path = "chat"
strip_prefix = true
endpoint = "chat"

[[listener]]
listen = "127.0.0.1:8002"
by = "color"

[[listener]]
listen = "127.0.0.1:8003"
by = "host"
[[listener.route]]
host = "bad host:80"
strip_prefix = false
endpoint = "chat"
"#;
    let e = config::parse("r.toml", src).unwrap_err();
    let all = e.to_string();
    let expect = [
        "r.toml:8:8: error: endpoint \"lonely\" has no listen and no [[listener.route]] names it",
        "r.toml:11:10: error: listen 127.0.0.1:8000 is also used by endpoint \"chat\"",
        "r.toml:17:9: error: model \"llama\" is routed twice on listener 127.0.0.1:8000",
        "r.toml:21:12: error: route to unknown endpoint \"nope\"; the [[endpoint]] names are [\"chat\", \"lonely\"]",
        "r.toml:23:8: error: host in a route of listener 127.0.0.1:8000, which routes by \"model\"",
        "r.toml:29:18: error: max_model_body applies only to a listener with by = \"model\"",
        "r.toml:31:8: error: path \"chat\" must start with '/'",
        "r.toml:37:6: error: by = \"color\": a listener routes by \"host\", \"path\" or \"model\"",
        "r.toml:43:8: error: host \"bad host:80\" is not a host name",
        "r.toml:44:16: error: strip_prefix applies only to routes of a listener with by = \"path\"",
    ];
    for line in expect {
        assert!(all.contains(line), "missing {line:?} in\n{all}");
    }
    // The route without its key, and the listener without routes.
    assert!(all.contains("names no model; add model = ..."), "{all}");
    assert!(all.contains("listener 127.0.0.1:8002 has no [[listener.route]]"), "{all}");
    assert_eq!(e.0.len(), expect.len() + 2, "{all}");
}

#[test]
fn duplicate_host_and_path_routes_are_refused() {
    let src = r#"control_socket = "/tmp/x.sock"
[[endpoint]]
name = "chat"
[[listener]]
listen = "127.0.0.1:9000"
by = "host"
[[listener.route]]
host = "a.example"
endpoint = "chat"
[[listener.route]]
host = "A.example"
endpoint = "chat"
[[listener]]
listen = "127.0.0.1:9001"
by = "path"
[[listener.route]]
path = "/chat"
endpoint = "chat"
[[listener.route]]
path = "/chat/"
endpoint = "chat"
[[listener]]
listen = "127.0.0.1:9001"
by = "path"
[[listener.route]]
path = "/x"
endpoint = "chat"
"#;
    let all = config::parse("d.toml", src).unwrap_err().to_string();
    assert!(all.contains("d.toml:11:8: error: host \"a.example\" is routed twice on listener 127.0.0.1:9000"), "{all}");
    assert!(all.contains("d.toml:20:8: error: path \"/chat\" is routed twice on listener 127.0.0.1:9001"), "{all}");
    assert!(
        all.contains("d.toml:23:10: error: listen 127.0.0.1:9001 is also used by [[listener]] 127.0.0.1:9001"),
        "{all}"
    );
}
