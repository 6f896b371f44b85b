//! The comparison as a terminal table and as JSON.

use serde::Serialize;

use crate::compare::{
    Because, ClassFigures, ClassMisses, ClassRow, Comparison, Miss, NoSaving, SearchEstimate, SharedSearch, Unmet,
};
use crate::input::BadRow;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub fleet_gpus: u64,
    pub skipped_rows: usize,
    pub skipped: Vec<String>,
    pub ignored: Vec<(String, usize)>,
    pub comparison: Comparison,
}

impl Report {
    pub fn new(fleet_gpus: u64, bad: &[BadRow], ignored: &[(String, usize)], comparison: Comparison) -> Report {
        Report {
            fleet_gpus,
            skipped_rows: bad.len(),
            skipped: bad.iter().map(|b| b.to_string()).collect(),
            ignored: ignored.to_vec(),
            comparison,
        }
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0}ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.1}s")
    } else if s < 7200.0 {
        format!("{:.1}m", s / 60.0)
    } else {
        format!("{:.1}h", s / 3600.0)
    }
}

fn opt_gpus(g: Option<u64>) -> String {
    g.map(|g| g.to_string()).unwrap_or_else(|| "unmet".into())
}

/// A number with thousands separators (search costs run to millions).
pub(super) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn service(f: &ClassFigures) -> Vec<String> {
    let mut parts = Vec::new();
    if f.jobs_started > 0 || f.unstarted_jobs > 0 {
        parts.push(format!("wait {}/{}", secs(f.wait_mean_s), secs(f.wait_p95_s)));
    }
    if let Some(slo) = f.slo_p99_s {
        parts.push(format!("p99 {} (SLO {})", secs(f.p99_queue_delay_s), secs(slo)));
    }
    if f.unstarted_jobs > 0 {
        parts.push(format!("{} never started", f.unstarted_jobs));
    }
    if f.unserved > 0 {
        parts.push(format!("{} unserved", f.unserved));
    }
    if f.failed_requests > 0 {
        parts.push(format!("{} cut off", f.failed_requests));
    }
    parts
}

/// A class that only runs endpoints' baseline replicas has no service
/// figures of its own: its replicas serve the endpoint's requests, which
/// are counted in the endpoint's class row. Say so rather than leave the
/// cell blank.
fn service_shared(row: &ClassRow) -> String {
    let mut parts = service(&row.shared);
    for b in &row.baseline_of {
        parts.push(format!(
            "first {} replicas of {} (requests under {})",
            b.replicas, b.endpoint, b.requests_counted_under
        ));
    }
    parts.join(", ")
}

/// Separately an endpoint's replicas all run in its own class, on its island.
fn service_separate(row: &ClassRow) -> String {
    match &row.separate {
        Some(f) => service(f).join(", "),
        None if !row.own_island && !row.baseline_of.is_empty() => {
            let eps: Vec<String> = row.baseline_of.iter().map(|b| b.endpoint.clone()).collect();
            format!("none ({}: every replica runs as {})", eps.join(", "), row.baseline_of[0].requests_counted_under)
        }
        None => "-".into(),
    }
}

fn lost(f: &ClassFigures) -> String {
    if f.dropped_jobs > 0 {
        format!("{:.1} ({} dropped, {:.1} never done)", f.lost_gpu_hours, f.dropped_jobs, f.dropped_gpu_hours)
    } else {
        format!("{:.1}", f.lost_gpu_hours)
    }
}

