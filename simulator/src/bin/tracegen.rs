//! `onepool-tracegen`: the benchmark's long inputs (see `generate`).
//!
//!     onepool-tracegen trace BASE.csv DAYS REQUESTS [SEED] > trace.csv
//!     onepool-tracegen jobs DAYS GAP_SECONDS CLASS [SEED] > jobs.csv
//!     onepool-tracegen bursts BASE.csv SECONDS [SEED] > bursty.csv
//!
//! `bursts`: quiet gaps of 30-140 s (Pareto, shape 1.2) at 0.5 requests/s,
//! and bursts of 1.6-8 s at 36-62 requests/s; request sizes drawn from
//! BASE's rows ([`generate::BurstShape::ISSUE_18`]).

// No FFI here: nothing unsafe, ever (issue #27).
#![forbid(unsafe_code)]

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use onepool_simulator::generate;
use onepool_simulator::input::{azure, OnBadRow};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(d);
    let out = std::io::stdout().lock();
    let mut out = BufWriter::new(out);
    let base = |path: &str| -> Option<Vec<azure::Request>> {
        let text = std::fs::read_to_string(path).map_err(|e| eprintln!("onepool-tracegen: {path}: {e}")).ok()?;
        azure::read(path, &text, None, OnBadRow::Abort)
            .map(|r| r.rows)
            .map_err(|e| eprintln!("onepool-tracegen: {e}"))
            .ok()
    };
    match args.first().map(String::as_str) {
        Some(kind @ ("trace" | "bursts")) if args.len() >= 3 => {
            let Some(base) = base(&args[1]) else { return ExitCode::from(2) };
            let reqs = if kind == "trace" {
                generate::tile(&base, num(2, 1) as u32, num(3, 1_000_000), num(4, 1))
            } else {
                generate::bursts(&base, num(2, 600) as f64, &generate::BurstShape::ISSUE_18, num(3, 1))
            };
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
                "usage: onepool-tracegen trace BASE.csv DAYS REQUESTS [SEED] | jobs DAYS GAP_SECONDS CLASS [SEED] | bursts BASE.csv SECONDS [SEED]"
            );
            return ExitCode::from(2);
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
