//! What Slurm does with the configuration onepool renders: the part of the
//! shared pool that onepool does not own, as a documented model. The
//! inputs are exactly what `onepool policy render` gives Slurm (the class
//! QOS with their priority, `Preempt` list, `GrpTRES` GPU limit and
//! GraceTime; the flexible partition's capping QOS; `PreemptExemptTime`),
//! so the model follows the rendered configuration, not a re-reading of
//! the policy.
//!
//! ## The model (Slurm 22.05, `PreemptType=preempt/qos`, `SelectType=select/cons_tres`)
//!
//! - **Order.** Pending jobs are considered by QOS priority (protected
//!   classes first, then flexible ranks), first come first served within a
//!   QOS. A job that cannot start blocks the later jobs of its own QOS;
//!   other QOS may still use what is left (an approximation of the main
//!   scheduler plus backfill without time limits).
//! - **Limits.** A protected class never holds more than its `GrpTRES`
//!   (its capacity); all flexible jobs together never hold more than the
//!   flexible partition's QOS allows (the pool minus reserved GPUs).
//!   Preemption is never used to get under a limit, only to find GPUs.
//! - **Placement.** First fit: the lowest-numbered node(s) of the right GPU
//!   type with enough free GPUs, the lowest free GPU indices there.
//! - **Victims.** Preemptable jobs (QOS in the preemptor's `Preempt` list,
//!   running at least `PreemptExemptTime`, not already being reclaimed) are
//!   tried lowest QOS priority first, and within one QOS by node order,
//!   lowest GPU index, then lowest job id (measured on 22.05: raising or
//!   lowering the priority of jobs of the SAME QOS did not change the
//!   victim; bench/VALIDATE.md shows that across QOS the lower one goes
//!   first). Candidates are set aside in that order until the job fits on
//!   the first nodes that have room; the victims are the set-aside jobs on
//!   the chosen nodes, in that order, as many as each node needs.
//! - **Timing.** Immediate reclaim (GraceTime 0) frees the GPUs
//!   [`IMMEDIATE_FREE_S`] after the preemptor's submission. Graceful
//!   reclaim frees them when the victim has drained: an inference replica
//!   when its in-flight requests finish, at most the class drain timeout;
//!   a batch job when it gives them back by itself (the scenario's
//!   `[victims]` `release_after`: checkpoint saved and requeued, or drained
//!   and exited), at the latest at its drain timeout (GraceTime; the
//!   default when `release_after` is not given). A victim whose work ends
//!   first simply completes.
//! - **After.** A requeued job checkpointed at its notice: it keeps the work
//!   it had done until then and may start again [`REQUEUE_HOLD_S`] after it
//!   was requeued (Reason=BeginTime), at the first scheduling pass after
//!   that (a job's submission or end, or the periodic pass every
//!   [`SCHED_INTERVAL_S`]). A cancelled one (immediate,
//!   or graceful after its drain) ends PREEMPTED; Slurm does nothing more.
//!   Whether its owner resubmits it (from the beginning: its work is lost)
//!   or it is dropped is the scenario's `[victims] cancelled` (default
//!   resubmit), a model input, not Slurm's behaviour.
//!
//! ## Replay
//!
//! A scenario file (see [`crate::scenario`]) lists each job as Slurm gets
//! it: submit offset, GPUs (per node), GPU type, class annotation and run
//! time, i.e. `sbatch --workload=CLASS --gpus-per-node=N --time=T` of a
//! job that sleeps its run time. `onepool simulate --job-log` prints the
//! simulated start and end of every job, to set beside `sacct` of the same
//! scenario replayed on the dev cluster (bench/validate-simulator.sh does
//! both and compares them; results in bench/RESULTS.md).

use std::time::Duration;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::policy::{Policy, Tier};
use onepool_decisions::render;

/// Seconds from an immediate reclaim decision to free GPUs (measured).
pub const IMMEDIATE_FREE_S: f64 = 0.5;

/// Seconds a requeued batch job is held (Reason=BeginTime) before it may
/// start again: Slurm 22.05 sets its begin time past the job credential's
/// lifetime (120 s by default) so the old run's credential has expired.
pub const REQUEUE_HOLD_S: f64 = 121.0;

