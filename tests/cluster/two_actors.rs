//! Issue #37 (part B): two onepoold instances act on one endpoint at once,
//! as when leadership is bypassed (no `[ha]` lock: both act), with the same
//! configuration and replica key, under a client load on each that scales
//! them up and down twice. Slurm's accounting then shows that no slot (job
//! name) ever had two running replicas at once: each replica job carries
//! `--dependency=singleton`, so where both instances submit for one slot
//! the second job waits and is cancelled. At the end a protected job still
//! gets its GPUs, and another user's protected job is never touched.
//!
//! Replicas of 2 GPUs leave room for duplicates to run (12 of the 16 GPUs
//! are free beside the other user's job, and the baseline class reserves
//! 4): without the dependency both instances' jobs for one slot start, and
//! this test fails on their overlap.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onepool_tests::elastic::{assert_untouched, control_state, daemon_config, foreign_job, protected_training, queue};
use onepool_tests::elastic::{scratch, Load};
use onepool_tests::{build_dir, cluster, Cleanup, TestCluster, TEST_MIN_RUNTIME_SECS};

const ENDPOINT: &str = "chat";

/// The onepoold binary run as a service would run it.
struct Onepoold(Child);

impl Onepoold {
    fn spawn(config: &Path, log: &Path) -> Onepoold {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut cmd = Command::new(build_dir().join("onepoold"));
        cmd.args(["--config", config.to_str().unwrap(), "--allow-root"]).stdout(out.try_clone().unwrap()).stderr(out);
        Onepoold(cmd.spawn().expect("starting onepoold"))
    }
}

impl Drop for Onepoold {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The endpoint's replica jobs in the queue, by name: (job, state).
fn replica_jobs(c: &TestCluster) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut by_name: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for q in queue(c).into_iter().filter(|q| q.name.starts_with(&format!("onepool-{ENDPOINT}-"))) {
        by_name.entry(q.name).or_default().push((q.id, q.state));
    }
    by_name
}

fn running_replicas(c: &TestCluster) -> usize {
    replica_jobs(c).values().flatten().filter(|(_, s)| s == "RUNNING").count()
}

/// Polls `f` every 200 ms for up to `timeout`; says how it went instead of
/// panicking, so that the run goes on to Slurm's records (a duplicate that
/// runs is the failure this test is about, and it may also hold a phase up).
fn reached(what: &str, timeout: Duration, t0: Instant, mut f: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > timeout {
            eprintln!("{:>6.1}s NOT REACHED within {timeout:?}: {what}", t0.elapsed().as_secs_f64());
            return Err(format!("{what} (not within {timeout:?})"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{:>6.1}s {what} ({:.1} s)", t0.elapsed().as_secs_f64(), start.elapsed().as_secs_f64());
    Ok(())
}

/// One replica job in Slurm's accounting; times in Unix seconds.
#[derive(Debug, Clone)]
struct Record {
    name: String,
    id: u32,
    submit: u64,
    /// When it ran, if it got nodes: Slurm gives a job cancelled while
    /// pending a start (and end) too, its cancellation's.
    start: Option<u64>,
    end: Option<u64>,
    state: String,
    /// Never eligible: held by its dependency all its life.
    never_eligible: bool,
}

/// The endpoint's replica jobs among job ids `ids` in Slurm's accounting
/// (`sacct -X`). By id, not by time window: a window lists only jobs that
/// became eligible, and a job held by its dependency until it was
/// cancelled never did.
fn records(c: &TestCluster, ids: std::ops::RangeInclusive<u32>) -> Vec<Record> {
    let list: Vec<String> = ids.map(|i| i.to_string()).collect();
    let out = c
        .cmd("sacct")
        .env("SLURM_TIME_FORMAT", "%s")
        .args(["-X", "-n", "-P", "-j", &list.join(","), "-o", "JobName,JobID,Submit,Start,End,State,Eligible,NodeList"])
        .output()
        .expect("sacct");
    assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
    let time = |s: &str| s.trim().parse::<u64>().ok().filter(|t| *t > 0);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let name = f.first()?.to_string();
            if !name.starts_with(&format!("onepool-{ENDPOINT}-")) {
                return None;
            }
            let ran = f.get(7).is_some_and(|n| !n.is_empty() && *n != "None assigned");
            Some(Record {
                name,
                id: f.get(1)?.parse().ok()?,
                submit: time(f.get(2)?)?,
                start: time(f.get(3)?).filter(|_| ran),
                end: time(f.get(4)?),
                state: f.get(5)?.to_string(),
                never_eligible: time(f.get(6)?).is_none(),
            })
        })
        .collect()
}

/// Pairs of jobs of one name whose running intervals overlap (an interval
/// ending in the second the next begins does not).
fn overlaps(jobs: &[&Record]) -> Vec<(u32, u32)> {
    let now = unix_now();
    let mut ran: Vec<(u64, u64, u32)> =
        jobs.iter().filter_map(|r| r.start.map(|s| (s, r.end.unwrap_or(now).max(s), r.id))).collect();
    ran.sort_unstable();
    let mut out = Vec::new();
    for (i, a) in ran.iter().enumerate() {
        out.extend(ran[i + 1..].iter().filter(|b| b.0 < a.1).map(|b| (a.2, b.2)));
    }
    out
}

/// Jobs that never started while another job of their name was in the
/// queue at the same time: the duplicates Slurm held back.
fn held_back<'a>(jobs: &[&'a Record]) -> Vec<&'a Record> {
    let now = unix_now();
    let live = |r: &Record| (r.submit, r.end.unwrap_or(now).max(r.submit));
    let meets = |r: &Record, o: &Record| o.id != r.id && live(o).0 <= live(r).1 && live(r).0 <= live(o).1;
    jobs.iter().copied().filter(|r| r.start.is_none() && jobs.iter().any(|o| meets(r, o))).collect()
}

