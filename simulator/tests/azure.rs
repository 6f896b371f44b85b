//! The real Azure conversation trace, end to end (kept in data/ with its
//! CC-BY attribution, data/NOTICE.md).

use std::path::Path;

use onepool_simulator::compare::{self, figures, Settings};
use onepool_simulator::input::OnBadRow;
use onepool_simulator::scenario;

fn example() -> scenario::Scenario {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/small/scenario.toml");
    scenario::load(&p, OnBadRow::Abort).unwrap()
}

#[test]
fn azure_trace_runs_end_to_end() {
    let sc = example();
    assert_eq!(sc.workload.endpoints[0].requests.len(), 19_366);
    assert!(sc.bad_rows.is_empty());
    let s = Settings { max_p95_wait_s: sc.max_p95_wait_s, ..Settings::default() };
    let inf = sc.workload.classes.iter().position(|c| c == "inference").unwrap();
    let alone = compare::run_separate(&sc.workload, inf, &sc.fleet.scaled(8), &s);
    let f = figures(&sc.workload, &s, inf, &alone.classes[inf]);
    eprintln!("{f:?}");
    assert_eq!(f.requests, 19_366);
    assert!(f.meets_target, "{f:?}");
    let (cmp, _) = compare::compare(&sc.workload, &sc.policy, &sc.fleet, &s, compare::Search::Always);
    assert!(cmp.separate_gpus.is_some());
}
