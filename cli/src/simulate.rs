//! `onepool simulate`: separate islands vs one shared pool on a scenario
//! (policy, fleet, job history, inference traces); see the
//! onepool-simulator crate.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::{Args, ValueEnum};
use onepool_simulator::compare::{self, Search, Settings};
use onepool_simulator::input::OnBadRow;
use onepool_simulator::report::{self, Report};
use onepool_simulator::{job_log, scenario, svg};

#[derive(Args)]
pub struct SimulateArgs {
    /// Scenario file (TOML: policy, fleet, jobs, endpoints)
    pub scenario: PathBuf,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Write SVG plots (demand vs allocation, GPUs needed) into this folder
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// What a malformed input row does: reported and left out, or stop
    #[arg(long, value_enum, default_value_t = BadRowArg::Skip)]
    pub on_bad_row: BadRowArg,
    /// Search the smallest shared pool that meets every target whatever it
    /// costs (by default it is searched when its estimated cost is small)
    #[arg(long, conflicts_with = "no_search")]
    pub search: bool,
    /// Do not search the smallest shared pool, even when it is cheap
    #[arg(long)]
    pub no_search: bool,
    /// Simulate the shared pool on this many nodes (the fleet's mix) instead of the scenario's
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Only the shared run: do not size separate islands (for timing)
    #[arg(long)]
    pub shared_only: bool,
    /// Autoscaler period in seconds
    #[arg(long, default_value_t = 2.0)]
    pub tick: f64,
    /// Print every job's simulated submit, start and end (shared run), to compare with sacct
    #[arg(long)]
    pub job_log: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BadRowArg {
    Skip,
    Abort,
}

/// What one simulation produced: the report, the shared run (its job
/// log) and the scenario it ran.
pub struct Outcome {
    pub report: Report,
    pub shared: onepool_simulator::engine::RunResult,
    pub scenario: scenario::Scenario,
    /// SVG files written (`--plots`).
    pub plots: Vec<PathBuf>,
}

/// Loads a scenario and compares separate islands with one shared pool:
/// the one path `onepool simulate` and `onepool report`'s "what the pool
/// saved" take, so the two give the same numbers on the same records.
pub fn evaluate(
    path: &std::path::Path,
    on_bad: OnBadRow,
    nodes: Option<u32>,
    settings: Settings,
    search: Search,
    plots: Option<&std::path::Path>,
) -> anyhow::Result<Outcome> {
    let sc = scenario::load(path, on_bad).map_err(|e| anyhow!(e))?;
    let fleet = match nodes {
        Some(0) => return Err(anyhow!("--nodes must be at least 1")),
        Some(n) => sc.fleet.scaled(n),
        None => sc.fleet.clone(),
    };
    let settings = Settings { max_p95_wait_s: sc.max_p95_wait_s, ..settings };
    let (cmp, shared) = compare::compare(&sc.workload, &sc.policy, &fleet, &settings, search);
    let plots = match plots {
        Some(dir) => svg::write_all(dir, &cmp).with_context(|| format!("writing plots into {}", dir.display()))?,
        None => Vec::new(),
    };
    let report = Report::new(fleet.gpus(), &sc.bad_rows, &sc.ignored, cmp);
    Ok(Outcome { report, shared, scenario: sc, plots })
}

pub fn run(a: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let on_bad = match a.on_bad_row {
        BadRowArg::Skip => OnBadRow::Skip,
        BadRowArg::Abort => OnBadRow::Abort,
    };
    if !(a.tick > 0.0 && a.tick.is_finite()) {
        return Err(anyhow!("--tick must be a positive number of seconds"));
    }
    let settings = Settings { tick_s: a.tick, job_log: a.job_log, separate: !a.shared_only, ..Settings::default() };
    let search = match (a.search, a.no_search) {
        (true, _) => Search::Always,
        (false, true) => Search::Never,
        (false, false) => Search::Auto,
    };
    let Outcome { report: r, shared, scenario: sc, plots } =
        evaluate(&a.scenario, on_bad, a.nodes, settings, search, a.plots.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", report::table(&r));
    }
    for f in plots {
        eprintln!("wrote {}", f.display());
    }
    if a.job_log {
        eprintln!("{}", job_log::HEADER);
        for e in &shared.job_log {
            eprintln!("{}", job_log::line(e, &sc.workload.classes));
        }
    }
    if !a.json && r.skipped_rows > 0 {
        eprintln!("onepool: {} malformed input rows were skipped (listed above)", r.skipped_rows);
    }
    Ok(ExitCode::SUCCESS)
}
