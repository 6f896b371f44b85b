//! What a real network brings (issue #36), on the hosts-mode cluster
//! (`onepool-devcluster up --hosts`): a node whose link goes down in the
//! middle of streams (which the router continues elsewhere, issue #43), and what crosses the bridge between the router and
//! the replicas (no replica key, no prompt in clear; no launcher on a
//! wildcard or loopback address).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use onepool_dev_cluster::hosts::{Host, HostsNet};
use onepool_elastic_daemon::config::ConfigFile;
use onepool_elastic_daemon::daemon::Daemon;
use onepool_tests::elastic::{
    daemon_config, protected_training, replica_view, runtime, scratch, serving, stand_in_server, start_daemon, wait,
};
use onepool_tests::streams::{Clients, Ending, Sent, HUNG};
use onepool_tests::{hosts_cluster, replica_records, Cleanup, TestCluster};

const ENDPOINT: &str = "links";

fn net(c: &TestCluster) -> HostsNet {
    c.hosts().expect("the hosts cluster runs in the hosts mode")
}

fn host_of(c: &TestCluster, node: &str) -> Host {
    net(c).node_named(c.spec.nodes, node).unwrap_or_else(|| panic!("no host for node {node}"))
}

/// Puts a cut node back as its admin would, also when the test fails: the
/// link up, then `scontrol update State=RESUME`. Slurm keeps a node that
/// stopped responding DOWN until its slurmd registers again, which a
/// running slurmd does not do by itself (measured: still DOWN 5 minutes
/// after its link came back); the resume also has slurmd end the lost
/// job's processes.
struct Reconnect<'a> {
    c: &'a TestCluster,
    host: Host,
    node: String,
}

impl Drop for Reconnect<'_> {
    fn drop(&mut self) {
        set_link(&self.host, true);
        let _ = self.c.run("scontrol", &["update", &format!("NodeName={}", self.node), "State=RESUME"]);
    }
}

fn set_link(host: &Host, up: bool) {
    let state = if up { "up" } else { "down" };
    let ok = Command::new("ip")
        .args(["-n", &host.namespace, "link", "set", "eth0", state])
        .status()
        .expect("ip link set")
        .success();
    assert!(ok, "ip -n {} link set eth0 {state}", host.namespace);
}

