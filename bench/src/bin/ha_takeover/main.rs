//! The HA takeover benchmark (issue #37, docs/ha.md; run by
//! scripts/ha-test.sh): two onepoold instances with one configuration on
//! the two service hosts of a hosts-mode dev cluster, the lock GET_LOCK on
//! the head's MariaDB over TLS, a steady client load from the client host.
//! The acting instance's host dies (SIGKILL to every process of its
//! namespace); measured: requests failed (clients that retry a failed
//! connection on the other address, and what clients without retries
//! saw), seconds until the other instance acts, replica jobs submitted
//! beyond the two the scenario needs, replicas restarted. Then the dead
//! instance comes back on its host and must follow, with no flap.
//!
//! Prints detail lines, then `ha: failed=N takeover_s=X duplicates=N
//! restarted=N` last; exits 1 when a goal is missed, 2 when the scenario
//! itself did not hold (e.g. no request in flight on the killed instance).
//!
//! With `cut`, the acting host's link is cut instead
//! (`ip -n NS link set eth0 down`, its processes running on), then put
//! back; the summary line is then `ha-cut: ...`.
//!
//! Usage: ha_takeover CLUSTER_DIR [kill|cut]
//!        ha_takeover client-load CLIENTS MAX_TOKENS ADDRESS...   (its own load, on the client host)

// No FFI here: the libc calls it needs are onepool-os's safe functions (issue #27).
#![forbid(unsafe_code)]

mod client;
mod instance;
mod records;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::{Ending, Request};
use instance::{service_user, Instance};
use onepool_dev_cluster::hosts::in_namespace;
use onepool_dev_cluster::onepoold::stand_in_command;
use onepool_dev_cluster::{Cluster, UpOptions};
use onepool_elastic_daemon::config::HaFile;
use onepool_tests::elastic::{daemon_config, scratch, stand_in_server, wait};
use onepool_tests::TestCluster;

const ENDPOINT: &str = "ha";
/// Two replicas, no more, no fewer: any other replica job is one too many.
const REPLICAS: u32 = 2;
const CLIENTS: usize = 8;
/// 100 tokens at 5 ms: half a second a request, so that at any moment
/// most clients have one in flight.
const MAX_TOKENS: u32 = 100;
const SECONDS_PER_TOKEN: f64 = 0.005;
/// The goal for the takeover.
const TAKEOVER_GOAL_S: f64 = 5.0;
/// The load before the kill, and after the takeover before the dead host
/// comes back.
const WARM_UP: Duration = Duration::from_secs(5);
const AFTER_TAKEOVER: Duration = Duration::from_secs(10);
/// How long the pair is watched for a flap once the dead instance is back.
const WATCH: Duration = Duration::from_secs(15);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client-load") {
        client::run(&args[1..]);
        return;
    }
    let usage = "usage: ha_takeover CLUSTER_DIR [kill|cut]";
    let dir = PathBuf::from(args.first().expect(usage));
    let fault = match args.get(1).map(String::as_str) {
        None | Some("kill") => Fault::Kill,
        Some("cut") => Fault::Cut,
        Some(_) => panic!("{usage}"),
    };
    std::process::exit(scenario(&dir, fault));
}

/// How the acting instance's host fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL to every process of its namespace; back: onepoold started again.
    Kill,
    /// Its link down, its processes running on; back: the link up again.
    Cut,
}

/// The hosts-mode cluster in `dir`, up (or reused) with the test policy
/// and the plugins just built, its queue empty.
fn hosts_cluster(dir: &Path) -> TestCluster {
    let cluster = Cluster::at(dir).expect("cluster folder");
    let options = UpOptions { hosts: true, ..onepool_tests::up_options() };
    let spec = cluster.up(&options, &mut |m| eprintln!("ha-cluster: {m}")).expect("bringing the cluster up");
    let c = TestCluster { cluster, spec };
    c.cancel_all();
    c
}

