//! The daemon's Slurm adapter against the real cluster: submit, read back
//! (with onepool's record), update, cancel, nodes; and a job under
//! preemption shows up as such within one poll.

use std::time::Duration;

use onepool_slurm_commands::adapter::{Commands, Slurm};
use onepool_slurm_commands::SystemRunner;
use onepool_tests::{cluster, Cleanup, TestCluster};

fn slurm(c: &TestCluster) -> Commands<SystemRunner> {
    Commands { runner: SystemRunner { timeout: Duration::from_secs(30), env: c.cluster.env() } }
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
    assert_eq!(jobs.iter().find(|j| j.job_id == owner).unwrap().job_state, "PENDING");
}