/// The figure the command is run for first, then what each figure
/// measured (or why it is not a number, and why the islands needed no
/// more than one pool: [`reasons`]): the two GPU counts are different
/// measurements (a search vs the size simulated for the table), and the
/// window is set by whichever input runs longest, not by the trace alone.
pub fn headline(c: &Comparison, o: &Options) -> String {
    let why = reasons(c, o);
    let mut out = format!("{}\n", gpus_needed_line(c));
    if c.separate_sized {
        let line = why.separate.clone().unwrap_or_else(|| format!("separate islands: {}", separate_measured(c)));
        out.push_str(&format!("  {line}\n"));
    }
    let line = why.shared.clone().unwrap_or_else(|| format!("one shared pool: {}", shared_measured(c)));
    out.push_str(&format!("  {line}\n"));
    if let Some(line) = &why.no_saving {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str(&window_line(c));
    out.push_str(&format!(
        "per class below: \"shared\" = one pool of {} GPUs, the fleet simulated (the scenario's, or --nodes), not \
         the size searched; its last GPU released at {:.1} h{}\n",
        c.shared_fleet_gpus,
        c.shared_last_busy_hours,
        if c.separate_sized { "; \"separate\" = each class on its island above" } else { "" }
    ));
    out
}

/// The two GPU figures in one line, a word where one is not a number.
pub fn gpus_needed_line(c: &Comparison) -> String {
    format!(
        "GPUs needed to meet every target: separate islands {}, one shared pool {}",
        if c.separate_sized { opt_gpus(c.separate_gpus) } else { "not sized (--shared-only)".into() },
        shared_needed(c)
    )
}

fn shared_needed(c: &Comparison) -> String {
    match (c.shared_gpus_needed, c.shared_search.ran()) {
        (Some(g), _) => g.to_string(),
        (None, true) => format!("unmet up to {} GPUs", count(c.shared_max_gpus)),
        (None, false) => "not searched".into(),
    }
}

fn separate_measured(c: &Comparison) -> String {
    let each: Vec<String> = c
        .classes
        .iter()
        .filter(|r| r.own_island)
        .map(|r| format!("{} {}", r.shared.class, opt_gpus(r.separate_gpus_needed)))
        .collect();
    format!(
        "each class alone on the smallest island of the fleet's node mix where it meets its target ({})",
        each.join(", ")
    )
}

/// What the shared figure measured when it is a number.
fn shared_measured(c: &Comparison) -> String {
    let how = match c.shared_search {
        SharedSearch::Cheap { estimate } => format!("searched by default ({})", cost(&estimate)),
        _ => "searched (--search)".to_string(),
    };
    match &c.shared_smaller_missed {
        Some(m) => format!(
            "the smallest pool found by bisection where every class meets its target under the policy, {how}; on {} \
             GPUs these missed theirs: {}",
            m.gpus,
            m.classes.join(", ")
        ),
        None => {
            format!("the smallest pool found by bisection where every class meets its target under the policy, {how}")
        }
    }
}

/// What sets the targets and assumptions behind the GPU figures, as the
/// command printing them takes it: a figure that is not a number names
/// what would change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub slo_p99: &'static str,
    pub max_p95_wait: &'static str,
    pub startup: &'static str,
    pub max_replicas: &'static str,
    /// What searches the shared pool whatever it costs.
    pub search: &'static str,
}

/// `onepool simulate`'s: the scenario's keys, and its flag.
pub const SCENARIO_OPTIONS: Options = Options {
    slo_p99: "the endpoint's slo_p99",
    max_p95_wait: "[targets] max_p95_wait",
    startup: "the endpoint's startup",
    max_replicas: "the endpoint's max_replicas",
    search: "--search",
};

/// The GPU figures' reasons in words (issue #38): why a figure is not a
/// number, and why the islands needed no more GPUs than one pool. Every
/// output says them in these words, from [`reasons`]: onepool simulate's
/// table and plot, onepool report's text, JSON and chart, and the demo.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reasons {
    pub separate: Option<String>,
    pub shared: Option<String>,
    pub no_saving: Option<String>,
}

impl Reasons {
    pub fn lines(&self) -> Vec<String> {
        [&self.separate, &self.shared, &self.no_saving].into_iter().flatten().cloned().collect()
    }
}

pub fn reasons(c: &Comparison, o: &Options) -> Reasons {
    Reasons {
        separate: c
            .separate_unmet
            .as_ref()
            .map(|u| format!("separate islands {}", unmet(u, "island", "its class's target", o))),
        shared: c.shared_unmet.as_ref().map(|u| format!("one shared pool {}", unmet(u, "pool", "every target", o))),
        no_saving: c.no_saving.as_ref().map(no_saving),
    }
}

fn unmet(u: &Unmet, what: &str, target: &str, o: &Options) -> String {
    match u {
        Unmet::NotSized => "not sized (--shared-only)".into(),
        Unmet::NotSearched { search: SharedSearch::TooCostly { estimate } } => format!(
            "not searched: {} is over the {} a search may cost by default; {} forces it",
            cost(estimate),
            count(estimate.budget),
            o.search
        ),
        Unmet::NotSearched { search: SharedSearch::SharedOnly } => {
            format!("not searched: --shared-only times the one shared run; {} forces it", o.search)
        }
        Unmet::NotSearched { .. } => "not searched (--no-search)".into(),
        Unmet::NoSizeMet { tried_gpus, at_largest } => {
            let largest = count(tried_gpus.last().copied().unwrap_or(0));
            let who = at_largest.iter().map(class_misses).collect::<Vec<_>>().join("; ");
            format!(
                "unmet: no {what} up to {largest} GPUs met {target} (sizes searched: {}){}.{}",
                sizes(tried_gpus),
                if who.is_empty() { String::new() } else { format!("; on {largest} GPUs {who}") },
                what_changes(at_largest, o)
            )
        }
    }
}