/// The lock's password and CA as onepoold's user needs them: its own
/// copy of the password, mode 0600.
fn lock_files(c: &TestCluster, shared: &Path) -> HaFile {
    let lock = c.cluster.ha_lock().expect("the cluster's HA lock");
    let (uid, gid) = service_user();
    let password = shared.join("ha-db.password");
    std::fs::copy(&lock.password_file, &password).expect("copying the lock's password");
    std::os::unix::fs::chown(&password, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ca = shared.join("ha-db-ca.pem");
    std::fs::copy(&lock.ca_file, &ca).expect("copying the lock's certificate");
    HaFile {
        lock: Some("mariadb".into()),
        database: Some(format!("{}:{}", lock.host, lock.port)),
        user: Some(lock.user.clone()),
        password_file: Some(password),
        ca_file: Some(ca),
        ..HaFile::default()
    }
}

/// The load, started on the client host; its requests come back when
/// [`Load::finish`] closes its stdin.
struct Load(std::process::Child);

impl Load {
    fn start(c: &TestCluster, addresses: &[std::net::SocketAddr]) -> Load {
        let net = c.hosts().expect("the hosts mode");
        let mut cmd = Command::new(std::env::current_exe().expect("this program"));
        cmd.args(["client-load", &CLIENTS.to_string(), &MAX_TOKENS.to_string()]);
        cmd.args(addresses.iter().map(ToString::to_string));
        let child = in_namespace(&cmd, &net.client())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the load on the client host");
        Load(child)
    }

    fn finish(mut self) -> Vec<Request> {
        drop(self.0.stdin.take());
        let out = self.0.stdout.take().expect("the load's stdout");
        let requests: Vec<Request> =
            std::io::BufReader::new(out).lines().map_while(Result::ok).filter_map(|l| Request::from_json(&l)).collect();
        let _ = self.0.wait();
        requests
    }
}

/// What the clients saw, around the kill at `kill` (Unix seconds) of the
/// instance at `dead`.
#[derive(Debug, Default)]
struct Seen {
    total: usize,
    failed: usize,
    retried: usize,
    /// First attempts on the dead instance that were in flight at the kill.
    in_flight: usize,
    /// Of those, the ones that failed.
    dropped: usize,
    /// First attempts refused by the dead instance after the kill, and the
    /// most any one client had.
    refused: usize,
    refused_per_client: usize,
    /// First attempts that failed otherwise.
    other: usize,
    served_after: BTreeMap<std::net::SocketAddr, usize>,
    /// The longest request from its first attempt to its last one's end,
    /// retries included (seconds).
    slowest: f64,
}

fn seen(requests: &[Request], dead: std::net::SocketAddr, kill: f64) -> Seen {
    let mut s = Seen { total: requests.len(), ..Seen::default() };
    let mut refused_by: BTreeMap<usize, usize> = BTreeMap::new();
    for r in requests {
        s.failed += usize::from(!r.ok());
        s.retried += usize::from(r.attempts.len() > 1);
        let took = r.attempts.last().map_or(0.0, |l| l.end) - r.first().start;
        s.slowest = s.slowest.max(took);
        let a = r.first();
        let on_dead_at_kill = a.to == dead && a.start < kill && a.end >= kill;
        s.in_flight += usize::from(on_dead_at_kill);
        if let Some(last) = r.attempts.last().filter(|l| l.ending == Ending::Ok && l.start >= kill) {
            *s.served_after.entry(last.to).or_default() += 1;
        }
        if a.ending == Ending::Ok {
            continue;
        }
        if on_dead_at_kill && matches!(a.ending, Ending::Dropped | Ending::Silent) {
            s.dropped += 1;
        } else if a.to == dead && a.start >= kill && a.ending == Ending::Connect {
            s.refused += 1;
            *refused_by.entry(r.client).or_default() += 1;
        } else {
            s.other += 1;
        }
    }
    s.refused_per_client = refused_by.values().copied().max().unwrap_or(0);
    s
}

#[allow(clippy::too_many_lines, reason = "one scenario on a real cluster, read top to bottom")]
fn scenario(dir: &Path, fault: Fault) -> i32 {
    let label = match fault {
        Fault::Kill => "ha",
        Fault::Cut => "ha-cut",
    };
    let c = hosts_cluster(dir);
    let net = c.hosts().expect("the hosts mode");
    let shared = scratch("ha-takeover");
    let (uid, gid) = service_user();
    std::os::unix::fs::chown(&shared, Some(uid), Some(gid)).unwrap();
    let mut base = daemon_config(&c, &shared, ENDPOINT, |r| {
        r.min = Some(REPLICAS);
        r.max = Some(REPLICAS);
        // The baseline class protects 4 GPUs (the test policy): both fit.
        r.gpus = Some(2);
        r.command = stand_in_command(&stand_in_server(), 0.0, SECONDS_PER_TOKEN);
    });
    base.ha = Some(lock_files(&c, &shared));
    let database = base.ha.as_ref().and_then(|h| h.database.clone()).unwrap_or_default();
    let since = client::now().floor() as i64;
    let mut pair = [Instance::new(&base, &shared, net.service()), Instance::new(&base, &shared, net.service2())];

    pair[0].start();
    wait("the first instance to act", Duration::from_secs(15), || pair[0].leadership().acting);
    pair[1].start();
    wait("the second instance to see the lock held", Duration::from_secs(15), || {
        pair[1].leadership().acting_instance.is_some()
    });
    wait("both routers to have both replicas ready", Duration::from_secs(120), || {
        pair.iter().all(|i| i.ready(ENDPOINT) == REPLICAS as usize)
    });
    println!(
        "{label}: onepoold on {} ({}) and {} ({}) as user {}, one configuration, [ha] lock GET_LOCK on {database} over TLS; endpoint {ENDPOINT}: {REPLICAS} replicas x 2 GPUs (stand-in server, {:.1} s a request); {CLIENTS} clients on the client host, retrying a failed connection on the other address (at most 2 retries)",
        pair[0].host.name,
        pair[0].address(),
        pair[1].host.name,
        pair[1].address(),
        onepool_decisions::policy::SERVICE_USER,
        f64::from(MAX_TOKENS) * SECONDS_PER_TOKEN,
    );
    let load = Load::start(&c, &[pair[0].address(), pair[1].address()]);
    std::thread::sleep(WARM_UP);

    let acting: Vec<usize> = (0..2).filter(|&i| pair[i].leadership().acting).collect();
    let before = records::queued(&c, ENDPOINT);
    let running: BTreeSet<u32> = before.iter().filter(|(_, s)| s.as_str() == "RUNNING").map(|(j, _)| *j).collect();
    if acting.len() != 1 || running.len() != REPLICAS as usize || before.len() != running.len() {
        let _ = load.finish();
        eprintln!("{label}: the scenario did not hold before the kill: acting {acting:?}, replica jobs {before:?}");
        return 2;
    }
    let (d, s) = (acting[0], 1 - acting[0]);
    let survivor_decided = pair[s].decisions();
    let dead_at = pair[d].address();

    let kill = client::now();
    let t0 = Instant::now();
    let what = match fault {
        Fault::Kill => {
            let n = pair[d].kill_host();
            format!("killed {} ({n} process(es), SIGKILL)", pair[d].host.name)
        }
        Fault::Cut => {
            pair[d].set_link(false);
            format!("cut {}'s link", pair[d].host.name)
        }
    };
    // When the cut instance stops acting by itself (its fence), as its
    // control socket, a file, still says.
    let mut demoted = None;
    let took = wait("the survivor to act", Duration::from_secs(30), || {
        if fault == Fault::Cut && demoted.is_none() && !pair[d].leadership().acting {
            demoted = Some(t0.elapsed());
        }
        pair[s].leadership().acting
    });
    let takeover_s = took.as_secs_f64();
    let acting_metric = pair[s].metric("onepool_ha_acting");
    let fence = match (fault, demoted) {
        (Fault::Kill, _) => String::new(),
        (Fault::Cut, Some(t)) => {
            format!("; {} stopped acting {:.2} s after the cut", pair[d].host.name, t.as_secs_f64())
        }
        (Fault::Cut, None) => format!("; {} still acted when {} took over", pair[d].host.name, pair[s].host.name),
    };
    println!(
        "{label}: {what}; {} acts {takeover_s:.2} s later (its control socket; onepool_ha_acting {acting_metric:?}){fence}",
        pair[s].host.name
    );
    std::thread::sleep(AFTER_TAKEOVER);
    let decided_after = pair[s].decisions() - survivor_decided;

    // The host comes back: its onepoold must follow and take nothing back.
    let restart = Instant::now();
    let rejoin = t0.elapsed();
    match fault {
        Fault::Kill => pair[d].start(),
        Fault::Cut => pair[d].set_link(true),
    }
    let me = pair[d].host.name.clone();
    wait("the instance back to see the other's lock", Duration::from_secs(15), || {
        let l = pair[d].leadership();
        !l.acting && l.acting_instance.is_some_and(|a| a != me)
    });
    let follows = restart.elapsed();
    let watch_until = Instant::now() + WATCH;
    let (mut samples, mut flaps, mut routes) = (0, 0, None);
    while Instant::now() < watch_until {
        let (ld, ls) = (pair[d].leadership(), pair[s].leadership());
        samples += 1;
        flaps += usize::from(ld.acting || !ls.acting);
        if routes.is_none() && pair[d].ready(ENDPOINT) == REPLICAS as usize {
            routes = Some(restart.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let takeovers = (pair[s].leadership().takeovers, pair[d].leadership().takeovers);
    let requests = load.finish();
    let after = records::queued(&c, ENDPOINT);

    // Slurm's records: every replica job since the start (accounting
    // lags squeue by a moment).
    std::thread::sleep(Duration::from_secs(2));
    let jobs = records::submitted_since(&c, ENDPOINT, since);
    let all: BTreeSet<u32> = jobs.iter().map(|j| j.id).chain(after.keys().copied()).collect();
    let extra: Vec<u32> = all.difference(&running).copied().collect();
    let overlapping = records::overlapping_slots(&jobs);
    let restarted: Vec<u32> =
        running.iter().copied().filter(|j| after.get(j).map(String::as_str) != Some("RUNNING")).collect();
    let duplicates = extra.len();

    let seen = seen(&requests, dead_at, kill);
    println!(
        "{label}: requests {}: failed {} with retries ({} retried); without retries {} would have failed: {} in flight on {} at the fault (of {} there), {} refused connections after it (at most {} per client), {} other; slowest request {:.1} s; served after the fault: {:?}",
        seen.total,
        seen.failed,
        seen.retried,
        seen.dropped + seen.refused + seen.other,
        seen.dropped,
        pair[d].host.name,
        seen.in_flight,
        seen.refused,
        seen.refused_per_client,
        seen.other,
        seen.slowest,
        seen.served_after,
    );
    let names: Vec<String> = jobs.iter().map(|j| format!("{} {} {}", j.id, j.name, j.state)).collect();
    println!(
        "{label}: replica jobs running before the fault {running:?}; in Slurm's records since the start {names:?}; beyond those {extra:?}; slots with two running at once {overlapping:?}; restarted {restarted:?}; {} decided {decided_after} thing(s) in the {}s after its takeover",
        pair[s].host.name,
        AFTER_TAKEOVER.as_secs()
    );
    println!(
        "rejoin: {} back {:.1} s after the fault, follows {:.2} s after (the other's lock seen held); acting: {} throughout, {flaps} flap(s) in {samples} samples over {} s; routes to {REPLICAS} replicas {} after; takeovers {}={} {}={}",
        pair[d].host.name,
        rejoin.as_secs_f64(),
        follows.as_secs_f64(),
        pair[s].host.name,
        WATCH.as_secs(),
        routes.map_or_else(|| "never".to_string(), |r| format!("{:.1} s", r.as_secs_f64())),
        pair[s].host.name,
        takeovers.0,
        pair[d].host.name,
        takeovers.1,
    );
    println!(
        "{label}: failed={} takeover_s={takeover_s:.2} duplicates={duplicates} restarted={}",
        seen.failed,
        restarted.len()
    );

    let panicked = pair.iter().any(|i| i.log_text().contains("panicked"));
    for i in &mut pair {
        i.stop();
    }
    c.cancel_all();
    if seen.in_flight == 0 {
        eprintln!("{label}: no request was in flight on the killed instance: the kill proved nothing about them");
        return 2;
    }
    let mut missed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            missed.push(what);
        }
    };
    check(seen.failed == 0, format!("{} request(s) failed with retries", seen.failed));
    check(takeover_s <= TAKEOVER_GOAL_S, format!("takeover {takeover_s:.2} s > {TAKEOVER_GOAL_S} s"));
    check(duplicates == 0 && overlapping.is_empty(), format!("replica jobs beyond the {REPLICAS}: {extra:?}"));
    check(restarted.is_empty(), format!("replicas restarted: {restarted:?}"));
    check(
        seen.other == 0 && seen.refused_per_client <= 1,
        format!(
            "without retries: {} failure(s) not in flight on the dead instance, {} refusal(s) for one client",
            seen.other, seen.refused_per_client
        ),
    );
    check(
        // A restarted instance counts afresh; a cut one took the lock once, at the start.
        flaps == 0 && takeovers == (1, u64::from(fault == Fault::Cut)) && routes.is_some(),
        format!("rejoin: {flaps} flap(s), takeovers {takeovers:?}, routes {routes:?}"),
    );
    check(acting_metric == Some(1.0), format!("the survivor's onepool_ha_acting is {acting_metric:?}"));
    check(!panicked, "an onepoold log says panicked".into());
    if missed.is_empty() {
        let _ = std::fs::remove_dir_all(&shared);
        0
    } else {
        eprintln!("{label}: goals missed: {}; logs in {}", missed.join("; "), shared.display());
        1
    }
}