/// Two jobs of one slot (its name) that ran at once.
type Overlap = (String, (u32, u32));

/// What Slurm's records say of each slot: printed, and the pairs of jobs
/// that ran at once in one slot with the number of duplicate submissions.
fn per_slot(recs: &[Record]) -> (Vec<Overlap>, usize) {
    let mut by_name: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in recs {
        by_name.entry(r.name.as_str()).or_default().push(r);
    }
    let (mut found, mut duplicates) = (Vec::new(), 0);
    eprintln!("slot               submitted  ran  held back (never eligible)  ran at once");
    for (name, jobs) in &by_name {
        let o = overlaps(jobs);
        let held = held_back(jobs);
        let never = held.iter().filter(|r| r.never_eligible).count();
        let ran = jobs.iter().filter(|r| r.start.is_some()).count();
        eprintln!("{name:<18} {:>9} {ran:>4} {:>9} ({never}) {o:?}", jobs.len(), held.len());
        duplicates += held.len() + o.len();
        found.extend(o.into_iter().map(|p| (name.to_string(), p)));
    }
    (found, duplicates)
}

/// One onepoold instance of the two.
struct Instance {
    name: &'static str,
    config: std::path::PathBuf,
    socket: std::path::PathBuf,
    port: u16,
    log: std::path::PathBuf,
}

/// Both instances' configuration: the same endpoint and replica key file,
/// each its own control socket and listening port. Replicas of 2 GPUs, up
/// to 4, scaled down 10 s after the load falls, polled every 2 s.
fn instances(c: &TestCluster, dir: &Path) -> Vec<Instance> {
    onepool_elastic_daemon::replica_key::load_or_create(&dir.join("replica.key")).expect("the replica key");
    ["a", "b"]
        .into_iter()
        .map(|name| {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut cfg = daemon_config(c, dir, ENDPOINT, |r| {
                // A duplicate is seen (and cancelled) at the next poll;
                // until then Slurm alone keeps it from running, which a
                // 2 s poll leaves it long enough to show.
                r.poll_interval = Some(onepool_dev_cluster::onepoold::poll_interval(Duration::from_secs(2)));
                r.gpus = Some(2);
                r.max = Some(4);
                r.scale_down_delay = Some(Duration::from_secs(10));
            });
            let socket = dir.join(format!("{name}.sock"));
            cfg.control_socket = socket.clone();
            cfg.endpoints[0].listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
            let config = dir.join(format!("{name}.toml"));
            cfg.write(&config).unwrap();
            Instance { name, config, socket, port, log: dir.join(format!("{name}.log")) }
        })
        .collect()
}

/// What the clients got, summed over loads.
#[derive(Default)]
struct Tally {
    sent: u64,
    statuses: BTreeMap<u16, u64>,
}

impl Tally {
    fn add(&mut self, loads: Vec<Load>) {
        for l in loads {
            let (n, s) = l.finish();
            self.sent += n;
            for (k, v) in s {
                *self.statuses.entry(k).or_default() += v;
            }
        }
    }
}

