//! The leadership against a lock server in memory: connections that take,
//! confirm and lose a lock the way MariaDB's GET_LOCK behaves (the lock is
//! the connection's; closing it, or the server ending it, frees it).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// The lock's server: which connection holds it, and what goes wrong.
#[derive(Default)]
struct Server {
    holder: Option<u32>,
    /// The holder took the lock without its proof: a connection that knows
    /// the lock's name but not the replica key.
    stranger: bool,
    next_id: u32,
    /// Every request fails (the link is cut).
    down: bool,
    /// Requests never answer.
    silent: bool,
}

/// One instance's connection to [`Server`].
struct FakeLock {
    server: Arc<Mutex<Server>>,
    id: Option<u32>,
    closes: Arc<Mutex<u32>>,
}

impl FakeLock {
    fn on(server: &Arc<Mutex<Server>>) -> FakeLock {
        FakeLock { server: server.clone(), id: None, closes: Arc::default() }
    }

    async fn ask<T>(&mut self, f: impl FnOnce(&mut Server, u32) -> T) -> Result<T, LockError> {
        let silent = self.server.lock().unwrap().silent;
        if silent {
            std::future::pending::<()>().await;
        }
        let mut s = self.server.lock().unwrap();
        if s.down {
            return Err(LockError::Answer("connection refused".into()));
        }
        let id = *self.id.get_or_insert_with(|| {
            s.next_id += 1;
            s.next_id
        });
        Ok(f(&mut s, id))
    }
}

impl Lock for FakeLock {
    async fn acquire(&mut self, _wait: Duration) -> Result<bool, LockError> {
        self.ask(|s, id| match s.holder {
            None => {
                s.holder = Some(id);
                s.stranger = false;
                true
            }
            Some(h) => h == id,
        })
        .await
    }

    async fn still_held(&mut self) -> Result<bool, LockError> {
        self.ask(|s, id| s.holder == Some(id)).await
    }

    async fn holder(&mut self) -> Result<Option<Holder>, LockError> {
        self.ask(|s, _| s.holder.map(|h| Holder { description: format!("connection {h}"), proven: !s.stranger })).await
    }

    async fn close(&mut self) {
        *self.closes.lock().unwrap() += 1;
        if let Some(id) = self.id.take() {
            let mut s = self.server.lock().unwrap();
            if s.holder == Some(id) {
                s.holder = None;
            }
        }
    }
}

const FENCE: Duration = Duration::from_secs(2);
const PACE: Pace = Pace { every: Duration::from_millis(10), answer_within: Duration::from_millis(100) };

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn a_single_instance_always_acts_and_nothing_demotes_it() {
    let l = Leadership::single("solo", None);
    assert!(l.may_act_at(Instant::now() + Duration::from_secs(86_400)));
    let v = l.view();
    assert!(v.acting && !v.shared);
    assert_eq!(v.acting_instance.as_deref(), Some("solo"));
    assert_eq!(v.takeovers, 0);
}

#[test]
fn of_two_instances_on_one_lock_exactly_one_acts_and_the_other_takes_over_when_it_is_gone() {
    rt().block_on(async {
        let server = Arc::new(Mutex::new(Server::default()));
        let (a, b) = (Leadership::shared("a", FENCE, None), Leadership::shared("b", FENCE, None));
        let (mut la, mut lb) = (FakeLock::on(&server), FakeLock::on(&server));
        assert!(!a.may_act() && !b.may_act(), "followers until the lock is taken");
        let mut held_a = step(&a, &mut la, PACE, false).await;
        let mut held_b = step(&b, &mut lb, PACE, false).await;
        for _ in 0..5 {
            held_a = step(&a, &mut la, PACE, held_a).await;
            held_b = step(&b, &mut lb, PACE, held_b).await;
            assert!(a.may_act() && !b.may_act());
        }
        let vb = b.view();
        assert_eq!(vb.acting_instance.as_deref(), Some("connection 1"), "the follower names the holder");
        assert_eq!((a.view().takeovers, vb.takeovers), (1, 0));

        // a's process dies: its connection ends and the server frees the lock.
        drop(la);
        server.lock().unwrap().holder = None;
        held_b = step(&b, &mut lb, PACE, held_b).await;
        assert!(held_b && b.may_act());
        let vb = b.view();
        assert_eq!((vb.acting_instance.as_deref(), vb.takeovers), (Some("b"), 1));
        assert!(vb.last_takeover.is_some() && vb.acting_since.is_some());

        // a comes back: it follows, and b keeps acting (no flap).
        let a = Leadership::shared("a", FENCE, None);
        let mut la = FakeLock::on(&server);
        let mut held_a = false;
        for _ in 0..5 {
            held_a = step(&a, &mut la, PACE, held_a).await;
            held_b = step(&b, &mut lb, PACE, held_b).await;
            assert!(!a.may_act() && b.may_act());
        }
        assert_eq!(b.view().takeovers, 1);
    });
}

