//! Reclaimed replicas: counted and timed when their GPUs are free, and the job
//! that took them found (issue #26), all from Slurm's records of the jobs
//! (issue #35): the victim's `PreemptTime`, `EndTime` and nodes, the
//! taker's submission and start.

use std::time::{Duration, Instant};

use onepool_router::metrics::{EndpointLabels, ReclaimLabels};

use crate::controller::ending::{reclaim_of, RecordedReclaim};
use crate::controller::tracked::{TakerSearch, TrackedJob};
use crate::controller::view::{ReclaimView, RECENT_RECLAIMS};
use crate::controller::{blocking, kind_name, Controller};

/// Failed reads of an ended job's record before onepoold settles it with
/// what it saw itself (a slurmctld that does not answer for this long has
/// other problems, and the record may be gone by then: `MinJobAge`).
const RECORD_READS: u32 = 10;

/// How long after a release onepoold looks for the job that took the GPUs.
pub(super) const TAKER_SEARCH: Duration = Duration::from_secs(30);

impl Controller {
    /// Reads the record of each replica job that left the queue and counts
    /// what it says: a reclaim, a failed start, or neither. A read that
    /// fails is tried again at the next poll, so a slow slurmctld delays a
    /// count but does not lose it.
    pub(super) async fn settle_ended(&mut self) {
        for mut e in std::mem::take(&mut self.ended) {
            let (slurm, id) = (self.slurm.clone(), e.job);
            let record = match blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.job_details(id))
                .await
            {
                Ok(r) => r,
                Err(err) if e.reads + 1 < RECORD_READS => {
                    tracing::warn!(endpoint = %self.name, job = id, "reading the ended replica job's record: {err}; again at the next poll");
                    e.reads += 1;
                    self.ended.push(e);
                    continue;
                }
                Err(err) => {
                    tracing::warn!(endpoint = %self.name, job = id, "reading the ended replica job's record failed {RECORD_READS} times ({err}); its end is not counted");
                    continue;
                }
            };
            if record.is_none() {
                tracing::warn!(endpoint = %self.name, job = id, "the ended replica job's record is gone from slurmctld (MinJobAge); a reclaim of it cannot be counted");
            }
            match record.as_ref().and_then(reclaim_of) {
                Some(r) => self.reclaimed(id, &e.tracked, r),
                None => {
                    if let Some(cause) = self.failed_start_cause(id, &e.tracked, record.as_ref()) {
                        self.failed_start(id, cause);
                    }
                }
            }
        }
    }

    /// A replica job Slurm reclaimed has ended: counted, timed, kept for
    /// status, and its taker looked for.
    pub(super) fn reclaimed(&mut self, job: u32, t: &TrackedJob, r: RecordedReclaim) {
        let mode = r.mode;
        tracing::info!(
            endpoint = %self.name,
            job,
            mode = mode.as_str(),
            "reclaimed replica job released its GPUs {:.0} s after Slurm picked it (its record)",
            r.released_after_s
        );
        let labels = ReclaimLabels { endpoint: self.name.clone(), mode: mode.as_str().to_string() };
        self.metrics.preemptions.get_or_create(&EndpointLabels { endpoint: self.name.clone() }).inc();
        self.metrics.reclaims.get_or_create(&labels).inc();
        self.metrics.reclaim_release_seconds.get_or_create(&labels).observe(r.released_after_s);
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.reclaims.push(ReclaimView {
            job,
            kind: kind_name(t.kind),
            mode,
            at: r.picked_at,
            released_after_s: r.released_after_s,
            taker: None,
            time_to_capacity_s: None,
        });
        let extra = v.reclaims.len().saturating_sub(RECENT_RECLAIMS);
        v.reclaims.drain(..extra);
        let nodes = if r.nodes.is_empty() { t.nodes.clone() } else { r.nodes };
        if !nodes.is_empty() {
            self.takers.push(TakerSearch {
                job,
                nodes,
                mode,
                picked_at: r.picked_at,
                until: Instant::now() + TAKER_SEARCH,
            });
        }
    }

    /// Looks for the jobs that took reclaimed replicas' GPUs: on the
    /// victim's nodes, another user's, eligible by Slurm's pick and started
    /// at or after it (running or already ended: slurmctld's records of
    /// both); the one eligible first, then started first, is the taker. One squeue per victim and poll, until found
    /// or [`TAKER_SEARCH`] after the release.
    /// A failed squeue is logged and tried again at the next poll (the
    /// taker is a figure for the admin, not a reason to stop a round).
    pub(super) async fn find_takers(&mut self) {
        let now = Instant::now();
        for s in std::mem::take(&mut self.takers) {
            let slurm = self.slurm.clone();
            let nodes = s.nodes.clone();
            let running = blocking(&self.metrics, &self.name, "squeue_started_on", move || slurm.started_on(&nodes));
            let running = match running.await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(endpoint = %self.name, job = s.job, "looking for the reclaimed replica's taker: {e}");
                    if now < s.until {
                        self.takers.push(s);
                    }
                    continue;
                }
            };
            // Slurm picked the victim for a job that was eligible then; one
            // released by the victim's end (a dependency on it, issue #52)
            // became eligible after, unless the pick and the end fell in
            // one second, where the one eligible first is taken.
            let taker = running
                .iter()
                .filter(|j| j.user_id != self.uid && j.start_time >= s.picked_at && j.submit_time > 0)
                .filter(|j| j.eligible_time <= s.picked_at)
                .min_by_key(|j| (j.eligible_time, j.start_time, j.job_id));
            match taker {
                Some(j) => self.took(&s, j.job_id, j.start_time.saturating_sub(j.submit_time)),
                None if now < s.until => self.takers.push(s),
                None => tracing::info!(
                    endpoint = %self.name,
                    job = s.job,
                    "no other job started on the reclaimed replica's nodes ({}) within {} s of its release",
                    s.nodes,
                    TAKER_SEARCH.as_secs()
                ),
            }
        }
    }

    pub(super) fn took(&mut self, s: &TakerSearch, taker: u32, ttc: u64) {
        tracing::info!(
            endpoint = %self.name,
            job = s.job,
            taker,
            mode = s.mode.as_str(),
            "job {taker} took the reclaimed replica's GPUs {ttc} s after its submission"
        );
        let labels = ReclaimLabels { endpoint: self.name.clone(), mode: s.mode.to_string() };
        self.metrics.reclaim_time_to_capacity_seconds.get_or_create(&labels).observe(ttc as f64);
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = v.reclaims.iter_mut().rev().find(|r| r.job == s.job) {
            r.taker = Some(taker);
            r.time_to_capacity_s = Some(ttc);
        }
    }
}
