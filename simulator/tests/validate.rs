//! `onepool-validate` on saved outputs of bench/validate-simulator.sh
//! (tests/validate/README.md): the reports, byte for byte, as the script
//! printed them when they were embedded Python.

use std::path::{Path, PathBuf};

use onepool_simulator::validate::{batch, inference};

fn here(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn expected(p: &str) -> String {
    std::fs::read_to_string(here(p)).unwrap()
}

#[test]
fn batch_report_of_a_saved_run() {
    let inputs = batch::Inputs::load(
        &here("tests/validate/batch"),
        &here("../bench/validate/scenario.toml"),
        &here("../bench/validate/jobs.csv"),
    )
    .unwrap();
    let got = batch::report(&inputs).unwrap();
    assert_eq!(got, expected("tests/validate/batch/report.md"), "{got}");
}

#[test]
fn inference_report_of_a_saved_run() {
    let inputs =
        inference::Inputs::load(&here("tests/validate/inference"), &here("../bench/validate/inference.toml")).unwrap();
    let got = inference::report(&inputs).unwrap();
    assert_eq!(got, expected("tests/validate/inference/report.md"), "{got}");
}

#[test]
fn the_classes_file_gives_each_class_its_mode_and_notice() {
    let sc = onepool_simulator::scenario::load(
        &here("../bench/validate/scenario.toml"),
        onepool_simulator::input::OnBadRow::Abort,
    )
    .unwrap();
    let lines: Vec<String> = batch::class_notices(&sc).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "critical-training - -",
            "inference-baseline - -",
            "training requeue 15.0",
            "inference graceful 20.0",
            "agents immediate -"
        ]
    );
}

#[test]
fn the_script_asks_sacct_for_the_fields_the_reports_read() {
    let script = std::fs::read_to_string(here("../bench/validate-simulator.sh")).unwrap();
    for format in [onepool_simulator::validate::sacct::BATCH_FORMAT, onepool_simulator::validate::sacct::REPLICA_FORMAT]
    {
        assert!(script.contains(&format!("--format={format} ")), "{format}");
    }
}

/// Every `.rs` file's text under `dir`.
fn sources(dir: &Path, text: &mut String) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, text);
        } else if p.extension().is_some_and(|x| x == "rs") {
            text.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
}

#[test]
fn onepoold_still_logs_the_messages_the_inference_report_reads() {
    // The report once looked for wordings onepoold had stopped using and
    // printed "-" for every replica's ready and draining time.
    let mut text = String::new();
    sources(&here("../elastic-daemon"), &mut text);
    for m in inference::DAEMON_MESSAGES {
        assert!(text.contains(&format!("\"{m}\"")), "onepoold no longer logs {m:?}");
    }
}
