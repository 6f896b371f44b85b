//! The integration-test harness: one real dev cluster per test run (brought
//! up on first use, or reused if it is already up), plus helpers to submit
//! jobs and read Slurm's answers.
//!
//! The cluster lives in `$ONEPOOL_TEST_CLUSTER_DIR` (default
//! `target/test-cluster`); the plugins come from cargo's output folder, so
//! run `cargo build --workspace` before the tests (scripts/test.sh does).
//! Tests that share the cluster must run one at a time
//! (`--test-threads=1`): each leaves it idle for the next.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

use onepool_devcluster::{Cluster, Spec, UpOptions};

pub struct TestCluster {
    pub cluster: Cluster,
    pub spec: Spec,
}

/// cargo's output folder (target/debug), found from the test binary
/// (target/debug/deps/NAME-HASH).
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// The shared cluster, up and idle.
pub fn cluster() -> &'static TestCluster {
    static C: OnceLock<TestCluster> = OnceLock::new();
    C.get_or_init(|| {
        let dir = std::env::var_os("ONEPOOL_TEST_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target").join("test-cluster"));
        let plugins = build_dir();
        for (built, _) in onepool_devcluster::PLUGINS {
            assert!(
                plugins.join(built).exists(),
                "{} is missing: run `cargo build --workspace` before the integration tests",
                plugins.join(built).display()
            );
        }
        let cluster = Cluster::at(&dir).expect("cluster folder");
        let opts = UpOptions {
            plugin_source: Some(plugins),
            ..UpOptions::default()
        };
        let spec = cluster
            .up(&opts, &mut |m| eprintln!("test-cluster: {m}"))
            .unwrap_or_else(|e| {
                panic!(
                    "bringing up the test cluster in {} failed: {e}",
                    dir.display()
                )
            });
        let tc = TestCluster { cluster, spec };
        tc.cancel_all();
        tc
    })
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
        self.cmd(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"))
            .into()
    }

    /// Runs a command that must succeed; returns stdout.
    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let r = self.run(program, args);
        assert!(
            r.ok,
            "{program} {args:?} failed ({:?}): {}{}",
            r.code, r.stdout, r.stderr
        );
        r.stdout
    }

    /// `sbatch --parsable ARGS`; returns the job id.
    pub fn sbatch(&self, args: &[&str]) -> u32 {
        let mut all = vec!["--parsable", "-o", "/dev/null"];
        all.extend_from_slice(args);
        let out = self.ok("sbatch", &all);
        out.trim()
            .split(';')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
    }

    /// The job's state from squeue (`None` once it left the queue).
    pub fn state(&self, job: u32) -> Option<String> {
        let out = self.ok("squeue", &["-h", "-j", &job.to_string(), "-o", "%T"]);
        let s = out.trim();
        (!s.is_empty()).then(|| s.to_string())
    }

    /// The job's final state as accounting recorded it.
    pub fn sacct_state(&self, job: u32) -> Option<String> {
        let out = self.ok(
            "sacct",
            &["-X", "-n", "-P", "-j", &job.to_string(), "-o", "State"],
        );
        out.lines()
            .next()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> bool,
    ) -> Duration {
        let t0 = Instant::now();
        while !f() {
            assert!(
                t0.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}"
            );
            sleep(Duration::from_millis(100));
        }
        t0.elapsed()
    }

    pub fn wait_state(&self, job: u32, want: &str, timeout: Duration) -> Duration {
        self.wait_until(&format!("job {job} to be {want}"), timeout, || {
            self.state(job).as_deref() == Some(want)
        })
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
        self.wait_until(
            "all jobs to leave the queue",
            Duration::from_secs(60),
            || self.ok("squeue", &["-h", "-o", "%i"]).trim().is_empty(),
        );
        self.wait_until("all nodes to be idle", Duration::from_secs(60), || {
            let out = self.ok("sinfo", &["-h", "-N", "-o", "%t"]);
            out.lines().all(|l| l.trim() == "idle")
        });
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.cluster.layout.log_file(name)).unwrap_or_default()
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
