use super::*;

#[test]
fn the_example_parses() {
    let src = include_str!("../../../etc/onepoold.toml");
    let c = parse("etc/onepoold.toml", src).unwrap();
    assert_eq!(c.endpoints.len(), 1);
    assert_eq!(c.control_socket_mode, 0o600);
    assert!(c.endpoints[0].health.is_some());
    let r = c.endpoints[0].replicas.as_ref().expect("[endpoint.replicas]");
    assert_eq!((r.min, r.max, r.port_range), (1, 4, (18000, 18999)));
    assert_eq!(c.max_buffered_body_bytes, 256 << 20);
    let p = &c.endpoints[0].proxy;
    assert_eq!((p.body_read_timeout, p.response_idle_timeout), (Duration::from_secs(30), Duration::from_secs(60)));
    assert_eq!((p.conn.max_connections, p.conn.max_connections_per_ip), (4096, 512));
    assert_eq!(p.conn.http2_idle_timeout, Duration::from_secs(60));
    assert_eq!(c.listeners[0].conn, p.conn);
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(
        c.listeners[0].routes,
        Routes::Model {
            max_body: 1 << 20,
            body_timeout: Duration::from_secs(30),
            routes: vec![("llama-3-8b-instruct".into(), "chat".into())]
        }
    );
}

#[test]
fn every_problem_is_reported_with_line_and_column() {
    let src = r#"control_socket = "/tmp/x.sock"
metrics_address = "0.0.0.0:9464"

[[endpoint]]
name = "chat"
listen = "not-an-address"
queue_timeout = "soon"

[[endpoint]]
name = "chat"
listen = "127.0.0.1:8000"
replica_concurrency = 0
"#;
    let e = parse("r.toml", src).unwrap_err();
    let all = e.to_string();
    assert!(all.contains("r.toml:2:19: error: metrics_address 0.0.0.0:9464 is not a loopback"), "{all}");
    assert!(all.contains("r.toml:6:10: error: listen = \"not-an-address\""), "{all}");
    assert!(all.contains("r.toml:7:17: error: queue_timeout"), "{all}");
    assert!(all.contains("r.toml:10:8: error: endpoint \"chat\" is defined twice"), "{all}");
    assert!(all.contains("r.toml:12:23: error: replica_concurrency = 0 is out of range"), "{all}");
    assert_eq!(e.0.len(), 5, "{all}");
}

#[test]
fn syntax_and_unknown_keys_have_a_place() {
    let e =
        parse("r.toml", "control_socket = \"/s\"\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\nqueue = 3\n")
            .unwrap_err();
    assert!(e.0[0].starts_with("r.toml:5:1: error: unknown field `queue`"), "{}", e);
}

#[test]
fn load_metrics_names_and_path_are_checked() {
    let src = r#"control_socket = "/tmp/x.sock"
[[endpoint]]
name = "llm"
listen = "127.0.0.1:0"
[endpoint.replicas]
command = "x"
load_metrics = ["vllm:num_requests_waiting", "bad name"]
metrics_path = "metrics"
"#;
    let e = parse("t.toml", src).unwrap_err().to_string();
    assert!(
        e.contains("t.toml:7:16: error: replicas.load_metrics: \"bad name\" is not a Prometheus metric name"),
        "{e}"
    );
    assert!(e.contains("t.toml:8:16: error: replicas.metrics_path = \"metrics\" must start with '/'"), "{e}");
    let ok = src.replace(", \"bad name\"", "").replace("\"metrics\"", "\"/m\"");
    let r = parse("t.toml", &ok).unwrap().endpoints[0].replicas.clone().unwrap();
    assert_eq!((r.load_metrics, r.metrics_path.as_str()), (vec!["vllm:num_requests_waiting".to_string()], "/m"));
}

