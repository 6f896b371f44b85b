//! One replica controller's read of Slurm per poll, two ways side by side,
//! on whatever cluster SLURM_CONF names: `squeue --json` filtered here (every
//! job slurmctld holds, as onepoold polled before) and `squeue -u UID -O`
//! (the user's own jobs, as it polls now; the admin comment of each of its
//! jobs is read once, on the first poll, and counted apart).
//!
//! Usage: poll_cost ROUNDS UID
//! Prints one line per way: `WAY ms_median ms_p90 bytes jobs_listed own_jobs`,
//! then `first_poll_records ms` (the one-time admin comment reads).

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
    let usage = "usage: poll_cost ROUNDS UID";
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).expect(usage);
    let uid: u32 = args.next().and_then(|a| a.parse().ok()).expect(usage);
    let runner = SystemRunner::new(Duration::from_secs(120));
    let s = Commands { runner: runner.clone() };
    let user = uid.to_string();
    let json_bytes = runner.run(&["squeue", "--json"]).expect("squeue --json").len();
    let user_bytes = runner
        .run(&["env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-u", &user, "-O", USER_JOB_FIELDS])
        .expect("squeue -u -O")
        .len();
    // Interleaved, so that both ways see the same machine.
    let (mut json_ms, mut user_ms) = (Vec::new(), Vec::new());
    let (mut listed_json, mut own_json, mut listed_user) = (0, 0, 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let all = s.jobs().expect("squeue --json");
        let own = all.iter().filter(|j| j.user_id == uid).count();
        json_ms.push(t.elapsed().as_secs_f64() * 1e3);
        (listed_json, own_json) = (all.len(), own);
        let t = Instant::now();
        let mine = s.user_jobs(uid).expect("squeue -u");
        user_ms.push(t.elapsed().as_secs_f64() * 1e3);
        listed_user = mine.len();
    }
    let t = Instant::now();
    for j in s.user_jobs(uid).expect("squeue -u") {
        s.admin_comment(j.job_id).expect("scontrol show job");
    }
    let records_ms = t.elapsed().as_secs_f64() * 1e3;
    let own_user = listed_user;
    for (way, ms, bytes, listed, own) in [
        ("squeue_json", &mut json_ms, json_bytes, listed_json, own_json),
        ("squeue_user", &mut user_ms, user_bytes, listed_user, own_user),
    ] {
        println!("{way} {:.1} {:.1} {bytes} {listed} {own}", quantile(ms, 0.5), quantile(ms, 0.9));
    }
    println!("first_poll_records {records_ms:.1}");
}
