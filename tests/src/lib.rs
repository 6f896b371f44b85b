//! The integration-test harness: one real dev cluster per test run (brought
//! up on first use, or reused if it is already up), plus helpers to submit
//! jobs and read Slurm's answers.
//!
//! The cluster lives in `$ONEPOOL_TEST_CLUSTER_DIR` (default
//! `target/test-cluster`); the plugins come from cargo's output folder, so
//! run `cargo build --workspace` before the tests (scripts/test.sh does).
//! Tests that share the cluster must run one at a time
//! (`--test-threads=1`): each leaves it idle for the next.
//!
//! `ONEPOOL_TEST_HOSTS=1` runs them on a hosts-mode cluster
//! (`onepool-devcluster up --hosts`: each node, the head, a service and a
//! client host in network namespaces of their own) in
//! `target/hosts-cluster`, unless `ONEPOOL_TEST_CLUSTER_DIR` names another
//! folder. The test process stays in the root namespace, which the bridge
//! joins as the "admin" host: Slurm commands and an in-process onepoold
//! reach every host by its address.

/// The hosts mode's packet capture (moved to the dev cluster: the demo uses it too).
pub use onepool_dev_cluster::capture;
pub mod answers;
pub mod elastic;
pub mod libslurm;
pub mod replica_records;
pub mod streams;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

use onepool_dev_cluster::{Cluster, Spec, UpOptions};

/// A benchmark's cluster of its own in `dir`, up with `policy` and the
/// plugins just built, its queue empty.
pub fn bench_cluster(dir: &std::path::Path, policy: PathBuf) -> TestCluster {
    let cluster = Cluster::at(dir).expect("cluster folder");
    let options = UpOptions { plugin_source: Some(build_dir()), policy: Some(policy), ..UpOptions::default() };
    let spec = cluster.up(&options, &mut |m| eprintln!("cluster: {m}")).expect("bringing the cluster up");
    let c = TestCluster { cluster, spec };
    c.cancel_all();
    c
}

pub struct TestCluster {
    pub cluster: Cluster,
    pub spec: Spec,
}

/// cargo's output folder (target/debug), found from the running binary:
/// a test (target/debug/deps/NAME-HASH) or one of this crate's programs
/// (target/debug/NAME).
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("the binary lives in a folder");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("target/<profile>/deps").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The folder above the build's profile folder: `target`, or
/// `target/slurm-RELEASE` for a build against another release's headers.
/// What one build's tests leave (clusters, policies) goes here, so that the
/// releases' runs never share a cluster or its database.
pub fn output_dir() -> PathBuf {
    build_dir().parent().expect("target/<profile> has a parent").to_path_buf()
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// The shipped sample policy with one change: borrowers may be reclaimed
/// after 10 s instead of 2 minutes, so preemption tests take seconds (and
/// still show that the minimum run time holds).
pub const TEST_MIN_RUNTIME_SECS: u64 = 10;

/// The text of the test policy (benchmarks change it further).
pub fn test_policy_text() -> String {
    let sample = std::fs::read_to_string(workspace_root().join("etc/onepool.toml")).expect("etc/onepool.toml");
    let from = "min_runtime_before_reclaim = \"2m\"";
    assert!(sample.contains(from), "etc/onepool.toml no longer says {from}; update the test harness");
    sample.replace(from, &format!("min_runtime_before_reclaim = \"{TEST_MIN_RUNTIME_SECS}s\""))
}

/// [`test_policy_text`] with the sample's commented warm class
/// (`[classes.inference-warm]`) taken in, as its comment tells admins to.
pub fn warm_policy_text() -> String {
    let sample = test_policy_text();
    let start = sample.find("# [classes.inference-warm]").expect("etc/onepool.toml's commented warm class");
    let block: String = sample[start..].lines().map_while(|l| l.strip_prefix("# ")).map(|l| format!("{l}\n")).collect();
    assert!(block.contains("rank = "), "the warm class block ends early: {block}");
    format!("{sample}\n{block}")
}

/// The test policy, written next to the build.
pub fn test_policy() -> PathBuf {
    let path = output_dir().join("onepool-test-policy.toml");
    std::fs::write(&path, test_policy_text()).expect("writing the test policy");
    path
}

/// How the harness brings the cluster up (also to restart what a test stopped).
pub fn up_options() -> UpOptions {
    UpOptions {
        plugin_source: Some(build_dir()),
        policy: Some(test_policy()),
        hosts: hosts_mode(),
        ..UpOptions::default()
    }
}

/// Whether the tests run on a hosts-mode cluster (`ONEPOOL_TEST_HOSTS=1`).
pub fn hosts_mode() -> bool {
    std::env::var("ONEPOOL_TEST_HOSTS").is_ok_and(|v| v == "1")
}

/// The shared cluster's folder: `ONEPOOL_TEST_CLUSTER_DIR`, else
/// `test-cluster` (`hosts-cluster` in the hosts mode) beside the build, so
/// that the two modes never share a folder, its ports or its database.
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("ONEPOOL_TEST_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| output_dir().join(if hosts_mode() { "hosts-cluster" } else { "test-cluster" }))
}

/// The shared cluster, up and idle.
pub fn cluster() -> &'static TestCluster {
    static C: OnceLock<TestCluster> = OnceLock::new();
    C.get_or_init(|| {
        let dir = cluster_dir();
        let plugins = build_dir();
        for (built, _) in onepool_dev_cluster::PLUGINS {
            assert!(
                plugins.join(built).exists(),
                "{} is missing: run `cargo build --workspace` before the integration tests",
                plugins.join(built).display()
            );
        }
        let cluster = Cluster::at(&dir).expect("cluster folder");
        let spec = cluster
            .up(&up_options(), &mut |m| eprintln!("test-cluster: {m}"))
            .unwrap_or_else(|e| panic!("bringing up the test cluster in {} failed: {e}", dir.display()));
        let tc = TestCluster { cluster, spec };
        tc.cancel_all();
        tc
    })
}

