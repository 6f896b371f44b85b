//! Submits N held batch jobs through libslurm from one process (no sbatch
//! start-up or munge cost per job), for the admission benchmark.
//!
//! Usage: submit_flood N [--gpus G] [--qos Q] [--partition P] [--time MINUTES] [NAME=VALUE spank env...]
//! Prints: `submitted N jobs in S s (R jobs/s), F refused`.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::time::Instant;

use onepool_tests::libslurm::{Job, LibSlurm};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).expect("usage: submit_flood N [--gpus G] [NAME=VALUE...]");
    let mut job = Job { name: "flood".into(), hold: true, ..Job::default() };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gpus" => job.gpus = args.next().and_then(|g| g.parse().ok()),
            "--qos" => job.qos = args.next(),
            "--partition" => job.partition = args.next(),
            "--time" => job.time_limit_min = args.next().and_then(|t| t.parse().ok()),
            _ => job.spank_env.push(a),
        }
    }
    let slurm = LibSlurm::load();
    let t0 = Instant::now();
    let mut refused = 0;
    let mut first_error = None;
    for _ in 0..n {
        if let Err(e) = slurm.submit(&job) {
            refused += 1;
            first_error.get_or_insert(e);
        }
    }
    let s = t0.elapsed().as_secs_f64();
    println!("submitted {n} jobs in {s:.2} s ({:.0} jobs/s), {refused} refused", n as f64 / s);
    if let Some(e) = first_error {
        eprintln!("first refusal: {e}");
    }
}
