//! What the demo is set to: its endpoint, sizes and phases, the other
//! user it must leave alone, and its command line.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Parser;
use onepool_dev_cluster::model_server::Slots;

pub(crate) const ENDPOINT: &str = "chat";
/// GPUs per replica (one node of the dev cluster).
pub(crate) const GPUS: u32 = 4;
/// Trace seconds per wall second in the light and the heavy phase.
pub(crate) const LIGHT: f64 = 0.4;
pub(crate) const HEAVY: f64 = 1.0;
pub(crate) const LIGHT_SECS: u64 = 15;
/// The demo policy's min_runtime_before_reclaim (PreemptExemptTime).
pub(crate) const MIN_RUNTIME_SECS: f64 = 10.0;
pub(crate) const TRAINING_SECS: u64 = 20;
pub(crate) const SCALE_DOWN_DELAY_SECS: u64 = 20;
/// One replica's llama-server: one CPU thread (the machine has few), as
/// many requests at once as the endpoint sends it.
pub(crate) const SLOTS: Slots = Slots { parallel: 4, context: 256, threads: 1 };
/// The other user's job, which onepoold must leave alone.
pub(crate) const OTHER_USER: &str = "op-ana";
pub(crate) const OTHER_ACCOUNT: &str = "research";
pub(crate) const OTHER_JOB: &str = "research-finetune";
pub(crate) const TRAINING_JOB: &str = "critical-training";

pub(crate) static ABORT: AtomicBool = AtomicBool::new(false);

#[derive(Parser)]
#[command(name = "onepool-demo", about = "onepoold autoscaling and graceful reclaim on a dev cluster that is up")]
pub(crate) struct Args {
    /// The dev cluster's state folder (`onepool-devcluster --dir`).
    #[arg(long, env = "ONEPOOL_DEVCLUSTER_DIR", default_value = ".devcluster")]
    pub(crate) dir: PathBuf,
    /// Folder with onepoold and onepool (default: beside this binary).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
    /// The Azure LLM inference trace to replay.
    #[arg(long, default_value = "data/azure-llm-inference-2023-conv.csv")]
    pub(crate) trace: PathBuf,
    /// The model server and model (scripts/model-server.sh makes them).
    #[arg(long, env = "ONEPOOL_MODEL_SERVER_DIR", default_value = "/var/cache/onepool/model-server")]
    pub(crate) model_server: PathBuf,
    /// The reclaim's victim at Slurm's pick: idle (the load pauses until
    /// nothing is in flight), busy (the training is submitted while every
    /// supplemental replica has requests in flight), or as the trace makes it
    #[arg(long, env = "ONEPOOL_DEMO_VICTIM", value_enum, default_value = "any")]
    pub(crate) victim: Victim,
}

/// What the reclaim's victim is doing when Slurm picks it (issue #35: every
/// check of the demo must hold for an idle victim, which drains in no
/// time, as for a busy one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Victim {
    /// Whatever the trace's load makes it.
    Any,
    /// Nothing in flight: the load pauses until every request is answered.
    Idle,
    /// Requests in flight on every supplemental replica.
    Busy,
}
