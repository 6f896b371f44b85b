//! The file types both ways: what a program builds is written as onepoold
//! reads it, and read back as it was built.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use onepool_decisions::duration;
use proptest::prelude::*;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn built(f: &ConfigFile) -> Config {
    f.build().unwrap_or_else(|e| panic!("{e}\n--- the file:\n{}", f.to_toml()))
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every key but the files read at load (tokens, TLS), none at its default.
fn everything() -> ConfigFile {
    ConfigFile {
        comment: Some("Written by a test,\n\nevery key set.".into()),
        control_socket: "/run/one \"pool\"/onepoold.sock".into(),
        control_socket_mode: Some(Mode(0o660)),
        metrics_address: Some("127.0.0.1:9100".parse().unwrap()),
        // Read and checked at build (a real private file): the metrics
        // listener's test in tests/bounds.rs writes and reads one.
        metrics_bearer_tokens_file: None,
        shutdown_grace: Some(ms(1500)),
        max_buffered_body_bytes: Some(64 << 20),
        slurm_conf: Some("/etc/slurm-x/slurm.conf".into()),
        policy: Some("/etc/slurm-x/onepool.toml".into()),
        replica_key_file: Some("/var/lib/one pool/replica.key".into()),
        access_log: Some(AccessLogFile {
            path: "/var/log/one pool/access.jsonl".into(),
            max_file_bytes: Some(1 << 20),
            keep_files: Some(3),
        }),
        advisory: Some(false),
        decision_log: Some(AccessLogFile {
            path: "/var/log/one pool/decisions.jsonl".into(),
            max_file_bytes: Some(2 << 20),
            keep_files: Some(4),
        }),
        endpoints: vec![
            EndpointFile {
                listen: Some("127.0.0.1:8001".parse().unwrap()),
                replica_concurrency: Some(16),
                queue_size: Some(2000),
                queue_timeout: Some(ms(250)),
                request_timeout: Some(secs(120)),
                connect_timeout: Some(ms(700)),
                header_read_timeout: Some(secs(7)),
                max_header_bytes: Some(32768),
                max_connections: Some(100),
                max_connections_per_ip: Some(10),
                http2_idle_timeout: Some(secs(90)),
                max_request_body: Some(1 << 20),
                body_read_timeout: Some(secs(20)),
                response_idle_timeout: Some(secs(45)),
                retry: Some(RetryFile { attempts: Some(3), idempotent: Some(true) }),
                routing: Some(RoutingFile {
                    policy: Some("prefix".into()),
                    block_bytes: Some(256),
                    load_bound: Some(1.5),
                    table_entries: Some(4096),
                }),
                health: Some(HealthFile {
                    interval: Some(ms(500)),
                    timeout: Some(secs(1)),
                    healthy_after: Some(1),
                    unhealthy_after: Some(4),
                    ..HealthFile::new("/health")
                }),
                resume: Some(Box::new(every_resume_key())),
                request_class: Some("inference".into()),
                replicas: Some(every_replicas_key()),
                ..EndpointFile::new("chat")
            },
            EndpointFile { listen: Some("127.0.0.1:8002".parse().unwrap()), ..EndpointFile::new("embed") },
        ],
        listeners: vec![ListenerFile {
            max_connections: Some(50),
            routes: vec![
                RouteFile { path: Some("/chat/".into()), strip_prefix: Some(true), ..route("chat") },
                RouteFile { path: Some("/".into()), ..route("embed") },
            ],
            ..ListenerFile::new(local(8003), "path")
        }],
        ha: Some(HaFile {
            instance: Some("svc-a".into()),
            lock: Some("mariadb".into()),
            database: Some("db.example:3307".into()),
            user: Some("onepool".into()),
            password_file: Some("/etc/one pool/ha.password".into()),
            ca_file: Some("/etc/one pool/ha-ca.pem".into()),
            lock_name: Some("onepoold.site".into()),
            check_interval: Some(ms(500)),
            lost_after: Some(secs(4)),
        }),
    }
}

fn every_resume_key() -> ResumeFile {
    ResumeFile { method: Some("text".into()), max_moves: Some(5), seed: Some(false) }
}

fn every_replicas_key() -> ReplicasFile {
    ReplicasFile {
        gpus: Some(4),
        replicas_per_job: Some(2),
        min: Some(1),
        max: Some(3),
        target_per_replica: Some(6.5),
        drain_timeout: Some(secs(20)),
        startup_timeout: Some(secs(60)),
        baseline_workload: Some("base".into()),
        supplemental_workload: Some("agents".into()),
        lower_workload: Some("eval".into()),
        port_range: Some((19400, 19499)),
        launcher: Some("/opt/onepool/bin/onepool".into()),
        poll_interval: Some(ms(500)),
        time_limit: Some(secs(2 * 60)),
        stable_window: Some(secs(10)),
        panic_window: Some(ms(250)),
        panic_threshold: Some(1.5),
        scale_down_delay: Some(secs(90)),
        output: Some("/tmp/replica-%j.out".into()),
        load_metrics: Some(vec!["vllm:num_requests_waiting".into(), "queue_depth".into()]),
        metrics_path: Some("/stats".into()),
        trend_horizon: Some(secs(12)),
        warm: Some(WarmFile { workload: Some("spare".into()), replicas: Some(1), fraction: Some(0.25) }),
        advisory: Some(true),
        latency: Some(LatencyFile {
            ttft_p99: Some(ms(1500)),
            queue_p99: Some(ms(300)),
            window: Some(secs(30)),
            min_samples: Some(50),
        }),
        transport: Some("plain".into()),
        ..ReplicasFile::new("env A=\"x y\" python3 'server.py' \\\n --port $ONEPOOL_BACKEND_PORT")
    }
}

fn route(endpoint: &str) -> RouteFile {
    RouteFile { endpoint: endpoint.into(), ..RouteFile::default() }
}

#[test]
#[allow(clippy::too_many_lines, reason = "every key, read back top to bottom")]
fn every_key_is_read_back_as_written() {
    let f = everything();
    let c = built(&f);
    assert!(f.to_toml().starts_with("# Written by a test,\n#\n# every key set.\ncontrol_socket = "), "{}", f.to_toml());
    let odd = ConfigFile { comment: Some("a\rb\u{1}\tc\r\n".into()), ..f.clone() };
    assert!(odd.to_toml().starts_with("# a\u{fffd}b\u{fffd}\tc\ncontrol_socket"), "{}", odd.to_toml());
    built(&odd);
    assert_eq!(c.control_socket, f.control_socket);
    assert_eq!(c.control_socket_mode, 0o660);
    assert_eq!(c.metrics_address, f.metrics_address);
    assert_eq!(c.shutdown_grace, ms(1500));
    assert_eq!(c.max_buffered_body_bytes, 64 << 20);
    assert_eq!(c.slurm_conf, f.slurm_conf);
    assert_eq!(c.policy, f.policy);
    assert_eq!(Some(c.replica_key_file), f.replica_key_file);
    let a = c.access_log.as_ref().unwrap();
    assert_eq!((a.path.to_str(), a.max_file_bytes, a.keep_files), (Some("/var/log/one pool/access.jsonl"), 1 << 20, 3));
    let d = c.decision_log.as_ref().unwrap();
    assert_eq!(
        (d.path.to_str(), d.max_file_bytes, d.keep_files),
        (Some("/var/log/one pool/decisions.jsonl"), 2 << 20, 4)
    );
    assert_eq!(c.endpoints.len(), 2);
    let (e, want) = (&c.endpoints[0], &f.endpoints[0]);
    assert_eq!((e.name.as_str(), e.listen), ("chat", want.listen));
    assert_eq!((e.replica_concurrency, e.queue_size, e.queue_timeout), (16, 2000, ms(250)));
    let p = &e.proxy;
    assert_eq!((p.request_timeout, p.connect_timeout), (secs(120), ms(700)));
    assert_eq!((p.max_request_body, p.body_read_timeout, p.response_idle_timeout), (1 << 20, secs(20), secs(45)));
    assert_eq!((p.retries, p.idempotent), (3, true));
    assert_eq!(
        p.prefix,
        Some(onepool_router::prefix::PrefixSettings { block_bytes: 256, load_bound: 1.5, table_entries: 4096 })
    );
    assert_eq!(
        p.conn,
        ConnSettings {
            header_read_timeout: secs(7),
            max_header_bytes: 32768,
            max_connections: 100,
            max_connections_per_ip: 10,
            http2_idle_timeout: secs(90),
            tls: None,
        }
    );
    let h = e.health.as_ref().unwrap();
    assert_eq!((h.path.as_str(), h.interval, h.timeout), ("/health", ms(500), secs(1)));
    assert_eq!((e.thresholds.healthy_after, e.thresholds.unhealthy_after), (1, 4));
    let r = want.replicas.as_ref().unwrap();
    assert_eq!(
        e.replicas,
        Some(ReplicaSettings {
            command: r.command.clone(),
            gpus: 4,
            replicas_per_job: 2,
            min: 1,
            max: 3,
            target_per_replica: 6.5,
            drain_timeout: secs(20),
            startup_timeout: secs(60),
            baseline_workload: "base".into(),
            supplemental_workload: "agents".into(),
            lower_workload: Some("eval".into()),
            port_range: (19400, 19499),
            launcher: "/opt/onepool/bin/onepool".into(),
            poll_interval: ms(500),
            time_limit: Some(secs(120)),
            stable_window: secs(10),
            panic_window: ms(250),
            panic_threshold: 1.5,
            scale_down_delay: secs(90),
            output: "/tmp/replica-%j.out".into(),
            load_metrics: vec!["vllm:num_requests_waiting".into(), "queue_depth".into()],
            metrics_path: "/stats".into(),
            serve_paths: vec!["/v1/".into(), "/health".into(), "/stats".into()],
            trend_horizon: secs(12),
            warm: Some(WarmSettings {
                workload: "spare".into(),
                spec: onepool_decisions::replicas::WarmSpec { replicas: 1, fraction: 0.25 },
                scope: Default::default(),
            }),
            advisory: true,
            latency: Some(onepool_decisions::latency::LatencyTargets {
                ttft_p99: Some(ms(1500)),
                queue_p99: Some(ms(300)),
                window: secs(30),
                min_samples: 50,
            }),
            immediate_classes: Vec::new(),
            transport: crate::config::ReplicaTransport::Plain,
        })
    );
    assert_eq!((c.endpoints[1].name.as_str(), c.endpoints[1].listen), ("embed", f.endpoints[1].listen));
    let l = &c.listeners[0];
    assert_eq!((l.listen, l.conn.max_connections), (local(8003), 50));
    let strip =
        |prefix: &str, strip, endpoint: &str| PathRoute { prefix: prefix.into(), strip, endpoint: endpoint.into() };
    assert_eq!(l.routes, Routes::Path(vec![strip("/chat", true, "chat"), strip("/", false, "embed")]));
}

#[test]
fn keys_left_out_take_the_parsers_defaults() {
    let f = ConfigFile {
        endpoints: vec![EndpointFile { listen: Some(local(0)), ..EndpointFile::new("a") }],
        ..ConfigFile::new("/s")
    };
    let text = "control_socket = \"/s\"\n\n[[endpoint]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\n";
    assert_eq!(f.to_toml(), text);
    assert_eq!(format!("{:?}", built(&f)), format!("{:?}", parse("x.toml", text).unwrap()));
    let with_replicas = ConfigFile {
        endpoints: vec![EndpointFile { replicas: Some(ReplicasFile::new("serve")), ..f.endpoints[0].clone() }],
        ..f.clone()
    };
    let r = built(&with_replicas).endpoints[0].replicas.clone().unwrap();
    let from_text = parse("x.toml", &format!("{text}[endpoint.replicas]\ncommand = \"serve\"\n")).unwrap();
    assert_eq!(Some(r), from_text.endpoints[0].replicas);
}

#[test]
fn what_onepoold_would_refuse_is_refused_at_build_too() {
    let f = ConfigFile {
        endpoints: vec![EndpointFile {
            listen: Some(local(0)),
            replicas: Some(ReplicasFile { min: Some(3), max: Some(2), ..ReplicasFile::new("serve") }),
            ..EndpointFile::new("a")
        }],
        ..ConfigFile::new("/s")
    };
    let e = f.build().unwrap_err().to_string();
    assert!(e.contains("replicas.max = 2 is below replicas.min = 3"), "{e}");
    assert!(e.starts_with("onepoold.toml (built):"), "{e}");
}

#[test]
fn the_file_is_written_where_asked() {
    let path = std::env::temp_dir().join(format!("onepool-config-file-{}.toml", std::process::id()));
    everything().write(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), everything().to_toml());
    assert!(load(&path).is_ok());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_example_reads_the_same_either_way() {
    // Typed values stand for names only, not "auto".
    let text = include_str!("../../../etc/onepoold.toml").replace("load_metrics = \"auto\"", "");
    let typed: ConfigFile = toml::from_str(&text).unwrap();
    let raw: ConfigFile<Raw> = toml::from_str(&text).unwrap();
    assert_eq!(typed.endpoints[0].replicas.as_ref().unwrap().startup_timeout, Some(secs(300)));
    assert_eq!(format!("{:?}", typed.build().unwrap()), format!("{:?}", parse("etc/onepoold.toml", &text).unwrap()));
    assert_eq!(raw.endpoints[0].get_ref().replicas.as_ref().unwrap().get_ref().port_range.as_ref().unwrap().span(), {
        let at = text.find("\"18000-18999\"").unwrap();
        at..at + "\"18000-18999\"".len()
    });
}

#[test]
fn typed_values_of_the_wrong_syntax_fail_the_read_at_their_key() {
    for (key, value) in
        [("shutdown_grace", "\"soon\""), ("metrics_address", "\"here\""), ("control_socket_mode", "\"9\"")]
    {
        let e = toml::from_str::<ConfigFile>(&format!("control_socket = \"/s\"\n{key} = {value}\n")).unwrap_err();
        assert_eq!(e.span(), Some(25 + key.len()..25 + key.len() + value.len()), "{key}: {e}");
    }
}

/// A duration onepoold takes: from 1 ms to a year.
/// Boxed: one more level of nested strategies overflows a test thread's
/// stack in a debug build.
fn latency_file() -> BoxedStrategy<LatencyFile> {
    (a_duration(), some(a_duration()), some(a_duration()), some(1u32..=100_000))
        .prop_map(|(ttft, queue, window, min_samples)| LatencyFile {
            ttft_p99: Some(ttft),
            queue_p99: queue,
            window,
            min_samples,
        })
        .boxed()
}

fn a_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1u64..=duration::MAX.as_millis() as u64).prop_map(Duration::from_millis),
        (1u64..=duration::MAX.as_secs()).prop_map(Duration::from_secs),
    ]
}

