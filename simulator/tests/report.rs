//! What `onepool simulate` prints and plots, on the example scenario
//! (examples/small: an hour of the Azure chat trace, batch jobs running
//! two hours, a baseline class for the endpoint's first replicas, 4 nodes x
//! 4 GPUs), where each figure has to say what it measured.

use std::path::Path;

use onepool_simulator::compare::{self, Comparison, Search, Settings, SharedSearch};
use onepool_simulator::input::OnBadRow;
use onepool_simulator::report::{self, Report};
use onepool_simulator::{scenario, svg};

fn example(search: Search, budget: Option<u64>) -> (scenario::Scenario, Comparison) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/small/scenario.toml");
    let sc = scenario::load(&p, OnBadRow::Abort).unwrap();
    let mut s = Settings { max_p95_wait_s: sc.max_p95_wait_s, ..Settings::default() };
    if let Some(b) = budget {
        s.search_budget = b;
    }
    let (cmp, _) = compare::compare(&sc.workload, &sc.policy, &sc.fleet, &s, search);
    (sc, cmp)
}

fn table(sc: &scenario::Scenario, cmp: &Comparison) -> String {
    report::table(&Report::new(sc.fleet.gpus(), &sc.bad_rows, &sc.ignored, cmp.clone()))
}

/// The cells of the table row of `class` (cells are separated by two or more spaces).
fn row_cells(table: &str, class: &str) -> Vec<String> {
    let header = table.lines().find(|l| l.starts_with("class ")).unwrap();
    let starts: Vec<usize> = std::iter::once(0)
        .chain(header.match_indices("  ").filter_map(|(i, _)| {
            let next = i + header[i..].find(|c: char| c != ' ')?;
            (header.as_bytes()[i - 1] != b' ').then_some(next)
        }))
        .collect();
    let line = table.lines().find(|l| l.starts_with(&format!("{class} "))).unwrap();
    let cell = |k: usize| {
        let from = starts[k].min(line.len());
        let to = starts.get(k + 1).copied().unwrap_or(line.len()).min(line.len());
        line[from..to].trim().to_string()
    };
    (0..starts.len()).map(cell).collect()
}

#[test]
fn the_shared_pool_is_searched_by_default_when_cheap() {
    let (sc, cmp) = example(Search::Auto, None);
    assert!(matches!(cmp.shared_search, SharedSearch::Cheap { .. }), "{:?}", cmp.shared_search);
    assert!(cmp.shared_searched && cmp.shared_search_runs > 0);
    // The same size as --search finds.
    let (_, forced) = example(Search::Always, None);
    assert_eq!(cmp.shared_gpus_needed, forced.shared_gpus_needed);
    assert_eq!(cmp.shared_gpus_needed, Some(16));
    let t = table(&sc, &cmp);
    assert!(t.starts_with("GPUs needed to meet every target: separate islands 24, one shared pool 16\n"), "{t}");
    assert!(t.contains("searched by default (about "), "{t}");
    assert!(!svg::gpus_needed(&cmp).contains("not searched"));
}

#[test]
fn a_costly_search_is_skipped_saying_why_and_which_flag_forces_it() {
    let (sc, cmp) = example(Search::Auto, Some(1));
    let SharedSearch::TooCostly { estimate } = cmp.shared_search else { panic!("{:?}", cmp.shared_search) };
    assert!(estimate.work > 1 && estimate.runs > 0);
    assert_eq!((cmp.shared_gpus_needed, cmp.shared_search_runs), (None, 0));
    let t = table(&sc, &cmp);
    assert!(t.contains("one shared pool not searched\n"), "{t}");
    assert!(t.contains(&format!("about {} simulations", estimate.runs)), "{t}");
    assert!(t.contains("is over the 1 a search may cost by default; --search forces it"), "{t}");
    let plot = svg::gpus_needed(&cmp);
    assert!(plot.contains("one shared pool not searched: about") && plot.contains("--search forces it"), "{plot}");
    // --search keeps working whatever the budget, and --no-search says so.
    let (_, forced) = example(Search::Always, Some(1));
    assert_eq!((forced.shared_search, forced.shared_gpus_needed), (SharedSearch::Asked, Some(16)));
    let (sc, declined) = example(Search::Never, None);
    assert!(table(&sc, &declined).contains("one shared pool not searched (--no-search)"));
}

