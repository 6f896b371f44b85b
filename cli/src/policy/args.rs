//! The command line of `onepool policy check|render`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Lint the policy file: every problem with its line and column
    Check(CheckArgs),
    /// Print the slurm.conf settings and sacctmgr commands that enforce the policy
    Render(RenderArgs),
}

#[derive(Args)]
pub struct CheckArgs {
    /// Policy file [default: $ONEPOOL_POLICY, else /etc/slurm/onepool.toml]
    pub file: Option<PathBuf>,
}

#[derive(Args)]
pub struct RenderArgs {
    /// Policy file [default: $ONEPOOL_POLICY, else /etc/slurm/onepool.toml]
    pub file: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Ask the running cluster (sacctmgr, scontrol) and print only what differs
    #[arg(long)]
    pub against_live: bool,
    /// Only the sacctmgr commands
    #[arg(long, conflicts_with = "slurm_conf_only")]
    pub sacctmgr_only: bool,
    /// Only the slurm.conf lines
    #[arg(long)]
    pub slurm_conf_only: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}
