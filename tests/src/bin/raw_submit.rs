//! Submits a batch job through libslurm directly, with SPANK environment
//! entries given on the command line: how a client that bypasses the SPANK
//! plugin (any API user) can hand slurmctld arbitrary annotations. The
//! integration tests use it to prove job_submit/onepool re-checks them.
//!
//! Usage: raw_submit [--qos Q] [--partition P] [--gpus N] [--gpus-per-node N]
//!        [--min-nodes N] [--max-nodes N] [--admin-comment TEXT] [--hold] NAME=VALUE...
//! Prints the job id, or `error: <Slurm's error>` and exits 1.

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use onepool_tests::libslurm::{Job, LibSlurm};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut job = Job { name: "raw-submit".into(), ..Job::default() };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--qos" => job.qos = args.next(),
            "--partition" => job.partition = args.next(),
            "--gpus" => job.gpus = args.next().and_then(|g| g.parse().ok()),
            "--gpus-per-node" => job.gpus_per_node = args.next().and_then(|g| g.parse().ok()),
            "--min-nodes" => job.min_nodes = args.next().and_then(|g| g.parse().ok()),
            "--max-nodes" => job.max_nodes = args.next().and_then(|g| g.parse().ok()),
            "--admin-comment" => job.admin_comment = args.next(),
            "--hold" => job.hold = true,
            _ => job.spank_env.push(a),
        }
    }
    match LibSlurm::load().submit(&job) {
        Ok(id) => println!("{id}"),
        Err(e) => {
            println!("error: {e}");
            std::process::exit(1);
        }
    }
}