#[test]
fn the_window_says_which_input_set_its_length() {
    let (sc, cmp) = example(Search::Never, None);
    // The trace is an hour; the last batch job (submitted at 5,500 s, 30 min) ends at 7,300 s.
    let reqs = cmp.requests_end_hours.unwrap();
    assert!((0.95..1.05).contains(&reqs), "{reqs}");
    assert!((cmp.jobs_end_hours.unwrap() - 7300.0 / 3600.0).abs() < 1e-9);
    assert_eq!(cmp.window_hours, cmp.jobs_end_hours.unwrap());
    let t = table(&sc, &cmp);
    assert!(
        t.contains(
            "window 2.0 h: from the first submission or request to when all work would be done with unlimited GPUs \
             (jobs 2.0 h, requests 1.0 h)"
        ),
        "{t}"
    );
    // Training ran late in the shared run: the report says until when.
    assert!(cmp.shared_last_busy_hours > cmp.window_hours, "{}", cmp.shared_last_busy_hours);
    assert!(t.contains(&format!("its last GPU released at {:.1} h", cmp.shared_last_busy_hours)), "{t}");
}

#[test]
fn the_gpu_figures_say_what_each_measured() {
    let (sc, cmp) = example(Search::Auto, None);
    // The search's answer happens to be the simulated fleet: the size below it missed.
    assert_eq!(cmp.shared_gpus_needed, Some(cmp.shared_fleet_gpus));
    let missed = cmp.shared_smaller_missed.clone().unwrap();
    assert_eq!((missed.gpus, missed.classes), (12, vec!["training".to_string(), "agents".to_string()]));
    let t = table(&sc, &cmp);
    assert!(t.contains("separate islands: each class alone on the smallest island of the fleet's node mix where it meets its target (critical-training 8, training 8, inference 4, agents 4)"), "{t}");
    assert!(
        t.contains(
            "one shared pool: the smallest pool found by bisection where every class meets its target under the policy"
        ),
        "{t}"
    );
    assert!(t.contains("on 12 GPUs these missed theirs: training, agents"), "{t}");
    assert!(
        t.contains(
            "\"shared\" = one pool of 16 GPUs, the fleet simulated (the scenario's, or --nodes), not the size searched"
        ),
        "{t}"
    );
}

#[test]
fn the_baseline_class_row_says_whose_replicas_it_runs() {
    let (sc, cmp) = example(Search::Never, None);
    let t = table(&sc, &cmp);
    let cells = row_cells(&t, "inference-baseline");
    let header = row_cells(&t, "class");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    assert_eq!(cells[col("service shared")], "first 3 replicas of chat (requests under inference)", "{t}");
    assert_eq!(cells[col("service separate")], "none (chat: every replica runs as inference)", "{t}");
    // Its demand in the plot is its replicas', not the endpoint class's.
    let c = cmp.classes.iter().find(|r| r.shared.class == "inference-baseline").unwrap();
    assert!(c.demand.iter().sum::<f64>() > 0.0);
    assert!(c.demand.iter().all(|&d| d <= 3.0 + 1e-9), "{:?}", c.demand);
    assert_eq!(c.baseline_of.len(), 1);
}

/// `<text ...>content</text>` elements: (attributes, content).
fn texts(svg: &str) -> Vec<(String, String)> {
    svg.split("<text ")
        .skip(1)
        .map(|t| {
            let (attrs, rest) = t.split_once('>').unwrap();
            (attrs.to_string(), rest.split_once("</text>").unwrap().0.to_string())
        })
        .collect()
}

fn attr(attrs: &str, name: &str) -> Option<String> {
    let from = attrs.find(&format!(" {name}=\"")).or_else(|| attrs.starts_with(&format!("{name}=\"")).then_some(0))?;
    let v = &attrs[from..];
    let v = &v[v.find('"')? + 1..];
    Some(v[..v.find('"')?].to_string())
}

fn svg_width(svg: &str) -> f64 {
    attr(&svg[svg.find("<svg").unwrap()..], "width").unwrap().parse().unwrap()
}

