//! `onepool-tracegen`: the benchmark's long inputs (see `generate`).
//!
//!     onepool-tracegen trace BASE.csv DAYS REQUESTS [SEED] > trace.csv
//!     onepool-tracegen jobs DAYS GAP_SECONDS CLASS [SEED] > jobs.csv

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use onepool_simulator::generate;
use onepool_simulator::input::{azure, OnBadRow};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(d);
    let out = std::io::stdout().lock();
    let mut out = BufWriter::new(out);
    match args.first().map(String::as_str) {
        Some("trace") if args.len() >= 4 => {
            let text = match std::fs::read_to_string(&args[1]) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("onepool-tracegen: {}: {e}", args[1]);
                    return ExitCode::from(2);
                }
            };
            let base = match azure::read(&args[1], &text, OnBadRow::Abort) {
                Ok(r) => r.rows,
                Err(e) => {
                    eprintln!("onepool-tracegen: {e}");
                    return ExitCode::from(2);
                }
            };
            let reqs = generate::tile(&base, num(2, 1) as u32, num(3, 1_000_000), num(4, 1));
            let _ = writeln!(out, "TIMESTAMP,ContextTokens,GeneratedTokens");
            for r in reqs {
                let _ = writeln!(out, "{:.3},{},{}", r.t, r.context_tokens, r.generated_tokens);
            }
        }
        Some("jobs") if args.len() >= 4 => {
            let gap: f64 = args[2].parse().unwrap_or(600.0);
            let _ = write!(out, "{}", generate::jobs(num(1, 1) as u32, gap, &args[3], num(4, 1)));
        }
        _ => {
            eprintln!(
                "usage: onepool-tracegen trace BASE.csv DAYS REQUESTS [SEED] | jobs DAYS GAP_SECONDS CLASS [SEED]"
            );
            return ExitCode::from(2);
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
