//! `onepool report`: what sharing did on a live cluster over a period,
//! measured from Slurm's accounting (`sacct`), which only slurmctld and
//! administrators write ([`records`]; never slurmctld's log, which quotes
//! users' text raw):
//! GPU-hours per class, those run on borrowed protected capacity, idle
//! GPU-hours, each reclaim (victim, taker, mode, what a drained replica
//! finished and cut, the taker's time to capacity, the GPUs that changed
//! hands), replica jobs that failed, in audit mode what the plugin
//! would have placed or refused, and what the pool saved: the GPUs
//! separate islands would have needed for the period's records, by the
//! simulator ([`saved`]). The counterpart of `onepool simulate`: the
//! simulator predicts, the report measures.

pub mod decisions;
pub mod failures;
pub mod reclaims;
pub mod records;
pub mod replica_jobs;
mod rotated;
pub mod saved;
pub mod serving;
mod svg;
pub mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use onepool_decisions::policy::load;
use onepool_decisions::render::live::{self, parse_scontrol_config};
use onepool_decisions::trace::format_time;
use onepool_slurm_commands::{Runner, SystemRunner};

const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

#[derive(Args)]
pub struct ReportArgs {
    /// Policy file [default: $ONEPOOL_POLICY, else /etc/slurm/onepool.toml]
    pub policy: Option<PathBuf>,
    /// Start of the period, as sacct takes it (e.g. 2026-12-01T00:00:00, or now-7days) [default: 24 hours before --to]
    #[arg(long)]
    pub from: Option<String>,
    /// End of the period [default: now]
    #[arg(long)]
    pub to: Option<String>,
    /// Ignored: the report no longer reads slurmctld's log, which quotes users' text as its own lines (issue #42)
    #[arg(long, hide = true)]
    pub log: Option<PathBuf>,
    /// Write a chart of the figures (SVG, a manager's one page) to this file
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// One JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// onepoold's configuration: its endpoints and access log, for what the pool saved
    #[arg(long, value_name = "FILE", default_value = crate::doctor::DAEMON_CONFIG)]
    pub daemon_config: PathBuf,
    /// Keep the scenario behind "what the pool saved" in this folder (onepool simulate DIR/scenario.toml prints the same)
    #[arg(long, value_name = "DIR")]
    pub scenario: Option<PathBuf>,
    /// Do not compute what the pool saved (no simulation)
    #[arg(long)]
    pub no_saved: bool,
    /// What the pool saved: the endpoints' p99 queueing delay the islands must meet
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    pub slo_p99: String,
    /// What the pool saved: the batch classes' p95 wait the islands must meet
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub max_p95_wait: String,
    /// What the pool saved: a replica's startup, instead of the estimate from the records
    #[arg(long, value_name = "DURATION")]
    pub replica_startup: Option<String>,
    /// What the pool saved: targets from what this pool achieved in the simulation (10 % looser), instead of --slo-p99 and --max-p95-wait: what separate islands need for the same service
    #[arg(long)]
    pub targets_from_pool: bool,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let src = crate::policy::source::read(args.policy.clone())?;
    let loaded = load(&src.text);
    let policy = match &loaded.policy {
        Some(p) if loaded.errors().next().is_none() => p,
        _ => anyhow::bail!("{} (onepool policy check {})", crate::policy::check::summary(&src.name, &loaded), src.name),
    };
    let runner = SystemRunner::new(COMMAND_TIMEOUT);
    let (mut report, runs) = gather(args, policy, &runner)?;
    report.decisions = decision_log(args, &report, &runner)?;
    let daemon = daemon_inputs(&args.daemon_config);
    let utc_offset_s = utc_offset(&runner)?;
    if let Ok(access) = &daemon.1 {
        report.serving = serving::compute(access, report.from, report.to, utc_offset_s);
    }
    if !args.no_saved {
        report.saved = Some(saved_figure(args, policy, &src.text, &report, &runs, daemon, utc_offset_s)?);
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::chart(&report)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads the period's records (allocations, audit decisions) and computes the
/// report; returns the runs too, for what the pool saved.
pub fn gather(
    args: &ReportArgs,
    policy: &onepool_decisions::policy::Policy,
    runner: &dyn Runner,
) -> anyhow::Result<(usage::Report, Vec<records::Run>)> {
    let cmd = |argv: &[&str]| runner.run(argv).with_context(|| format!("the report needs `{}`", argv.join(" ")));
    // The period in the cluster's own clock and format, as sacct reads it.
    let now = cmd(&["date", "+%Y-%m-%dT%H:%M:%S"])?.trim().to_string();
    let to_text = args.to.clone().unwrap_or(now);
    let to = time(&to_text, None)?;
    let from_text = args.from.clone().unwrap_or_else(|| format_time(to - 86_400.0));
    let from = time(&from_text, Some(to))?;
    anyhow::ensure!(from < to, "--from {from_text} is not before --to {to_text}");
    let delim = records::delimiter().context("reading /dev/urandom for sacct's delimiter")?;
    let out = cmd(&[
        "sacct",
        "-a",
        "-X",
        "-D",
        "-P",
        "-n",
        &format!("--delimiter={delim}"),
        "--starttime",
        &format_time(from),
        // sacct's end is exclusive to the second: a job that started in
        // the period's last second would be missed (compute clips to `to`).
        "--endtime",
        &format_time(to + 1.0),
        &format!("--format={}", records::SACCT_FORMAT),
    ])?;
    let mut records = records::parse_sacct(&out, &delim).map_err(|e| anyhow::anyhow!(e))?;
    for u in &records.unreadable {
        eprintln!("onepool report: sacct's record of job {:?} cannot be read ({}): no figure counts it", u.id, u.why);
    }
    let config = parse_scontrol_config(&cmd(live::SHOW_CONFIG)?);
    records.requeues = records::Requeues::of_release(config.get("SLURM_VERSION"));
    if !config.get("AccountingStoreFlags").is_some_and(|f| f.to_ascii_lowercase().contains("job_comment")) {
        eprintln!(
            "onepool report: AccountingStoreFlags has no job_comment: slurmdbd keeps no job comments, so drained \
             replicas' records (requests finished and cut, graceful reclaims that drained in time) and failed \
             starts' causes are missing (onepool policy render)"
        );
    }
    if let Some(p) = &args.log {
        eprintln!(
            "onepool report: --log {} is ignored: the report reads no log, only Slurm's records (docs/report.md)",
            p.display()
        );
    }
    let replicas = replica_jobs::ReplicaJobs::read(&args.daemon_config);
    let report = usage::compute(&records, policy, from, to, &replicas);
    Ok((report, records.runs))
}

/// Reads what the figure needs beside the runs (onepoold's endpoints and
/// its access log), writes the scenario and simulates it.
fn saved_figure(
    args: &ReportArgs,
    policy: &onepool_decisions::policy::Policy,
    policy_text: &str,
    report: &usage::Report,
    runs: &[records::Run],
    daemon: DaemonInputs,
    utc_offset_s: f64,
) -> anyhow::Result<saved::Saved> {
    let dur = |s: &str, flag: &str| {
        onepool_decisions::duration::parse_seconds(s)
            .filter(|v| *v >= 0.0)
            .with_context(|| format!("{flag} {s:?} is not a duration (seconds, or e.g. 2s, 1m30s, 1h)"))
    };
    let slo_p99_s = dur(&args.slo_p99, "--slo-p99")?;
    let max_p95_wait_s = dur(&args.max_p95_wait, "--max-p95-wait")?;
    let startup_s = args.replica_startup.as_deref().map(|s| dur(s, "--replica-startup")).transpose()?;
    let replicas = replica_jobs::ReplicaJobs::read(&args.daemon_config);
    let inputs = saved::Inputs {
        runs,
        replicas: &replicas,
        policy,
        policy_text,
        from: report.from,
        to: report.to,
        endpoints: daemon.0,
        access: daemon.1,
        slo_p99_s,
        max_p95_wait_s,
        startup_s,
        utc_offset_s,
    };
    let pool = u64::from(policy.pool.total_gpus);
    match args.targets_from_pool {
        true => saved::for_the_pool_s_service(inputs, args.scenario.as_deref(), pool),
        false => saved::evaluate(&saved::scenario(&inputs), args.scenario.as_deref(), pool),
    }
}

/// The period's entries of onepoold's decision log, when its configuration
/// names one (a configuration that does not load is the saved figure's to
/// report).
fn decision_log(
    args: &ReportArgs,
    report: &usage::Report,
    runner: &dyn Runner,
) -> anyhow::Result<Option<decisions::Decisions>> {
    let Ok(config) = onepool_elastic_daemon::config::load(&args.daemon_config) else { return Ok(None) };
    let Some(log) = &config.decision_log else { return Ok(None) };
    let offset = utc_offset(runner)?;
    match decisions::read(&log.files_oldest_first(), &log.path, report.from, report.to, offset) {
        Ok(d) => Ok(Some(d)),
        Err(e) => {
            eprintln!("onepool report: {e}; no replica decisions listed");
            Ok(None)
        }
    }
}

/// The cluster's local clock minus UTC, in seconds (`date +%z`: +0100 is 3600).
fn utc_offset(runner: &dyn Runner) -> anyhow::Result<f64> {
    let z = runner.run(&["date", "+%z"]).context("the report needs `date +%z`")?;
    let z = z.trim();
    let (sign, digits) = match z.split_at_checked(1) {
        Some(("+", d)) => (1.0, d),
        Some(("-", d)) => (-1.0, d),
        _ => anyhow::bail!("date +%z printed {z:?}, not +HHMM"),
    };
    anyhow::ensure!(
        digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()),
        "date +%z printed {z:?}, not +HHMM"
    );
    let (h, m): (f64, f64) = (digits[..2].parse()?, digits[2..].parse()?);
    Ok(sign * (h * 3600.0 + m * 60.0))
}

/// onepoold's endpoints (those it runs replicas for) and its access log's
/// lines, or why there are none.
type DaemonInputs =
    (Result<Vec<saved::EndpointSettings>, String>, Result<Vec<onepool_decisions::trace::AccessEntry>, String>);

fn daemon_inputs(path: &std::path::Path) -> DaemonInputs {
    if !path.exists() {
        let why = format!("no {} (--daemon-config)", path.display());
        return (Err(why.clone()), Err(why));
    }
    let config = match onepool_elastic_daemon::config::load(path) {
        Ok(c) => c,
        Err(e) => {
            let why = format!("{} does not load: {e}", path.display());
            return (Err(why.clone()), Err(why));
        }
    };
    let endpoints = config
        .endpoints
        .iter()
        .filter_map(|e| {
            let r = e.replicas.as_ref()?;
            Some(saved::EndpointSettings {
                name: e.name.clone(),
                class: r.supplemental_workload.clone(),
                baseline_class: r.baseline_workload.clone(),
                min: r.min,
                max: r.max,
                gpus: r.gpus,
                concurrency: e.replica_concurrency,
                target_per_replica: r.target_per_replica,
                stable_window_s: r.stable_window.as_secs_f64(),
                panic_window_s: r.panic_window.as_secs_f64(),
                panic_threshold: r.panic_threshold,
                scale_down_delay_s: r.scale_down_delay.as_secs_f64(),
                trend_horizon_s: r.trend_horizon.as_secs_f64(),
                latency: r.latency.clone(),
                warm: r.warm.as_ref().map(|w| (w.workload.clone(), w.spec.replicas, w.spec.fraction)),
            })
        })
        .collect();
    let access = match &config.access_log {
        None => Err(format!("{} has no [access_log]", path.display())),
        Some(a) => read_access_log(&a.files_oldest_first(), &a.path),
    };
    (Ok(endpoints), access)
}

/// Every line of the access log's files (oldest first); lines that are
/// not access entries are named on stderr.
fn read_access_log(
    files: &[PathBuf],
    path: &std::path::Path,
) -> Result<Vec<onepool_decisions::trace::AccessEntry>, String> {
    let mut out = Vec::new();
    for (f, text) in rotated::texts(files, path, "access log")? {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match serde_json::from_str(line) {
                Ok(e) => out.push(e),
                Err(e) => eprintln!("onepool report: {}:{}: not an access log line: {e}", f.display(), i + 1),
            }
        }
    }
    Ok(out)
}

