use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use onepool_dev_cluster::model_server::ModelServer;
use onepool_loadgen::Trace;

use crate::checks::saved_lines;
use crate::config::config;
use crate::demo::Paths;
use crate::scenario::{taken_back, trace_name, Pace, HEAVY_RATE};
use crate::settings::{ENDPOINT, GPUS, HEAVY, LIGHT, LIGHT_SECS, SCALE_DOWN_DELAY_SECS, SLOTS};
use crate::summary::phase_row;

#[test]
fn the_story_of_the_gpus_taken_back_is_checked_not_told() {
    let pending = (94.0, 67.7, "supplemental replica 6".to_string());
    assert_eq!(taken_back(93.8, std::slice::from_ref(&pending)), None);
    // Cancelled while the load dropped; a new one came 35 s later.
    let late = (130.0, 128.8, "supplemental replica 9".to_string());
    let told = taken_back(93.8, &[late]).unwrap();
    assert!(told.contains("supplemental replica 9 was submitted 35.0 s after it"), "{told}");
    assert_eq!(taken_back(93.8, &[]), None);
}

#[test]
fn the_shipped_trace_keeps_its_pace_a_lighter_one_is_fitted_and_a_sparse_one_refused() {
    let shipped = Trace::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/azure-llm-inference-2023-conv.csv"),
    )
    .unwrap();
    let light_end = LIGHT_SECS as f64 * LIGHT;
    let own = shipped.rate(light_end, light_end + 60.0) * HEAVY;
    assert!((HEAVY_RATE * 0.99..HEAVY_RATE * 1.05).contains(&own), "HEAVY_RATE is the shipped trace's: {own}");
    assert_eq!(Pace::fit(&shipped).unwrap(), Pace { offset: 0.0, light: LIGHT, heavy: HEAVY, fitted: None });
    // One request every 2 s, and a busier minute from 600 s: 1 a second.
    let mut rows: Vec<(f64, u32, u32)> = (0..300).map(|i| (f64::from(i) * 2.0, 100, 10)).collect();
    rows.extend((0..60).map(|i| (600.0 + f64::from(i) + 0.5, 100, 10)));
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let p = Pace::fit(&Trace { rows }).unwrap();
    assert!((p.heavy - HEAVY_RATE).abs() < 0.1, "{p:?}");
    assert!((p.offset - (600.0 - LIGHT_SECS as f64 * p.light)).abs() < 1.0, "{p:?}");
    assert!(p.fitted.unwrap().contains("its busiest minute"));
    // Two requests a minute at most: refused, with what would do.
    let sparse = Trace { rows: (0..100).map(|i| (f64::from(i) * 30.0, 100, 10)).collect() };
    let e = Pace::fit(&sparse).unwrap_err().to_string();
    assert!(e.contains("at most 2 requests in any minute") && e.contains("at least 12 requests"), "{e}");
}

#[test]
fn the_heading_names_the_trace_replayed() {
    assert!(trace_name(Path::new("data/azure-llm-inference-2023-conv.csv")).contains("conversation trace"));
    assert_eq!(trace_name(Path::new("/tmp/bursty.csv")), "the trace /tmp/bursty.csv");
}

#[test]
fn the_demo_config_loads() {
    let demo = PathBuf::from("/c/demo");
    let p = Paths {
        root: "/c".into(),
        log: demo.join("replicas"),
        bin: "/src/target/debug".into(),
        socket: demo.join("onepoold.sock"),
        config: demo.join("onepoold.toml"),
        pid_file: demo.join("onepoold.pid"),
        onepoold_log: "/c/log/onepoold.log".into(),
        service_host: None,
        bridge: None,
    };
    let listen: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let dir = std::env::temp_dir().join(format!("onepool-demo-config-{}", std::process::id()));
    for f in ["bin/llama-server", "models/SmolLM2-135M-Instruct.Q4_1.gguf"] {
        fs::create_dir_all(dir.join(f).parent().unwrap()).unwrap();
        fs::write(dir.join(f), "").unwrap();
    }
    let server = ModelServer::at(&dir).unwrap();
    let c = config(&p, listen, "/c/etc/slurm.conf", &server).build().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.control_socket, c.slurm_conf), (p.socket.clone(), Some("/c/etc/slurm.conf".into())));
    let e = &c.endpoints[0];
    assert_eq!((e.name.as_str(), e.listen, e.replica_concurrency, e.proxy.retries), (ENDPOINT, Some(listen), 4, 2));
    let r = e.replicas.as_ref().unwrap();
    assert_eq!(r.command, server.replica_command(SLOTS));
    assert_eq!(r.load_metrics, ["llamacpp:requests_processing", "llamacpp:requests_deferred"]);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!((r.gpus, r.min, r.max, r.port_range), (GPUS, 1, 3, (19400, 19499)));
    assert_eq!(r.scale_down_delay, Duration::from_secs(SCALE_DOWN_DELAY_SECS));
    assert_eq!(
        (r.launcher.as_str(), r.output.as_str()),
        ("/src/target/debug/onepool", "/c/demo/replicas/replica-%j.out")
    );
}

#[test]
fn the_requests_table_says_speeds_as_people_read_them() {
    let light = onepool_loadgen::Phase {
        name: "light".into(),
        speed: 0.12282157676348548,
        start: 3.04,
        end: Some(40.25),
        ..Default::default()
    };
    let row = phase_row(&light);
    assert!(row.contains(" 0.12x ") && !row.contains("0.1228"), "{row}");
    let heavy = onepool_loadgen::Phase { name: "heavy".into(), speed: 0.3070539419087137, ..light };
    assert!(phase_row(&heavy).contains(" 0.31x "), "{}", phase_row(&heavy));
}

#[test]
fn the_saved_figure_is_printed_in_the_reports_words() {
    // What `onepool report --json` gives when no size met the p99 target.
    let saved = serde_json::json!({
        "jobs": 2,
        "requests": 316,
        "pool_gpus": 16,
        "separate_islands_gpus": null,
        "shared_pool_gpus": null,
        "reading": [
            "GPUs needed to meet every target: separate islands unmet, one shared pool unmet up to 64 GPUs",
            "one shared pool unmet: no pool up to 64 GPUs met every target (sizes searched: 4, 8, 16, 32 and 64 GPUs); \
             on 64 GPUs inference missed its p99 queueing delay target of 2.0s (p99 9.5s). What changes it: \
             --slo-p99 sets the p99 target, --replica-startup the replica startup assumed."
        ],
        "assumptions": ["targets: ..."]
    });
    let said = saved_lines(&saved).join("\n");
    assert!(!said.contains("unmet or not searched"), "{said}");
    assert!(said.contains("this pool 16 GPUs") && said.contains("  - targets: ..."), "{said}");
    assert!(said.contains("\n  one shared pool unmet: no pool up to 64 GPUs") && said.contains("--slo-p99"), "{said}");
}