/// Slurm's periodic main scheduling pass (`sched_interval`, 60 s by
/// default). A job that becomes eligible by time alone (a requeued job's
/// BeginTime passing) is not started then: it waits for the next pass,
/// which a job's submission or end triggers, or this periodic one (the
/// backfill pass skips its cycle when no job or node changed; measured on
/// the dev cluster, bench/RESULTS.md). The model runs the periodic pass
/// every `SCHED_INTERVAL_S` from the window's start.
pub const SCHED_INTERVAL_S: f64 = 60.0;

/// One class's QOS as Slurm enforces it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassQos {
    pub class: String,
    pub protected: bool,
    pub priority: u32,
    /// Indices (into [`SlurmModel::classes`]) of the classes this one preempts.
    pub preempts: Vec<usize>,
    pub grp_gpus: Option<u32>,
    /// Protected classes: the part of the capacity flexible work never holds.
    pub reserved: u32,
    pub grace_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SlurmModel {
    /// In the policy's class order.
    pub classes: Vec<ClassQos>,
    /// GPUs all flexible jobs may hold together (flexible partition QOS).
    pub flexible_cap: Option<u32>,
    /// PreemptExemptTime.
    pub exempt_s: f64,
}

impl SlurmModel {
    pub fn from_policy(policy: &Policy) -> SlurmModel {
        let r = render::render(policy);
        let by_qos = |q: &str| policy.classes.iter().position(|c| c.qos == q);
        let classes = policy
            .classes
            .iter()
            .map(|c| {
                let spec = r.qos.iter().find(|s| s.name == c.qos);
                ClassQos {
                    class: c.name.clone(),
                    protected: c.is_protected(),
                    // A site-managed QOS is not rendered: rank it by tier.
                    priority: spec.map(|s| s.priority).unwrap_or(if c.is_protected() { u32::MAX } else { 0 }),
                    preempts: spec.map(|s| s.preempt.iter().filter_map(|q| by_qos(q)).collect()).unwrap_or_default(),
                    grp_gpus: spec.and_then(|s| s.grp_gpus),
                    reserved: match c.tier {
                        Tier::Protected { capacity } => capacity.reserved,
                        Tier::Flexible { .. } => 0,
                    },
                    grace_s: spec.map(|s| s.grace_time.as_secs_f64()).unwrap_or(0.0),
                }
            })
            .collect();
        SlurmModel {
            classes,
            flexible_cap: r.flexible_partition.as_ref().and_then(|p| p.qos.grp_gpus),
            exempt_s: policy.pool.min_runtime_before_reclaim.as_secs_f64(),
        }
    }

    /// The model for the policy applied to a pool of `gpus` GPUs (its
    /// `total_gpus` set to the simulated fleet, so the flexible cap is the
    /// fleet minus the reserved GPUs; protected capacities stay as written).
    pub fn for_fleet(policy: &Policy, gpus: u64) -> SlurmModel {
        let mut p = policy.clone();
        p.pool.total_gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
        SlurmModel::from_policy(&p)
    }

    /// Class indices, highest priority first (ties: policy order).
    pub fn priority_order(&self) -> Vec<usize> {
        let mut o: Vec<usize> = (0..self.classes.len()).collect();
        o.sort_by_key(|&i| (std::cmp::Reverse(self.classes[i].priority), i));
        o
    }

    /// Seconds from the reclaim decision until a batch victim's GPUs are
    /// free: at once for an immediate reclaim; for a graceful or requeue
    /// one when the victim gives them back by itself (`by_itself`: it saved
    /// its checkpoint and requeued, or drained and exited), at the latest at
    /// its drain timeout (GraceTime).
    pub fn batch_free_after(
        &self,
        mode: Option<ReclaimMode>,
        drain: Option<Duration>,
        victim_class: usize,
        by_itself: Option<f64>,
    ) -> f64 {
        match mode {
            None | Some(ReclaimMode::Immediate) => IMMEDIATE_FREE_S,
            Some(_) => {
                let limit = drain.map(|d| d.as_secs_f64()).unwrap_or(self.classes[victim_class].grace_s);
                by_itself.map_or(limit, |b| b.min(limit)).max(IMMEDIATE_FREE_S)
            }
        }
    }
}

/// A running job's GPUs on one node, as victim selection sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holder {
    pub job: usize,
    /// Its QOS priority: lower ones are preempted first.
    pub priority: u32,
    pub lowest_gpu: u32,
    pub gpus: u32,
    /// May be preempted by the pending job now (QOS listed, past the exempt time, not already reclaimed).
    pub eligible: bool,
}

