//! The summary printed at the end.

use onepool_loadgen::Load;

use crate::demo::{step, Demo};
use crate::settings::OTHER_USER;
use crate::watch::{Kind, Timeline};

/// Phase 8: Summary: the timeline, the replica jobs, the requests.
pub(crate) fn summary(
    d: &Demo,
    tl: &Timeline,
    load: &Load,
    training: u32,
    time_to_capacity: f64,
    other: u32,
    other_state: Option<&str>,
) {
    step("Timeline (seconds since the demo started)");
    for (t, e) in tl.events() {
        println!("  {t:>6.1}s  {e}");
    }
    step("onepoold's replica jobs");
    println!(
        "  {:>6}  {:<12} {:<6} {:>9} {:>8} {:>8} {:>8}  {:<10} {:>7}",
        "JOB", "KIND", "NODE", "SUBMITTED", "RUNNING", "SERVING", "ENDED", "STATE", "ROUTED"
    );
    {
        let s = d.watch().seen();
        let t = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
        for j in s.replicas() {
            println!(
                "  {:>6}  {:<12} {:<6} {:>9} {:>8} {:>8} {:>8}  {:<10} {:>7}",
                j.id,
                if j.kind == Kind::Baseline { "baseline" } else { "supplemental" },
                j.node,
                format!("{:.1}", j.seen),
                t(j.running),
                t(j.serving),
                t(j.ended),
                if j.ended.is_some() { j.state.as_str() } else { "live" },
                j.served
            );
        }
    }
    step("Requests");
    println!(
        "  {:<7} {:>6} {:>12} {:>6} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}",
        "PHASE", "SPEED", "SECONDS", "SENT", "SERVED", "FAILED", "P50_S", "P99_S", "TTFT_P50", "TTFT_P99"
    );
    for p in load.phases() {
        println!("{}", phase_row(&p));
    }
    let (sent, served, failed) = load.totals();
    println!("\nrequests sent {sent}, served (2xx) {served}, failed {failed}");
    for (why, n) in load.failures() {
        println!("  failed: {n} x {why}");
    }
    let s = d.watch().seen();
    let started = s.job(training).and_then(|j| j.running);
    let victim = s.replicas().filter(|j| j.preempted.is_some()).map(|j| (j.label.clone(), j.draining, j.ended)).next();
    let how = match (victim, started) {
        (Some((label, Some(_), Some(end))), Some(run)) if end <= run => {
            format!("{label} drained and ended {:.1} s before", run - end)
        }
        (Some((label, _, end)), _) => {
            format!("{label} ended at {}", end.map_or("-".to_string(), |e| format!("{e:.1}s")))
        }
        (None, _) => "no victim was seen".to_string(),
    };
    drop(s);
    println!(
        "time to capacity: critical training job {training} RUNNING {time_to_capacity:.1} s after submission ({how})"
    );
    println!("{OTHER_USER}'s job {other}: {}", other_state.unwrap_or("gone"));
}

/// One load phase's row of the requests table: its speed as a person
/// reads it (the trace at 0.12x, not 0.12282157676348548x).
pub(crate) fn phase_row(p: &onepool_loadgen::Phase) -> String {
    let lat = |q| seconds(p.latency(q));
    let ttft = |q| seconds(p.ttft(q));
    format!(
        "  {:<7} {:>6} {:>12} {:>6} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}",
        p.name,
        format!("{:.2}x", p.speed),
        format!("{:.1}-{:.1}", p.start, p.end.unwrap_or(p.start)),
        p.sent,
        p.served,
        p.failed,
        lat(0.5),
        lat(0.99),
        ttft(0.5),
        ttft(0.99)
    )
}

pub(crate) fn seconds(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}
