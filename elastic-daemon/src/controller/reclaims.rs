//! Reclaimed replicas: counted and timed when their GPUs are free, and the job
//! that took them found (issue #26).

use super::*;

/// A reclaimed replica whose taker is still to be found.
#[derive(Clone, Debug)]
pub(super) struct TakerSearch {
    job: u32,
    nodes: String,
    mode: ReclaimMode,
    /// Unix seconds when Slurm's pick was seen: the taker starts after.
    picked_at: u64,
    /// Given up (no other job started on its nodes) after this.
    until: Instant,
}

/// How long after a release onepoold looks for the job that took the GPUs.
pub(super) const TAKER_SEARCH: Duration = Duration::from_secs(30);

impl Controller {
    /// A preempted replica job is gone: counted, timed, kept for status.
    pub(super) fn reclaimed(&mut self, job: u32, t: &TrackedJob, seen: Instant, at: u64, mode: ReclaimMode) {
        let released = seen.elapsed().as_secs_f64();
        tracing::info!(endpoint = %self.name, job, mode = mode.as_str(), "reclaimed replica job released its GPUs {released:.1} s after Slurm's pick was seen");
        let labels = ReclaimLabels { endpoint: self.name.clone(), mode: mode.as_str().to_string() };
        self.metrics.reclaims.get_or_create(&labels).inc();
        self.metrics.reclaim_release_seconds.get_or_create(&labels).observe(released);
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.reclaims.push(ReclaimView {
            job,
            kind: kind_name(t.kind),
            mode,
            at,
            released_after_s: released,
            taker: None,
            time_to_capacity_s: None,
        });
        let extra = v.reclaims.len().saturating_sub(RECENT_RECLAIMS);
        v.reclaims.drain(..extra);
        if !t.nodes.is_empty() {
            self.takers.push(TakerSearch {
                job,
                nodes: t.nodes.clone(),
                mode,
                picked_at: at,
                until: Instant::now() + TAKER_SEARCH,
            });
        }
    }

    /// Looks for the jobs that took reclaimed replicas' GPUs: on the
    /// victim's nodes, another user's, started at or after Slurm's pick;
    /// the first to start is the taker. One squeue per victim and poll,
    /// until found or [`TAKER_SEARCH`] after the release.
    /// A failed squeue is logged and tried again at the next poll (the
    /// taker is a figure for the admin, not a reason to stop a round).
    pub(super) async fn find_takers(&mut self) {
        let now = Instant::now();
        for s in std::mem::take(&mut self.takers) {
            let slurm = self.slurm.clone();
            let nodes = s.nodes.clone();
            let running = blocking(&self.metrics, &self.name, "squeue_running_on", move || slurm.running_on(&nodes));
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
            let taker = running
                .iter()
                .filter(|j| j.user_id != self.uid && j.start_time >= s.picked_at && j.submit_time > 0)
                .min_by_key(|j| (j.start_time, j.job_id));
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