/// The hosts-mode cluster (`up --hosts`) in `hosts-cluster` beside the
/// build, up and idle: the shared cluster itself under
/// `ONEPOOL_TEST_HOSTS=1`, else one brought up for the hosts tests.
pub fn hosts_cluster() -> &'static TestCluster {
    if hosts_mode() {
        return cluster();
    }
    static C: OnceLock<TestCluster> = OnceLock::new();
    C.get_or_init(|| {
        let dir = output_dir().join("hosts-cluster");
        let cluster = Cluster::at(&dir).expect("cluster folder");
        let options = UpOptions { hosts: true, ..up_options() };
        let spec = cluster
            .up(&options, &mut |m| eprintln!("hosts-cluster: {m}"))
            .unwrap_or_else(|e| panic!("bringing up the hosts-mode cluster in {} failed: {e}", dir.display()));
        let tc = TestCluster { cluster, spec };
        tc.cancel_all();
        tc
    })
}

/// A cluster of its own whose nodes track processes and constrain GPU
/// devices by cgroup (`onepool-devcluster up --cgroup`), with the test
/// policy; `Err` with the measured reason where this machine cannot host
/// it (no cgroup v1 freezer and devices hierarchies).
pub fn cgroup_cluster() -> Result<&'static TestCluster, String> {
    static C: OnceLock<Result<TestCluster, String>> = OnceLock::new();
    C.get_or_init(|| {
        onepool_dev_cluster::cgroups::check_this_host().map_err(|e| e.to_string())?;
        let cluster = Cluster::at(output_dir().join("cgroup-cluster")).map_err(|e| e.to_string())?;
        // `ip netns exec` hides the cgroup v1 hierarchies: never in the hosts mode.
        let options = UpOptions { cgroup: true, hosts: false, ..up_options() };
        let spec = cluster
            .up(&options, &mut |m| eprintln!("cgroup-cluster: {m}"))
            .unwrap_or_else(|e| panic!("bringing up the cgroup cluster failed: {e}"));
        let tc = TestCluster { cluster, spec };
        tc.cancel_all();
        Ok(tc)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// What a Slurm command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Ran {
    fn from(o: Output) -> Ran {
        Ran {
            ok: o.status.success(),
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl TestCluster {
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = self.cluster.command(program);
        c.current_dir(self.cluster.layout.root.join("state"));
        c
    }

    /// Runs a Slurm command (as the current user) and returns what it said.
    pub fn run(&self, program: &str, args: &[&str]) -> Ran {
        self.cmd(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}")).into()
    }

    /// Runs a command that must succeed; returns stdout.
    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let r = self.run(program, args);
        assert!(r.ok, "{program} {args:?} failed ({:?}): {}{}", r.code, r.stdout, r.stderr);
        r.stdout
    }

    /// `sbatch --parsable ARGS`; returns the job id.
    pub fn sbatch(&self, args: &[&str]) -> u32 {
        let mut all = vec!["--parsable", "-o", "/dev/null"];
        all.extend_from_slice(args);
        let out = self.ok("sbatch", &all);
        out.trim().split(';').next().unwrap().parse().unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
    }

    /// `sbatch --parsable ARGS` with the job's output in `log`.
    pub fn sbatch_with_output(&self, args: &[&str], log: &std::path::Path) -> u32 {
        let mut all = vec!["--parsable", "-o", log.to_str().expect("UTF-8 path")];
        all.extend_from_slice(args);
        let out = self.ok("sbatch", &all);
        out.trim().split(';').next().unwrap().parse().unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
    }

    /// The job's state from squeue (`None` once it left the queue).
    pub fn state(&self, job: u32) -> Option<String> {
        let out = self.ok("squeue", &["-h", "-j", &job.to_string(), "-o", "%T"]);
        let s = out.trim();
        (!s.is_empty()).then(|| s.to_string())
    }

    /// The job's final state as accounting recorded it.
    pub fn sacct_state(&self, job: u32) -> Option<String> {
        let out = self.ok("sacct", &["-X", "-n", "-P", "-j", &job.to_string(), "-o", "State"]);
        out.lines().next().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    }

    /// The job's final state once accounting has recorded its end.
    /// slurmdbd is written asynchronously: a job that has just left
    /// squeue can still read PENDING or RUNNING in sacct for a moment.
    pub fn final_state(&self, job: u32) -> Option<String> {
        const LIVE: [&str; 6] = ["PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "RESIZING", "COMPLETING"];
        let mut last = None;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            last = self.sacct_state(job);
            match last.as_deref() {
                Some(s) if !LIVE.iter().any(|l| s.starts_with(l)) => return last,
                _ => sleep(Duration::from_millis(200)),
            }
        }
        last
    }

    /// Waits until accounting has each of `jobs`' end, eligible and start
    /// times, as `onepool report` needs them: sacct's time window leaves
    /// out a job whose eligible time reads `Unknown`, and that lasts a few
    /// seconds after the end of a job whose comment was updated (3.6 s
    /// measured on 22.05) or that was cancelled within a second of its
    /// start (a test's taker: up to 1.6 s measured, nodes capped), so a
    /// windowed query cannot be what waits for them. Every job passed must
    /// have run and ended: an `Unknown` start or end is waited out too.
    pub fn wait_for_accounting(&self, jobs: &[u32]) {
        let ids: std::collections::BTreeSet<String> = jobs.iter().map(u32::to_string).collect();
        let list = ids.iter().cloned().collect::<Vec<_>>().join(",");
        self.wait_until("accounting's eligible, start and end times", Duration::from_secs(60), || {
            let out = self.ok("sacct", &["-X", "-P", "-n", "-j", &list, "--format=JobID,Eligible,Start,End"]);
            out.lines().filter(|l| !l.is_empty()).count() == ids.len() && !out.contains("Unknown")
        });
    }

    pub fn wait_until(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
            sleep(Duration::from_millis(100));
        }
        t0.elapsed()
    }

    pub fn wait_state(&self, job: u32, want: &str, timeout: Duration) -> Duration {
        self.wait_until(&format!("job {job} to be {want}"), timeout, || self.state(job).as_deref() == Some(want))
    }

    /// Cancels every job and waits until the nodes are idle again.
    pub fn cancel_all(&self) {
        let ids = self.ok("squeue", &["-h", "-o", "%i"]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["--quiet"];
            args.extend(ids);
            let _ = self.run("scancel", &args);
        }
        self.wait_until("all jobs to leave the queue", Duration::from_secs(60), || {
            self.ok("squeue", &["-h", "-o", "%i"]).trim().is_empty()
        });
        self.wait_until("all nodes to be idle", Duration::from_secs(60), || {
            let out = self.ok("sinfo", &["-h", "-N", "-o", "%t"]);
            out.lines().all(|l| l.trim() == "idle")
        });
    }

    /// The hosts mode's network; `None` on a single-namespace cluster.
    pub fn hosts(&self) -> Option<onepool_dev_cluster::hosts::HostsNet> {
        self.spec.hosts
    }

    /// `program` run on `host` (`head`, `service`, `service2`, `client`, `nodeN`) with
    /// the cluster's environment: in the host's network namespace in the
    /// hosts mode, as is on a single-namespace cluster (one host).
    pub fn on_host(&self, host: &str, program: &str) -> Command {
        let c = self.cmd(program);
        let Some(net) = self.hosts() else {
            return c;
        };
        let h = net
            .hosts(self.spec.nodes)
            .into_iter()
            .find(|h| h.name == host)
            .unwrap_or_else(|| panic!("the cluster has no host {host}"));
        onepool_dev_cluster::hosts::in_namespace(&c, &h)
    }

    /// Where a launcher a test starts by hand listens on its node: the
    /// node's loopback on a single-namespace cluster (the test's own), every
    /// address of the node's namespace in the hosts mode (the test reaches
    /// it at [`Self::job_address`]).
    pub fn replica_listen_ip(&self) -> &'static str {
        if self.hosts().is_some() {
            "0.0.0.0"
        } else {
            "127.0.0.1"
        }
    }

    /// The address the node a job runs on (its batch host) has: its
    /// NodeAddr, 127.0.0.1 on a single-namespace cluster.
    pub fn job_address(&self, job: u32) -> std::net::IpAddr {
        let node = self.job_fields(job).get("BatchHost").cloned().unwrap_or_default();
        self.node_address(&node)
    }

    /// A node's address as Slurm has it (NodeAddr).
    pub fn node_address(&self, node: &str) -> std::net::IpAddr {
        let out = self.ok("scontrol", &["-o", "show", "node", node]);
        let addr = out.split_whitespace().find_map(|kv| kv.strip_prefix("NodeAddr=")).unwrap_or_default();
        addr.parse().unwrap_or_else(|_| panic!("node {node}'s NodeAddr is {addr:?}, not an address"))
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.cluster.layout.log_file(name)).unwrap_or_default()
    }
}