/// A time as the arguments give it: sacct's `YYYY-MM-DDTHH:MM:SS`, or
/// `now-N{days,hours,minutes}` relative to `to`.
fn time(s: &str, to: Option<f64>) -> anyhow::Result<f64> {
    if let (Some(rest), Some(to)) = (s.strip_prefix("now-"), to) {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let n: f64 =
            digits.parse().with_context(|| format!("{s:?}: expected now-N followed by days, hours or minutes"))?;
        let unit = match &rest[digits.len()..] {
            "days" | "day" | "d" => 86_400.0,
            "hours" | "hour" | "h" => 3600.0,
            "minutes" | "minute" | "min" | "m" => 60.0,
            other => anyhow::bail!("{s:?}: unknown unit {other:?} (days, hours or minutes)"),
        };
        return Ok(to - n * unit);
    }
    onepool_decisions::trace::parse_time(s).with_context(|| format!("{s:?} is not a time (YYYY-MM-DDTHH:MM:SS)"))
}

pub fn text(r: &usage::Report) -> String {
    let mut out = usage_text(r);
    if r.unreadable.count > 0 {
        let named: Vec<String> = r.unreadable.records.iter().map(|u| format!("job {}: {}", u.id, u.why)).collect();
        out.push_str(&format!(
            "{} sacct record(s) could not be read ({}): no figure counts them\n",
            r.unreadable.count,
            named.join("; ")
        ));
    }
    out.push_str(&reclaims_text(r));
    out.push_str(&failures_text(&r.replica_failures));
    out.push_str(&serving::text(&r.serving));
    if let Some(d) = &r.decisions {
        out.push_str(&decisions::text(d));
    }
    if let Some(s) = &r.saved {
        out.push_str(&saved_text(s));
    }
    if let Some(a) = &r.audit {
        out.push_str(&audit_text(a));
    }
    out
}