#[test]
fn the_replicas_transport_is_tls_unless_plain_is_asked_for() {
    let src = |v: &str| {
        format!(
            "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n{v}\n"
        )
    };
    let transport = |v: &str| parse("t.toml", &src(v)).unwrap().endpoints[0].replicas.clone().unwrap().transport;
    assert_eq!(transport(""), crate::config::ReplicaTransport::Tls);
    assert_eq!(transport("transport = \"tls\""), crate::config::ReplicaTransport::Tls);
    assert_eq!(transport("transport = \"plain\""), crate::config::ReplicaTransport::Plain);
    for v in ["\"TLS\"", "\"https\""] {
        let e = parse("t.toml", &src(&format!("transport = {v}"))).unwrap_err().to_string();
        let want = format!("t.toml:7:13: error: replicas.transport = {v}: give \"tls\"");
        assert!(e.contains(&want), "{e}");
    }
    let e = parse("t.toml", &src("transport = 1")).unwrap_err().to_string();
    assert!(e.contains("t.toml:7:13"), "{e}");
}

#[test]
fn load_metrics_auto_is_the_known_servers_gauges() {
    let src = |v: &str| {
        format!(
            "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"llm\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\nload_metrics = {v}\n"
        )
    };
    let r = parse("t.toml", &src("\"auto\"")).unwrap().endpoints[0].replicas.clone().unwrap();
    assert!(r.load_metrics.contains(&"llamacpp:requests_deferred".to_string()), "{:?}", r.load_metrics);
    assert!(r.load_metrics.contains(&"vllm:num_requests_waiting".to_string()), "{:?}", r.load_metrics);
    for v in ["\"vllm\"", "5", "[\"a\", 1]"] {
        let e = parse("t.toml", &src(v)).unwrap_err().to_string();
        let want = format!("t.toml:7:16: error: replicas.load_metrics = {v}: give a list of metric names, or \"auto\"");
        assert!(e.contains(&want), "{e}");
    }
}

#[test]
fn resource_bounds_are_checked() {
    let src = r#"control_socket = "/tmp/x.sock"
max_buffered_body_bytes = 2097152

[[endpoint]]
name = "chat"
listen = "127.0.0.1:0"
max_request_body = 4194304
body_read_timeout = "0s"
response_idle_timeout = "soon"
max_connections = 10
max_connections_per_ip = 20

[[listener]]
listen = "127.0.0.1:0"
by = "model"
max_model_body = 3145728
max_connections = 0
http2_idle_timeout = "1x"

[[listener.route]]
model = "m"
endpoint = "chat"
"#;
    let e = parse("b.toml", src).unwrap_err();
    let all = e.to_string();
    for want in [
        "b.toml:7:20: error: max_request_body = 4194304 of endpoint \"chat\" is above max_buffered_body_bytes = 2097152",
        "b.toml:8:21: error: body_read_timeout must be longer than zero",
        "b.toml:9:25: error: response_idle_timeout: ",
        "b.toml:11:26: error: max_connections_per_ip = 20 is above max_connections = 10",
        "b.toml:16:18: error: max_model_body = 3145728 is above max_buffered_body_bytes = 2097152",
        "b.toml:17:19: error: max_connections = 0 is out of range; use 1 to 1000000",
        "b.toml:18:22: error: http2_idle_timeout: ",
    ] {
        assert!(all.contains(want), "{want} not in\n{all}");
    }
    assert_eq!(e.0.len(), 7, "{all}");
    // The per-client cap follows a total set below its default.
    let ok = "control_socket = \"/s\"\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\nmax_connections = 100\n";
    let conn = &parse("o.toml", ok).unwrap().endpoints[0].proxy.conn;
    assert_eq!((conn.max_connections, conn.max_connections_per_ip), (100, 100));
}