fn some<T: std::fmt::Debug + Clone>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

prop_compose! {
    fn replicas()(
        command in "[^\u{0}]*[a-z][^\u{0}]*",
        (gpus, per_job) in (some(1u32..=64), some(1u32..=256)),
        (min, extra, target) in (0u32..=1000, 0u32..=1000, some(0.001f64..1e6)),
        first in 1u16..=40000,
        times in proptest::collection::vec(some(a_duration()), 8),
        (panic_threshold, workloads) in (some(0.001f64..100.0), some(("[a-z0-9_-]{1,12}", "[A-Z0-9_-]{1,12}"))),
        (launcher, output) in (some("[^\u{0}]+"), some("[^\u{0}]+")),
        metrics in some(proptest::collection::vec("[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", 0..3)),
        metrics_path in some("/[^\u{0}]*"),
        warm in some((some("[a-z0-9_-]{1,12}"), some(0.0f64..=100.0))),
        (advisory, transport) in (some(proptest::bool::ANY), some(proptest::sample::select(vec!["tls".to_string(), "plain".to_string()]))),
        latency in some(latency_file()),
    ) -> ReplicasFile {
        let max = min.max(1).saturating_add(extra).min(1000);
        ReplicasFile {
            command,
            gpus,
            replicas_per_job: per_job,
            min: Some(min.min(max)),
            max: Some(max),
            target_per_replica: target,
            drain_timeout: times[0],
            startup_timeout: times[1],
            baseline_workload: workloads.clone().map(|w| w.0),
            supplemental_workload: workloads.map(|w| w.1),
            lower_workload: None,
            // Two ports a replica.
            port_range: Some((first, first + 2 * max as u16)),
            launcher,
            poll_interval: times[2],
            time_limit: times[3],
            stable_window: times[4],
            panic_window: times[5],
            panic_threshold,
            scale_down_delay: times[6],
            output,
            load_metrics: metrics,
            metrics_path,
            trend_horizon: times[7],
            // Some headroom, under max.
            warm: warm.filter(|_| max > 1).map(|(workload, fraction)| WarmFile {
                workload,
                replicas: Some(max - 1),
                fraction,
            }),
            advisory,
            latency,
            transport,
        }
    }
}