/// The period, each class's GPU-hours, and how much of the pool was used.
fn usage_text(r: &usage::Report) -> String {
    let mut out = format!(
        "onepool report {} to {} ({:.1} h), pool of {} GPUs\n\n",
        format_time(r.from),
        format_time(r.to),
        (r.to - r.from) / 3600.0,
        r.pool_gpus
    );
    out.push_str(&format!("{:<24} {:>10} {:>10} {:>14} {:>6}\n", "class", "tier", "GPU-hours", "on borrowed", "jobs"));
    for c in &r.classes {
        let tier = if c.protected { "protected" } else { "flexible" };
        let borrowed = if c.protected { "-".to_string() } else { format!("{:.2}", c.borrowed_gpu_hours) };
        out.push_str(&format!("{:<24} {:>10} {:>10.2} {:>14} {:>6}\n", c.class, tier, c.gpu_hours, borrowed, c.jobs));
    }
    let used: f64 = r.classes.iter().map(|c| c.gpu_hours).sum();
    let capacity = f64::from(r.pool_gpus) * (r.to - r.from) / 3600.0;
    out.push_str(&format!(
        "\nused {used:.2} of {capacity:.2} GPU-hours ({:.0} %); idle {:.2}; outside the pool {:.2}\n",
        if capacity > 0.0 { 100.0 * used / capacity } else { 0.0 },
        r.idle_gpu_hours,
        r.outside_gpu_hours
    ));
    out
}

