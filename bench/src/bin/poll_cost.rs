//! One replica controller's read of Slurm per poll, two ways side by side,
//! on whatever cluster SLURM_CONF names: `squeue --json` (every
//! job slurmctld holds, as onepoold polled before) and `squeue -u UID -O`
//! (the user's own jobs, as it polls now; the admin comment of each of its
//! jobs is read once, on the first poll, and counted apart).
//!
//! Usage: poll_cost ROUNDS UID json|user
//! Prints `WAY ms_median ms_p90 bytes jobs_listed own_jobs`, and for `user`
//! `records ms` (the one-time admin comment reads of its own jobs).

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::state::USER_JOB_FIELDS;
use onepool_slurm_commands::{Runner, SystemRunner};

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: poll_cost ROUNDS UID json|user";
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).expect(usage);
    let uid: u32 = args.next().and_then(|a| a.parse().ok()).expect(usage);
    let way = args.next().expect(usage);
    let runner = SystemRunner::new(Duration::from_secs(120));
    let s = Commands { runner: runner.clone() };
    let user = uid.to_string();
    let mut ms = Vec::new();
    let (bytes, mut listed, mut own) = match way.as_str() {
        "json" => (runner.run(&["squeue", "--json"]).expect("squeue --json").len(), 0, 0),
        "user" => (
            runner
                .run(&["env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-u", &user, "-O", USER_JOB_FIELDS])
                .expect("squeue -u -O")
                .len(),
            0,
            0,
        ),
        _ => panic!("{usage}"),
    };
    for _ in 0..rounds {
        let t = Instant::now();
        let jobs = if way == "json" { s.jobs().expect("squeue --json") } else { s.user_jobs(uid).expect("squeue -u") };
        own = jobs.iter().filter(|j| j.user_id == uid).count();
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        listed = jobs.len();
    }
    println!("{way} {:.1} {:.1} {bytes} {listed} {own}", quantile(&mut ms, 0.5), quantile(&mut ms, 0.9));
    if way == "user" {
        // The one-time part of the new poll: each own job's record.
        let t = Instant::now();
        for j in s.user_jobs(uid).expect("squeue -u") {
            s.admin_comment(j.job_id).expect("scontrol show job");
        }
        println!("records {:.1}", t.elapsed().as_secs_f64() * 1e3);
    }
}