prop_compose! {
    fn endpoint()(
        name in "[a-zA-Z0-9_.-]{1,20}",
        port in some(1024u16..=65535),
        (concurrency, queue_size) in (some(1u32..=100_000), some(0usize..=1_000_000)),
        times in proptest::collection::vec(some(a_duration()), 7),
        (header_bytes, connections, per_ip) in (some(8192usize..=1 << 20), 1usize..=1_000_000, some(1usize..=1_000_000)),
        (body, retry) in (some(1usize..=1 << 20), some((some(0u32..=10), some(any::<bool>())))),
        health in some(("/[^\u{0}]*", some(a_duration()), some(a_duration()), some(1u32..=100), some(1u32..=100))),
        replicas in some(replicas()),
        routing in some((some(prop_oneof![Just("prefix"), Just("least_outstanding")]), some(16usize..=1 << 20), some(1.0f64..100.0), some(1024usize..=1 << 26))),
    ) -> EndpointFile {
        let chosen = name.len();
        EndpointFile {
            name,
            listen: Some(local(port.unwrap_or(0))),
            replica_concurrency: concurrency,
            queue_size,
            queue_timeout: times[0],
            request_timeout: times[1],
            connect_timeout: times[2],
            header_read_timeout: times[3],
            max_header_bytes: header_bytes,
            max_connections: Some(connections),
            max_connections_per_ip: per_ip.map(|n| n.min(connections)),
            http2_idle_timeout: times[4],
            max_request_body: body,
            body_read_timeout: times[5],
            response_idle_timeout: times[6],
            retry: retry.map(|(attempts, idempotent)| RetryFile { attempts, idempotent }),
            routing: routing.map(|(policy, block_bytes, load_bound, table_entries)| RoutingFile {
                policy: policy.map(str::to_string),
                block_bytes,
                load_bound,
                table_entries,
            }),
            health: health.map(|(path, interval, timeout, healthy_after, unhealthy_after)| HealthFile {
                path,
                interval,
                timeout,
                healthy_after,
                unhealthy_after,
            }),
            auth: None,
            tls: None,
            // From the name rather than a strategy of its own: one more
            // overflowed the test thread's stack (debug build) in proptest's
            // tree of strategies.
            resume: (chosen % 5 != 0).then(|| {
                let method = ["auto", "tokens", "text", "off"][chosen % 4];
                Box::new(ResumeFile { method: Some(method.to_string()), max_moves: Some(chosen as u32 % 100 + 1), seed: Some(chosen % 2 == 0) })
            }),
            headroom: (chosen % 3 == 0).then(|| {
                Box::new(HeadroomFile {
                    share: Some((chosen % 5) as f64 / 4.0),
                    quiet: Some(Duration::from_secs(chosen as u64 % 60 + 1)),
                    classes: Some([("agents".to_string(), 0.25)].into()),
                })
            }),
            priority: (chosen % 4 == 1).then(|| {
                Box::new(PriorityFile {
                    engine: Some(["auto", "sglang", "vllm", "off"][chosen % 4].to_string()),
                    values: Some([("agents".to_string(), chosen as u32 % 1000)].into()),
                })
            }),
            request_class: None,
            replicas,
        }
    }
}

