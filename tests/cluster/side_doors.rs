//! onepoold's replicas tried the way an ordinary cluster user would get
//! around the router (issue #25), and replica commands that cannot start
//! (issue #24), on the real cluster with onepoold in-process. Each test
//! ends where every attack ends: protected serving still answers and
//! protected training still gets its GPUs.
//!
//! - A user's CPU-only job binds every port of `port_range` first: the
//!   replicas listen where the kernel chooses and report it in their job's
//!   comment, so the baseline serves anyway.
//! - The same user finds every listening port of the node (/proc/net/tcp is
//!   readable by all) and asks each for a chat completion: only the router
//!   answers; the launcher speaks TLS only (issue #36: a clear request
//!   gets no HTTP answer) and wants onepoold's key inside it, the model
//!   server its own. With the key, the model server's administrative
//!   paths are still refused; a client that stalls in its handshake is cut
//!   at the launcher's header timeout.
//! - Replica commands that exit at once, die of SIGSEGV or never become
//!   healthy: each endpoint backs off (a handful of jobs, not one a poll),
//!   `onepool status` names the cause and the next attempt, and once the
//!   command is fixed, `onepool retry` brings the endpoint back without a
//!   restart of onepoold.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use onepool_elastic_daemon::config::ReplicasFile;
use onepool_elastic_daemon::daemon::Daemon;
use onepool_router::backend_pool::Transport;
use onepool_tests::elastic::{
    assert_untouched, daemon_config, foreign_job, protected_training, replica_view, request, runtime, scratch, serving,
    stand_in_server, start_daemon, wait,
};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster, User};

const ENDPOINT: &str = "chat";

fn attacker(c: &TestCluster) -> User {
    c.user("op-mal", "research")
}

/// A chat completion through the router answers 200.
fn router_answers(port: u16) -> bool {
    request(port, "POST", "/v1/chat/completions", r#"{"max_tokens": 4}"#) == Some(200)
}

/// Binds every port from `lo` to `hi` (both included) on all addresses and
/// holds them; prints "bound N" once done.
const SQUATTER: &str = r#"
import socket, sys, time
lo, hi = int(sys.argv[1]), int(sys.argv[2])
held = []
for p in range(lo, hi + 1):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p)); s.listen(1); held.append(s)
    except OSError:
        pass
print("bound", len(held), flush=True)
time.sleep(600)
"#;

/// Every TCP port listening on this host (from /proc/net/tcp, which any
/// user may read), except `skip`; a POST of a chat completion to each,
/// "PORT STATUS" per line ("PORT -" without an HTTP answer).
const SCANNER: &str = r#"
import socket, sys
skip = set(int(p) for p in sys.argv[1:])
ports = set()
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        for line in open(f).read().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A":
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    except OSError:
        pass
body = b'{"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
for p in sorted(ports - skip):
    status = "-"
    try:
        s = socket.create_connection(("127.0.0.1", p), timeout=0.5)
        s.settimeout(0.5)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        head = s.recv(64).split(b" ")
        if len(head) > 1 and head[0].startswith(b"HTTP/"):
            status = head[1].decode()
        s.close()
    except OSError:
        pass
    print(p, status, flush=True)
"#;

/// Connects to `address`, sends half a TLS record header (the start of a
/// handshake) and waits; prints the seconds until the server closed the
/// connection.
const SLOW_CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
s.sendall(b"\x16\x03\x01")
t0 = time.time()
try:
    while s.recv(1024):
        pass
except OSError:
    pass
print("%.1f" % (time.time() - t0), flush=True)
"#;

