//! onepoold.toml written from typed values: the one place the demo, the
//! cluster tests and the benchmarks get their onepoold configuration from.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use onepool_decisions::duration;

use super::{parse, Config, ConfigError};

/// onepoold's configuration file as typed values. [`ConfigFile::to_toml`]
/// writes it as [`parse`] (and `onepoold --config`) reads it;
/// [`ConfigFile::build`] parses what it writes. A field left `None` is left
/// out of the file, so it takes [`parse`]'s default. Durations are written
/// in whole milliseconds at the finest. Shared listeners (`[[listener]]`)
/// are not written: no configuration built here has one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigFile {
    /// Written as `#` lines at the top, e.g. who wrote the file.
    pub comment: Option<String>,
    pub control_socket: PathBuf,
    pub control_socket_mode: Option<u32>,
    pub metrics_address: Option<SocketAddr>,
    pub metrics_bearer_tokens_file: Option<PathBuf>,
    pub shutdown_grace: Option<Duration>,
    pub max_buffered_body_bytes: Option<usize>,
    pub slurm_conf: Option<PathBuf>,
    pub policy: Option<PathBuf>,
    pub replica_key_file: Option<PathBuf>,
    pub access_log: Option<AccessLogFile>,
    pub endpoints: Vec<EndpointFile>,
}

/// `[access_log]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccessLogFile {
    pub path: PathBuf,
    pub max_file_bytes: Option<u64>,
    pub keep_files: Option<u32>,
}

/// One `[[endpoint]]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointFile {
    pub name: String,
    pub listen: Option<SocketAddr>,
    pub replica_concurrency: Option<u32>,
    pub queue_size: Option<usize>,
    pub queue_timeout: Option<Duration>,
    pub request_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub header_read_timeout: Option<Duration>,
    pub max_header_bytes: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub http2_idle_timeout: Option<Duration>,
    pub max_request_body: Option<usize>,
    pub body_read_timeout: Option<Duration>,
    pub response_idle_timeout: Option<Duration>,
    /// `[endpoint.retry]` `attempts`.
    pub retry_attempts: Option<u32>,
    /// `[endpoint.retry]` `idempotent`.
    pub retry_idempotent: Option<bool>,
    pub health: Option<HealthFile>,
    pub replicas: Option<ReplicasFile>,
}

/// `[endpoint.health]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HealthFile {
    pub path: String,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub healthy_after: Option<u32>,
    pub unhealthy_after: Option<u32>,
}

/// `[endpoint.replicas]`: see [`super::ReplicaSettings`] for each key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicasFile {
    pub command: String,
    pub gpus: Option<u32>,
    pub replicas_per_job: Option<u32>,
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub target_per_replica: Option<f64>,
    pub drain_timeout: Option<Duration>,
    pub startup_timeout: Option<Duration>,
    pub baseline_workload: Option<String>,
    pub supplemental_workload: Option<String>,
    /// First and last port.
    pub port_range: Option<(u16, u16)>,
    pub launcher: Option<String>,
    pub poll_interval: Option<Duration>,
    pub time_limit: Option<Duration>,
    pub stable_window: Option<Duration>,
    pub panic_window: Option<Duration>,
    pub panic_threshold: Option<f64>,
    pub scale_down_delay: Option<Duration>,
    pub output: Option<String>,
    pub load_metrics: Option<Vec<String>>,
    pub metrics_path: Option<String>,
    pub trend_horizon: Option<Duration>,
    pub warm: Option<WarmFile>,
}

/// `[endpoint.replicas.warm]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WarmFile {
    pub workload: Option<String>,
    pub replicas: Option<u32>,
    pub fraction: Option<f64>,
}