#[test]
fn plot_labels_fit_inside_the_plots() {
    for search in [Search::Auto, Search::Never] {
        let (_, cmp) = example(search, Some(1));
        for plot in [svg::demand_vs_allocation(&cmp), svg::gpus_needed(&cmp)] {
            let w = svg_width(&plot);
            for (a, text) in texts(&plot) {
                if a.contains("transform") {
                    continue; // the rotated axis title
                }
                let x: f64 = attr(&a, "x").unwrap().parse().unwrap();
                let px: f64 = attr(&a, "font-size").map_or(12.0, |s| s.parse().unwrap());
                // 0.6 em a character, 10% more in bold: wide sans-serif text.
                let bold = if a.contains("bold") { 1.1 } else { 1.0 };
                let width = text.chars().count() as f64 * px * 0.6 * bold;
                let (from, to) = match attr(&a, "text-anchor").as_deref() {
                    Some("middle") => (x - width / 2.0, x + width / 2.0),
                    Some("end") => (x - width, x),
                    _ => (x, x + width),
                };
                assert!(from >= 0.0 && to <= w, "{text:?} spans {from:.0}..{to:.0}, the plot is {w} wide");
            }
        }
    }
}

#[test]
fn every_panel_shares_one_time_axis() {
    let (_, cmp) = example(Search::Never, None);
    // Training ran past the window, the endpoint's classes stopped at the trace's end.
    let lens: Vec<usize> = cmp.classes.iter().filter(|r| r.shared.has_work).map(|r| r.alloc.len()).collect();
    assert!(lens.iter().max() > lens.iter().min(), "{lens:?}");
    let plot = svg::demand_vs_allocation(&cmp);
    // Hour ticks: each label at one x in every panel, the same ticks in each.
    let mut at: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (a, text) in texts(&plot) {
        if attr(&a, "text-anchor").as_deref() == Some("middle") && text.parse::<f64>().is_ok() {
            at.entry(text).or_default().push(attr(&a, "x").unwrap());
        }
    }
    let panels = lens.len();
    assert!(at.len() >= 3, "{at:?}");
    for (hour, xs) in &at {
        assert_eq!(xs.len(), panels, "tick {hour}: {xs:?}");
        assert!(xs.iter().all(|x| x == &xs[0]), "tick {hour} at {xs:?}");
    }
    // The axis reaches the longest series, and the window's end is marked.
    let longest = *lens.iter().max().unwrap() as f64 * cmp.bucket_s / 3600.0;
    let last: f64 = at.keys().map(|h| h.parse::<f64>().unwrap()).fold(0.0, f64::max);
    assert!(last + 0.5 >= longest, "{last} {longest}");
    assert!(plot.contains("window end"));
}

/// Two flexible classes, no protected capacity (every GPU unprotected).
const TWO_FLEXIBLE: &str = r#"
[pool]
partitions = ["gpu"]
total_gpus = 16
default_class = "b"

[classes.a]
tier = "flexible"
rank = 1
qos = "op-a"

[classes.b]
tier = "flexible"
rank = 2
qos = "op-b"
"#;