/// A shared listener with routes to `endpoint`, each key once.
fn listener(endpoint: String) -> impl Strategy<Value = ListenerFile> {
    let keys = prop_oneof![
        proptest::collection::btree_set("[a-z0-9-]{1,10}(\\.[a-z0-9-]{1,10}){0,2}", 1..4).prop_map(|k| ("host", k)),
        proptest::collection::btree_set("/[a-z0-9]{1,8}", 1..4).prop_map(|k| ("path", k)),
        proptest::collection::btree_set("[^\u{0}]+", 1..4).prop_map(|k| ("model", k)),
    ];
    (keys, some(1usize..=1 << 20), some(a_duration()), some(any::<bool>()), some(1usize..=1_000_000)).prop_map(
        move |((by, keys), max_body, body_timeout, strip, connections)| {
            let model = by == "model";
            let routes = keys
                .into_iter()
                .map(|k| {
                    let mut r = route(&endpoint);
                    *match by {
                        "host" => &mut r.host,
                        "path" => &mut r.path,
                        _ => &mut r.model,
                    } = Some(k);
                    r.strip_prefix = strip.filter(|_| by == "path");
                    r
                })
                .collect();
            ListenerFile {
                max_model_body: max_body.filter(|_| model),
                model_body_timeout: body_timeout.filter(|_| model),
                max_connections: connections,
                max_connections_per_ip: connections.map(|n| n.min(512)),
                routes,
                ..ListenerFile::new(local(0), by)
            }
        },
    )
}