impl ConfigFile {
    pub fn new(control_socket: impl Into<PathBuf>) -> ConfigFile {
        ConfigFile { control_socket: control_socket.into(), ..ConfigFile::default() }
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        let mut t = Toml::default();
        for line in self.comment.iter().flat_map(|c| c.lines()) {
            // TOML comments hold no control characters but tabs.
            let line: String = line.chars().map(|c| if c.is_control() && c != '\t' { '\u{fffd}' } else { c }).collect();
            t.line(if line.is_empty() { "#".to_string() } else { format!("# {line}") });
        }
        t.put("control_socket", Some(path(&self.control_socket)));
        t.put("control_socket_mode", self.control_socket_mode.map(|m| text(format!("{m:04o}"))));
        t.put("metrics_address", self.metrics_address.map(address));
        t.put("metrics_bearer_tokens_file", self.metrics_bearer_tokens_file.as_deref().map(path));
        t.put("shutdown_grace", self.shutdown_grace.map(time));
        t.put("max_buffered_body_bytes", self.max_buffered_body_bytes.map(int));
        t.put("slurm_conf", self.slurm_conf.as_deref().map(path));
        t.put("policy", self.policy.as_deref().map(path));
        t.put("replica_key_file", self.replica_key_file.as_deref().map(path));
        if let Some(a) = &self.access_log {
            t.table("[access_log]");
            t.put("path", Some(path(&a.path)));
            t.put("max_file_bytes", a.max_file_bytes.map(int));
            t.put("keep_files", a.keep_files.map(int));
        }
        for e in &self.endpoints {
            e.write(&mut t);
        }
        t.0
    }

    /// What onepoold makes of the file: [`parse`] of [`ConfigFile::to_toml`].
    pub fn build(&self) -> Result<Config, ConfigError> {
        parse("onepoold.toml (built)", &self.to_toml())
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_toml())
    }
}

impl EndpointFile {
    pub fn new(name: impl Into<String>) -> EndpointFile {
        EndpointFile { name: name.into(), ..EndpointFile::default() }
    }

    fn write(&self, t: &mut Toml) {
        t.table("[[endpoint]]");
        t.put("name", Some(text(&self.name)));
        t.put("listen", self.listen.map(address));
        t.put("replica_concurrency", self.replica_concurrency.map(int));
        t.put("queue_size", self.queue_size.map(int));
        t.put("queue_timeout", self.queue_timeout.map(time));
        t.put("request_timeout", self.request_timeout.map(time));
        t.put("connect_timeout", self.connect_timeout.map(time));
        t.put("header_read_timeout", self.header_read_timeout.map(time));
        t.put("max_header_bytes", self.max_header_bytes.map(int));
        t.put("max_connections", self.max_connections.map(int));
        t.put("max_connections_per_ip", self.max_connections_per_ip.map(int));
        t.put("http2_idle_timeout", self.http2_idle_timeout.map(time));
        t.put("max_request_body", self.max_request_body.map(int));
        t.put("body_read_timeout", self.body_read_timeout.map(time));
        t.put("response_idle_timeout", self.response_idle_timeout.map(time));
        if self.retry_attempts.is_some() || self.retry_idempotent.is_some() {
            t.table("[endpoint.retry]");
            t.put("attempts", self.retry_attempts.map(int));
            t.put("idempotent", self.retry_idempotent.map(toml::Value::Boolean));
        }
        if let Some(h) = &self.health {
            t.table("[endpoint.health]");
            t.put("path", Some(text(&h.path)));
            t.put("interval", h.interval.map(time));
            t.put("timeout", h.timeout.map(time));
            t.put("healthy_after", h.healthy_after.map(int));
            t.put("unhealthy_after", h.unhealthy_after.map(int));
        }
        if let Some(r) = &self.replicas {
            r.write(t);
        }
    }
}

impl HealthFile {
    pub fn new(path: impl Into<String>) -> HealthFile {
        HealthFile { path: path.into(), ..HealthFile::default() }
    }
}

impl ReplicasFile {
    pub fn new(command: impl Into<String>) -> ReplicasFile {
        ReplicasFile { command: command.into(), ..ReplicasFile::default() }
    }

