//! Failed starts (issue #24): why a replica job ended before serving, and the
//! back-off it causes.

use std::time::{Duration, Instant};

use onepool_decisions::backoff::FailedStart;
use onepool_launcher::conventions::ReplicaNote;
use onepool_router::metrics::EndpointLabels;
use onepool_slurm_commands::state::JobDetails;

use crate::controller::sbatch::launcher_end;
use crate::controller::tracked::TrackedJob;
use crate::controller::view::{FailedStartView, StartFailures};
use crate::controller::{blocking, Controller};
use crate::round_error::RoundError;

/// A replica job that ends this soon after it first served counts as a
/// failed start too: a server that crashes under its first requests loops
/// as surely as one that never loads.
pub(super) const FAILED_START_WINDOW: Duration = Duration::from_secs(120);

/// Whether an end now is still within the job's start: before it served
/// (`Some(false)`) or within [`FAILED_START_WINDOW`] of its first answer
/// (`Some(true)`); `None` past it.
fn start_window(t: &TrackedJob) -> Option<bool> {
    match t.served_at {
        None => Some(false),
        Some(s) => (s.elapsed() < FAILED_START_WINDOW).then_some(true),
    }
}

impl Controller {
    pub(super) fn start_failures_view(&self) -> StartFailures {
        let b = &self.backoff;
        StartFailures {
            in_a_row: b.failures(),
            total: b.total(),
            backing_off: b.active(),
            next_attempt: b.next_attempt().map(|t| self.unix_at(t)),
            last: b.last().map(|f| FailedStartView { job: f.job, at: self.unix_at(f.at), cause: f.cause.clone() }),
        }
    }

    /// Counts a failed start and says so where an admin looks.
    pub(super) fn failed_start(&mut self, job: u32, cause: String) {
        let now = self.since_start(Instant::now());
        self.backoff.failed(now, FailedStart { job, at: now, cause: cause.clone() });
        let labels = EndpointLabels { endpoint: self.name.clone() };
        self.metrics.failed_starts.get_or_create(&labels).inc();
        let wait = self.backoff.next_attempt().map(|t| t.saturating_sub(now).as_secs()).unwrap_or(0);
        tracing::error!(
            endpoint = %self.name,
            job,
            in_a_row = self.backoff.failures(),
            "replica job failed to start: {cause}; no replica job is submitted for {wait} s"
        );
    }

    /// Why a replica job that left the queue counts as a failed start, if
    /// it does: onepoold did not release it, Slurm did not preempt it, and
    /// its server ended by itself (the launcher's note says so), its
    /// launcher never started, or Slurm ended it (time limit, node, memory)
    /// before it served — always within [`FAILED_START_WINDOW`] of its
    /// first answer. A job that ended cleanly (COMPLETED: the launcher
    /// drained on a notice and exited 0) or was cancelled, preempted or
    /// requeued did not fail to start. The cause comes from Slurm's record
    /// of the job (`record`, read once when it left the queue) and the
    /// launcher's note in it (the server's signal or code, its last lines).
    pub(super) fn failed_start_cause(&self, id: u32, t: &TrackedJob, record: Option<&JobDetails>) -> Option<String> {
        let ours = t.failure_counted || t.members.values().any(|m| m.released || m.drain_started.is_some());
        if ours || t.preempt_end.is_some() {
            return None;
        }
        let when =
            if start_window(t)? { "ended within its first minutes of serving" } else { "ended before it served" };
        let Some(d) = record else {
            // No record left (MinJobAge): a job seen running that never
            // served is still a failed start; nothing more is known.
            return (t.seen_running.is_some() && t.served_at.is_none())
                .then(|| format!("job {id} {when}; Slurm no longer holds its record (MinJobAge)"));
        };
        if d.preempt_time > 0
            || matches!(d.state.as_str(), "COMPLETED" | "CANCELLED" | "PREEMPTED" | "REQUEUED" | "REQUEUE_HOLD")
        {
            return None;
        }
        let note = ReplicaNote::decode(&d.comment).unwrap_or_default();
        let server = t.members.keys().find_map(|slot| note.ended(*slot));
        // It listened and its server did not end by itself: a drain that
        // timed out, or Slurm's end (time, node, memory); a failure to
        // start only if it never served.
        if server.is_none() && !note.listening.is_empty() && t.served_at.is_some() {
            return None;
        }
        let mut cause = format!("job {id} {when}: {}", d.ending());
        cause.push_str(&launcher_end(&note, server));
        Some(cause)
    }

    /// Per-node replicas whose step ended while their job runs on: a
    /// failed start when the launcher's note (the job's comment, read
    /// here) says its server ended by itself before it served or within
    /// [`FAILED_START_WINDOW`] of the job's first answer. A step that ended
    /// for onepoold's own drain or shrink, or with no note of its server's
    /// end (its node left the job), is not one.
    pub(super) async fn settle_step_ends(&mut self) -> Result<(), RoundError> {
        let mut jobs: Vec<u32> = self.step_ends.iter().map(|(j, _)| *j).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for id in jobs {
            let slurm = self.slurm.clone();
            let d = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.job_details(id)).await?;
            let note = d.and_then(|d| ReplicaNote::decode(&d.comment)).unwrap_or_default();
            let slots: Vec<u16> = self.step_ends.iter().filter(|(j, _)| *j == id).map(|(_, s)| *s).collect();
            self.step_ends.retain(|(j, _)| *j != id);
            for slot in slots {
                let Some(t) = self.tracked.get(&id) else { continue };
                let Some(m) = t.members.get(&slot) else { continue };
                let (Some(server), false) = (note.ended(slot), m.released || m.drain_started.is_some()) else {
                    continue;
                };
                let Some(served) = start_window(t) else { continue };
                let when =
                    if served { "ended within its job's first minutes of serving" } else { "ended before it served" };
                let node = m.node.clone().unwrap_or_default();
                let cause = format!("job {id}'s replica on {node} (slot {slot}) {when}: the model server {server}");
                self.failed_start(id, cause);
            }
        }
        Ok(())
    }

    /// Why a replica released for not becoming healthy failed, with what
    /// its launcher reported (where it listens).
    pub(super) fn never_healthy_cause(&self, job: u32, starting_for: Duration) -> String {
        let secs = starting_for.as_secs();
        let limit = onepool_decisions::duration::format(self.settings.startup_timeout);
        let t = self.tracked.get(&job);
        let reported = t.and_then(|t| t.note.as_ref()).is_some_and(|n| !n.listening.is_empty());
        let routed = t.is_some_and(|t| t.members.values().any(|m| m.address.is_some()));
        let detail = match (reported, routed) {
            (false, _) => "its launcher never reported a port (see the job's output file)",
            (true, false) => "its node's address could not be resolved",
            (true, true) => "its health checks never passed",
        };
        format!("job {job} ran {secs} s without becoming healthy (startup_timeout {limit}): {detail}")
    }
}
