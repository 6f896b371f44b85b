//! `onepool policy check|render`.

mod args;
pub(crate) mod check;
mod json;
mod render;
pub(crate) mod source;

use std::process::ExitCode;

pub use args::PolicyCommand;

pub fn run(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Check(args) => check::run(&source::read(args.file)?),
        PolicyCommand::Render(args) => render::run(&source::read(args.file.clone())?, &args),
    }
}
