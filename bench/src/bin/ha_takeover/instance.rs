//! One onepoold of the pair: the real binary, as its service user, in a
//! service host's network namespace, listening on that host's address.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use onepool_control::api::{Leadership, ReplicaState, State};
use onepool_dev_cluster::hosts::{in_namespace, Host};
use onepool_elastic_daemon::config::{AccessLogFile, ConfigFile, HaFile};
use onepool_tests::build_dir;
use onepool_tests::elastic::{control_state, wait};

/// The endpoints' port on both hosts (each binds its own address).
pub const PORT: u16 = 8000;
const METRICS_PORT: u16 = 9100;

pub struct Instance {
    pub host: Host,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// The service user's uid and gid (the dev cluster creates it).
pub fn service_user() -> (u32, u32) {
    let user = onepool_decisions::policy::SERVICE_USER;
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, user]).output().expect("id");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("no user {user}"))
    };
    (id("-u"), id("-g"))
}

impl Instance {
    /// Writes the instance's configuration: `base` (the same for both) with
    /// this host's name, addresses, control socket and decision log.
    pub fn new(base: &ConfigFile, shared: &Path, host: Host) -> Instance {
        let dir = shared.join(&host.name);
        std::fs::create_dir_all(&dir).unwrap();
        let (uid, gid) = service_user();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let mut file = base.clone();
        let ip = IpAddr::V4(host.address);
        file.control_socket = dir.join("onepoold.sock");
        file.endpoints[0].listen = Some(SocketAddr::new(ip, PORT));
        // onepoold serves metrics on loopback only: the host's own.
        file.metrics_address = Some(SocketAddr::from(([127, 0, 0, 1], METRICS_PORT)));
        file.decision_log = Some(AccessLogFile { path: dir.join("decisions.jsonl"), ..Default::default() });
        let ha: &mut HaFile = file.ha.as_mut().expect("the base configuration's [ha]");
        ha.instance = Some(host.name.clone());
        let config = dir.join("onepoold.toml");
        file.write(&config).unwrap();
        Instance { config, socket: dir.join("onepoold.sock"), log: dir.join("onepoold.log"), host, child: None }
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.host.address), PORT)
    }

    /// Starts onepoold on its host and waits for its control socket.
    pub fn start(&mut self) {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let user = onepool_decisions::policy::SERVICE_USER;
        // setpriv execs (runuser would stay as a parent): the PID is onepoold's.
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
            .arg(build_dir().join("onepoold"))
            .arg("--config")
            .arg(&self.config)
            .env("ONEPOOLD_LOG", "info");
        let child = in_namespace(&cmd, &self.host)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting onepoold");
        self.child = Some(child);
        wait(&format!("{}'s control socket", self.host.name), Duration::from_secs(30), || self.state().is_some());
    }

    /// SIGKILL to every process of the host's namespace (`ip netns pids`),
    /// as when the host dies; returns how many there were.
    pub fn kill_host(&mut self) -> usize {
        let out = Command::new("ip").args(["netns", "pids", &self.host.namespace]).output().expect("ip netns pids");
        let pids: Vec<String> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect();
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-9").args(&pids).status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        pids.len()
    }

    /// Cuts the host's link (`ip -n NS link set eth0 down`) or puts it back:
    /// its processes run on, unreachable and unable to reach anything.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args(["-n", &self.host.namespace, "link", "set", "eth0", state])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip -n {} link set eth0 {state}", self.host.namespace);
    }

    /// SIGTERM and wait: the replica jobs stay (for the next start).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }

    pub fn state(&self) -> Option<State> {
        control_state(&self.socket)
    }

    pub fn leadership(&self) -> Leadership {
        self.state().and_then(|s| s.leadership).unwrap_or_default()
    }

    /// Replicas this instance's router sends requests to.
    pub fn ready(&self, endpoint: &str) -> usize {
        let s = self.state().unwrap_or_default();
        s.endpoint(endpoint).map_or(0, |e| e.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count())
    }

    /// What this instance decided (its decision log).
    pub fn decisions(&self) -> usize {
        let text = std::fs::read_to_string(self.config.with_file_name("decisions.jsonl")).unwrap_or_default();
        text.lines().filter(|l| !l.trim().is_empty()).count()
    }

    /// A metric's value from the instance's /metrics, read on its host.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "5", &format!("http://127.0.0.1:{METRICS_PORT}/metrics")]);
        let out = in_namespace(&curl, &self.host).output().ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.split(['{', ' ']).next() == Some(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A link cut by a run that failed half-way is put back, or the
        // cluster keeps a host off the network.
        let _ = Command::new("ip").args(["-n", &self.host.namespace, "link", "set", "eth0", "up"]).status();
        self.stop();
    }
}