prop_compose! {
    fn a_file()(
        socket in "/[^\u{0}]+",
        mode in some(prop_oneof![Just(0o600u32), Just(0o660), Just(0o640)]),
        grace in some(a_duration()),
        budget in some((1usize << 20)..=1 << 40),
        paths in (some("/[^\u{0}]+"), some("/[^\u{0}]+"), some("/[^\u{0}]+")),
        access_log in some(("/[^\u{0}]+", some((64u64 << 10)..=1 << 40), some(1u32..=100))),
        decision_log in some(("/[^\u{0}]+", some((64u64 << 10)..=1 << 40), some(1u32..=100))),
        advisory in some(proptest::bool::ANY),
        comment in some("[^\u{0}]*"),
        (endpoint, shared) in endpoint().prop_flat_map(|e| (Just(e.clone()), some(listener(e.name)))),
    ) -> ConfigFile {
        ConfigFile {
            comment,
            control_socket: socket.into(),
            control_socket_mode: mode.map(Mode),
            metrics_address: Some(local(0)),
            metrics_bearer_tokens_file: None,
            shutdown_grace: grace,
            max_buffered_body_bytes: budget,
            slurm_conf: paths.0.map(PathBuf::from),
            policy: paths.1.map(PathBuf::from),
            replica_key_file: paths.2.map(PathBuf::from),
            access_log: access_log.map(|(path, max_file_bytes, keep_files)| AccessLogFile {
                path: path.into(),
                max_file_bytes,
                keep_files,
            }),
            advisory,
            decision_log: decision_log.map(|(path, max_file_bytes, keep_files)| AccessLogFile {
                path: path.into(),
                max_file_bytes,
                keep_files,
            }),
            endpoints: vec![endpoint],
            listeners: shared.into_iter().collect(),
            ha: None,
        }
    }
}

