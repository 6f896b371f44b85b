//! Which onepoold acts on Slurm when several run (issue #37, docs/ha.md).
//!
//! Every instance routes every endpoint to every ready replica it learns
//! from Slurm's records; one of them, the acting instance, also submits,
//! drains and cancels. The acting instance is the one that holds a named
//! lock on the accounting database server ([`mariadb`]), on a connection
//! of its own: the server drops the connection, and with it the lock, when
//! the holder dies, when its link is cut or when it says nothing for the
//! session's `wait_timeout` (`[ha] lost_after`). The others try to take
//! the lock every `check_interval` and act once they have it.
//!
//! [`Leadership`] is what the replica controllers ask immediately before
//! every sbatch, scancel and scontrol update ([`Leadership::may_act`]): yes
//! only while the last confirmation that this instance holds the lock was
//! sent less than the fence ago, on the monotonic clock. The fence is
//! shorter than `lost_after`, the time the server waits before it gives
//! the lock to another, so two instances never both believe they act
//! (a paused process and its limits are in docs/ha.md). A lost or stale
//! lock demotes the instance at once.

mod lock;
pub mod mariadb;
pub mod names;
mod password;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onepool_control::api;
use onepool_router::metrics::Metrics;
use tokio::sync::watch;

pub use lock::{Holder, Lock, LockError};
pub use password::{read_password, read_password_as, PasswordError};

/// Whether this instance acts, and what it knows of the one that does.
pub struct Leadership {
    instance: String,
    /// `None`: a single instance (`[ha] lock = "none"`), which always acts.
    fence: Option<Duration>,
    state: Mutex<State>,
    metrics: Option<Arc<Metrics>>,
}

#[derive(Default)]
struct State {
    acting: Option<Acting>,
    /// The acting instance as the lock's server describes it, while
    /// another one acts.
    holder: Option<String>,
    /// Checks in a row that found the lock held without the proof only an
    /// instance with the replica key can make.
    unproven: u32,
    /// The holder that is no onepoold instance of this configuration, once
    /// seen on two checks in a row (a holder takes the lock and then its
    /// proof: one check may fall between the two).
    foreign: Option<String>,
    takeovers: u64,
    last_takeover_unix: Option<f64>,
    /// Why this instance cannot reach the lock, or why it last lost it.
    last_error: Option<String>,
}

