//! `onepool`: the administrator's command for the shared GPU pool.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

mod doctor;
mod gpus;
mod manpages;
mod policy;
mod replica;
mod report;
mod simulate;
mod status;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "onepool", version, about = "One prioritized GPU pool on Slurm: policy, GPU and simulation tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check the policy file, or render the Slurm configuration that enforces it
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// List this host's GPUs by device minor number (/dev/nvidiaN) and the processes holding them
    #[command(after_help = gpus::EXIT_STATUS_HELP)]
    Gpus(gpus::GpusArgs),
    /// Compare separate GPU islands with one shared pool on your own job history and inference traces
    Simulate(simulate::SimulateArgs),
    /// The pool per class (from Slurm) and the inference endpoints (from onepoold)
    Status(status::StatusArgs),
    /// End an endpoint's start back-off now (after fixing why its replicas failed to start)
    Retry(status::RetryArgs),
    /// Run an inference replica's server and drain it gracefully on Slurm's preemption notice
    Replica(replica::ReplicaArgs),
    /// Check a live cluster against the policy: every setting it relies on, PASS/WARN/FAIL with the fix
    #[command(after_help = doctor::EXIT_STATUS_HELP)]
    Doctor(doctor::DoctorArgs),
    /// What sharing did over a period, from Slurm's accounting and slurmctld's log: GPU-hours per class, reclaims, failed replicas
    Report(report::ReportArgs),
    /// Write the manual pages (onepool(1) and its subcommands, onepool.toml(5)) under DIR/man1 and DIR/man5
    #[command(hide = true)]
    Man { dir: std::path::PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(cmd) => policy::run(cmd),
        Command::Gpus(args) => gpus::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Retry(args) => status::retry(&args),
        Command::Replica(args) => replica::run_replica(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Man { dir } => manpages::write_all(&dir, Cli::command()).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("onepool: {e:#}");
            ExitCode::from(status::EXIT_TROUBLE)
        }
    }
}
