//! "What the pool saved" when a figure is not a number, and when the
//! islands needed no more than one pool (issue #38): the report's text,
//! JSON and chart say why, in the simulator's words with the report's
//! flags.

use super::*;
use crate::report::{svg, text, usage};

const POLICY: &str = r#"
[pool]
partitions = ["gpu"]
total_gpus = 4
default_class = "b"

[classes.a]
tier = "flexible"
rank = 1
qos = "op-a"

[classes.b]
tier = "flexible"
rank = 2
qos = "op-b"
"#;

/// The figure on a scenario of the given files (with the policy above, on
/// 2 nodes x 2 GPUs), and the report showing it: (figure, text, chart).
fn saved(files: &[(&str, &str)], scenario: &str) -> (Saved, String, String) {
    let head = "policy = \"policy.toml\"\n[fleet]\nnodes = 2\ngpus_per_node = 2\n";
    let mut all =
        vec![("scenario.toml".to_string(), format!("{head}{scenario}")), ("policy.toml".into(), POLICY.into())];
    all.extend(files.iter().map(|(n, t)| (n.to_string(), t.to_string())));
    let w = Written { files: all, jobs: 0, requests: 0, endpoints: Vec::new(), assumptions: Vec::new() };
    let s = evaluate(&w, None, 4).unwrap();
    let report = usage::Report { saved: Some(s.clone()), ..usage::Report::default() };
    (s, text(&report), svg::chart(&report))
}

/// The chart's text elements' contents as one text (lines wrapped to the
/// chart's width joined again).
fn chart_text(chart: &str) -> String {
    let texts: Vec<&str> =
        chart.split("<text ").skip(1).filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0)).collect();
    texts.join(" ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A request a second for 200 s, each 10 s of one replica's only slot, at
/// most one replica: no size meets a 2 s p99 queueing delay (the demo on
/// another trace said "unmet or not searched GPUs").
#[test]
fn an_unmeetable_target_is_named_with_the_sizes_searched_and_the_flags_that_change_it() {
    let mut trace = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..200 {
        trace.push_str(&format!("2023-11-16 18:{:02}:{:02}.0000000,100,100\n", 15 + i / 60, i % 60));
    }
    let endpoint = "[[endpoints]]\nname = \"chat\"\ntrace = \"trace.csv\"\nclass = \"b\"\ngpus_per_replica = 1\n\
                    max_concurrent = 1\nprefill_tokens_per_s = 1000\ndecode_tokens_per_s = 10\nstartup = \"10s\"\n\
                    slo_p99 = \"2s\"\nmax_replicas = 1\n";
    let (s, text, chart) = saved(&[("trace.csv", &trace)], endpoint);
    assert_eq!((s.separate_islands_gpus, s.shared_pool_gpus), (None, None));
    let shared =
        "one shared pool unmet: no pool up to 8,192 GPUs met every target (sizes searched: 2, 4, 8, ..., 8,192 \
                  GPUs, 13 sizes); on 8,192 GPUs b missed its p99 queueing delay target of 2.0s (p99 ";
    let flags =
        "What changes it: --slo-p99 sets the p99 target, --replica-startup the replica startup assumed; max in \
                 onepoold.toml's [endpoint.replicas] caps the replicas more GPUs could add.";
    for said in [shared, flags, "separate islands unmet: no island up to 8,192 GPUs met its class's target"] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
        assert!(s.reading.iter().any(|r| r.contains(said)), "{said:?} not in {:?}", s.reading);
    }
    assert_eq!(
        s.reading[0],
        "GPUs needed to meet every target: separate islands unmet, one shared pool unmet up to 8,192 GPUs"
    );
    let chart = chart_text(&chart);
    assert!(!chart.contains("unmet or not searched"), "{chart}");
    assert!(chart.contains("unmet up to 8192 GPUs (below)") && chart.contains("one shared pool unmet: no pool up to"));
    assert!(chart.contains("--slo-p99 sets the p99 target"), "{chart}");
    // JSON: the figures as before, and why as data beside them.
    let json = serde_json::to_value(&s).unwrap();
    assert!(json["separate_islands_gpus"].is_null() && json["shared_pool_gpus"].is_null());
    let unmet = &json["shared_pool_unmet"];
    assert_eq!((unmet["why"].as_str(), unmet["tried_gpus"][12].as_u64()), (Some("no_size_met"), Some(8192)));
    let missed = &unmet["at_largest"][0];
    assert_eq!(
        (missed["class"].as_str(), missed["missed"][0]["target"].as_str()),
        (Some("b"), Some("p99_queue_delay"))
    );
    assert_eq!(missed["missed"][0]["slo_s"].as_f64(), Some(2.0));
    assert_eq!(json["separate_islands_unmet"]["why"].as_str(), Some("no_size_met"));
}

/// Both classes hold their GPUs through the same hour: the pool needs what
/// the islands need, and the figure says why instead of leaving "16 GPUs,
/// 16 GPUs" after a story of one pool beating islands.
#[test]
fn a_period_without_saving_says_why() {
    let jobs = format!("submit,duration,gpus,class\n{}{}", "0,1h,1,a\n".repeat(2), "0,1h,1,b\n".repeat(2));
    let batch = "[targets]\nmax_p95_wait = \"0s\"\n[[jobs]]\nfile = \"jobs.csv\"\nkeep_times = true\n";
    let (s, text, chart) = saved(&[("jobs.csv", &jobs)], batch);
    assert_eq!((s.separate_islands_gpus, s.shared_pool_gpus), (Some(4), Some(4)));
    let why = "no saving in this period (islands and one pool both need 4 GPUs) because the classes' busiest moments \
               came together: one pool held 4 GPUs at once, as many as their peaks apart add up to; on 2 GPUs, ";
    assert!(text.contains(why), "{why:?} not in:\n{text}");
    assert!(s.reading.iter().any(|r| r.starts_with(why)), "{:?}", s.reading);
    assert!(chart_text(&chart).contains("no saving in this period (islands and one pool both need 4 GPUs)"), "{chart}");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["no_saving"]["because"].as_str(), Some("peaks_together"));
    assert!(json["separate_islands_unmet"].is_null() && json["shared_pool_unmet"].is_null());
}