    fn write(&self, t: &mut Toml) {
        t.table("[endpoint.replicas]");
        t.put("command", Some(text(&self.command)));
        t.put("gpus", self.gpus.map(int));
        t.put("replicas_per_job", self.replicas_per_job.map(int));
        t.put("min", self.min.map(int));
        t.put("max", self.max.map(int));
        t.put("target_per_replica", self.target_per_replica.map(toml::Value::Float));
        t.put("drain_timeout", self.drain_timeout.map(time));
        t.put("startup_timeout", self.startup_timeout.map(time));
        t.put("baseline_workload", self.baseline_workload.as_deref().map(text));
        t.put("supplemental_workload", self.supplemental_workload.as_deref().map(text));
        t.put("port_range", self.port_range.map(|(first, last)| text(format!("{first}-{last}"))));
        t.put("launcher", self.launcher.as_deref().map(text));
        t.put("poll_interval", self.poll_interval.map(time));
        t.put("time_limit", self.time_limit.map(time));
        t.put("stable_window", self.stable_window.map(time));
        t.put("panic_window", self.panic_window.map(time));
        t.put("panic_threshold", self.panic_threshold.map(toml::Value::Float));
        t.put("scale_down_delay", self.scale_down_delay.map(time));
        t.put("output", self.output.as_deref().map(text));
        t.put("load_metrics", self.load_metrics.as_ref().map(|m| toml::Value::Array(m.iter().map(text).collect())));
        t.put("metrics_path", self.metrics_path.as_deref().map(text));
        t.put("trend_horizon", self.trend_horizon.map(time));
        if let Some(w) = &self.warm {
            t.table("[endpoint.replicas.warm]");
            t.put("workload", w.workload.as_deref().map(text));
            t.put("replicas", w.replicas.map(int));
            t.put("fraction", w.fraction.map(toml::Value::Float));
        }
    }
}

/// The file being written.
#[derive(Default)]
struct Toml(String);

impl Toml {
    fn line(&mut self, line: String) {
        self.0.push_str(&line);
        self.0.push('\n');
    }

    fn table(&mut self, header: &str) {
        let _ = write!(self.0, "\n{header}\n");
    }

    /// `key = value`, quoted and escaped as TOML wants; nothing for `None`.
    fn put(&mut self, key: &str, value: Option<toml::Value>) {
        if let Some(v) = value {
            let _ = writeln!(self.0, "{key} = {v}");
        }
    }
}

fn text(s: impl Into<String>) -> toml::Value {
    toml::Value::String(s.into())
}

fn path(p: &Path) -> toml::Value {
    text(p.display().to_string())
}

fn address(a: SocketAddr) -> toml::Value {
    text(a.to_string())
}

fn time(d: Duration) -> toml::Value {
    text(duration::format_millis(d))
}