proptest! {
    /// Whatever a program builds, within the ranges onepoold takes, is
    /// written as it is read back: the same typed values, the same text
    /// from what onepoold reads, and onepoold takes it.
    #[test]
    fn every_file_reads_back_as_written(f in a_file()) {
        let text = f.to_toml();
        let typed: ConfigFile = toml::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&typed, &ConfigFile { comment: None, ..f.clone() }, "{}", text);
        let raw: ConfigFile<Raw> = toml::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(toml::to_string(&raw).unwrap(), toml::to_string(&f).unwrap());
        let c = f.build();
        prop_assert!(c.is_ok(), "{}\n--- the file:\n{}", c.unwrap_err(), text);
        let c = c.unwrap();
        prop_assert_eq!(&c.control_socket, &f.control_socket);
        prop_assert_eq!(Some(c.shutdown_grace), f.shutdown_grace.or(Some(c.shutdown_grace)));
        prop_assert_eq!(&c.slurm_conf, &f.slurm_conf);
        let (e, want) = (&c.endpoints[0], &f.endpoints[0]);
        prop_assert_eq!(&e.name, &want.name);
        prop_assert_eq!(e.listen, want.listen);
        prop_assert_eq!(Some(e.queue_timeout), want.queue_timeout.or(Some(e.queue_timeout)));
        prop_assert_eq!(Some(e.proxy.request_timeout), want.request_timeout.or(Some(e.proxy.request_timeout)));
        if let Some(h) = &want.health {
            prop_assert_eq!(&e.health.as_ref().unwrap().path, &h.path);
        }
        let prefix = want.routing.as_ref().filter(|r| r.policy.as_deref() == Some("prefix"));
        prop_assert_eq!(e.proxy.prefix.is_some(), prefix.is_some());
        if let (Some(got), Some(r)) = (e.proxy.prefix, prefix) {
            prop_assert_eq!(Some(got.block_bytes), r.block_bytes.or(Some(got.block_bytes)));
            prop_assert_eq!(Some(got.load_bound), r.load_bound.or(Some(got.load_bound)));
            prop_assert_eq!(Some(got.table_entries), r.table_entries.or(Some(got.table_entries)));
        }
        if let Some(r) = &want.replicas {
            let got = e.replicas.as_ref().unwrap();
            prop_assert_eq!(&got.command, &r.command);
            prop_assert_eq!((got.min, got.max, got.port_range), (r.min.unwrap(), r.max.unwrap(), r.port_range.unwrap()));
            prop_assert_eq!(Some(got.target_per_replica), r.target_per_replica.or(Some(got.target_per_replica)));
            prop_assert_eq!(got.time_limit, r.time_limit);
            prop_assert_eq!(Some(got.drain_timeout), r.drain_timeout.or(Some(got.drain_timeout)));
            prop_assert_eq!(Some(&got.launcher), r.launcher.as_ref().or(Some(&got.launcher)));
            prop_assert_eq!(Some(&got.load_metrics), r.load_metrics.as_ref().or(Some(&got.load_metrics)));
            prop_assert_eq!(got.warm.is_some(), r.warm.is_some());
            // The daemon's key makes every endpoint advisory.
            let daemon = f.advisory == Some(true);
            prop_assert_eq!(got.advisory, r.advisory == Some(true) || daemon);
            prop_assert_eq!(got.latency.as_ref().map(|l| l.ttft_p99), r.latency.as_ref().map(|l| l.ttft_p99));
        }
        prop_assert_eq!(c.listeners.len(), f.listeners.len());
        for (l, want) in c.listeners.iter().zip(&f.listeners) {
            prop_assert_eq!(l.routes.endpoints().count(), want.routes.len());
        }
    }
}