/// The sizes a search tried, the first and last few when there are many.
fn sizes(gpus: &[u64]) -> String {
    let each: Vec<String> = gpus.iter().map(|g| count(*g)).collect();
    match each.len() {
        0 => "none".into(),
        1 => format!("{} GPUs", each[0]),
        n if n <= 5 => format!("{} and {} GPUs", each[..n - 1].join(", "), each[n - 1]),
        n => format!("{}, ..., {} GPUs, {n} sizes", each[..3].join(", "), each[n - 1]),
    }
}

/// "training missed its p95 wait target of 1.0h (p95 1.3h)", what a
/// class left undone, and its endpoints capped at their maximum.
fn class_misses(m: &ClassMisses) -> String {
    let (mut targets, mut left) = (Vec::new(), Vec::new());
    for x in &m.missed {
        match x {
            Miss::P99QueueDelay { p99_s, slo_s } => {
                targets.push(format!("its p99 queueing delay target of {} (p99 {})", secs(*slo_s), secs(*p99_s)));
            }
            Miss::P95Wait { p95_s, max_s } => {
                targets.push(format!("its p95 wait target of {} (p95 {})", secs(*max_s), secs(*p95_s)));
            }
            Miss::Unserved { requests } => left.push(format!("{requests} request(s) unserved")),
            Miss::Unstarted { jobs } => left.push(format!("{jobs} job(s) never started")),
        }
    }
    let mut said = Vec::new();
    if !targets.is_empty() {
        said.push(format!("missed {}", and_list(&targets)));
    }
    if !left.is_empty() {
        said.push(format!("left {}", and_list(&left)));
    }
    let capped: Vec<String> = m
        .at_max_replicas
        .iter()
        .map(|(e, n)| format!("endpoint {e} at its maximum of {n} replica{}", if *n == 1 { "" } else { "s" }))
        .collect();
    format!(
        "{} {}{}",
        m.class,
        said.join(" and "),
        if capped.is_empty() { String::new() } else { format!(", with {}", and_list(&capped)) }
    )
}

fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The options that change a missed target, once each.
fn what_changes(at: &[ClassMisses], o: &Options) -> String {
    let missed = |f: fn(&Miss) -> bool| at.iter().flat_map(|m| &m.missed).any(f);
    let mut out = Vec::new();
    if missed(|x| matches!(x, Miss::P99QueueDelay { .. } | Miss::Unserved { .. })) {
        out.push(format!("{} sets the p99 target, {} the replica startup assumed", o.slo_p99, o.startup));
    }
    if at.iter().any(|m| !m.at_max_replicas.is_empty()) {
        out.push(format!("{} caps the replicas more GPUs could add", o.max_replicas));
    }
    if missed(|x| matches!(x, Miss::P95Wait { .. })) {
        out.push(format!("{} sets the p95 wait target", o.max_p95_wait));
    }
    if out.is_empty() {
        String::new()
    } else {
        format!(" What changes it: {}.", out.join("; "))
    }
}

/// Why the islands needed no more GPUs than one pool, from what the runs
/// show.
fn no_saving(n: &NoSaving) -> String {
    let head = if n.separate_gpus == n.shared_gpus {
        format!("no saving in this period (islands and one pool both need {} GPUs)", n.separate_gpus)
    } else {
        format!(
            "islands needed fewer GPUs than one pool in this period ({} against {})",
            n.separate_gpus, n.shared_gpus
        )
    };
    let (together, apart) = (n.together_peak_gpus, n.apart_peak_gpus);
    let why = match n.because {
        Because::OneClass => match n.islands.first() {
            Some(c) => format!("only {c} had work of its own: there was nothing to share"),
            None => "no class had work of its own".into(),
        },
        Because::PeaksTogether if together == apart => format!(
            "the classes' busiest moments came together: one pool held {together} GPUs at once, as many as their \
             peaks apart add up to"
        ),
        Because::PeaksTogether => format!(
            "the classes' busiest moments came together: one pool held {together} GPUs at once, more than their \
             peaks apart add up to ({apart})"
        ),
        Because::SmallestIslands => format!(
            "each class alone fits on the smallest island searched ({} GPUs), so the islands cannot be smaller, and \
             a smaller pool missed a target though the peaks did not all come at once (one pool held at most \
             {together} GPUs at once, their peaks apart add up to {apart})",
            n.smallest_island_gpus.unwrap_or(0)
        ),
        Because::SmallerPoolMissed => format!(
            "a smaller pool missed a target though the peaks did not all come at once (one pool held at most \
             {together} GPUs at once, their peaks apart add up to {apart})"
        ),
    };
    let below = match &n.below {
        Some(b) if !b.targets.is_empty() => format!(
            "; on {} GPUs, {}",
            count(b.gpus),
            b.targets.iter().map(class_misses).collect::<Vec<_>>().join("; ")
        ),
        _ => String::new(),
    };
    format!("{head} because {why}{below}")
}