/// A count; beyond TOML's integers it is written as the largest, which
/// [`parse`] refuses as out of range like any count too large.
fn int(n: impl TryInto<i64>) -> toml::Value {
    toml::Value::Integer(n.try_into().unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::ReplicaSettings;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn built(f: &ConfigFile) -> Config {
        f.build().unwrap_or_else(|e| panic!("{e}\n--- the file:\n{}", f.to_toml()))
    }

    /// Every key, none at its default.
    fn everything() -> ConfigFile {
        ConfigFile {
            comment: Some("Written by a test,\n\nevery key set.".into()),
            control_socket: "/run/one \"pool\"/onepoold.sock".into(),
            control_socket_mode: Some(0o660),
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
                    retry_attempts: Some(3),
                    retry_idempotent: Some(true),
                    health: Some(HealthFile {
                        interval: Some(ms(500)),
                        timeout: Some(secs(1)),
                        healthy_after: Some(1),
                        unhealthy_after: Some(4),
                        ..HealthFile::new("/health")
                    }),
                    replicas: Some(ReplicasFile {
                        gpus: Some(4),
                        replicas_per_job: Some(2),
                        min: Some(1),
                        max: Some(3),
                        target_per_replica: Some(6.5),
                        drain_timeout: Some(secs(20)),
                        startup_timeout: Some(secs(60)),
                        baseline_workload: Some("base".into()),
                        supplemental_workload: Some("agents".into()),
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
                        warm: Some(WarmFile {
                            workload: Some("spare".into()),
                            replicas: Some(1),
                            fraction: Some(0.25),
                        }),
                        ..ReplicasFile::new("env A=\"x y\" python3 'server.py' \\\n --port $ONEPOOL_BACKEND_PORT")
                    }),
                    ..EndpointFile::new("chat")
                },
                EndpointFile { listen: Some("127.0.0.1:8002".parse().unwrap()), ..EndpointFile::new("embed") },
            ],
        }
    }

    #[test]
    fn every_key_is_read_back_as_written() {
        let f = everything();
        let c = built(&f);
        assert!(
            f.to_toml().starts_with("# Written by a test,\n#\n# every key set.\ncontrol_socket = "),
            "{}",
            f.to_toml()
        );
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
        assert_eq!(
            (a.path.to_str(), a.max_file_bytes, a.keep_files),
            (Some("/var/log/one pool/access.jsonl"), 1 << 20, 3)
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
            p.conn,
            crate::config::ConnSettings {
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
                warm: Some(crate::config::WarmSettings {
                    workload: "spare".into(),
                    spec: onepool_decisions::replicas::WarmSpec { replicas: 1, fraction: 0.25 },
                    scope: Default::default(),
                }),
            })
        );
        assert_eq!((c.endpoints[1].name.as_str(), c.endpoints[1].listen), ("embed", f.endpoints[1].listen));
    }

    #[test]
    fn keys_left_out_take_the_parsers_defaults() {
        let f = ConfigFile {
            endpoints: vec![EndpointFile { listen: Some("127.0.0.1:0".parse().unwrap()), ..EndpointFile::new("a") }],
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
                listen: Some("127.0.0.1:0".parse().unwrap()),
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
        assert!(crate::config::load(&path).is_ok());
        std::fs::remove_file(&path).unwrap();
    }

    /// A duration onepoold takes: from 1 ms to a year.
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
                warm: (max > 1).then(|| WarmFile { workload: None, replicas: Some(max - 1), fraction: Some(0.5) }),
            }
        }
    }

    prop_compose! {
        fn endpoint()(
            name in "[a-zA-Z0-9_.-]{1,20}",
            port in some(1024u16..=65535),
            (concurrency, queue_size, retry) in (some(1u32..=100_000), some(0usize..=1_000_000), some(0u32..=10)),
            times in proptest::collection::vec(some(a_duration()), 7),
            (header_bytes, connections, per_ip) in (some(8192usize..=1 << 20), 1usize..=1_000_000, some(1usize..=1_000_000)),
            (body, idempotent) in (some(1usize..=1 << 20), some(any::<bool>())),
            health in some(("/[^\u{0}]*", some(a_duration()), some(a_duration()), some(1u32..=100), some(1u32..=100))),
            replicas in some(replicas()),
        ) -> EndpointFile {
            EndpointFile {
                name,
                listen: Some(SocketAddr::from(([127, 0, 0, 1], port.unwrap_or(0)))),
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
                retry_attempts: retry,
                retry_idempotent: idempotent,
                health: health.map(|(path, interval, timeout, healthy_after, unhealthy_after)| HealthFile {
                    path,
                    interval,
                    timeout,
                    healthy_after,
                    unhealthy_after,
                }),
                replicas,
            }
        }
    }

    proptest! {
        /// Whatever the builder is given, within the ranges onepoold takes,
        /// onepoold loads what it writes and reads back what it was given.
        #[test]
        fn every_built_config_loads(
            socket in "/[^\u{0}]+",
            mode in some(prop_oneof![Just(0o600u32), Just(0o660), Just(0o640)]),
            grace in some(a_duration()),
            budget in some((1usize << 20)..=1 << 40),
            paths in (some("/[^\u{0}]+"), some("/[^\u{0}]+")),
            comment in some("[^\u{0}]*"),
            endpoint in endpoint(),
        ) {
            let f = ConfigFile {
                comment,
                control_socket: socket.into(),
                control_socket_mode: mode,
                metrics_address: Some("127.0.0.1:0".parse().unwrap()),
                metrics_bearer_tokens_file: None,
                shutdown_grace: grace,
                max_buffered_body_bytes: budget,
                slurm_conf: paths.0.map(PathBuf::from),
                policy: paths.1.map(PathBuf::from),
                replica_key_file: None,
                access_log: None,
                endpoints: vec![endpoint],
            };
            let c = f.build();
            prop_assert!(c.is_ok(), "{}\n--- the file:\n{}", c.unwrap_err(), f.to_toml());
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
            if let Some(r) = &want.replicas {
                let got = e.replicas.as_ref().unwrap();
                prop_assert_eq!(&got.command, &r.command);
                prop_assert_eq!((got.min, got.max, got.port_range), (r.min.unwrap(), r.max.unwrap(), r.port_range.unwrap()));
                prop_assert_eq!(Some(got.target_per_replica), r.target_per_replica.or(Some(got.target_per_replica)));
                prop_assert_eq!(got.time_limit, r.time_limit);
                prop_assert_eq!(Some(got.drain_timeout), r.drain_timeout.or(Some(got.drain_timeout)));
                prop_assert_eq!(Some(&got.launcher), r.launcher.as_ref().or(Some(&got.launcher)));
                prop_assert_eq!(Some(&got.load_metrics), r.load_metrics.as_ref().or(Some(&got.load_metrics)));
            }
        }
    }
}