/// A scenario from its files, in a fresh folder, compared with a search up
/// to `max_nodes`.
fn compared(name: &str, files: &[(&str, &str)], max_nodes: u32) -> (scenario::Scenario, Comparison) {
    let dir = std::env::temp_dir().join(format!("onepool-sim-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (f, text) in files {
        std::fs::write(dir.join(f), text).unwrap();
    }
    let sc = scenario::load(&dir.join("scenario.toml"), OnBadRow::Abort).unwrap();
    let s = Settings { max_p95_wait_s: sc.max_p95_wait_s, max_nodes, ..Settings::default() };
    let (cmp, _) = compare::compare(&sc.workload, &sc.policy, &sc.fleet, &s, Search::Auto);
    let _ = std::fs::remove_dir_all(&dir);
    (sc, cmp)
}

/// A request a second for 200 s, each 10 s of one replica's only slot,
/// and at most one replica: no number of GPUs gets its p99 queueing delay
/// under 2 s (issue #38: the figure said "unmet or not searched").
#[test]
fn an_unmeetable_target_names_the_target_the_sizes_searched_and_what_changes_it() {
    let mut trace = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..200 {
        trace.push_str(&format!("2023-11-16 18:{:02}:{:02}.0000000,100,100\n", 15 + i / 60, i % 60));
    }
    let scen = "policy = \"policy.toml\"\n[fleet]\nnodes = 2\ngpus_per_node = 2\n\
                [[endpoints]]\nname = \"chat\"\ntrace = \"trace.csv\"\nclass = \"b\"\ngpus_per_replica = 1\n\
                max_concurrent = 1\nprefill_tokens_per_s = 1000\ndecode_tokens_per_s = 10\nstartup = \"10s\"\n\
                slo_p99 = \"2s\"\nmax_replicas = 1\n";
    let (sc, cmp) =
        compared("unmeetable", &[("policy.toml", TWO_FLEXIBLE), ("trace.csv", &trace), ("scenario.toml", scen)], 8);
    assert_eq!((cmp.separate_gpus, cmp.shared_gpus_needed), (None, None));
    let Some(compare::Unmet::NoSizeMet { tried_gpus, at_largest }) = &cmp.shared_unmet else {
        panic!("{:?}", cmp.shared_unmet)
    };
    assert_eq!(tried_gpus, &[2, 4, 8, 16]);
    assert_eq!(at_largest[0].at_max_replicas, [("chat".to_string(), 1)]);
    let t = table(&sc, &cmp);
    for said in [
        "separate islands unmet: no island up to 16 GPUs met its class's target (sizes searched: 2, 4, 8 and 16 GPUs); \
         on 16 GPUs b missed its p99 queueing delay target of 2.0s (p99 ",
        "one shared pool unmet: no pool up to 16 GPUs met every target (sizes searched: 2, 4, 8 and 16 GPUs); on 16 \
         GPUs b missed its p99 queueing delay target of 2.0s",
        "with endpoint chat at its maximum of 1 replica. What changes it: the endpoint's slo_p99 sets the p99 target, \
         the endpoint's startup the replica startup assumed; the endpoint's max_replicas caps the replicas more GPUs \
         could add.",
    ] {
        assert!(t.contains(said), "{said:?} not in:\n{t}");
    }
    assert!(!t.contains("no saving"), "{t}");
    // The plot says the same, wrapped to its width.
    let plot: String = texts(&svg::gpus_needed(&cmp)).into_iter().map(|(_, t)| t).collect::<Vec<_>>().join(" ");
    assert!(plot.contains("one shared pool unmet: no pool up to 16 GPUs met every target"), "{plot}");
    assert!(plot.contains("the endpoint's max_replicas caps"), "{plot}");
}

/// Both classes want their GPUs at the same hour: one pool must hold what
/// the islands hold, and the figure says so instead of leaving a reader
/// to wonder why sharing saved nothing.
#[test]
fn a_period_without_saving_says_why_from_the_runs() {
    let jobs = |later: u32| {
        let mut j = String::from("submit,duration,gpus,class\n");
        j.push_str(&"0,1h,1,a\n".repeat(4));
        j.push_str(&format!("{later},1h,1,b\n").repeat(6));
        j
    };
    let scen = "policy = \"policy.toml\"\n[fleet]\nnodes = 8\ngpus_per_node = 2\n[targets]\nmax_p95_wait = \"0s\"\n\
                [[jobs]]\nfile = \"jobs.csv\"\nkeep_times = true\n";
    let (sc, cmp) =
        compared("together", &[("policy.toml", TWO_FLEXIBLE), ("jobs.csv", &jobs(0)), ("scenario.toml", scen)], 64);
    assert_eq!((cmp.separate_gpus, cmp.shared_gpus_needed), (Some(10), Some(10)));
    let n = cmp.no_saving.clone().unwrap();
    assert_eq!((n.because, n.together_peak_gpus, n.apart_peak_gpus), (compare::Because::PeaksTogether, 10, 10));
    let t = table(&sc, &cmp);
    let said = "no saving in this period (islands and one pool both need 10 GPUs) because the classes' busiest \
                moments came together: one pool held 10 GPUs at once, as many as their peaks apart add up to; on 8 \
                GPUs, ";
    assert!(t.contains(said), "{said:?} not in:\n{t}");
    assert!(t.contains("b missed its p95 wait target of 0ms (p95 60.0m)"), "{t}");
    // Two hours apart, one pool of the larger peak does: a saving, nothing to explain.
    let (_, apart) =
        compared("apart", &[("policy.toml", TWO_FLEXIBLE), ("jobs.csv", &jobs(7200)), ("scenario.toml", scen)], 64);
    assert_eq!((apart.separate_gpus, apart.shared_gpus_needed, apart.no_saving), (Some(10), Some(6), None));
}
