//! `onepool-validate`: bench/validate-simulator.sh's reports, the real
//! cluster's run beside the simulator's (see `validate`).
//!
//!     onepool-validate classes SCENARIO              > OUT/classes
//!     onepool-validate batch OUT SCENARIO JOBS.csv
//!     onepool-validate inference OUT SCENARIO
//!
//! `classes`: a line per class of the scenario's policy, `NAME MODE
//! NOTICE` (its reclaim mode and the seconds job.sh takes after a notice,
//! `-` for none): what the script submits each job with.

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use onepool_simulator::input::OnBadRow;
use onepool_simulator::scenario;
use onepool_simulator::validate::{batch, inference};

const USAGE: &str = "usage: onepool-validate classes SCENARIO | batch OUT SCENARIO JOBS.csv | inference OUT SCENARIO";

fn run(args: &[String]) -> Result<Option<String>, String> {
    let p = |i: usize| Path::new(&args[i]);
    Ok(Some(match (args.first().map(String::as_str), args.len()) {
        (Some("classes"), 2) => {
            let sc = scenario::load(p(1), OnBadRow::Abort)?;
            batch::class_notices(&sc).iter().map(|c| format!("{c}\n")).collect()
        }
        (Some("batch"), 4) => batch::report(&batch::Inputs::load(p(1), p(2), p(3))?)?,
        (Some("inference"), 3) => inference::report(&inference::Inputs::load(p(1), p(2))?)?,
        _ => return Ok(None),
    }))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(Some(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(None) => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("onepool-validate: {e}");
            ExitCode::FAILURE
        }
    }
}