#[test]
fn a_lock_the_server_gave_away_demotes_at_once_and_the_connection_is_closed() {
    rt().block_on(async {
        let server = Arc::new(Mutex::new(Server::default()));
        let a = Leadership::shared("a", FENCE, None);
        let mut la = FakeLock::on(&server);
        let closes = la.closes.clone();
        let held = step(&a, &mut la, PACE, false).await;
        assert!(held && a.may_act());
        // The server ended a's connection (wait_timeout) and gave the lock to another.
        server.lock().unwrap().holder = Some(99);
        let held = step(&a, &mut la, PACE, held).await;
        assert!(!held && !a.may_act());
        assert_eq!(*closes.lock().unwrap(), 1);
        let v = a.view();
        assert!(v.last_error.as_deref().is_some_and(|e| e.contains("another connection")), "{v:?}");
        assert_eq!(v.acting_instance, None);
        // The other lets go: a takes the lock again, a second takeover.
        server.lock().unwrap().holder = None;
        let held = step(&a, &mut la, PACE, held).await;
        assert!(held && a.may_act());
        assert_eq!(a.view().takeovers, 2);
    });
}

#[test]
fn a_server_that_errs_or_does_not_answer_within_the_fence_demotes_the_acting_instance() {
    rt().block_on(async {
        let server = Arc::new(Mutex::new(Server::default()));
        let a = Leadership::shared("a", FENCE, None);
        let mut la = FakeLock::on(&server);
        let held = step(&a, &mut la, PACE, false).await;
        assert!(held);
        server.lock().unwrap().down = true;
        let held = step(&a, &mut la, PACE, held).await;
        assert!(!held && !a.may_act());
        assert!(a.view().last_error.unwrap().contains("connection refused"));
        // Following while the server is down: no act, the error shown.
        let _ = step(&a, &mut la, PACE, held).await;
        assert!(!a.may_act());
        server.lock().unwrap().down = false;
        let held = step(&a, &mut la, PACE, false).await;
        assert!(held && a.may_act());
        // A silent server (a cut link with no reset): no answer within
        // answer_within, and the instance stops acting.
        server.lock().unwrap().silent = true;
        let t0 = Instant::now();
        let held = step(&a, &mut la, PACE, held).await;
        assert!(!held && !a.may_act());
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(a.view().last_error.unwrap().contains("did not confirm"));
    });
}

#[test]
fn the_fence_refuses_to_act_on_a_confirmation_older_than_it_and_the_stale_lock_is_let_go() {
    rt().block_on(async {
        let server = Arc::new(Mutex::new(Server::default()));
        let a = Leadership::shared("a", FENCE, None);
        let mut la = FakeLock::on(&server);
        let closes = la.closes.clone();
        let t0 = Instant::now();
        let held = step(&a, &mut la, PACE, false).await;
        assert!(held);
        assert!(a.may_act_at(t0 + FENCE - Duration::from_millis(100)));
        // Paused past the fence (no confirmation since): the next command
        // is refused, whatever the lock's task believed.
        assert!(!a.may_act_at(t0 + FENCE + Duration::from_millis(100)));
        assert!(!a.may_act(), "demoted, not just refused once");
        assert!(a.view().last_error.unwrap().contains("past the fence"));
        // The lock's task then closes the connection that may still hold
        // the lock before it tries again.
        let held = step(&a, &mut la, PACE, held).await;
        assert_eq!(*closes.lock().unwrap(), 1);
        assert!(held, "taken again on a fresh connection");
        assert_eq!(a.view().takeovers, 2);
    });
}

