//! onepoold on the dev cluster: endpoints whose replicas run the stand-in
//! model server (etc/dev-cluster/stand-in-model-server.py), configured with
//! onepoold's own builder, [`ConfigFile`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use onepool_decisions::duration;
use onepool_elastic_daemon::config::{ConfigFile, EndpointFile, HealthFile, ReplicasFile};
use serde::Deserialize;

/// The health check of every onepoold the dev cluster, the demo and the
/// tests start: `path` every 0.5 s, in after one success, out after three
/// failures, so a replica serves half a second after its model loads.
pub fn quick_health(path: &str) -> HealthFile {
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    HealthFile {
        interval: Some(millis(500)),
        timeout: Some(secs(1)),
        healthy_after: Some(1),
        unhealthy_after: Some(3),
        ..HealthFile::new(path)
    }
}

/// The environment variable that stretches the poll of every onepoold the
/// demo and the tests start (issue #35: what onepoold counts must not
/// depend on how often it polls; CI runs the demo and the reclaim programs
/// at 5 s).
pub const POLL_INTERVAL_ENV: &str = "ONEPOOL_POLL_INTERVAL";

/// The replica controllers' poll: `default`, or [`POLL_INTERVAL_ENV`] where
/// it is set (a duration: `5s`, `200ms`). A value that is not one stops
/// the run with what is wrong: a run meant to stretch the poll must not
/// pass at the default.
pub fn poll_interval(default: Duration) -> Duration {
    match std::env::var(POLL_INTERVAL_ENV) {
        Ok(v) if !v.trim().is_empty() => match onepool_decisions::duration::parse(v.trim()) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => panic!("{POLL_INTERVAL_ENV}={v:?}: a poll interval must be above zero"),
            Err(e) => panic!("{POLL_INTERVAL_ENV}={v:?}: {e}"),
        },
        _ => default,
    }
}

/// The stand-in model server's command line: it loads its "model" for
/// `model_load_s` seconds, then takes `seconds_per_token` a generated token.
pub fn stand_in_command(server: &Path, model_load_s: f64, seconds_per_token: f64) -> String {
    format!(
        "env ONEPOOL_MODEL_LOAD_SECONDS={model_load_s} ONEPOOL_SECONDS_PER_TOKEN={seconds_per_token} python3 {}",
        server.display()
    )
}

/// What bench/validate-simulator.sh's onepoold is made of: a simulator
/// scenario's first endpoint (the scenario's own words for it), and where
/// the real one runs.
#[derive(Clone, Debug)]
pub struct Validation<'a> {
    /// The scenario's path, for the file's comment.
    pub scenario: &'a Path,
    /// The scenario's text (TOML).
    pub text: &'a str,
    pub listen: SocketAddr,
    /// The stand-in server's model load, seconds.
    pub model_load_s: f64,
    pub server: &'a Path,
    /// The `onepool` binary the replicas run under.
    pub launcher: &'a Path,
    /// Where the control socket and the replica logs go.
    pub out: &'a Path,
}

/// The keys of a scenario's `[[endpoints]]` the real endpoint takes on.
#[derive(Deserialize)]
struct Scenario {
    endpoints: Vec<ScenarioEndpoint>,
}

#[derive(Deserialize)]
struct ScenarioEndpoint {
    name: String,
    class: String,
    gpus_per_replica: u32,
    max_concurrent: u32,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    min_replicas: u32,
    max_replicas: u32,
    target_per_replica: f64,
    stable_window: String,
    panic_window: String,
    scale_down_delay: String,
    baseline_class: String,
    baseline_replicas: u32,
}

