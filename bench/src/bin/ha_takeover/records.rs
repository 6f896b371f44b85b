//! The endpoint's replica jobs as Slurm has them: squeue for what runs
//! now; accounting for every job since the scenario began
//! ([`onepool_tests::replica_records`]), from which duplicates and
//! restarts are counted.

use std::collections::BTreeMap;

use onepool_tests::replica_records::prefix;
pub use onepool_tests::replica_records::{overlapping_slots, submitted_since};
use onepool_tests::TestCluster;

/// The endpoint's replica jobs in squeue: id and state.
pub fn queued(c: &TestCluster, endpoint: &str) -> BTreeMap<u32, String> {
    c.ok("squeue", &["-h", "-o", "%i|%j|%T"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            (f.get(1)?.starts_with(&prefix(endpoint))).then_some(())?;
            Some((f[0].parse().ok()?, f.get(2)?.to_string()))
        })
        .collect()
}