struct Acting {
    since_unix: f64,
    /// When the last confirmation that this instance holds the lock was
    /// sent (not when its answer came: the server counts from the request).
    confirmed: Instant,
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Leadership {
    /// The single instance of a site without `[ha]`: it acts from its
    /// start, and nothing can take that away.
    pub fn single(instance: &str, metrics: Option<Arc<Metrics>>) -> Arc<Leadership> {
        let l = Leadership {
            instance: instance.to_string(),
            fence: None,
            state: Mutex::new(State {
                acting: Some(Acting { since_unix: unix_now(), confirmed: Instant::now() }),
                ..State::default()
            }),
            metrics,
        };
        l.export(&l.lock());
        Arc::new(l)
    }

    /// One of several instances: a follower until the lock is taken.
    /// `fence`: how long a confirmation of the lock lets it act.
    pub fn shared(instance: &str, fence: Duration, metrics: Option<Arc<Metrics>>) -> Arc<Leadership> {
        let l = Leadership { instance: instance.to_string(), fence: Some(fence), state: Mutex::default(), metrics };
        l.export(&l.lock());
        Arc::new(l)
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this instance may act on Slurm now. Asked immediately
    /// before each command that changes a job; a stale confirmation
    /// demotes the instance here, whatever the lock's task believes.
    pub fn may_act(&self) -> bool {
        self.may_act_at(Instant::now())
    }

    pub(crate) fn may_act_at(&self, now: Instant) -> bool {
        let Some(fence) = self.fence else { return true };
        let mut s = self.lock();
        let Some(a) = &s.acting else { return false };
        let age = now.saturating_duration_since(a.confirmed);
        if age < fence {
            return true;
        }
        let why = format!(
            "the lock was last confirmed {} ms ago, past the fence of {} ms",
            age.as_millis(),
            fence.as_millis()
        );
        self.demote(&mut s, why);
        false
    }

    /// Whether this instance believes it acts (for the lock's task, which
    /// then confirms rather than tries to take the lock).
    pub fn acting(&self) -> bool {
        self.lock().acting.is_some()
    }

    /// The lock was taken by a request sent at `sent`.
    pub(crate) fn acquired(&self, sent: Instant) {
        let mut s = self.lock();
        if s.acting.is_some() {
            return;
        }
        let now = unix_now();
        s.acting = Some(Acting { since_unix: now, confirmed: sent });
        s.holder = None;
        s.unproven = 0;
        s.foreign = None;
        s.takeovers += 1;
        s.last_takeover_unix = Some(now);
        s.last_error = None;
        tracing::info!(instance = %self.instance, takeovers = s.takeovers, "took the lock: this instance acts on Slurm now");
        self.export(&s);
    }

    /// The server said, to a request sent at `sent`, that this instance
    /// still holds the lock.
    pub(crate) fn confirmed(&self, sent: Instant) {
        let mut s = self.lock();
        if let Some(a) = s.acting.as_mut() {
            // Never backwards: a late answer to an older request proves less.
            if sent > a.confirmed {
                a.confirmed = sent;
            }
        }
    }

    /// The lock is gone (or cannot be confirmed): follow from now on.
    pub(crate) fn lost(&self, why: String) {
        let mut s = self.lock();
        self.demote(&mut s, why);
    }

    fn demote(&self, s: &mut State, why: String) {
        if s.acting.take().is_some() {
            tracing::warn!(instance = %self.instance, "no longer acting on Slurm: {why}");
            self.export(s);
        }
        s.last_error = Some(why);
    }

    /// Another connection holds the lock (`None`: the server named none).
    pub(crate) fn following(&self, holder: Option<Holder>) {
        let mut s = self.lock();
        s.last_error = None;
        match holder {
            Some(h) if !h.proven => {
                s.unproven += 1;
                if s.unproven >= 2 && s.foreign.as_deref() != Some(h.description.as_str()) {
                    tracing::error!(
                        instance = %self.instance,
                        "the leadership lock is held by {}, which is not an onepoold instance of this configuration \
                         (it holds no proof made with the replica key): no instance acts on Slurm while it holds the \
                         lock; find and end that connection (docs/ha.md)",
                        h.description
                    );
                    s.foreign = Some(h.description.clone());
                    self.export(&s);
                }
                s.holder = Some(h.description);
            }
            other => {
                s.unproven = 0;
                if s.foreign.take().is_some() {
                    tracing::info!(instance = %self.instance, "the leadership lock is no longer held by a stranger");
                    self.export(&s);
                }
                s.holder = other.map(|h| h.description);
            }
        }
    }

    /// The lock could not be reached (a follower stays one).
    pub(crate) fn unreachable(&self, why: String) {
        let mut s = self.lock();
        if s.acting.is_none() {
            s.holder = None;
        }
        if s.last_error.as_deref() != Some(why.as_str()) {
            tracing::warn!(instance = %self.instance, "the leadership lock: {why}");
        }
        s.last_error = Some(why);
    }

    /// What `onepool status` and the control API show.
    pub fn view(&self) -> api::Leadership {
        let s = self.lock();
        api::Leadership {
            instance: self.instance.clone(),
            shared: self.fence.is_some(),
            acting: s.acting.is_some(),
            acting_since: s.acting.as_ref().map(|a| a.since_unix),
            acting_instance: match &s.acting {
                Some(_) => Some(self.instance.clone()),
                None => s.holder.clone(),
            },
            takeovers: s.takeovers,
            last_takeover: s.last_takeover_unix,
            last_error: s.last_error.clone(),
            foreign_holder: s.foreign.clone(),
        }
    }

    fn export(&self, s: &State) {
        let Some(m) = &self.metrics else { return };
        let labels = onepool_router::metrics::InstanceLabels { instance: self.instance.clone() };
        m.ha_acting.get_or_create(&labels).set(i64::from(s.acting.is_some()));
        m.ha_lock_foreign.get_or_create(&labels).set(i64::from(s.foreign.is_some()));
        m.ha_acting_since.get_or_create(&labels).set(s.acting.as_ref().map_or(0.0, |a| a.since_unix));
        m.ha_last_takeover.get_or_create(&labels).set(s.last_takeover_unix.unwrap_or(0.0));
        let takeovers = m.ha_takeovers.get_or_create(&labels);
        let counted = takeovers.get();
        if s.takeovers > counted {
            takeovers.inc_by(s.takeovers - counted);
        }
    }
}

/// What `onepoold --check` (and so `onepool doctor`) and the start warn
/// about in `[ha]`: a lock connection that crosses a network in clear.
pub fn warnings(config: &crate::config::Config) -> Vec<String> {
    let Some(l) = &config.ha.lock else { return Vec::new() };
    let loopback = l.host == "localhost" || l.host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    if l.ca_file.is_some() || loopback {
        return Vec::new();
    }
    vec![format!(
        "[ha]: the lock's connection to {}:{} is not encrypted: its password and the lock cross the network in clear, \
         and anyone on the path can stand in for the server; set ca_file to the server's CA (or its own certificate) \
         so that TLS is required and the server proven",
        l.host, l.port
    )]
}

/// How the lock's task paces itself.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Between two confirmations, or two tries to take the lock.
    pub every: Duration,
    /// Longest wait for one answer of the server.
    pub answer_within: Duration,
}

/// Keeps `leadership` in step with `lock` until `shutdown` turns true;
/// closing then lets the lock go at once (the next instance need not wait
/// for the server to notice).
pub async fn run<L: Lock>(leadership: Arc<Leadership>, mut lock: L, pace: Pace, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(pace.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut held = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = onepool_router::shutdown::stopped(&mut shutdown) => break,
        }
        held = step(&leadership, &mut lock, pace, held).await;
    }
    lock.close().await;
}