#[test]
fn bearer_tokens_come_from_a_private_file_and_bad_ones_are_refused_with_where() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("onepool-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chat.tokens");
    let src = format!(
        "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"chat\"\nlisten = \"127.0.0.1:0\"\n[endpoint.auth]\nbearer_tokens_file = \"{}\"\n",
        file.display()
    );
    let write = |text: &str, mode: u32| {
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let err = || parse("t.toml", &src).unwrap_err().to_string();
    write("# the chat team\n0123456789abcdef0123\n\nfedcba9876543210fedc  # ops\n", 0o600);
    let c = parse("t.toml", &src).unwrap();
    assert_eq!(c.endpoints[0].proxy.auth.as_ref().map(|a| a.len()), Some(2));
    write("0123456789abcdef0123\n", 0o644);
    assert!(
        err().contains("t.toml:6:22: error: auth.bearer_tokens_file") && err().contains("mode 644): chmod 600"),
        "{}",
        err()
    );
    write("short\n", 0o600);
    assert!(err().contains("line 1: a token is one word of at least 16 ASCII characters"), "{}", err());
    write("# nothing\n", 0o600);
    assert!(err().contains("holds no token"), "{}", err());
    // A line may name the requests' class (issue #44), one word after the token.
    write("0123456789abcdef0123 agents\nfedcba9876543210fedc\n", 0o600);
    let c = parse("t.toml", &src).unwrap();
    let classes: Vec<&str> = c.endpoints[0].proxy.auth.as_ref().unwrap().classes().collect();
    assert_eq!(classes, ["agents"]);
    assert_eq!(c.endpoints[0].keyed_classes, [("agents".to_string(), format!("{}:1", file.display()))]);
    write("0123456789abcdef0123 agents extra\n", 0o600);
    assert!(err().contains("line 1: \"extra\" after the token and its class"), "{}", err());
    write("0123456789abcdef0123 ag/ents\n", 0o600);
    assert!(err().contains("line 1: \"ag/ents\" is not a class name"), "{}", err());
    std::fs::remove_file(&file).unwrap();
    assert!(err().contains("cannot read it"), "{}", err());
    std::fs::remove_dir_all(&dir).unwrap();
    // Without the table, nothing is asked of clients.
    assert!(parse("t.toml", &src.replace("[endpoint.auth]", "").replace("bearer_tokens_file", "#")).unwrap().endpoints
        [0]
    .proxy
    .auth
    .is_none());
}

