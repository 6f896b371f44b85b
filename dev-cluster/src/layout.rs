//! Where everything of one dev cluster lives inside its state folder. Two
//! clusters in two folders share nothing but the installed binaries.

use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }
    fn sub(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }
    pub fn etc(&self) -> PathBuf {
        self.sub("etc")
    }
    pub fn slurm_conf(&self) -> PathBuf {
        self.sub("etc/slurm.conf")
    }
    pub fn policy_slurm_conf(&self) -> PathBuf {
        self.sub("etc/onepool-slurm.conf")
    }
    pub fn slurmdbd_conf(&self) -> PathBuf {
        self.sub("etc/slurmdbd.conf")
    }
    pub fn cgroup_conf(&self) -> PathBuf {
        self.sub("etc/cgroup.conf")
    }
    pub fn gres_conf(&self) -> PathBuf {
        self.sub("etc/gres.conf")
    }
    pub fn plugstack_conf(&self) -> PathBuf {
        self.sub("etc/plugstack.conf")
    }
    /// Beside slurm.conf, where job_submit/onepool looks for it.
    pub fn policy(&self) -> PathBuf {
        self.sub("etc/onepool.toml")
    }
    /// The fake GPU source's "processes on GPUs" file (a test aid).
    pub fn gpu_processes(&self) -> PathBuf {
        self.sub("gpu-processes")
    }
    pub fn job_submit_lua(&self) -> PathBuf {
        self.sub("etc/job_submit.lua")
    }
    pub fn munge_key(&self) -> PathBuf {
        self.sub("etc/munge.key")
    }
    pub fn run(&self) -> PathBuf {
        self.sub("run")
    }
    /// munged checks that every folder above its socket is not writable by
    /// others and that the socket's own folder is 0755.
    pub fn munge_dir(&self) -> PathBuf {
        self.sub("run/munge")
    }
    pub fn munge_socket(&self) -> PathBuf {
        self.sub("run/munge/munge.socket")
    }
    pub fn db_socket(&self) -> PathBuf {
        self.sub("run/mysqld.sock")
    }
    pub fn db_dir(&self) -> PathBuf {
        self.sub("db")
    }
    pub fn log(&self) -> PathBuf {
        self.sub("log")
    }
    pub fn log_file(&self, name: &str) -> PathBuf {
        self.sub("log").join(format!("{name}.log"))
    }
    pub fn state(&self) -> PathBuf {
        self.sub("state")
    }
    pub fn spool(&self) -> PathBuf {
        self.sub("spool")
    }
    pub fn dev(&self) -> PathBuf {
        self.sub("dev")
    }
    pub fn plugins(&self) -> PathBuf {
        self.sub("plugins")
    }
    pub fn pids(&self) -> PathBuf {
        self.sub("pids")
    }
    pub fn pid_file(&self, service: &str) -> PathBuf {
        self.pids().join(format!("{service}.pid"))
    }
    pub fn cluster_json(&self) -> PathBuf {
        self.sub("cluster.json")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.sub(".lock")
    }
    pub fn all_dirs(&self) -> Vec<PathBuf> {
        vec![
            self.etc(),
            self.run(),
            self.munge_dir(),
            self.db_dir(),
            self.log(),
            self.state(),
            self.spool(),
            self.dev(),
            self.plugins(),
            self.pids(),
        ]
    }
}

pub fn display(p: &Path) -> String {
    p.display().to_string()
}
