//! How a replica job ended, from Slurm's record of it (issue #35): a
//! reclaim is what the job's record says (`PreemptTime`, set when Slurm
//! picks a victim and kept after it ends), never whether a poll happened
//! to see the job while Slurm was preempting it. A victim that drains in
//! no time, or an immediate class's victim (GraceTime 0), leaves the
//! queue between two polls; its record still says what happened.

use onepool_decisions::record::JobRecord;
use onepool_launcher::conventions::ReplicaNote;
use onepool_slurm_commands::state::JobDetails;

use crate::controller::ReclaimMode;

/// A reclaim as the victim's record tells it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RecordedReclaim {
    pub mode: ReclaimMode,
    /// Unix seconds of Slurm's pick (the record's `PreemptTime`).
    pub picked_at: u64,
    /// From the pick to the job's end (its GPUs free), in whole seconds as
    /// Slurm keeps them.
    pub released_after_s: f64,
    /// The nodes it held (a host list): where its taker started.
    pub nodes: String,
}

/// The notices a drain begins on when Slurm preempts a replica with a
/// grace time: SIGUSR1 (`--signal=B:USR1@N`), SIGURG for a per-node job's
/// steps.
fn on_slurm_notice(signal: i32) -> bool {
    signal == libc::SIGUSR1 || signal == libc::SIGURG
}

/// The reclaim a replica job's record shows, if Slurm reclaimed it.
///
/// Slurm's pick is `PreemptTime` (22.05 to 26.05 set it for a victim with
/// and without grace time); a `PREEMPTED` end without one (a record
/// rebuilt after a slurmctld restart) is taken as picked at its end. The
/// mode: a drain that began on Slurm's notice (the launcher's note) is
/// graceful; otherwise job_submit/onepool's record of the class says what
/// Slurm was told to do; with neither, a pick that ended the job within
/// the second is immediate.
pub(super) fn reclaim_of(d: &JobDetails) -> Option<RecordedReclaim> {
    let picked_at = match (d.preempt_time, d.state.as_str()) {
        (0, "PREEMPTED") if d.end_time > 0 => d.end_time,
        (0, _) => return None,
        (t, _) => t,
    };
    let note = ReplicaNote::decode(&d.comment).unwrap_or_default();
    let drained = note.drained.iter().any(|(_, n)| on_slurm_notice(n.signal));
    let released = d.end_time.saturating_sub(picked_at);
    let mode = if drained {
        ReclaimMode::Graceful
    } else {
        match JobRecord::decode(&d.admin_comment).and_then(|r| r.reclaim) {
            Some(onepool_decisions::annotation::ReclaimMode::Immediate) => ReclaimMode::Immediate,
            Some(onepool_decisions::annotation::ReclaimMode::Graceful) => ReclaimMode::Graceful,
            // A requeue class's replica (submitted --no-requeue) has its
            // grace time and then ends: graceful if it had time to drain.
            _ if released > 1 => ReclaimMode::Graceful,
            _ => ReclaimMode::Immediate,
        }
    };
    Some(RecordedReclaim { mode, picked_at, released_after_s: released as f64, nodes: d.nodes.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: &str, preempt: u64, end: u64, admin: &str, comment: &str) -> JobDetails {
        JobDetails {
            admin_comment: admin.into(),
            comment: comment.into(),
            state: state.into(),
            exit_code: "0:0".into(),
            start_time: 1000,
            end_time: end,
            preempt_time: preempt,
            nodes: "node2".into(),
            ..JobDetails::default()
        }
    }

    const GRACEFUL: &str = "onepool:class=inference;tier=flexible;reclaim=graceful;drain=1m;endpoint=chat";
    const IMMEDIATE: &str = "onepool:class=agents;tier=flexible;reclaim=immediate;endpoint=chat";

    /// The demo's failure (issue #35): an idle victim drained in no time
    /// and ended COMPLETED between two polls; only its record tells.
    #[test]
    fn an_idle_graceful_victim_that_ended_completed_is_a_reclaim() {
        let d = record("COMPLETED", 2000, 2000, GRACEFUL, "op1;L0=41000;D0=2000100,10,0,0,0,3");
        let r = reclaim_of(&d).unwrap();
        assert_eq!(
            (r.mode, r.picked_at, r.released_after_s, r.nodes.as_str()),
            (ReclaimMode::Graceful, 2000, 0.0, "node2")
        );
        // Without the launcher's note (it could not write it), the class says.
        assert_eq!(reclaim_of(&record("COMPLETED", 2000, 2000, GRACEFUL, "")).unwrap().mode, ReclaimMode::Graceful);
    }

    #[test]
    fn an_immediate_victim_is_immediate_and_a_busy_drain_takes_its_time() {
        let r = reclaim_of(&record("PREEMPTED", 2000, 2000, IMMEDIATE, "op1;L0=41000")).unwrap();
        assert_eq!((r.mode, r.released_after_s), (ReclaimMode::Immediate, 0.0));
        // An immediate class's launcher notes its cut at SIGTERM: not a drain on Slurm's notice.
        let cut = record("PREEMPTED", 2000, 2000, IMMEDIATE, "op1;L0=41000;D0=2000100,15,4,4,0,5");
        assert_eq!(reclaim_of(&cut).unwrap().mode, ReclaimMode::Immediate);
        let busy = record("COMPLETED", 2000, 2004, GRACEFUL, "op1;L0=41000;D0=2000500,10,4,0,2,3400");
        let r = reclaim_of(&busy).unwrap();
        assert_eq!((r.mode, r.released_after_s), (ReclaimMode::Graceful, 4.0));
        // A per-node job's steps drain on SIGURG.
        let steps = record("COMPLETED", 2000, 2003, "", "op1;L0=41000;D0=2000500,23,1,0,0,900");
        assert_eq!(reclaim_of(&steps).unwrap().mode, ReclaimMode::Graceful);
    }

    #[test]
    fn a_job_slurm_did_not_pick_is_no_reclaim() {
        for state in ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"] {
            // A drain onepoold asked for (scale-down) leaves a note too.
            let d = record(state, 0, 2004, GRACEFUL, "op1;L0=41000;D0=2000500,10,4,0,2,3400");
            assert_eq!(reclaim_of(&d), None, "{state}");
        }
        // PREEMPTED with no PreemptTime (a record rebuilt at a restart): picked at its end.
        let r = reclaim_of(&record("PREEMPTED", 0, 2004, IMMEDIATE, "")).unwrap();
        assert_eq!((r.picked_at, r.mode), (2004, ReclaimMode::Immediate));
        assert_eq!(reclaim_of(&record("PREEMPTED", 0, 0, IMMEDIATE, "")), None);
    }

    #[test]
    fn without_a_class_record_the_time_it_took_says_the_mode() {
        assert_eq!(reclaim_of(&record("PREEMPTED", 2000, 2001, "", "")).unwrap().mode, ReclaimMode::Immediate);
        assert_eq!(reclaim_of(&record("PREEMPTED", 2000, 2030, "", "")).unwrap().mode, ReclaimMode::Graceful);
    }
}
