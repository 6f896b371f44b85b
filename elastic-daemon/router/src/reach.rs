//! Whether a replica can be reached at all (issue #36: a node whose link
//! goes down). A replica that stops answering health checks with anything,
//! not even an error status, `unhealthy_after` times in a row is lost:
//! across a network that drops its packets, a request already written to
//! it would otherwise wait for its answer until `request_timeout`, though
//! no answer can come. Requests still waiting for a lost replica's answer
//! head are sent elsewhere: their client has had nothing yet, so the retry
//! is invisible to it (a server that is in fact alive behind the cut only
//! does the work twice). Streams already answered are left to
//! `response_idle_timeout`, which ends them with an error.
//!
//! A slow answer is still an answer: an overloaded server whose health
//! check says 503 or 500 is unhealthy (out of rotation) but never lost,
//! and keeps what it serves.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::watch;

/// One replica's reachability, shared by its health checks (which set it)
/// and its requests (which wait on it).
#[derive(Debug)]
pub struct Reach {
    /// Health checks in a row that got no answer at all.
    missed: AtomicU32,
    lost: watch::Sender<bool>,
}

impl Default for Reach {
    fn default() -> Self {
        Reach { missed: AtomicU32::new(0), lost: watch::Sender::new(false) }
    }
}

impl Reach {
    /// A health check got an answer (of any status): reachable again.
    pub fn answered(&self) {
        self.missed.store(0, Ordering::Relaxed);
        self.lost.send_if_modified(|lost| std::mem::replace(lost, false));
    }

    /// A health check got no answer; the `after`th in a row makes the
    /// replica lost. Returns true when this call did.
    pub fn missed(&self, after: u32) -> bool {
        let n = self.missed.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        n >= after.max(1) && self.lost.send_if_modified(|lost| !std::mem::replace(lost, true))
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves once the replica is lost (at once if it is now).
    pub async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        // The sender lives as long as `self`: the wait ends only by a loss.
        let _ = rx.wait_for(|lost| *lost).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn lost_after_the_threshold_of_unanswered_checks_in_a_row_and_found_again_by_an_answer() {
        let r = Reach::default();
        assert!(!r.missed(3));
        assert!(!r.missed(3));
        // An answer in between starts the count again.
        r.answered();
        assert!(!r.missed(3) && !r.missed(3));
        assert!(!r.is_lost());
        assert!(r.missed(3), "the third in a row");
        assert!(!r.missed(3), "lost once, not again");
        assert!(r.is_lost());
        tokio::time::timeout(Duration::from_millis(100), r.lost()).await.expect("resolves at once when lost");
        r.answered();
        assert!(!r.is_lost());
        assert!(tokio::time::timeout(Duration::from_millis(50), r.lost()).await.is_err(), "found again");
    }

    #[tokio::test]
    async fn a_request_waiting_on_the_replica_wakes_when_it_is_lost() {
        let r = std::sync::Arc::new(Reach::default());
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.lost().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        r.missed(1);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("woken").unwrap();
    }
}