/// The GET of `path` at the replica at `address` with `key`, over TLS
/// pinned to its certificate as onepoold's router reaches it (on a
/// connection of the router's own): the status.
fn get(
    rt: &onepool_elastic_daemon::tokio::runtime::Runtime,
    d: &Daemon,
    address: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> Option<u16> {
    let conns = d.endpoint(ENDPOINT)?.endpoint.conns_of(address)?;
    let fields: Vec<_> = key
        .and_then(|k| http::HeaderValue::from_str(k).ok())
        .map(|k| (onepool_router::REPLICA_KEY_HEADER, k))
        .into_iter()
        .collect();
    let t = Duration::from_secs(10);
    let (status, _) =
        rt.block_on(onepool_router::replica_client::get(&conns, address, path, &fields, t, t, 1 << 16)).ok()?;
    Some(status.as_u16())
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn squatted_ports_and_keyless_or_administrative_requests_leave_protected_serving_untouched() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("side-doors");
    let config = dir.join("onepoold.toml");
    let mut range = (0, 0);
    daemon_config(c, &dir, ENDPOINT, |r| {
        r.max = Some(1);
        range = r.port_range.unwrap();
        // Said, not assumed: the launcher's port is scanned below as TLS.
        r.transport = Some("tls".into());
    })
    .write(&config)
    .unwrap();
    let mal = attacker(c);
    let foreign = foreign_job(c);

    // 1. A CPU-only job of an ordinary user takes every port of the range
    // (the dev cluster's nodes share this host's ports, so one job is
    // every node's squatter).
    let squat_log = dir.join("squatter.out");
    std::fs::File::create(&squat_log).unwrap();
    std::fs::set_permissions(&squat_log, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let lo = range.0.to_string();
    let hi = range.1.to_string();
    // In the hosts mode each node has ports of its own: a task per node.
    let squat = format!("python3 -c '{SQUATTER}' {lo} {hi}");
    let (nodes, shape, wrap) = match c.hosts() {
        Some(_) => (c.spec.nodes, format!("-N{} --ntasks-per-node=1", c.spec.nodes), format!("srun {squat}")),
        None => (1, "-n1".to_string(), squat),
    };
    let mut args = vec!["--parsable"];
    args.extend(shape.split(' '));
    args.extend(["-o", squat_log.to_str().unwrap(), "--wrap", &wrap]);
    let r = c.run_as(&mal, "sbatch", &args);
    assert!(r.ok, "sbatch as op-mal: {}{}", r.stdout, r.stderr);
    let squatter: u32 = r.stdout.trim().split(';').next().unwrap().parse().unwrap();
    c.wait_state(squatter, "RUNNING", Duration::from_secs(30));
    c.wait_until("the squatter to bind the range", Duration::from_secs(30), || {
        std::fs::read_to_string(&squat_log).unwrap_or_default().matches("bound").count() == nodes as usize
    });
    let bound = std::fs::read_to_string(&squat_log).unwrap();
    eprintln!("squatter job {squatter}: {}", bound.trim());

    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let router = d.endpoint(ENDPOINT).unwrap().listen.unwrap().port();
    let took = wait("the baseline replica to serve past the squatter", Duration::from_secs(90), || {
        serving(&d, ENDPOINT, "baseline").len() == 1
    });
    eprintln!("baseline serving {took:?} after onepoold started, every port of {lo}-{hi} held by job {squatter}");
    assert!(router_answers(router), "a chat completion through the router");
    assert_eq!(c.state(squatter).as_deref(), Some("RUNNING"), "the squatter held the range throughout");
    let v = replica_view(&d, ENDPOINT);
    let address = v.jobs.iter().find(|j| j.phase.as_str() == "serving").and_then(|j| j.address).unwrap();
    assert!(
        !(range.0..=range.1).contains(&address.port()),
        "the replica listens outside the squatted range: {address}"
    );
    assert_eq!(v.start_failures.total, 0, "no failed start: {:?}", v.start_failures);
    c.ok("scancel", &[&squatter.to_string()]);

    // 2. Every listening port of the node, as op-mal: only the router
    // answers a chat completion (the metrics listener and the router's own
    // port are onepoold's front doors and skipped).
    let mut skip = vec![router.to_string()];
    skip.extend(d.metrics_address.map(|a| a.port().to_string()));
    let mut args = vec!["-c", SCANNER];
    args.extend(skip.iter().map(String::as_str));
    // On the replica's node: in the hosts mode only there are its ports.
    let node = v.jobs.iter().find(|j| j.address == Some(address)).map(|j| c.job_fields(j.job)["BatchHost"].clone());
    let scan = c.run_as_on(&node.unwrap_or_default(), &mal, "python3", &args);
    assert!(scan.ok, "{}", scan.stderr);
    let answers: BTreeMap<u16, String> = scan
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(p, s)| Some((p.parse().ok()?, s.to_string())))
        .collect();
    eprintln!("op-mal's scan of {} listening ports: {answers:?}", answers.len());
    assert!(
        matches!(
            d.endpoint(ENDPOINT).and_then(|e| e.endpoint.conns_of(address)).map(|c| c.transport().clone()),
            Some(Transport::Pinned(_))
        ),
        "onepoold reaches its replica over TLS pinned to its certificate"
    );
    assert_eq!(answers.get(&address.port()).map(String::as_str), Some("-"), "the launcher answers no clear HTTP");
    let served: Vec<_> = answers.iter().filter(|(_, s)| s.starts_with('2')).collect();
    assert!(served.is_empty(), "answered a user without a key: {served:?}");
    // The model server itself is among them: some port answered 401 that
    // is not the launcher's.
    assert!(
        answers.iter().any(|(p, s)| *p != address.port() && s == "401"),
        "the model server's own port refuses a keyless request too: {answers:?}"
    );

    // 3. Even with onepoold's key, only the endpoint's paths pass.
    let key = std::fs::read_to_string(dir.join("replica.key")).unwrap();
    let keyed = Some(key.trim());
    assert_eq!(get(&rt, &d, address, "/health", keyed), Some(200));
    for admin in ["/slots", "/props", "/v1/../slots", "/"] {
        assert_eq!(get(&rt, &d, address, admin, keyed), Some(404), "{admin} with the key");
    }
    assert_eq!(get(&rt, &d, address, "/health", None), Some(401), "no key");

    // 4. A client that stalls in its TLS handshake on the launcher's port
    // is cut at its header timeout.
    let slow = c.run_as(&mal, "python3", &["-c", SLOW_CLIENT, &address.ip().to_string(), &address.port().to_string()]);
    let secs: f64 = slow.stdout.trim().parse().unwrap_or_else(|_| panic!("{}{}", slow.stdout, slow.stderr));
    eprintln!("a half-sent handshake on the launcher's port was cut after {secs} s");
    assert!((8.0..20.0).contains(&secs), "the header read timeout is 10 s: {secs}");

    // 5. The dev cluster's fake GPU source is root's: a line there would
    // have the hand-off check drain a node.
    let fake = c.cluster.layout.gpu_processes();
    let w = c.run_as(&mal, "sh", &["-c", &format!("echo '0 1' >> {}", fake.display())]);
    assert!(!w.ok, "op-mal wrote into {}", fake.display());

    // The point of it all.
    assert!(router_answers(router), "protected serving still answers");
    let (training, took) = protected_training(c);
    eprintln!("protected training {training} RUNNING {took:?} after submission");
    assert_untouched(c, foreign);
    rt.block_on(d.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

/// One endpoint of [`failing_config`]: its name and command.
fn endpoint(
    c: &TestCluster,
    dir: &Path,
    name: &str,
    command: String,
    edit: impl FnOnce(&mut ReplicasFile),
) -> onepool_elastic_daemon::config::EndpointFile {
    let mut f = daemon_config(c, dir, name, |r| {
        r.command = command;
        r.gpus = Some(1);
        r.max = Some(1);
        r.output = Some(format!("{}/{name}-%j.log", dir.display()));
        edit(r);
    });
    f.endpoints.remove(0)
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn replicas_that_cannot_start_back_off_say_why_and_come_back_once_fixed() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("failed-starts");
    let config = dir.join("onepoold.toml");
    let server = dir.join("server.sh");
    std::fs::write(
        &server,
        "echo 'cannot open model file /models/missing.gguf: No such file or directory' >&2\nexit 3\n",
    )
    .unwrap();
    let standin = stand_in_server();
    let mut file = daemon_config(c, &dir, "unused", |_| {});
    file.endpoints = vec![
        endpoint(c, &dir, "exits", format!("sh {}", server.display()), |_| {}),
        endpoint(c, &dir, "segv", "sh -c 'echo loading model >&2; kill -SEGV $$'".into(), |_| {}),
        endpoint(
            c,
            &dir,
            "unhealthy",
            format!("env ONEPOOL_MODEL_LOAD_SECONDS=100000 python3 {}", standin.display()),
            |r| r.startup_timeout = Some(Duration::from_secs(4)),
        ),
    ];
    file.write(&config).unwrap();
    let foreign = foreign_job(c);
    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let t0 = Instant::now();
    let watched = Duration::from_secs(75);
    std::thread::sleep(watched);
    let mut counts = BTreeMap::new();
    for name in ["exits", "segv", "unhealthy"] {
        let v = replica_view(&d, name);
        let f = &v.start_failures;
        let cause = f.last.as_ref().map(|l| l.cause.clone()).unwrap_or_default();
        eprintln!("{name}: {} jobs submitted in {:?}; {f:?}", v.submitted.len(), t0.elapsed());
        counts.insert(name, v.submitted.len());
        // Waits of 10, 20, 40 s after the failures: 3 or 4 jobs in 75 s,
        // where the poll (0.5 s) would have submitted about 150 before.
        assert!((2..=4).contains(&v.submitted.len()), "{name}: {} jobs in {watched:?}", v.submitted.len());
        assert!(f.backing_off && f.in_a_row >= 2, "{name}: {f:?}");
        assert!(f.next_attempt.is_some(), "{name}: {f:?}");
        let want = match name {
            "exits" => "exited with code 3; last output:\ncannot open model file /models/missing.gguf",
            "segv" => "killed by SIGSEGV",
            _ => "without becoming healthy (startup_timeout 4s): its health checks never passed",
        };
        assert!(cause.contains(want), "{name}: {want:?} not in {cause:?}");
    }
    let metrics = d.metrics.encode();
    for name in ["exits", "segv", "unhealthy"] {
        let line = format!("onepool_replica_failed_starts_total{{endpoint=\"{name}\"}}");
        assert!(metrics.lines().any(|l| l.starts_with(&line)), "{line} not in the metrics");
    }
    // What an admin sees.
    let socket = dir.join("onepoold.sock");
    let status = std::process::Command::new(build_dir().join("onepool"))
        .args(["status", "--socket", socket.to_str().unwrap()])
        .envs(c.cluster.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    eprintln!("onepool status:\n{text}");
    assert!(text.contains("START BACK-OFF") && text.contains("onepool retry exits"), "{text}");
    assert!(text.contains("| cannot open model file /models/missing.gguf"), "{text}");

    // The serving preflight says the same before onepoold would go live.
    let preflight = |endpoint: &str| {
        let o = std::process::Command::new(build_dir().join("onepoold"))
            .args(["--config", config.to_str().unwrap(), "--allow-root", "--preflight", endpoint])
            .envs(c.cluster.env())
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
    };
    let (code, out) = preflight("segv");
    eprintln!("onepoold --preflight segv:\n{out}");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("FAILED: job") && out.contains("killed by SIGSEGV") && out.contains("| loading model"),
        "{out}"
    );

    // The admin fixes the command and ends the wait: serving again
    // without a restart of onepoold.
    std::fs::write(&server, format!("exec python3 {}\n", standin.display())).unwrap();
    let (code, out) = preflight("exits");
    eprintln!("onepoold --preflight exits:\n{out}");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("first chat completion answered"), "{out}");

    let retry = std::process::Command::new(build_dir().join("onepool"))
        .args(["retry", "exits", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(retry.status.success(), "{}", String::from_utf8_lossy(&retry.stderr));
    let back =
        wait("the fixed endpoint to serve", Duration::from_secs(60), || serving(&d, "exits", "baseline").len() == 1);
    eprintln!("the fixed endpoint served {back:?} after `onepool retry exits`");
    let v = replica_view(&d, "exits");
    assert!(!v.start_failures.backing_off, "{:?}", v.start_failures);

    let port = d.endpoint("exits").unwrap().listen.unwrap().port();
    assert!(router_answers(port), "the fixed endpoint answers");
    let (training, took) = protected_training(c);
    eprintln!("protected training {training} RUNNING {took:?} after submission; jobs per endpoint {counts:?}");
    assert_untouched(c, foreign);
    rt.block_on(d.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}
