//! onepoold's configuration for the demo.

use std::net::SocketAddr;
use std::time::Duration;

use onepool_dev_cluster::model_server::ModelServer;
use onepool_elastic_daemon::config::{AccessLogFile, ConfigFile, EndpointFile, ReplicasFile, RetryFile};

use crate::demo::Paths;
use crate::settings::{ENDPOINT, GPUS, SCALE_DOWN_DELAY_SECS, SLOTS};

pub(crate) fn config(p: &Paths, listen: SocketAddr, slurm_conf: &str, server: &ModelServer) -> ConfigFile {
    let command = server.replica_command(SLOTS);
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    ConfigFile {
        comment: Some("Written by onepool-demo: one endpoint whose replicas onepoold runs as Slurm jobs.".into()),
        shutdown_grace: Some(secs(5)),
        slurm_conf: Some(slurm_conf.into()),
        endpoints: vec![EndpointFile {
            listen: Some(listen),
            replica_concurrency: Some(SLOTS.parallel),
            queue_size: Some(2000),
            queue_timeout: Some(secs(60)),
            request_timeout: Some(secs(120)),
            retry: Some(RetryFile { attempts: Some(2), ..RetryFile::default() }),
            health: Some(onepool_dev_cluster::onepoold::quick_health("/health")),
            replicas: Some(ReplicasFile {
                gpus: Some(GPUS),
                min: Some(1),
                max: Some(3),
                target_per_replica: Some(3.0),
                // The server's own count of what it decodes and defers.
                load_metrics: Some(vec!["llamacpp:requests_processing".into(), "llamacpp:requests_deferred".into()]),
                drain_timeout: Some(secs(30)),
                startup_timeout: Some(secs(60)),
                baseline_workload: Some("inference-baseline".into()),
                supplemental_workload: Some("inference".into()),
                port_range: Some((19400, 19499)),
                launcher: Some(p.bin.join("onepool").display().to_string()),
                poll_interval: Some(onepool_dev_cluster::onepoold::poll_interval(millis(500))),
                stable_window: Some(secs(10)),
                panic_window: Some(secs(2)),
                scale_down_delay: Some(secs(SCALE_DOWN_DELAY_SECS)),
                output: Some(p.log.join("replica-%j.out").display().to_string()),
                ..ReplicasFile::new(command)
            }),
            ..EndpointFile::new(ENDPOINT)
        }],
        replica_key_file: Some(p.socket.with_file_name("replica.key")),
        // The report's "what the pool saved" replays what the router served.
        access_log: Some(AccessLogFile { path: p.socket.with_file_name("access.jsonl"), ..AccessLogFile::default() }),
        ..ConfigFile::new(&p.socket)
    }
}