#[test]
fn a_late_answer_never_moves_the_confirmation_back() {
    let a = Leadership::shared("a", FENCE, None);
    let t0 = Instant::now();
    a.acquired(t0);
    a.confirmed(t0 + Duration::from_secs(1));
    a.confirmed(t0);
    assert!(a.may_act_at(t0 + FENCE + Duration::from_millis(500)));
}

/// A connection that is no onepoold instance of this configuration holds
/// the lock (it learned the name, but has no proof): the followers say so
/// in status and metrics once two checks in a row found it, then take the
/// lock the moment it lets go.
#[test]
fn a_stranger_holding_the_lock_is_named_and_the_followers_take_it_when_it_lets_go() {
    rt().block_on(async {
        let server = Arc::new(Mutex::new(Server::default()));
        let m = Arc::new(Metrics::new());
        let a = Leadership::shared("a", FENCE, Some(m.clone()));
        let mut la = FakeLock::on(&server);
        {
            let mut s = server.lock().unwrap();
            s.holder = Some(77);
            s.stranger = true;
        }
        let held = step(&a, &mut la, PACE, false).await;
        assert!(!held && a.view().foreign_holder.is_none(), "one check may fall between a lock and its proof");
        let held = step(&a, &mut la, PACE, held).await;
        let v = a.view();
        assert!(!held && !a.may_act());
        assert_eq!(v.foreign_holder.as_deref(), Some("connection 77"), "{v:?}");
        assert!(m.encode().contains("onepool_ha_lock_foreign{instance=\"a\"} 1"), "{}", m.encode());
        // The stranger lets go: taken at once, and the alarm ends.
        server.lock().unwrap().holder = None;
        let held = step(&a, &mut la, PACE, held).await;
        assert!(held && a.may_act());
        assert_eq!(a.view().foreign_holder, None);
        assert!(m.encode().contains("onepool_ha_lock_foreign{instance=\"a\"} 0"), "{}", m.encode());
        // An instance of ours holding it is no stranger.
        let b = Leadership::shared("b", FENCE, None);
        let mut lb = FakeLock::on(&server);
        for _ in 0..3 {
            let _ = step(&b, &mut lb, PACE, false).await;
        }
        assert_eq!(b.view().foreign_holder, None);
    });
}

#[test]
fn the_metrics_say_which_instance_acts_since_when_and_its_takeovers() {
    let m = Arc::new(Metrics::new());
    let a = Leadership::shared("svc-a", FENCE, Some(m.clone()));
    let text = m.encode();
    assert!(text.contains("onepool_ha_acting{instance=\"svc-a\"} 0"), "{text}");
    a.acquired(Instant::now());
    let text = m.encode();
    assert!(text.contains("onepool_ha_acting{instance=\"svc-a\"} 1"), "{text}");
    assert!(text.contains("onepool_ha_takeovers_total{instance=\"svc-a\"} 1"), "{text}");
    assert!(!text.contains("onepool_ha_acting_since_seconds{instance=\"svc-a\"} 0"), "{text}");
    assert!(!text.contains("onepool_ha_last_takeover_seconds{instance=\"svc-a\"} 0"), "{text}");
    a.lost("test".into());
    let text = m.encode();
    assert!(text.contains("onepool_ha_acting{instance=\"svc-a\"} 0"), "{text}");
    assert!(text.contains("onepool_ha_takeovers_total{instance=\"svc-a\"} 1"), "{text}");
}