/// One beat: confirm the lock if this instance acts, else wait for it.
/// `held`: whether the connection held the lock after the last beat.
/// Returns whether it holds it now.
pub async fn step<L: Lock>(leadership: &Leadership, lock: &mut L, pace: Pace, held: bool) -> bool {
    // Demoted in between (a stale fence): this connection may still hold
    // the lock, which nobody would then confirm or use; close it so the
    // server lets the lock go.
    if held && !leadership.acting() {
        lock.close().await;
    }
    let sent = Instant::now();
    if leadership.acting() {
        let r = tokio::time::timeout(pace.answer_within, lock.still_held()).await;
        match r {
            Ok(Ok(true)) => {
                leadership.confirmed(sent);
                return true;
            }
            Ok(Ok(false)) => leadership.lost("the database server says another connection holds the lock".into()),
            Ok(Err(e)) => leadership.lost(format!("confirming the lock: {e}")),
            Err(_) => leadership.lost(format!(
                "the database server did not confirm the lock within {} ms",
                pace.answer_within.as_millis()
            )),
        }
        lock.close().await;
        return false;
    }
    // Queued behind the holder for half the time an answer may take.
    match tokio::time::timeout(pace.answer_within, lock.acquire(pace.answer_within / 2)).await {
        Ok(Ok(true)) => {
            leadership.acquired(sent);
            return true;
        }
        Ok(Ok(false)) => {
            let holder = match tokio::time::timeout(pace.answer_within, lock.holder()).await {
                Ok(Ok(h)) => h,
                _ => None,
            };
            leadership.following(holder);
            return false;
        }
        Ok(Err(e)) => leadership.unreachable(format!("taking the lock: {e}")),
        Err(_) => leadership
            .unreachable(format!("the database server did not answer within {} ms", pace.answer_within.as_millis())),
    }
    lock.close().await;
    false
}

#[cfg(test)]
mod tests;