/// A real Unix user with a Slurm account association, created once.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub account: String,
}

impl TestCluster {
    /// Creates (if needed) a Unix user and its Slurm account and association.
    pub fn user(&self, name: &str, account: &str) -> User {
        if !Command::new("id").arg("-u").arg(name).output().map(|o| o.status.success()).unwrap_or(false) {
            let out = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", name])
                .output()
                .expect("useradd");
            assert!(
                out.status.success() || out.status.code() == Some(9),
                "useradd {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let uid: u32 = String::from_utf8_lossy(&Command::new("id").arg("-u").arg(name).output().unwrap().stdout)
            .trim()
            .parse()
            .unwrap();
        let accounts = self.ok("sacctmgr", &["-n", "-P", "show", "account", "format=account"]);
        if !accounts.lines().any(|a| a.trim() == account) {
            self.ok("sacctmgr", &["-i", "add", "account", account, "Description=test", "Organization=test"]);
        }
        let assocs = self.ok("sacctmgr", &["-n", "-P", "show", "assoc", "format=account,user"]);
        if !assocs.lines().any(|l| l.trim() == format!("{account}|{name}")) {
            self.ok("sacctmgr", &["-i", "add", "user", name, &format!("Account={account}")]);
        }
        User { name: name.to_string(), uid, account: account.to_string() }
    }

    /// Runs a Slurm command as `user`, in /tmp.
    pub fn run_as(&self, user: &User, program: &str, args: &[&str]) -> Ran {
        self.as_user(user, program, args).output().unwrap_or_else(|e| panic!("runuser {program}: {e}")).into()
    }

    /// [`Self::run_as`] on `host` (`nodeN`, `client`, ...): in its network
    /// namespace in the hosts mode, where a user's process on that node
    /// sees what the node listens on; as [`Self::run_as`] otherwise.
    pub fn run_as_on(&self, host: &str, user: &User, program: &str, args: &[&str]) -> Ran {
        let c = self.as_user(user, program, args);
        let mut c = match self.hosts().and_then(|net| net.hosts(self.spec.nodes).into_iter().find(|h| h.name == host)) {
            Some(h) => onepool_dev_cluster::hosts::in_namespace(&c, &h),
            None if self.hosts().is_some() => panic!("the cluster has no host {host}"),
            None => c,
        };
        c.output().unwrap_or_else(|e| panic!("runuser {program} on {host}: {e}")).into()
    }

    fn as_user(&self, user: &User, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", &user.name, "--", "env"]);
        for (k, v) in self.cluster.env() {
            c.arg(format!("{k}={v}"));
        }
        c.arg(program).args(args).current_dir("/tmp");
        c
    }

    /// `scontrol show job` as key=value pairs.
    pub fn job_fields(&self, job: u32) -> std::collections::HashMap<String, String> {
        let out = self.ok("scontrol", &["-o", "show", "job", &job.to_string()]);
        out.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// GPUs Slurm allocated to a started job, from `scontrol show job`:
    /// `TRES=` in 22.05, `AllocTRES=` since 23.02. Panics when neither is
    /// printed, so that a renamed field cannot turn a check into 0 <= cap.
    pub fn allocated_gpus(&self, job: u32) -> u64 {
        let f = self.job_fields(job);
        let tres = f
            .get("AllocTRES")
            .or_else(|| f.get("TRES"))
            .unwrap_or_else(|| panic!("scontrol show job {job} prints neither AllocTRES nor TRES: {f:?}"));
        tres.split(',').find_map(|kv| kv.strip_prefix("gres/gpu=")).map_or(0, |n| n.parse().unwrap_or(0))
    }

    /// slurmctld still answers (after every bad-input case).
    pub fn assert_ctld_up(&self) {
        let out = self.ok("scontrol", &["ping"]);
        assert!(out.contains("UP"), "slurmctld is down: {out}");
    }
}

/// Cancels the test's jobs when it ends, pass or fail, so the next test
/// finds the cluster idle.
pub struct Cleanup<'a>(pub &'a TestCluster);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        self.0.cancel_all();
    }
}