/// Slurm's victim choice for a job needing `per_node` GPUs on each of
/// `nodes` nodes. `view` gives, for each node the job may use (in node
/// order), its free GPUs and its holders. Returns the victims, or `None`
/// when preemption cannot make room.
pub fn pick_victims(view: &[(u32, Vec<Holder>)], nodes: u32, per_node: u32) -> Option<Vec<usize>> {
    let mut candidates: Vec<(usize, &Holder)> = view
        .iter()
        .enumerate()
        .flat_map(|(n, (_, hs))| hs.iter().filter(|h| h.eligible).map(move |h| (n, h)))
        .collect();
    candidates.sort_by_key(|(n, h)| (h.priority, *n, h.lowest_gpu, h.job));
    let mut room: Vec<u32> = view.iter().map(|(free, _)| *free).collect();
    let mut set_aside: Vec<(usize, &Holder)> = Vec::new();
    let chosen = |room: &[u32]| -> Option<Vec<usize>> {
        let fit: Vec<usize> = (0..room.len()).filter(|&n| room[n] >= per_node).take(nodes as usize).collect();
        (fit.len() == nodes as usize).then_some(fit)
    };
    let mut picked = None;
    for c in candidates {
        // A multi-node job's GPUs on another node come free too.
        let job = c.1.job;
        for (n, (_, hs)) in view.iter().enumerate() {
            for h in hs.iter().filter(|h| h.job == job) {
                room[n] += h.gpus;
                set_aside.push((n, h));
            }
        }
        if let Some(fit) = chosen(&room) {
            picked = Some(fit);
            break;
        }
    }
    let fit = picked?;
    let mut victims: Vec<usize> = Vec::new();
    for n in fit {
        let mut have = view[n].0;
        for (_, h) in set_aside.iter().filter(|(m, _)| *m == n) {
            if have >= per_node {
                break;
            }
            have += h.gpus;
            if !victims.contains(&h.job) {
                victims.push(h.job);
            }
        }
    }
    (!victims.is_empty()).then_some(victims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(job: usize, lowest_gpu: u32, gpus: u32) -> Holder {
        Holder { job, priority: 1000, lowest_gpu, gpus, eligible: true }
    }

    #[test]
    fn within_one_qos_first_node_lowest_gpu() {
        // Node 0: job 5 on GPUs 0-1, job 3 on GPUs 2-3. Node 1: job 1 on 0-3.
        let view = vec![(0, vec![h(3, 2, 2), h(5, 0, 2)]), (0, vec![h(1, 0, 4)])];
        assert_eq!(pick_victims(&view, 1, 2), Some(vec![5]));
        assert_eq!(pick_victims(&view, 1, 3), Some(vec![5, 3]));
        assert_eq!(pick_victims(&view, 2, 4), Some(vec![5, 3, 1]));
    }

    #[test]
    fn the_lowest_qos_goes_first_whatever_the_node() {
        // As on the dev cluster (bench/VALIDATE.md): training (priority 3000)
        // on node 1, agents (1000) on node 2: the agents job yields.
        let training = Holder { priority: 3000, ..h(7, 0, 4) };
        let agents = Holder { priority: 1000, ..h(8, 0, 4) };
        let view = vec![(0, vec![training]), (0, vec![agents])];
        assert_eq!(pick_victims(&view, 1, 4), Some(vec![8]));
    }

    #[test]
    fn exempt_jobs_are_skipped_and_no_room_is_none() {
        let mut young = h(2, 0, 4);
        young.eligible = false;
        assert_eq!(pick_victims(&[(0, vec![young])], 1, 1), None);
        assert_eq!(pick_victims(&[(0, vec![young]), (1, vec![h(7, 1, 1)])], 1, 2), Some(vec![7]));
    }

    #[test]
    fn the_rendered_sample_policy() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../etc/onepool.toml")).unwrap();
        let p = onepool_decisions::policy::load(&text).policy.unwrap();
        let m = SlurmModel::from_policy(&p);
        let name = |i: usize| m.classes[i].class.as_str();
        let order: Vec<&str> = m.priority_order().into_iter().map(name).collect();
        assert_eq!(&order[2..], ["training", "inference", "agents"]);
        let training = p.classes.iter().position(|c| c.name == "training").unwrap();
        let pre: Vec<&str> = m.classes[training].preempts.iter().map(|&i| name(i)).collect();
        assert_eq!(pre, ["inference", "agents"]);
        assert_eq!(m.flexible_cap, Some(12));
        assert_eq!(m.exempt_s, 120.0);
    }
}