/// onepoold's configuration for [`Validation`]: the scenario's endpoint,
/// its replicas Slurm jobs running the stand-in server at the scenario's
/// decode rate (its prefill must be instant: the server ignores the
/// context).
pub fn validation_config(v: &Validation) -> Result<ConfigFile, String> {
    let at = |e: String| format!("{}: {e}", v.scenario.display());
    let s: Scenario = toml::from_str(v.text).map_err(|e| at(e.message().to_string()))?;
    let e = s.endpoints.first().ok_or_else(|| at("no [[endpoints]]".into()))?;
    if e.prefill_tokens_per_s < 1e9 {
        return Err(at("the stand-in server ignores the context: prefill_tokens_per_s must be 1e9 or more".into()));
    }
    if e.min_replicas != e.baseline_replicas {
        return Err(at(format!(
            "min_replicas = {} but baseline_replicas = {}: onepoold's min replicas are its baseline ones",
            e.min_replicas, e.baseline_replicas
        )));
    }
    // As onepoold reads it.
    let window = |key: &str, text: &str| duration::parse_millis(text).map_err(|err| at(format!("{key}: {err}")));
    let command = stand_in_command(v.server, v.model_load_s, 1.0 / e.decode_tokens_per_s);
    let secs = Duration::from_secs;
    Ok(ConfigFile {
        comment: Some(format!("Written by onepool-devcluster onepoold-config from {}", v.scenario.display())),
        shutdown_grace: Some(secs(5)),
        endpoints: vec![EndpointFile {
            listen: Some(v.listen),
            replica_concurrency: Some(e.max_concurrent),
            queue_size: Some(5000),
            queue_timeout: Some(secs(120)),
            request_timeout: Some(secs(120)),
            health: Some(quick_health("/health")),
            replicas: Some(ReplicasFile {
                gpus: Some(e.gpus_per_replica),
                min: Some(e.baseline_replicas),
                max: Some(e.max_replicas),
                target_per_replica: Some(e.target_per_replica),
                drain_timeout: Some(secs(30)),
                startup_timeout: Some(secs(60)),
                baseline_workload: Some(e.baseline_class.clone()),
                supplemental_workload: Some(e.class.clone()),
                port_range: Some((19500, 19599)),
                launcher: Some(v.launcher.display().to_string()),
                poll_interval: Some(secs(2)),
                stable_window: Some(window("stable_window", &e.stable_window)?),
                panic_window: Some(window("panic_window", &e.panic_window)?),
                scale_down_delay: Some(window("scale_down_delay", &e.scale_down_delay)?),
                output: Some(v.out.join("replica-%j.out").display().to_string()),
                ..ReplicasFile::new(command)
            }),
            ..EndpointFile::new(e.name.clone())
        }],
        replica_key_file: Some(v.out.join("replica.key")),
        ..ConfigFile::new(v.out.join("onepoold.sock"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validation(text: &str) -> Validation<'_> {
        Validation {
            scenario: Path::new("bench/validate/inference.toml"),
            text,
            listen: "127.0.0.1:4100".parse().unwrap(),
            model_load_s: 3.0,
            server: Path::new("/src/etc/dev-cluster/stand-in-model-server.py"),
            launcher: Path::new("/src/target/debug/onepool"),
            out: Path::new("/src/target/validate-cluster/validate"),
        }
    }

    const SCENARIO: &str = include_str!("../../bench/validate/inference.toml");

    #[test]
    fn the_validation_bench_config_loads_with_the_scenarios_numbers() {
        let c = validation_config(&validation(SCENARIO)).unwrap().build().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.control_socket, Path::new("/src/target/validate-cluster/validate/onepoold.sock"));
        assert_eq!((c.shutdown_grace, c.slurm_conf.as_deref()), (Duration::from_secs(5), None));
        let e = &c.endpoints[0];
        assert_eq!((e.name.as_str(), e.listen), ("chat", Some("127.0.0.1:4100".parse().unwrap())));
        assert_eq!((e.replica_concurrency, e.queue_size, e.queue_timeout), (4, 5000, Duration::from_secs(120)));
        assert_eq!(e.proxy.request_timeout, Duration::from_secs(120));
        assert_eq!((e.thresholds.healthy_after, e.thresholds.unhealthy_after), (1, 3));
        let h = e.health.as_ref().unwrap();
        assert_eq!(
            (h.path.as_str(), h.interval, h.timeout),
            ("/health", Duration::from_millis(500), Duration::from_secs(1))
        );
        let r = e.replicas.as_ref().unwrap();
        assert_eq!(
            r.command,
            "env ONEPOOL_MODEL_LOAD_SECONDS=3 ONEPOOL_SECONDS_PER_TOKEN=0.004 python3 \
             /src/etc/dev-cluster/stand-in-model-server.py"
        );
        assert_eq!((r.gpus, r.min, r.max, r.target_per_replica), (4, 1, 3, 2.0));
        assert_eq!(
            (r.baseline_workload.as_str(), r.supplemental_workload.as_str()),
            ("inference-baseline", "inference")
        );
        assert_eq!(
            (r.stable_window, r.panic_window, r.scale_down_delay),
            (Duration::from_secs(20), Duration::from_secs(4), Duration::from_secs(30))
        );
        assert_eq!((r.drain_timeout, r.startup_timeout), (Duration::from_secs(30), Duration::from_secs(60)));
        assert_eq!((r.port_range, r.poll_interval), ((19500, 19599), Duration::from_secs(2)));
        assert_eq!(r.launcher, "/src/target/debug/onepool");
        assert_eq!(r.output, "/src/target/validate-cluster/validate/replica-%j.out");
    }

    #[test]
    fn a_scenario_the_real_endpoint_cannot_follow_is_refused() {
        let e = |text: &str| validation_config(&validation(text)).unwrap_err();
        let slow = SCENARIO.replace("prefill_tokens_per_s = 1e12", "prefill_tokens_per_s = 8000");
        assert!(e(&slow).contains("prefill_tokens_per_s must be 1e9 or more"), "{}", e(&slow));
        let min = SCENARIO.replace("min_replicas = 1", "min_replicas = 2");
        assert!(e(&min).contains("min_replicas = 2 but baseline_replicas = 1"), "{}", e(&min));
        let window = SCENARIO.replace("panic_window = \"4s\"", "panic_window = \"4x\"");
        assert!(e(&window).starts_with("bench/validate/inference.toml: panic_window: invalid duration \"4x\""));
        assert!(e("policy = \"p.toml\"\n").contains("missing field `endpoints`"), "{}", e("policy = \"p.toml\"\n"));
    }
}
