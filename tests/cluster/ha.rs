//! Two onepoold instances with one configuration (issue #37, docs/ha.md):
//! both route to the endpoint's replica, exactly one acts on Slurm, and
//! when the acting one is killed with SIGKILL the other acts within 5 s,
//! says so in its status and metrics, and restarts no replica; the killed
//! one, started again, follows and takes nothing back. The lock is
//! GET_LOCK on the cluster's own MariaDB (the accounting database), over
//! TLS pinned to the certificate the dev cluster made for it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use onepool_control::api::{Leadership, ReplicaState, State};
use onepool_elastic_daemon::config::HaFile;
use onepool_tests::elastic::{completion, control_state, daemon_config, metric, queue, scratch, wait};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster};

const ENDPOINT: &str = "ha";

/// One onepoold process of the pair: its own state, socket, ports and log.
struct Instance {
    name: &'static str,
    config: PathBuf,
    socket: PathBuf,
    port: u16,
    metrics: u16,
    log: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Instance {
    fn new(c: &TestCluster, shared: &Path, name: &'static str, lock_name: &str) -> Instance {
        let dir = shared.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let lock = c.cluster.ha_lock().expect("the cluster's HA lock");
        let (port, metrics) = (free_port(), free_port());
        let mut file = daemon_config(c, shared, ENDPOINT, |_| {});
        file.control_socket = dir.join("onepoold.sock");
        file.endpoints[0].listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
        file.metrics_address = Some(SocketAddr::from(([127, 0, 0, 1], metrics)));
        file.decision_log = Some(onepool_elastic_daemon::config::AccessLogFile {
            path: dir.join("decisions.jsonl"),
            ..Default::default()
        });
        // Defaults for the pace: confirmed every 1 s, lost after 3 s.
        file.ha = Some(HaFile {
            instance: Some(name.into()),
            lock: Some("mariadb".into()),
            database: Some(format!("{}:{}", lock.host, lock.port)),
            user: Some(lock.user.clone()),
            password_file: Some(lock.password_file.clone()),
            ca_file: Some(lock.ca_file.clone()),
            lock_name: Some(lock_name.into()),
            ..HaFile::default()
        });
        let config = dir.join("onepoold.toml");
        file.write(&config).unwrap();
        let log = dir.join("onepoold.log");
        Instance { name, config, socket: dir.join("onepoold.sock"), port, metrics, log, child: None }
    }

    fn start(&mut self) {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(build_dir().join("onepoold"))
            .args(["--allow-root", "--config"])
            .arg(&self.config)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting onepoold");
        self.child = Some(child);
        wait(&format!("{}'s control socket", self.name), Duration::from_secs(30), || self.state().is_some());
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    fn state(&self) -> Option<State> {
        control_state(&self.socket)
    }

    fn leadership(&self) -> Leadership {
        self.state().and_then(|s| s.leadership).unwrap_or_default()
    }

    /// Replicas this instance's router sends requests to.
    fn ready(&self) -> usize {
        let s = self.state().unwrap_or_default();
        s.endpoint(ENDPOINT).map_or(0, |e| e.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count())
    }

    fn decisions(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.config.with_file_name("decisions.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Two instances of one configuration in `dir` (lock `lock_name`): svc-a
/// started first and acting, svc-b started after it and seeing the lock held.
fn acting_and_following(c: &TestCluster, dir: &Path, lock_name: &str) -> (Instance, Instance) {
    let mut a = Instance::new(c, dir, "svc-a", lock_name);
    let mut b = Instance::new(c, dir, "svc-b", lock_name);
    a.start();
    wait("svc-a to act", Duration::from_secs(10), || a.leadership().acting);
    b.start();
    wait("svc-b to see the lock held", Duration::from_secs(10), || b.leadership().acting_instance.is_some());
    (a, b)
}

fn replica_jobs(c: &TestCluster) -> BTreeSet<u32> {
    queue(c).into_iter().filter(|q| q.name.starts_with(&format!("onepool-{ENDPOINT}-"))).map(|q| q.id).collect()
}

#[test]
fn of_two_instances_one_acts_and_the_other_takes_over_within_5s_of_a_sigkill_without_restarting_replicas() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("ha");
    let lock_name = format!("onepoold.test-ha-{}", std::process::id());
    let (mut a, b) = acting_and_following(c, &dir, &lock_name);
    let lb = b.leadership();
    assert!(lb.shared && !lb.acting && lb.takeovers == 0, "svc-b follows: {lb:?}");
    eprintln!("svc-b follows; acting: {:?}", lb.acting_instance);

    // Both route to the baseline replica svc-a submitted.
    wait("both routers to have the baseline replica ready", Duration::from_secs(90), || {
        a.ready() == 1 && b.ready() == 1
    });
    assert_eq!(completion(a.port, 0.05), Some(200), "through svc-a");
    assert_eq!(completion(b.port, 0.05), Some(200), "through svc-b, the follower");
    let before = replica_jobs(c);
    assert_eq!(before.len(), 1, "one baseline replica, submitted once: {before:?}");
    let decided = a.decisions();
    assert!(
        decided.iter().any(|d| d["action"] == "submit" && d["instance"] == "svc-a"),
        "svc-a's decision log names it: {decided:?}"
    );
    assert!(b.decisions().is_empty(), "the follower decided nothing: {:?}", b.decisions());
    let la = a.leadership();
    assert_eq!(la.acting_instance.as_deref(), Some("svc-a"));
    assert!(la.acting_since.is_some() && la.takeovers == 1, "{la:?}");
    assert_eq!(metric(a.metrics, "onepool_ha_acting"), Some(1.0));
    assert_eq!(metric(b.metrics, "onepool_ha_acting"), Some(0.0));

    // The acting host dies.
    let t0 = Instant::now();
    a.kill9();
    wait("svc-b to act", Duration::from_secs(10), || b.leadership().acting);
    let took = t0.elapsed();
    eprintln!("svc-b acts {:.2} s after svc-a's SIGKILL", took.as_secs_f64());
    assert!(took < Duration::from_secs(5), "takeover within 5 s: {took:?}");
    let lb = b.leadership();
    assert_eq!(lb.acting_instance.as_deref(), Some("svc-b"));
    assert_eq!(lb.takeovers, 1);
    let (since, last) = (lb.acting_since.unwrap(), lb.last_takeover.unwrap());
    assert!((since - last).abs() < 0.01, "acting since its takeover: {lb:?}");
    assert_eq!(metric(b.metrics, "onepool_ha_acting"), Some(1.0));
    assert_eq!(metric(b.metrics, "onepool_ha_takeovers_total"), Some(1.0));
    assert!(metric(b.metrics, "onepool_ha_last_takeover_seconds").is_some_and(|t| (t - last).abs() < 0.01));

    // Nothing was restarted: the same job serves, through the survivor.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(replica_jobs(c), before, "the replica job survived the takeover, none was added");
    assert_eq!(b.ready(), 1);
    assert_eq!(completion(b.port, 0.05), Some(200));
    assert!(b.decisions().is_empty(), "the new acting instance had nothing to change: {:?}", b.decisions());

    // svc-a comes back: it follows; svc-b keeps acting throughout.
    a.start();
    wait("svc-a to see svc-b's lock", Duration::from_secs(10), || a.leadership().acting_instance.is_some());
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        let (la, lb) = (a.leadership(), b.leadership());
        assert!(!la.acting && lb.acting, "no flap: svc-a {la:?}, svc-b {lb:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(b.leadership().takeovers, 1);
    assert_eq!(a.leadership().takeovers, 0, "a restarted instance counts afresh");
    wait("svc-a routes to the replica again", Duration::from_secs(30), || a.ready() == 1);
    assert_eq!(completion(a.port, 0.05), Some(200));
    assert_eq!(replica_jobs(c), before);
    assert!(!b.log_text().contains("panicked") && !a.log_text().contains("panicked"));
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A paused acting instance (SIGSTOP past `lost_after`): the server frees
/// its lock, the other acts within 5 s; resumed, the paused one finds its
/// last confirmation older than the fence and acts on nothing, then follows.
#[test]
fn a_paused_acting_instance_loses_the_lock_and_on_resume_acts_on_nothing() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("ha-pause");
    let lock_name = format!("onepoold.test-ha-pause-{}", std::process::id());
    let mut a = Instance::new(c, &dir, "svc-a", &lock_name);
    let mut b = Instance::new(c, &dir, "svc-b", &lock_name);
    a.start();
    wait("svc-a to act", Duration::from_secs(10), || a.leadership().acting);
    b.start();
    wait("both routers to have the baseline replica ready", Duration::from_secs(90), || {
        a.ready() == 1 && b.ready() == 1
    });
    let before = replica_jobs(c);
    let decided = a.decisions().len();
    assert!(!b.leadership().acting);

    let t0 = Instant::now();
    a.signal(libc::SIGSTOP);
    wait("svc-b to act", Duration::from_secs(10), || b.leadership().acting);
    let took = t0.elapsed();
    eprintln!("svc-b acts {:.2} s after svc-a was paused", took.as_secs_f64());
    assert!(took < Duration::from_secs(5), "takeover within 5 s of the pause: {took:?}");
    std::thread::sleep(Duration::from_secs(8).saturating_sub(t0.elapsed()));
    a.signal(libc::SIGCONT);
    let resumed = Instant::now();
    wait("svc-a to follow", Duration::from_secs(5), || !a.leadership().acting);
    eprintln!("svc-a follows {:.2} s after it resumed", resumed.elapsed().as_secs_f64());
    let la = a.leadership();
    assert!(la.last_error.is_some(), "svc-a says why it stopped acting: {la:?}");
    eprintln!("svc-a: {:?}", la.last_error);
    for _ in 0..20 {
        assert!(!a.leadership().acting && b.leadership().acting, "no flap");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(a.decisions().len(), decided, "svc-a decided nothing after its pause: {:?}", a.decisions());
    assert_eq!(replica_jobs(c), before, "nothing submitted or cancelled");
    assert_eq!(b.leadership().takeovers, 1);
    assert_eq!(completion(a.port, 0.05), Some(200), "svc-a routes on as a follower");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A database account of its own, with no privileges at all, that waits
/// for a named lock (`SELECT GET_LOCK(name, 100000)`) until killed: what
/// any of a site's other tools with an account on the server can do.
struct Squatter(Child);

impl Squatter {
    fn wait_for(c: &TestCluster, lock: &str) -> Squatter {
        let socket = c.cluster.layout.db_socket();
        let root = |sql: &str| {
            let out = Command::new("mariadb")
                .args(["--no-defaults", &format!("--socket={}", socket.display()), "-u", "root", "-N", "-e", sql])
                .output()
                .unwrap();
            assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        };
        root("CREATE USER IF NOT EXISTS 'op-squatter'@'localhost' IDENTIFIED BY 'squat'; FLUSH PRIVILEGES;");
        let child = Command::new("mariadb")
            .args(["--no-defaults", &format!("--socket={}", socket.display()), "-u", "op-squatter", "-psquat", "-N"])
            // Held for as long as the connection lasts: it sleeps on.
            .args(["-e", &format!("SELECT GET_LOCK('{lock}', 100000); SELECT SLEEP(100000)")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Squatter(child)
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops MariaDB (SIGTERM, as `systemctl restart` does) and starts it
/// again through the cluster's `up`, which starts what is not running.
fn restart_mariadb(c: &TestCluster) {
    let pid_file = c.cluster.layout.run().join("mariadbd.pid");
    // MariaDB's own pid file, or the harness's "PID START" in its place.
    let text = std::fs::read_to_string(&pid_file).unwrap();
    let pid: i32 = text.split_whitespace().next().and_then(|p| p.parse().ok()).expect("MariaDB's pid");
    // SAFETY: signalling the cluster's own MariaDB by its recorded pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    // Gone, or a zombie: a cluster this test process brought up has its
    // MariaDB as a child nobody reaps until the process ends.
    let gone = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    };
    wait("MariaDB to stop", Duration::from_secs(60), gone);
    c.cluster.up(&onepool_tests::up_options(), &mut |m| eprintln!("test-cluster: {m}")).unwrap();
}

/// Lock squatting (issue #42), by a database account with no privileges:
/// - waiting on the lock's old public name (`onepoold.<name>`) gets it
///   nothing: the follower acts within 5 s of the holder's SIGKILL, and
///   within seconds of a MariaDB restart;
/// - holding the real name (a leak: it is made with the replica key) when
///   no instance does, it cannot prove itself: status and metrics name it
///   and say no instance acts; an instance acts within 5 s of its going.
#[test]
#[allow(clippy::too_many_lines, reason = "one attack on a real cluster, read top to bottom")]
fn a_squatter_without_the_replica_key_cannot_silently_hold_the_lock() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("ha-squat");
    let lock_name = format!("onepoold.test-squat-{}", std::process::id());
    let (mut a, mut b) = acting_and_following(c, &dir, &lock_name);

    // The old, public name: the squatter waits on it (and holds it) in vain.
    let public = Squatter::wait_for(c, &lock_name);
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    a.kill9();
    wait("svc-b to act", Duration::from_secs(10), || b.leadership().acting);
    eprintln!("svc-b acts {:.2} s after svc-a's SIGKILL, a squatter on the public name", t0.elapsed().as_secs_f64());
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(b.leadership().foreign_holder, None);
    // MariaDB restarts (every connection ends, the lock's too): the
    // squatter's client is gone with it, and an instance takes the lock
    // again within seconds of the server's return.
    a.start();
    wait("svc-a to follow", Duration::from_secs(10), || a.leadership().acting_instance.is_some());
    let takeovers = |x: &Instance| x.leadership().takeovers;
    let before = takeovers(&a) + takeovers(&b);
    let t0 = Instant::now();
    restart_mariadb(c);
    let back = t0.elapsed();
    wait("an instance to take the lock after MariaDB's restart", Duration::from_secs(15), || {
        takeovers(&a) + takeovers(&b) > before && (a.leadership().acting || b.leadership().acting)
    });
    let after = t0.elapsed() - back;
    eprintln!(
        "MariaDB restarted in {:.2} s; an instance took the lock {:.2} s after it was back",
        back.as_secs_f64(),
        after.as_secs_f64()
    );
    assert!(after < Duration::from_secs(5), "{after:?}");
    drop(public);

    // The real name, leaked, taken while no instance holds it.
    let key = std::fs::read_to_string(dir.join("replica.key")).unwrap();
    let real = onepool_elastic_daemon::leader::names::LockNames::new(key.trim(), &lock_name).main;
    a.kill9();
    b.kill9();
    let squatter = Squatter::wait_for(c, &real);
    std::thread::sleep(Duration::from_secs(1));
    a.start();
    wait("svc-a to name the stranger", Duration::from_secs(10), || a.leadership().foreign_holder.is_some());
    let l = a.leadership();
    eprintln!("svc-a: {:?}", l.foreign_holder);
    assert!(!l.acting);
    assert_eq!(metric(a.metrics, "onepool_ha_lock_foreign"), Some(1.0));
    assert_eq!(metric(a.metrics, "onepool_ha_acting"), Some(0.0));
    let out = c
        .cmd(build_dir().join("onepool").to_str().unwrap())
        .arg("status")
        .arg("--socket")
        .arg(&a.socket)
        .arg("--policy")
        .arg(onepool_tests::test_policy())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("onepool status:\n{text}");
    assert!(text.contains("NO INSTANCE ACTS: the lock is held by"), "onepool status:\n{text}");
    assert!(a.log_text().contains("which is not an onepoold instance of this configuration"), "{}", a.log_text());
    let t0 = Instant::now();
    drop(squatter);
    wait("svc-a to act once the squatter is gone", Duration::from_secs(10), || a.leadership().acting);
    eprintln!("svc-a acts {:.2} s after the squatter's connection ended", t0.elapsed().as_secs_f64());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(a.leadership().foreign_holder, None);
    assert_eq!(metric(a.metrics, "onepool_ha_lock_foreign"), Some(0.0));
    assert!(!a.log_text().contains("panicked"));
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}
