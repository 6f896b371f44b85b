//! The onepoold binary restarted under continuous load on a listening
//! socket it is handed (systemd's socket activation, emulated here as
//! systemd does it: the socket is opened once, outside onepoold, and given
//! to each process as descriptor 3 with LISTEN_PID and LISTEN_FDS). No
//! client is ever refused: across a SIGTERM restart and an upgrade to
//! another binary no request fails; a SIGKILL loses only the requests that
//! process held at that moment.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// How one request through the listener ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Status(u16),
    /// Nothing accepted the connection.
    Refused,
    /// Accepted, then cut before a whole answer.
    Cut,
}

/// One request on a connection of its own (`connection: close`): a
/// connection kept from before a restart would hide whether the new
/// process accepts.
fn one_request(client: &onepool_client::blocking::Client, addr: SocketAddr) -> Outcome {
    let r = client.request(
        http::Method::GET,
        &format!("http://{addr}/sleep/150"),
        None,
        &[("connection", "close")],
        1 << 20,
    );
    match r {
        Ok(answer) => Outcome::Status(answer.status.as_u16()),
        Err(e) if e.connect_error().is_some() => Outcome::Refused,
        Err(_) => Outcome::Cut,
    }
}

/// Clients sending back to back until stopped; every outcome with when it ended.
struct Clients {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<(Instant, Outcome)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Clients {
    fn start(addr: SocketAddr, n: usize) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..n)
            .map(|_| {
                let (stop, outcomes) = (stop.clone(), outcomes.clone());
                std::thread::spawn(move || {
                    let client = onepool_client::blocking::Client::new(Duration::from_secs(30));
                    while !stop.load(Ordering::SeqCst) {
                        let o = one_request(&client, addr);
                        outcomes.lock().unwrap().push((Instant::now(), o));
                    }
                })
            })
            .collect();
        Clients { stop, outcomes, threads }
    }

    fn since(&self, t: Instant) -> Vec<Outcome> {
        self.outcomes.lock().unwrap().iter().filter(|(at, _)| *at >= t).map(|(_, o)| o.clone()).collect()
    }

    fn finish(self) -> Vec<(Instant, Outcome)> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.outcomes).unwrap().into_inner().unwrap()
    }
}

/// onepoold from `binary`, handed `socket` as descriptor 3.
fn spawn(binary: &Path, config: &Path, socket: &TcpListener) -> Child {
    let mut cmd = Command::new("sh");
    // LISTEN_PID must be the daemon's own pid: the shell's, which exec keeps.
    cmd.args(["-c", "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" --config \"$1\"", &binary.display().to_string()])
        .arg(config)
        .env("ONEPOOLD_LOG", "warn");
    onepool_elastic_daemon::inherited::hand_over(&mut cmd, socket);
    cmd.spawn().expect("onepoold starts")
}

/// Waits for the daemon's control socket, then puts the replica in its router.
fn add_replica(rt: &tokio::runtime::Runtime, control: &Path, replica: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let add = onepool_control::api::AddReplica { address: replica, concurrency: None, ready: None, pin: None };
        let r = rt.block_on(onepool_control::Control::new(control, Duration::from_secs(5)).add_replica("chat", &add));
        match r {
            Ok(_) => return,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("adding the replica: {other:?}"),
        }
    }
}

fn signal(child: &Child, sig: i32) {
    onepool_os::signal(child.id(), sig).expect("signalling onepoold, our own child");
}

#[test]
fn restarts_and_an_upgrade_on_a_handed_over_socket_refuse_no_client() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let replica = rt.block_on(backend(Mode::Normal));
    let dir = std::env::temp_dir().join(format!("onepool-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The socket systemd would hold (onepoold.socket): open once, for good.
    let socket = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let control = dir.join("onepoold.sock");
    let config = dir.join("onepoold.toml");
    std::fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\nshutdown_grace = \"10s\"\n[[endpoint]]\nname = \"chat\"\nlisten = \"{addr}\"\n\
             queue_size = 1000\nqueue_timeout = \"20s\"\n",
            control.display()
        ),
    )
    .unwrap();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_onepoold"));
    // A new process on the socket, its replica in its router, then a
    // second of load through it.
    let start = |binary: &Path| {
        let d = spawn(binary, &config, &socket);
        add_replica(&rt, &control, replica.addr);
        d
    };
    let mut daemon = start(&binary);
    let clients = Clients::start(addr, 8);
    std::thread::sleep(Duration::from_secs(1));

    // SIGTERM (systemctl restart): the old process stops accepting and
    // finishes what it holds; connections meanwhile wait in the backlog.
    let t_term = Instant::now();
    signal(&daemon, onepool_os::SIGTERM);
    assert!(daemon.wait().unwrap().success());
    daemon = start(&binary);
    std::thread::sleep(Duration::from_secs(1));

    // An upgrade: the same, with another binary file.
    let upgraded = dir.join("onepoold-upgraded");
    std::fs::copy(&binary, &upgraded).unwrap();
    let t_upgrade = Instant::now();
    signal(&daemon, onepool_os::SIGTERM);
    assert!(daemon.wait().unwrap().success());
    daemon = start(&upgraded);
    std::thread::sleep(Duration::from_secs(1));
    let graceful = clients.since(t_term);
    assert!(!graceful.is_empty() && clients.since(t_upgrade).len() > 8, "requests went on across the restarts");
    assert!(graceful.iter().all(|o| *o == Outcome::Status(200)), "SIGTERM restart and upgrade: {graceful:?}");

    // SIGKILL: what the killed process held is lost, nothing else.
    let t_kill = Instant::now();
    signal(&daemon, onepool_os::SIGKILL);
    daemon.wait().unwrap();
    daemon = start(&binary);
    std::thread::sleep(Duration::from_secs(1));
    let all = clients.finish();
    signal(&daemon, onepool_os::SIGTERM);
    assert!(daemon.wait().unwrap().success());
    let after_kill: Vec<Outcome> = all.iter().filter(|(at, _)| *at >= t_kill).map(|(_, o)| o.clone()).collect();
    let lost = after_kill.iter().filter(|o| **o != Outcome::Status(200)).count();
    assert!(
        after_kill.iter().all(|o| matches!(o, Outcome::Status(200) | Outcome::Cut)),
        "none refused: {after_kill:?}"
    );
    assert!(lost <= 8, "at most the 8 clients' requests in flight at the kill: {lost} lost");
    eprintln!(
        "{} requests; after SIGTERM and upgrade: {} all 200; after SIGKILL: {} lost of {}",
        all.len(),
        graceful.len(),
        lost,
        after_kill.len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