/// Two scale-ups and -downs: 14 clients on each instance with 1.5 s
/// completions (4 replicas' worth, max, to each), then a trickle that the
/// baseline alone serves. Phases not reached are returned, not panicked
/// on: Slurm's records come first.
fn cycles(c: &TestCluster, ports: &[u16], t0: Instant, tally: &mut Tally) -> Vec<String> {
    let mut missed = Vec::new();
    let mut note = |r: Result<(), String>| missed.extend(r.err());
    note(reached("a baseline replica running", Duration::from_secs(60), t0, || running_replicas(c) >= 1));
    for cycle in 1..=2 {
        let loads = burst(ports);
        note(reached(&format!("cycle {cycle}: four replicas running"), Duration::from_secs(60), t0, || {
            running_replicas(c) >= 4
        }));
        std::thread::sleep(Duration::from_secs(8));
        tally.add(loads);
        let loads: Vec<Load> = ports.iter().map(|p| Load::start(*p, 1, 0.2)).collect();
        note(reached(&format!("cycle {cycle}: scaled down to one replica"), Duration::from_secs(90), t0, || {
            replica_jobs(c).values().flatten().count() == 1
        }));
        tally.add(loads);
    }
    missed
}

fn burst(ports: &[u16]) -> Vec<Load> {
    ports.iter().map(|p| Load::start(*p, 14, 1.5)).collect()
}

#[test]
fn two_acting_instances_never_run_two_replicas_in_one_slot() {
    let c = cluster();
    let _cleanup = Cleanup(c);
    let dir = scratch("two-actors");
    let foreign = foreign_job(c);
    let instances = instances(c, &dir);
    let t0 = Instant::now();
    // Started together, they poll in step: the same view, the same slots.
    let daemons: Vec<Onepoold> = instances.iter().map(|i| Onepoold::spawn(&i.config, &i.log)).collect();
    for i in &instances {
        let up = || control_state(&i.socket).is_some();
        reached(&format!("{}'s control socket", i.name), Duration::from_secs(20), t0, up).unwrap();
    }
    let ports: Vec<u16> = instances.iter().map(|i| i.port).collect();
    let mut tally = Tally::default();
    let mut missed = cycles(c, &ports, t0, &mut tally);
    // Full again, then protected training: its GPUs come whatever the two
    // instances do (Slurm's preemption takes a supplemental replica).
    let loads = burst(&ports);
    missed.extend(
        reached("four replicas running before the protected job", Duration::from_secs(60), t0, || {
            running_replicas(c) >= 4
        })
        .err(),
    );
    std::thread::sleep(Duration::from_secs(TEST_MIN_RUNTIME_SECS + 1));
    let (training, took) = protected_training(c);
    eprintln!("{:>6.1}s protected training RUNNING {took:?} after submission", t0.elapsed().as_secs_f64());
    assert_untouched(c, foreign);
    std::thread::sleep(Duration::from_secs(5));
    tally.add(loads);
    let left = replica_jobs(c);
    eprintln!("{:>6.1}s replica jobs in the queue at the end: {left:?}", t0.elapsed().as_secs_f64());
    drop(daemons);
    let window = t0.elapsed();

    // Slurm's records of every job since the foreign one, once each ended.
    let last = left.values().flatten().map(|(id, _)| *id).max().unwrap_or(0).max(training) + 20;
    c.cancel_all();
    let mut recs = Vec::new();
    reached("accounting to record every replica job's end", Duration::from_secs(60), t0, || {
        recs = records(c, foreign..=last);
        recs.iter().all(|r| r.end.is_some() && !matches!(r.state.as_str(), "RUNNING" | "PENDING"))
    })
    .unwrap();
    let (found, duplicates) = per_slot(&recs);
    let cancelled: Vec<usize> = instances
        .iter()
        .map(|i| std::fs::read_to_string(&i.log).unwrap_or_default())
        .map(|l| l.matches("another replica job holds this one's slot").count())
        .collect();
    eprintln!(
        "{:.0} s: {} replica jobs, {duplicates} duplicate submissions; duplicates cancelled by a: {}, by b: {}; \
         clients: {} requests, answers {:?}",
        window.as_secs_f64(),
        recs.len(),
        cancelled[0],
        cancelled[1],
        tally.sent,
        tally.statuses
    );
    assert!(found.is_empty(), "slots that ran two replicas at once (job pairs): {found:?}\n{recs:#?}");
    // The instances did submit for one slot at once: what the dependency
    // is for happened, and Slurm held the second job back.
    assert!(duplicates > 0, "no slot got two jobs: the instances never collided\n{recs:#?}");
    assert!(missed.is_empty(), "phases not reached: {missed:?}");
    assert!(tally.statuses.get(&200).copied().unwrap_or(0) > 0, "the endpoint served: {:?}", tally.statuses);
    let _ = std::fs::remove_dir_all(&dir);
}