fn cost(e: &SearchEstimate) -> String {
    format!(
        "about {} simulations of {} jobs, requests and autoscaler ticks, {} in all",
        e.runs,
        count(e.run_size),
        count(e.work)
    )
}

/// The window and which input set its length.
fn window_line(c: &Comparison) -> String {
    let mut ends = Vec::new();
    if let Some(h) = c.jobs_end_hours {
        ends.push(format!("jobs {h:.1} h"));
    }
    if let Some(h) = c.requests_end_hours {
        ends.push(format!("requests {h:.1} h"));
    }
    format!(
        "window {:.1} h: from the first submission or request to when all work would be done with unlimited GPUs \
         ({}); idle GPU-hours are counted in it\n",
        c.window_hours,
        if ends.is_empty() { "no work".into() } else { ends.join(", ") }
    )
}

/// The terminal table.
#[allow(
    clippy::too_many_lines,
    reason = "a renderer: one section after another in the order the reader sees them; split, each piece would only pass the text along"
)]
pub fn table(r: &Report) -> String {
    let c = &r.comparison;
    let mut out = String::new();
    out.push_str(&headline(c, &SCENARIO_OPTIONS));
    out.push('\n');
    let header = [
        "class",
        "separate GPUs",
        "shared peak",
        "GPU-h used",
        "borrowed GPU-h",
        "reclaims",
        "lost GPU-h",
        "idle GPU-h separate",
        "unused capacity GPU-h",
        "time to capacity mean/max",
        "service separate",
        "service shared",
        "target",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for row in &c.classes {
        let s = &row.shared;
        if !s.has_work {
            continue;
        }
        rows.push(vec![
            s.class.clone(),
            if row.own_island && c.separate_sized { opt_gpus(row.separate_gpus_needed) } else { "-".into() },
            s.peak_gpus.to_string(),
            format!("{:.1}", s.gpu_hours_used),
            format!("{:.1}", s.borrowed_gpu_hours),
            s.reclaims.to_string(),
            lost(s),
            row.separate_idle_gpu_hours.map(|h| format!("{h:.1}")).unwrap_or_else(|| "-".into()),
            match (s.unused_capacity_gpu_hours, s.unused_reserved_gpu_hours) {
                (Some(u), Some(r)) if r > 0.0 => format!("{u:.1} (reserved {r:.1})"),
                (Some(u), _) => format!("{u:.1}"),
                _ => "-".into(),
            },
            format!("{}/{}", secs(s.time_to_capacity_mean_s), secs(s.time_to_capacity_max_s)),
            service_separate(row),
            service_shared(row),
            if s.meets_target { "met".into() } else { "MISSED".into() },
        ]);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    for (k, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if k == 0 {
            out.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
            out.push('\n');
        }
    }
    out.push('\n');
    let sep_idle = if c.separate_sized {
        format!("separate {:.1} (each island's own, per class above), ", c.separate_idle_gpu_hours)
    } else {
        String::new()
    };
    out.push_str(&format!(
        "idle GPU-hours in the window: {sep_idle}shared {:.1} (one pool: any class may use them within its limits)\n",
        c.shared_idle_gpu_hours
    ));
    out.push_str(&format!(
        "search: {} runs in {:.2} s ({} of them for the shared pool); shared run {:.2} s\n",
        c.search_runs, c.search_seconds, c.shared_search_runs, c.shared_run_seconds
    ));
    out.push_str("wait = training wait mean/p95; p99 = inference p99 queueing delay\n");
    out.push_str(
        "lost = GPU-hours of reclaimed runs that did not advance their job (a cancelled run's whole run, a requeued \
         run's notice to release); unused capacity = a protected class's GPUs it did not hold (lent or idle), in \
         brackets of its reserved ones\n",
    );
    out.push_str(&format!("skipped rows: {}\n", r.skipped_rows));
    for s in r.skipped.iter().take(20) {
        out.push_str(&format!("  {s}\n"));
    }
    if r.skipped.len() > 20 {
        out.push_str(&format!("  ... and {} more (all in --json)\n", r.skipped.len() - 20));
    }
    for (why, n) in &r.ignored {
        out.push_str(&format!("not simulated: {n} ({why})\n"));
    }
    out
}
