//! `onepool`: the administrator's command for the shared GPU pool.

mod policy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "onepool", version, about = "One prioritized GPU pool on Slurm: policy tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check the policy file, or render the Slurm configuration that enforces it
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
}

/// Exit status when the command could not do its work at all (unreadable
/// file, Slurm command failing), as opposed to finding problems (1).
pub const EXIT_TROUBLE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(cmd) => policy::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("onepool: {e:#}");
            ExitCode::from(EXIT_TROUBLE)
        }
    }
}