/// The reclaims: a summary per mode, then each one.
fn reclaims_text(r: &usage::Report) -> String {
    let mut out = format!("\nreclaims: {} (source: {})\n", r.reclaims.len(), r.reclaim_source);
    out.push_str(&format!("  replica jobs (their drain notes count): {}\n", r.replica_jobs));
    for m in ["immediate", "graceful", "requeue"] {
        let of: Vec<&reclaims::Reclaim> = r.reclaims.iter().filter(|x| x.mode == m).collect();
        if of.is_empty() {
            continue;
        }
        let lost: f64 = of.iter().map(|x| x.run_gpu_hours).sum();
        let mut ttc: Vec<f64> = of.iter().filter_map(|x| x.time_to_capacity_s).collect();
        ttc.sort_by(f64::total_cmp);
        let median = match ttc.len() {
            0 => String::new(),
            n => format!(", median time to capacity {:.1} s", ttc[n / 2]),
        };
        out.push_str(&format!("  {m}: {} (runs ended: {lost:.2} GPU-hours{median})\n", of.len()));
    }
    for x in &r.reclaims {
        out.push_str(&reclaim_line(x));
    }
    out
}

/// One reclaim: its victim, who took the GPUs and how soon, and what a
/// drained replica finished and cut.
fn reclaim_line(x: &reclaims::Reclaim) -> String {
    let taker = match (&x.for_job, x.time_to_capacity_s) {
        (Some(j), Some(t)) => {
            let class = x.for_class.as_deref().map(|c| format!(" ({c})")).unwrap_or_default();
            let gpus = x.gpus_changed_hands.map(|g| format!(", {g} GPU(s) changed hands")).unwrap_or_default();
            format!("for job {j}{class}, which ran {t:.1} s after submission{gpus}")
        }
        (Some(j), None) => format!("for job {j}, not started"),
        _ => "no job started on its nodes right after".to_string(),
    };
    let drain = match (x.drained, x.cut, x.drain_s) {
        (Some(d), Some(c), Some(s)) => {
            let moved = x.moved.unwrap_or(0);
            format!("; drained {d} request(s) in {s:.1} s, moved {moved} to other replicas, cut {c}")
        }
        _ => String::new(),
    };
    format!("  job {} ({}, {}) at +{:.0} s: {taker}{drain}\n", x.job, x.class, x.mode, x.at_s)
}