/// The value of one of onepoold's metrics (its samples whose labels
/// contain `labels`, summed).
fn sample(d: &Daemon, name: &str, labels: &str) -> f64 {
    d.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn a_node_whose_link_goes_down_mid_stream_moves_its_streams_sends_the_rest_elsewhere_and_is_replaced_once() {
    let c = hosts_cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("network-link");
    let config = dir.join("onepoold.toml");
    let since: i64 = c.ok("date", &["+%s"]).trim().parse().unwrap();
    // Two replicas of 4 GPUs (a node each): the baseline and, under the
    // load below, a supplemental one. Clients of 100 tokens at 0.05 s.
    let mut file: ConfigFile = daemon_config(c, &dir, ENDPOINT, |r| {
        r.command = format!("env ONEPOOL_SECONDS_PER_TOKEN=0.05 python3 {}", stand_in_server().display());
        r.min = Some(1);
        r.max = Some(2);
        r.target_per_replica = Some(2.0);
        r.startup_timeout = Some(Duration::from_secs(30));
        r.scale_down_delay = Some(Duration::from_secs(600));
    });
    let e = &mut file.endpoints[0];
    e.response_idle_timeout = Some(Duration::from_secs(5));
    e.request_timeout = Some(Duration::from_secs(60));
    // Room on each replica for both kinds of request below.
    e.replica_concurrency = Some(8);
    file.write(&config).unwrap();
    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let router = d.endpoint(ENDPOINT).unwrap().listen.unwrap();
    let t0 = Instant::now();
    wait("the baseline replica to serve", Duration::from_secs(60), || serving(&d, ENDPOINT, "baseline").len() == 1);
    let load = Clients::start(router, 4, 100, true, None);
    // And requests answered whole, whose answer comes at the end: those in
    // flight on the cut replica have no answer yet when the link goes.
    let whole = Clients::start(router, 6, 100, false, None);
    wait("a supplemental replica to serve beside it", Duration::from_secs(90), || {
        serving(&d, ENDPOINT, "supplemental").len() == 1
    });
    let view = replica_view(&d, ENDPOINT);
    let node_of = |job: u32| view.jobs.iter().find(|j| j.job == job).and_then(|j| j.node.clone()).expect("its node");
    let victim = serving(&d, ENDPOINT, "baseline")[0];
    let other = serving(&d, ENDPOINT, "supplemental")[0];
    let (node, other_node) = (node_of(victim), node_of(other));
    assert_ne!(node, other_node, "4-GPU replicas on 4-GPU nodes share none");
    let victim_address = view.jobs.iter().find(|j| j.job == victim).and_then(|j| j.address).expect("its address");
    // Both kinds of request in flight on the replica whose link goes.
    let in_flight = |d: &Daemon| {
        let snap = d.endpoint(ENDPOINT).unwrap().endpoint.snapshot();
        snap.replicas.iter().find(|r| r.address == victim_address).map_or(0, |r| r.in_flight)
    };
    wait("6 requests in flight on the replica", Duration::from_secs(30), || in_flight(&d) >= 6);
    let at_cut = in_flight(&d);
    let host = host_of(c, &node);
    let cut = Instant::now();
    set_link(&host, false);
    let reconnect = Reconnect { c, host, node: node.clone() };
    eprintln!(
        "{:>5.1}s {node}'s link down (replica job {victim} at {victim_address}, {at_cut} requests in flight on it)",
        t0.elapsed().as_secs_f64()
    );
    let out_of_rotation = wait("the router to stop sending to the cut replica", Duration::from_secs(30), || {
        let snap = d.endpoint(ENDPOINT).unwrap().endpoint.snapshot();
        !snap
            .replicas
            .iter()
            .any(|r| r.address == victim_address && r.state == onepool_router::registry::ReplicaState::Ready)
    });
    let replaced = wait("a replacement baseline replica serving on another node", Duration::from_secs(240), || {
        serving(&d, ENDPOINT, "baseline").iter().any(|j| *j != victim)
    });
    let victim_end = c.final_state(victim);
    eprintln!(
        "{:>5.1}s out of rotation {:.1} s after the cut; replaced {:.1} s after it; job {victim} ended {victim_end:?}",
        t0.elapsed().as_secs_f64(),
        out_of_rotation.as_secs_f64(),
        cut.elapsed().as_secs_f64(),
    );
    let streamed = load.finish();
    let whole = whole.finish();
    // The link comes back: the node returns, its old replica is gone for
    // good (never requeued, never routed to again), nothing is submitted.
    drop(reconnect);
    c.wait_until("the node back in service", Duration::from_secs(120), || {
        let s = c.ok("sinfo", &["-h", "-n", &node, "-o", "%t"]);
        matches!(s.trim(), "idle" | "mix" | "alloc")
    });
    std::thread::sleep(Duration::from_secs(10));
    let snap = d.endpoint(ENDPOINT).unwrap().endpoint.snapshot();
    assert!(
        !snap.replicas.iter().any(|r| r.address == victim_address),
        "the lost replica is routed to again: {snap:?}"
    );

    // What the clients saw.
    let sent: Vec<Sent> = streamed.iter().chain(&whole).cloned().collect();
    let before = |s: &Sent| s.start < cut;
    let cut_streams: Vec<&Sent> = sent.iter().filter(|s| s.ending == Ending::CutMidStream).collect();
    let hung = sent.iter().filter(|s| s.ending == Ending::Hung).count();
    let lost: Vec<&Sent> = sent.iter().filter(|s| matches!(s.ending, Ending::Status(_) | Ending::NoAnswer)).collect();
    let longest_cut = cut_streams.iter().map(|s| s.end.saturating_duration_since(cut)).max().unwrap_or_default();
    let retried = sample(&d, "onepool_router_retries_total", &format!("endpoint=\"{ENDPOINT}\""));
    let retried_lost = sample(&d, "onepool_router_retries_total", "reason=\"replica_lost\"");
    let endings = |v: &[Sent]| {
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for s in v {
            *m.entry(format!("{:?}", s.ending)).or_default() += 1;
        }
        m
    };
    let endings = format!("streamed {:?}, answered whole {:?}", endings(&streamed), endings(&whole));
    eprintln!(
        "link-down: {} requests: {endings:?}; streams cut mid-stream {} (all started before the cut: {}; the last ended {:.1} s after it); requests retried by the router {retried}; lost {}; hung {hung}",
        sent.len(),
        cut_streams.len(),
        cut_streams.iter().all(|s| before(s)),
        longest_cut.as_secs_f64(),
        lost.len(),
    );

    // Duplicates, from Slurm's records: each slot ran at most one job at a
    // time, and the endpoint had 3 jobs (two, then one replacement).
    let records = replica_records::submitted_since(c, ENDPOINT, since);
    let overlapping = replica_records::overlapping_slots(&records).len();
    let started = records.iter().filter(|r| r.start.is_some()).count();
    eprintln!(
        "link-down: replica jobs {} ({} started): {records:?}; slots with two at once {overlapping}; replacement serving {:.1} s after the cut",
        records.len(),
        started,
        replaced.as_secs_f64() + out_of_rotation.as_secs_f64(),
    );

    assert_eq!(hung, 0, "a client still waited {HUNG:?} after its last byte");
    // Issue #43: the streams on the cut replica went on elsewhere, whole.
    assert!(cut_streams.is_empty(), "every stream ends whole: {cut_streams:?}");
    let short: Vec<&Sent> = streamed.iter().filter(|s| s.ending == Ending::Done && s.tokens != 100).collect();
    assert!(short.is_empty(), "every stream has its 100 tokens, none twice: {short:?}");
    let moved = onepool_tests::elastic::moved_streams(&d);
    let slowest = sent.iter().filter_map(|s| Some(s.answered?.saturating_duration_since(s.start))).max();
    eprintln!("link-down: streams moved {moved:?}; the slowest status line came {slowest:.1?} after its request");
    assert!(moved.values().sum::<u64>() >= 1, "streams were in flight on the cut replica: {moved:?}");
    assert_eq!(onepool_tests::elastic::moves_failed(&d), 0);
    assert!(lost.is_empty(), "requests not yet streaming are sent elsewhere, none lost: {lost:?}");
    // Of the requests in flight on it, those not streaming yet waited for
    // an answer that could not come: sent elsewhere once it was lost.
    assert!(
        retried_lost >= 1.0,
        "{at_cut} in flight on the cut replica: the unanswered ones are retried ({retried_lost})"
    );
    assert_eq!(overlapping, 0, "a slot ran two replica jobs at once: {records:?}");
    assert_eq!(started, 3, "two replicas, then one replacement, and nothing more: {records:?}");
    assert!(
        victim_end.as_deref().is_some_and(|s| s.starts_with("NODE_FAIL")),
        "the cut replica's job ends NODE_FAIL: {victim_end:?}"
    );
    // The protected work still gets its GPUs.
    let (training, waited) = protected_training(c);
    eprintln!("protected training {training} ran {:.1} s after submission", waited.as_secs_f64());
    rt.block_on(d.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A self-signed certificate for `ip` and its key, as PEM files in `dir`
/// (the key private to this user, as onepoold requires).
fn front_certificate(dir: &std::path::Path, ip: std::net::Ipv4Addr) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip.into()));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.join("front.crt"), dir.join("front.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert_file, key_file)
}

/// The listening TCP sockets in a host's namespace: (address, process).
fn listeners(namespace: &str) -> Vec<(String, String, Option<u32>)> {
    let out = Command::new("ip").args(["netns", "exec", namespace, "ss", "-ltnpH"]).output().expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let users = w.get(5).copied().unwrap_or_default();
            let process = users.split('"').nth(1).unwrap_or_default().to_string();
            Some((w.get(3)?.to_string(), process, job_of(users)))
        })
        .collect()
}

