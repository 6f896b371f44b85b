//! The daemon's Slurm adapter against the real cluster: submit, read back
//! (with onepool's record), update, cancel, nodes; and a job under
//! preemption shows up as such within one poll.

use std::time::Duration;

use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::state::JobInfo;
use onepool_slurm_commands::SystemRunner;
use onepool_tests::{cluster, Cleanup, TestCluster};

fn slurm(c: &TestCluster) -> Commands<SystemRunner> {
    Commands { runner: SystemRunner { timeout: Duration::from_secs(30), env: c.cluster.env() } }
}

/// The fields onepoold's poll reads agree between `squeue -u -O` and
/// `squeue --json`.
fn assert_same_poll_fields(polled: &JobInfo, full: &JobInfo) {
    let fields = |j: &JobInfo| {
        (
            j.job_id,
            j.name.clone(),
            j.user_id,
            j.job_state.clone(),
            j.node_count,
            j.nodes.clone(),
            j.batch_host.clone(),
            j.start_time,
            j.end_time,
            j.preempt_time,
            j.time_limit,
        )
    };
    let (mut p, mut f) = (fields(polled), fields(full));
    // A pending job's end is an estimate both print differently.
    if full.is_pending() {
        (p.8, f.8) = (0, 0);
    }
    assert_eq!(p, f, "squeue -u -O vs squeue --json");
}

#[test]
fn submit_read_update_cancel() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let s = slurm(c);
    let id = s
        .submit(&["--hold", "-o", "/dev/null", "--gpus=1", "--workload=inference", "--endpoint=llm", "--wrap", "true"])
        .unwrap();
    let job = s.jobs().unwrap().into_iter().find(|j| j.job_id == id).expect("the new job is listed");
    assert!(job.is_pending());
    let r = job.record().expect("job_submit/onepool's record");
    assert_eq!((r.class.as_str(), r.endpoint.as_deref()), ("inference", Some("llm")));
    s.update_job(id, &[("TimeLimit", "30")]).unwrap();
    assert_eq!(s.jobs().unwrap().iter().find(|j| j.job_id == id).unwrap().time_limit, 30);
    // One user's jobs as onepoold polls them: what squeue --json says, and
    // the record read apart.
    let full = s.jobs().unwrap().into_iter().find(|j| j.job_id == id).unwrap();
    let mine = s.user_jobs(full.user_id).unwrap();
    assert!(mine.iter().all(|j| j.user_id == full.user_id));
    assert_same_poll_fields(mine.iter().find(|j| j.job_id == id).expect("listed among the user's jobs"), &full);
    assert_eq!(s.admin_comment(id).unwrap().as_deref(), Some(full.admin_comment.as_str()));
    assert_eq!(s.admin_comment(999_999).unwrap(), None, "no such job");
    s.cancel(id, None).unwrap();
    c.wait_until("the job to be cancelled", Duration::from_secs(10), || {
        s.jobs().unwrap().iter().find(|j| j.job_id == id).is_none_or(|j| j.job_state == "CANCELLED")
    });
    let nodes = s.nodes().unwrap();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| n.gres == "gpu:4"));
}

#[test]
fn a_job_under_preemption_is_visible_at_once() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let s = slurm(c);
    // Supplemental serving holds all 12 flexible GPUs, baseline the 4 reserved.
    let borrowers: Vec<u32> = (0..3)
        .map(|_| {
            s.submit(&["-o", "/dev/null", "--workload=inference", "--gpus=4", "-N1", "--wrap", "sleep 600"]).unwrap()
        })
        .collect();
    let base = s
        .submit(&["-o", "/dev/null", "--workload=inference-baseline", "--gpus=4", "-N1", "--wrap", "sleep 600"])
        .unwrap();
    for j in borrowers.iter().chain([&base]) {
        c.wait_state(*j, "RUNNING", Duration::from_secs(30));
    }
    let owner = s
        .submit(&[
            "-o",
            "/dev/null",
            "--workload=critical-training",
            "--time=10:00",
            "--gpus=4",
            "-N1",
            "--wrap",
            "sleep 60",
        ])
        .unwrap();
    // Graceful class: the victim keeps running through its GraceTime, marked.
    let waited = c.wait_until("Slurm to mark a borrower for preemption", Duration::from_secs(40), || {
        s.jobs().unwrap().iter().any(|j| borrowers.contains(&j.job_id) && j.is_being_preempted())
    });
    eprintln!("victim marked {waited:?} after the protected job's submission");
    let jobs = s.jobs().unwrap();
    let victim = jobs.iter().find(|j| borrowers.contains(&j.job_id) && j.is_being_preempted()).unwrap();
    assert!(victim.is_running(), "a graceful victim runs on during its grace time: {victim:?}");
    assert!(victim.end_time >= victim.preempt_time + 60, "end = preempt + GraceTime (60 s for inference)");
    assert_eq!(jobs.iter().filter(|j| borrowers.contains(&j.job_id) && j.is_being_preempted()).count(), 1);
    let mine = s.user_jobs(victim.user_id).unwrap();
    for j in jobs.iter().filter(|j| borrowers.contains(&j.job_id) || j.job_id == base) {
        assert_same_poll_fields(mine.iter().find(|m| m.job_id == j.job_id).expect("listed"), j);
    }
    assert_eq!(jobs.iter().find(|j| j.job_id == owner).unwrap().job_state, "PENDING");
}