#[test]
fn tls_files_are_read_and_checked_when_the_config_is_and_errors_point_at_the_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("onepool-tls-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key) = (dir.join("chat.crt"), dir.join("chat.key"));
    let make = |name: &str| {
        let k = rcgen::KeyPair::generate().unwrap();
        let c = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap().self_signed(&k).unwrap();
        (c.pem(), k.serialize_pem())
    };
    let ((cert_pem, key_pem), (_, other_key)) = (make("chat.example"), make("other.example"));
    let write = |path: &std::path::Path, text: &str, mode: u32| {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let src = format!(
        "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"chat\"\nlisten = \"127.0.0.1:0\"\n[endpoint.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\nby = \"path\"\n[listener.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n[[listener.route]]\nendpoint = \"chat\"\npath = \"/chat\"\n",
        crt.display(),
        key.display(),
        crt.display(),
        key.display()
    );
    let err = || parse("t.toml", &src).unwrap_err().to_string();
    write(&crt, &cert_pem, 0o644);
    write(&key, &key_pem, 0o600);
    let c = parse("t.toml", &src).unwrap();
    assert!(c.endpoints[0].proxy.conn.tls.is_some() && c.listeners[0].conn.tls.is_some());

    // Each error names the file, says what is wrong, and sits at its key
    // (line 7 for the endpoint's key_file, 6 for its cert_file).
    write(&key, &other_key, 0o600);
    assert!(
        err().contains("t.toml:7:12: error: tls: key_file")
            && err().contains("is not the key of the first certificate"),
        "{}",
        err()
    );
    write(&key, &key_pem, 0o640);
    assert!(err().contains("t.toml:7:12") && err().contains("(mode 640): chmod 600"), "{}", err());
    write(&key, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o600);
    assert!(err().contains("holds no PEM PRIVATE KEY"), "{}", err());
    write(&key, &key_pem, 0o600);
    write(&crt, "", 0o644);
    assert!(
        err().contains("t.toml:6:13: error: tls: cert_file") && err().contains("holds no PEM CERTIFICATE"),
        "{}",
        err()
    );
    std::fs::remove_file(&crt).unwrap();
    assert!(err().contains("cannot read cert_file"), "{}", err());
    // The listener's table is checked as well: both errors are reported.
    assert_eq!(err().matches("cannot read cert_file").count(), 2, "{}", err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn warm_headroom_and_the_trend_are_read_and_checked() {
    let base = "control_socket = \"/tmp/x.sock\"\n[[endpoint]]\nname = \"e\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\nmax = 4\n";
    let c =
        parse("w.toml", &format!("{base}trend_horizon = \"20s\"\n[endpoint.replicas.warm]\nfraction = 0.5\n")).unwrap();
    let r = c.endpoints[0].replicas.as_ref().unwrap();
    assert_eq!(r.trend_horizon, Duration::from_secs(20));
    let w = r.warm.as_ref().unwrap();
    assert_eq!((w.workload.as_str(), w.spec.replicas, w.spec.fraction), ("inference-warm", 0, 0.5));
    let none = parse("w.toml", base).unwrap();
    let r = none.endpoints[0].replicas.as_ref().unwrap();
    assert_eq!((r.trend_horizon, r.warm.is_none()), (Duration::ZERO, true));
    for (table, want) in [
        ("[endpoint.replicas.warm]\n", "w.toml:8:1: error: [endpoint.replicas.warm] asks for no headroom"),
        (
            "[endpoint.replicas.warm]\nreplicas = 4\n",
            "w.toml:9:12: error: replicas.warm.replicas = 4 leaves no room under replicas.max = 4",
        ),
        (
            "[endpoint.replicas.warm]\nfraction = -1.0\n",
            "w.toml:9:12: error: replicas.warm.fraction = -1 is out of range",
        ),
        ("[endpoint.replicas.warm]\nreplicas = 1\nwarmth = 2\n", "unknown field `warmth`"),
    ] {
        let e = parse("w.toml", &format!("{base}{table}")).unwrap_err().to_string();
        assert!(e.contains(want), "{table:?}: {e}");
    }
}

#[test]
fn routing_by_prefix_is_read_and_its_mistakes_have_a_place() {
    let src = |routing: &str| {
        format!("control_socket = \"/s\"\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\n[endpoint.routing]\n{routing}\n")
    };
    let c = parse("r.toml", &src("policy = \"prefix\"\nblock_bytes = 256")).unwrap();
    let p = c.endpoints[0].proxy.prefix.unwrap();
    assert_eq!((p.block_bytes, p.load_bound, p.table_entries), (256, 1.25, 1 << 16));
    assert_eq!(parse("r.toml", &src("policy = \"least_outstanding\"")).unwrap().endpoints[0].proxy.prefix, None);
    let e =
        parse("r.toml", &src("policy = \"round_robin\"\nload_bound = 0.5\nblock_bytes = 8")).unwrap_err().to_string();
    assert!(e.contains("r.toml:6:10: error: routing.policy = \"round_robin\" is not a routing policy"), "{e}");
    assert!(e.contains("r.toml:7:14: error: routing.load_bound = 0.5 is below 1"), "{e}");
    assert!(e.contains("r.toml:8:15: error: routing.block_bytes = 8 is out of range; use 16 to 1048576"), "{e}");
}

#[test]
fn latency_targets_are_read_and_a_table_without_one_is_refused_at_its_place() {
    let base = "control_socket = \"/s\"\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\n[endpoint.replicas]\ncommand = \"x\"\n";
    let c = parse("x.toml", &format!("{base}[endpoint.replicas.latency]\nttft_p99 = \"2s\"\n")).unwrap();
    let l = c.endpoints[0].replicas.as_ref().unwrap().latency.clone().unwrap();
    assert_eq!(
        (l.ttft_p99, l.queue_p99, l.window, l.min_samples),
        (Some(Duration::from_secs(2)), None, Duration::from_secs(60), 20)
    );
    let e = parse("x.toml", &format!("{base}[endpoint.replicas.latency]\nwindow = \"30s\"\n")).unwrap_err().to_string();
    assert!(e.contains("x.toml:7:") && e.contains("sets no target: give ttft_p99"), "{e}");
    let e =
        parse("x.toml", &format!("{base}[endpoint.replicas.latency]\nqueue_p99 = \"0s\"\n")).unwrap_err().to_string();
    assert!(e.contains("x.toml:8:") && e.contains("replicas.latency.queue_p99 must be longer than zero"), "{e}");
}