/// Replica jobs that failed, per endpoint; nothing when none did.
fn failures_text(failed: &[failures::ReplicaFailures]) -> String {
    if failed.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nreplica jobs that failed (not service):\n");
    for f in failed {
        let ends: Vec<String> = f.by_end.iter().map(|(e, n)| format!("{n} {e}")).collect();
        out.push_str(&format!(
            "  endpoint {} (user {}): {} of {} job(s), {:.2} GPU-hours ({}); last: job {} at +{:.0} s: {}\n",
            f.endpoint,
            f.user,
            f.failed,
            f.jobs,
            f.gpu_hours,
            ends.join(", "),
            f.last_job,
            f.last_at_s,
            f.last_cause
        ));
    }
    out
}

/// What the plugin would have placed and refused in audit mode.
fn audit_text(a: &usage::Audit) -> String {
    let mut out = String::from("\naudit mode (the plugin's record on each job): the plugin would have\n");
    for (class, n) in &a.would_place {
        out.push_str(&format!("  placed {n} job(s) in {class}\n"));
    }
    for (rule, n) in &a.would_refuse {
        out.push_str(&format!("  refused {n} job(s): rule {rule}\n"));
    }
    out
}

fn saved_text(s: &saved::Saved) -> String {
    let mut out = format!(
        "\nwhat the pool saved: the simulator on the period's {} job run(s) and {} request(s){}, as onepool simulate runs it\n",
        s.jobs,
        s.requests,
        if s.endpoints.is_empty() { String::new() } else { format!(" (endpoints {})", s.endpoints.join(", ")) }
    );
    for line in s.measured.lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str(&format!("  this pool: {} GPUs\n  assumptions:\n", s.pool_gpus));
    for a in &s.assumptions {
        out.push_str(&format!("    - {a}\n"));
    }
    for (why, n) in &s.left_out {
        out.push_str(&format!("  left out: {n} {why}\n"));
    }
    if let Some(p) = &s.scenario {
        out.push_str(&format!("  scenario kept: {p} (onepool simulate {p} prints the same figures)\n"));
    }
    out
}

#[cfg(test)]
mod tests;