/// The Slurm job a listening process (`ss`'s `users:((...,pid=N,...))`)
/// runs in, from its environment.
fn job_of(users: &str) -> Option<u32> {
    let pid: u32 = users.split("pid=").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|v| std::str::from_utf8(v.strip_prefix(b"SLURM_JOB_ID=")?).ok()?.parse().ok())
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn the_bridge_carries_neither_the_replica_key_nor_a_prompt_in_clear_and_launchers_listen_on_their_node_s_address() {
    let c = hosts_cluster();
    let _cleanup = Cleanup(c);
    let net = net(c);
    let dir = scratch("network-capture");
    let config = dir.join("onepoold.toml");
    // onepoold on the admin host's bridge address, its front in TLS (a
    // client on the client host reaches it across the bridge), its
    // replicas' hop in TLS (the default): every hop of a request crosses
    // the bridge, and none in clear.
    let front = net.admin_address();
    let (cert_file, key_file) = front_certificate(&dir, front);
    let mut file: ConfigFile = daemon_config(c, &dir, ENDPOINT, |r| {
        r.min = Some(2);
        r.max = Some(2);
        r.gpus = Some(2);
    });
    file.endpoints[0].listen = Some(SocketAddr::from((front, 0)));
    file.endpoints[0].tls =
        Some(onepool_elastic_daemon::config::TlsFile { cert_file: cert_file.clone(), key_file: key_file.clone() });
    file.write(&config).unwrap();
    let capture = onepool_tests::capture::Capture::start(&net.bridge(), &dir.join("bridge.pcap")).unwrap();
    let rt = runtime();
    let d = start_daemon(&rt, &config);
    let router = d.endpoint(ENDPOINT).unwrap().listen.unwrap();
    wait("both replicas to serve", Duration::from_secs(90), || serving(&d, ENDPOINT, "baseline").len() == 2);

    // Prompts from the client host, over the front's TLS, streamed and not.
    let marker = format!("onepool-capture-marker-{}-{}", std::process::id(), router.port());
    for (i, stream) in [false, true, false, true].into_iter().enumerate() {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{marker} prompt {i}"}}],"max_tokens":8,"stream":{stream}}}"#
        );
        let out = c
            .on_host("client", "curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(&cert_file)
            .args(["-H", "content-type: application/json", "--data-binary", &body])
            .arg(format!("https://{router}/v1/chat/completions"))
            .output()
            .expect("curl");
        assert!(out.status.success(), "curl from the client host: {}", String::from_utf8_lossy(&out.stderr));
    }
    // The control: the same text across the same bridge in clear, to a
    // listener of the test's on the admin address, must be found.
    let plain = std::net::TcpListener::bind((front, 0)).unwrap();
    let plain_at = plain.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = plain.accept().unwrap();
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut got);
        got
    });
    let probe = format!("exec 3<>/dev/tcp/{}/{}; printf '%s' 'control {marker}' >&3", plain_at.ip(), plain_at.port());
    let ok = c.on_host("client", "bash").args(["-c", &probe]).status().expect("bash").success();
    assert!(ok, "the control text could not be sent from the client host");
    assert!(String::from_utf8_lossy(&reader.join().unwrap()).contains(&marker));

    // Where the replicas listen, in their nodes' namespaces.
    let view = replica_view(&d, ENDPOINT);
    let mut launchers = 0;
    let nodes: std::collections::BTreeSet<String> =
        view.jobs.iter().filter(|j| j.address.is_some()).filter_map(|j| j.node.clone()).collect();
    for node in nodes {
        let host = host_of(c, &node);
        for (address, process, job) in listeners(&host.namespace) {
            // A job of an earlier test whose node was cut off may still
            // run there: Slurm ends a lost job's processes when the node
            // comes back, not always by the time the next test looks
            // (seen once in three runs here).
            if process == "slurmd" || job.is_some_and(|j| !view.jobs.iter().any(|v| v.job == j)) {
                continue;
            }
            let ip = address.rsplit_once(':').map(|(ip, _)| ip.trim_matches(['[', ']'])).unwrap_or_default();
            if process == "onepool" {
                launchers += 1;
                assert_eq!(
                    ip,
                    host.address.to_string(),
                    "a launcher on {node} listens on {address}, not its node's address"
                );
            } else {
                // The model server: the node's loopback only.
                assert_eq!(ip, "127.0.0.1", "{process} on {node} listens on {address}");
            }
        }
    }
    assert_eq!(launchers, 2, "one launcher per replica found listening");

    rt.block_on(d.shutdown());
    let flows = capture.finish().unwrap();
    let key = std::fs::read_to_string(dir.join("replica.key")).unwrap();
    let key = key.trim();
    assert!(key.len() >= 32, "the replica key file holds the key: {key:?}");
    let control: Vec<_> = flows.containing(marker.as_bytes());
    eprintln!(
        "capture: {} packets, {} TCP flows with payload; the marker in clear in {control:?}",
        flows.packets,
        flows.streams.len()
    );
    assert_eq!(
        control.iter().map(|f| std::net::SocketAddr::V4(f.to)).collect::<Vec<_>>(),
        vec![plain_at],
        "the prompts' text crosses the bridge in clear, or the control was not seen"
    );
    let with_key = flows.containing(key.as_bytes());
    assert!(with_key.is_empty(), "the replica key crosses the bridge in clear in {with_key:?}");
    // Traffic did go to the front and to both replicas.
    let front_v4 = std::net::SocketAddrV4::new(front, router.port());
    assert!(flows.bytes_to(front_v4) > 0, "nothing reached the front across the bridge");
    for job in view.jobs.iter().filter_map(|j| j.address) {
        let std::net::SocketAddr::V4(a) = job else { continue };
        assert!(flows.bytes_to(a) > 0, "nothing reached the replica at {a} across the bridge");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
