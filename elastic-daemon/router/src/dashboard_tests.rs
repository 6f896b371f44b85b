//! The Grafana dashboard (etc/grafana/onepool-dashboard.json) against the
//! metrics as [`Metrics::new`] registers them: every series a panel or a
//! template variable queries is one onepoold exposes, with the labels it
//! filters, groups and names legends by; counters and histograms only
//! under rate()/increase(); every exposed family on some panel; panels with
//! a datasource and queries, unique ids and a layout without overlaps.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::*;

const DASHBOARD: &str = include_str!("../../../etc/grafana/onepool-dashboard.json");

/// The datasource every panel and query variable reads: the dashboard's
/// datasource variable, so an import picks the Prometheus to use.
const DATASOURCE_UID: &str = "${DS_PROMETHEUS}";

/// Grafana's own variables a query may use.
const BUILTIN_VARIABLES: [&str; 6] =
    ["__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"];

/// Families the dashboard leaves out on purpose (none yet).
const NOT_ON_DASHBOARD: [&str; 0] = [];

const AGGREGATIONS: [&str; 12] =
    ["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"];

const FUNCTIONS: [&str; 41] = [
    "abs",
    "absent",
    "absent_over_time",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_sum",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log2",
    "log10",
    "max_over_time",
    "min_over_time",
    "predict_linear",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "sum_over_time",
    "time",
    "vector",
];

/// Followed by a list of label names in parentheses.
const GROUPING: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

/// `group_left` and `group_right` may come without a label list.
const KEYWORDS: [&str; 9] = ["and", "or", "unless", "offset", "bool", "inf", "nan", "group_left", "group_right"];

/// What makes a per-second figure of a counter (or a histogram's).
const RATES: [&str; 3] = ["rate", "irate", "increase"];

/// Every family with one series, made through the calls the router and
/// the replica controllers make (on one registry, as onepoold's).
fn exercised() -> Metrics {
    let m = Metrics::new();
    let (endpoint, replica) = ("llm", "127.0.0.1:18000");
    m.count_request(endpoint, replica, 200);
    let r = m.replica(endpoint, replica);
    r.in_flight.set(1);
    r.latency.observe(0.2);
    r.response_idle_timeouts.inc();
    r.requests.count(503);
    m.count_retry(endpoint, crate::metrics::Retry::Lost);
    m.count_moved(endpoint, crate::resume::Why::Reclaimed);
    m.count_move_failed(endpoint, "max_moves");
    m.count_stream_cut(endpoint, "replica_failed");
    m.followed_counter(endpoint, "agents", "tools").inc();
    m.observe_move_pause(endpoint, 0.2);
    m.resume_kept_bytes.set(4096);
    for what in [
        crate::metrics::ClassEvent::Request,
        crate::metrics::ClassEvent::Shed,
        crate::metrics::ClassEvent::Yielded,
        crate::metrics::ClassEvent::Moved,
    ] {
        m.count_class(endpoint, "agents", what);
    }
    m.count_class_tokens(endpoint, "agents", 32);
    m.observe_class_wait(endpoint, "agents", 0.1);
    let instance = crate::metrics::InstanceLabels { instance: "svc-a".into() };
    m.ha_acting.get_or_create(&instance).set(1);
    m.ha_lock_foreign.get_or_create(&instance).set(0);
    m.ha_acting_since.get_or_create(&instance).set(1.0);
    m.ha_last_takeover.get_or_create(&instance).set(1.0);
    m.ha_takeovers.get_or_create(&instance).inc();
    m.queue_depth(endpoint).set(2);
    let outcome = "drained".to_string();
    m.drains.get_or_create(&DrainLabels { endpoint: endpoint.into(), replica: replica.into(), outcome }).inc();
    m.drain_seconds.get_or_create(&replica_labels(endpoint, replica)).observe(3.0);
    let (kind, phase) = ("supplemental".to_string(), "serving".to_string());
    m.replicas.get_or_create(&ReplicaJobLabels { endpoint: endpoint.into(), kind, phase }).set(1);
    m.desired.get_or_create(&EndpointLabels { endpoint: endpoint.into() }).set(1);
    m.preemptions.get_or_create(&EndpointLabels { endpoint: endpoint.into() }).inc();
    let reclaim = crate::metrics::ReclaimLabels { endpoint: endpoint.into(), mode: "graceful".into() };
    m.reclaims.get_or_create(&reclaim).inc();
    m.reclaim_release_seconds.get_or_create(&reclaim).observe(2.5);
    m.reclaim_time_to_capacity_seconds.get_or_create(&reclaim).observe(3.0);
    m.failed_starts.get_or_create(&EndpointLabels { endpoint: endpoint.into() }).inc();
    m.backoff_failures.get_or_create(&EndpointLabels { endpoint: endpoint.into() }).set(2);
    m.backoff_seconds.get_or_create(&EndpointLabels { endpoint: endpoint.into() }).set(20);
    m.count_slurm_call(endpoint, "squeue", "ok");
    let listener = "127.0.0.1:8000".to_string();
    m.connections.get_or_create(&ListenerLabels { listener: listener.clone() }).set(1);
    let reason = "max_connections".to_string();
    m.connections_refused.get_or_create(&RefusedLabels { listener, reason }).inc();
    m.buffered_body_bytes.set(10);
    let outcome = crate::prefix::Affine::Hit { blocks: 3 }.label().to_string();
    m.prefix_routed.get_or_create(&crate::metrics::PrefixLabels { endpoint: endpoint.into(), outcome }).inc();
    m.body_budget_refused.inc();
    m.count_unavailable(endpoint, crate::metrics::Unavailable::QueueTimeout);
    m.access_log_dropped.inc();
    let (action, mode) = ("submit".to_string(), "advisory".to_string());
    let d = crate::metrics::DecisionLabels { endpoint: endpoint.into(), action: action.clone(), mode };
    m.decisions.get_or_create(&d).inc();
    m.advised.get_or_create(&crate::metrics::AdvisedLabels { endpoint: endpoint.into(), action }).set(1);
    m.decision_log_dropped.inc();
    let l = crate::metrics::LatencyLabels { endpoint: endpoint.into(), what: "ttft".into() };
    m.latency_p99.get_or_create(&l).set(0.8);
    m
}

/// One series name of the exposition: its family, the family's type and
/// the label names its samples carry.
#[derive(Debug)]
struct Series {
    family: String,
    kind: String,
    labels: BTreeSet<String>,
}

/// The series names of a text exposition (`# TYPE` lines and samples).
fn exposed(text: &str) -> BTreeMap<String, Series> {
    let mut families = BTreeMap::new();
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').expect("# TYPE name type");
            families.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).expect("a sample has a value");
        let name = &line[..end];
        let family = ["_total", "_bucket", "_sum", "_count", "_created", ""]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|f| families.contains_key(*f))
            .unwrap_or_else(|| panic!("sample {name} of no # TYPE family"));
        let s = series.entry(name.to_string()).or_insert_with(|| Series {
            family: family.to_string(),
            kind: families[family].clone(),
            labels: BTreeSet::new(),
        });
        if let Some(labels) = line[end..].strip_prefix('{') {
            s.labels.extend(label_names(labels));
        }
    }
    for family in families.keys() {
        assert!(series.values().any(|s| &s.family == family), "{family} has no sample: exercise it in exercised()");
    }
    series
}

/// The names of `k="v",...}` (values may hold escaped quotes).
fn label_names(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = s;
    while let Some((name, after)) = rest.split_once("=\"") {
        names.push(name.trim_start_matches(',').to_string());
        let mut escaped = false;
        let close = after
            .char_indices()
            .find(|&(_, c)| {
                let end = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                end
            })
            .map(|(i, _)| i)
            .expect("closing quote");
        rest = &after[close + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// The Grafana variables an expression uses, in label values too:
/// `$name`, `${name}`, `${name:format}`.
fn variables(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, after) in expr.match_indices('$').map(|(i, _)| expr.split_at(i + 1)) {
        let name = match after.strip_prefix('{') {
            Some(braced) => braced.split(['}', ':']).next().unwrap_or_default(),
            None => after.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or_default(),
        };
        assert!(!name.is_empty(), "a bare $ in {expr}");
        found.insert(name.to_string());
    }
    found
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// A Grafana variable (`$name`, `${name}`, `${name:format}`).
    Var,
    Str,
    Num,
    /// A label matcher or comparison.
    Op(String),
    P(char),
}

fn lex(expr: &str) -> Vec<Tok> {
    let chars: Vec<char> = expr.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if matches!(c, '"' | '\'' | '`') {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' && c != '`' { 2 } else { 1 };
            }
            assert!(i < chars.len(), "unterminated string in {expr}");
            i += 1;
            toks.push(Tok::Str);
        } else if c == '$' {
            i = if next == Some('{') {
                (i..chars.len()).find(|&j| chars[j] == '}').expect("closing } of ${...}") + 1
            } else {
                (i + 1..chars.len())
                    .find(|&j| !(chars[j].is_ascii_alphanumeric() || chars[j] == '_'))
                    .unwrap_or(chars.len())
            };
            toks.push(Tok::Var);
        } else if ident_start(c) {
            let end = (i..chars.len()).find(|&j| !ident_char(chars[j])).unwrap_or(chars.len());
            toks.push(Tok::Ident(chars[i..end].iter().collect()));
            i = end;
        } else if c.is_ascii_digit() || (c == '.' && next.is_some_and(|n| n.is_ascii_digit())) {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            toks.push(Tok::Num);
        } else if matches!((c, next), ('=' | '!', Some('~')) | ('=' | '!' | '<' | '>', Some('='))) {
            toks.push(Tok::Op(format!("{c}{}", next.unwrap_or_default())));
            i += 2;
        } else {
            toks.push(if c == '=' { Tok::Op("=".into()) } else { Tok::P(c) });
            i += 1;
        }
    }
    toks
}

/// One metric a query selects.
#[derive(Debug)]
struct Selector {
    metric: String,
    /// Label names of its matchers.
    labels: Vec<String>,
    /// The functions it is an argument of, outermost first.
    under: Vec<String>,
}

#[derive(Debug, Default)]
struct Query {
    selectors: Vec<Selector>,
    /// Labels of `by (...)`, `without (...)`, `on (...)` and the like.
    grouping: BTreeSet<String>,
    variables: BTreeSet<String>,
}

fn parse(expr: &str) -> Query {
    let toks = lex(expr);
    let mut q = Query { variables: variables(expr), ..Query::default() };
    // What each open parenthesis is: a call's name, or "" for grouping.
    let mut stack: Vec<String> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let next = toks.get(i + 1);
        match &toks[i] {
            Tok::Ident(w) if GROUPING.contains(&w.as_str()) && next == Some(&Tok::P('(')) => {
                i += 2;
                while toks.get(i) != Some(&Tok::P(')')) {
                    match toks.get(i) {
                        Some(Tok::Ident(l)) => {
                            q.grouping.insert(l.clone());
                        }
                        Some(Tok::P(',')) => {}
                        t => panic!("{t:?} in the label list of {w} in {expr}"),
                    }
                    i += 1;
                }
            }
            Tok::Ident(w) if KEYWORDS.contains(&w.as_str()) => {}
            Tok::Ident(w) if next == Some(&Tok::P('(')) => {
                assert!(
                    FUNCTIONS.contains(&w.as_str()) || AGGREGATIONS.contains(&w.as_str()),
                    "{w}() is no PromQL function this test knows, in {expr}"
                );
                stack.push(w.clone());
                i += 1;
            }
            // `sum by (...) (...)`: the aggregation's own parenthesis follows
            // its grouping.
            Tok::Ident(w) if AGGREGATIONS.contains(&w.as_str()) => {}
            Tok::Ident(metric) => {
                let mut labels = Vec::new();
                if next == Some(&Tok::P('{')) {
                    i += 2;
                    loop {
                        match (toks.get(i), toks.get(i + 1), toks.get(i + 2)) {
                            (Some(Tok::P('}')), ..) => break,
                            (Some(Tok::P(',')), ..) => i += 1,
                            (Some(Tok::Ident(l)), Some(Tok::Op(op)), Some(Tok::Str))
                                if ["=", "!=", "=~", "!~"].contains(&op.as_str()) =>
                            {
                                labels.push(l.clone());
                                i += 3;
                            }
                            t => panic!("{t:?} in the matchers of {metric} in {expr}"),
                        }
                    }
                }
                q.selectors.push(Selector { metric: metric.clone(), labels, under: stack.clone() });
            }
            Tok::P('{') => panic!("a selector without a metric name in {expr}"),
            Tok::P('(') => stack.push(String::new()),
            Tok::P(')') => assert!(stack.pop().is_some(), "unbalanced ) in {expr}"),
            Tok::P('[') => {
                // A range or subquery: durations and variables only.
                while toks.get(i) != Some(&Tok::P(']')) {
                    assert!(i < toks.len(), "unclosed [ in {expr}");
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    assert!(stack.is_empty(), "unclosed ( in {expr}");
    q
}

/// Checks one query against the exposition; returns the families it reads.
fn check_query(
    expr: &str,
    legend: Option<&str>,
    series: &BTreeMap<String, Series>,
    vars: &BTreeSet<String>,
) -> Vec<String> {
    let q = parse(expr);
    assert!(!q.selectors.is_empty(), "no metric in {expr}");
    let mut labels = BTreeSet::new();
    let mut families = Vec::new();
    for s in &q.selectors {
        let Some(exposed) = series.get(&s.metric) else {
            panic!("{expr} reads {}, which onepoold does not expose; it does: {:?}", s.metric, series.keys());
        };
        families.push(exposed.family.clone());
        for l in &s.labels {
            assert!(exposed.labels.contains(l), "{expr}: {} has no label {l} (has {:?})", s.metric, exposed.labels);
        }
        labels.extend(exposed.labels.iter().cloned());
        let rated = s.under.iter().any(|f| RATES.contains(&f.as_str()));
        let cumulative = exposed.kind == "counter" || exposed.kind == "histogram";
        assert_eq!(
            rated,
            cumulative,
            "{expr}: {} is a {}: {}",
            s.metric,
            exposed.kind,
            if cumulative { "read it through rate() or increase()" } else { "a gauge is read as it is" }
        );
        if s.metric.ends_with("_bucket") {
            assert!(
                s.under.first().is_some_and(|f| f == "histogram_quantile"),
                "{expr}: buckets outside histogram_quantile"
            );
            assert!(q.grouping.contains("le"), "{expr}: buckets summed without `by (le)`");
        }
    }
    for l in &q.grouping {
        assert!(labels.contains(l), "{expr} groups by {l}, a label of none of its metrics ({labels:?})");
    }
    for v in &q.variables {
        assert!(
            vars.contains(v) || BUILTIN_VARIABLES.contains(&v.as_str()),
            "{expr} uses ${v}, no variable of the dashboard"
        );
    }
    // `{{label}}` in a legend: kept by the aggregation, or on the metric.
    let kept = if q.grouping.is_empty() { &labels } else { &q.grouping };
    let mut rest = legend.unwrap_or_default();
    while let Some((_, after)) = rest.split_once("{{") {
        let (name, after) = after.split_once("}}").expect("closing }} in a legend");
        assert!(kept.contains(name.trim()), "legend {legend:?} of {expr} names {name}, which the query does not keep");
        rest = after;
    }
    families
}

fn str_at<'a>(v: &'a Value, key: &str, what: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("{what} has no string {key}"))
}

fn int_at(v: &Value, key: &str, what: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("{what} has no integer {key}"))
}

#[test]
fn the_grafana_dashboard_reads_only_what_onepoold_exposes_and_is_well_formed() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let series = exposed(&exercised().encode());
    assert_eq!(str_at(&dash, "uid", "the dashboard"), "onepool");
    assert!(!str_at(&dash, "title", "the dashboard").is_empty());
    assert!(dash["schemaVersion"].as_i64().is_some_and(|v| (36..=41).contains(&v)), "schemaVersion");
    assert!(dash["time"]["from"].is_string() && dash["time"]["to"].is_string(), "time range");

    // Template variables: the datasource, then queries on it.
    let variables = dash["templating"]["list"].as_array().expect("templating.list");
    let names: BTreeSet<String> = variables.iter().map(|v| str_at(v, "name", "a variable").to_string()).collect();
    assert_eq!(names.len(), variables.len(), "variable names are unique");
    let ds = variables.iter().find(|v| v["name"] == "DS_PROMETHEUS").expect("a DS_PROMETHEUS variable");
    assert_eq!((ds["type"].as_str(), ds["query"].as_str()), (Some("datasource"), Some("prometheus")));
    let mut read = BTreeSet::new();
    for v in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"]["uid"], DATASOURCE_UID, "variable {}", v["name"]);
        let query = v["query"].as_str().or_else(|| v["query"]["query"].as_str()).expect("a variable's query");
        let inner = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')'));
        let (selector, label) = inner.and_then(|q| q.rsplit_once(',')).expect("label_values(metric, label)");
        let q = parse(selector);
        assert_eq!(q.selectors.len(), 1, "{query}");
        let metric = &q.selectors[0].metric;
        let s = series.get(metric).unwrap_or_else(|| panic!("{query}: onepoold exposes no {metric}"));
        assert!(s.labels.contains(label.trim()), "{query}: {metric} has no label {label}");
        read.insert(s.family.clone());
    }
    assert!(names.contains("endpoint"), "an endpoint variable");

    // Panels, rows' nested ones included.
    let mut panels = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    let mut boxes: Vec<(String, [i64; 4])> = Vec::new();
    for p in &panels {
        let title = str_at(p, "title", "a panel");
        assert!(ids.insert(int_at(p, "id", title)), "panel id {} is not unique ({title})", p["id"]);
        assert!(!title.is_empty() && titles.insert(title.to_string()), "panel title {title:?} empty or repeated");
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| int_at(g, k, &format!("gridPos of {title}")));
        assert!(x >= 0 && y >= 0 && w >= 1 && h >= 1 && x + w <= 24, "{title}: gridPos {g} outside the 24 columns");
        for (other, [ox, oy, ow, oh]) in &boxes {
            let apart = x + w <= *ox || *ox + ow <= x || y + h <= *oy || *oy + oh <= y;
            assert!(apart, "{title} overlaps {other}");
        }
        boxes.push((title.to_string(), [x, y, w, h]));
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], DATASOURCE_UID, "{title}: datasource");
        assert_eq!(p["datasource"]["type"], "prometheus", "{title}: datasource");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.unwrap_or_else(|| panic!("{title} has no target"));
        let mut ref_ids = BTreeSet::new();
        for t in targets {
            assert!(ref_ids.insert(str_at(t, "refId", title)), "{title}: refId {} repeated", t["refId"]);
            if !t["datasource"].is_null() {
                assert_eq!(t["datasource"]["uid"], DATASOURCE_UID, "{title}: a target's datasource");
            }
            let expr = str_at(t, "expr", title);
            read.extend(check_query(expr, t["legendFormat"].as_str(), &series, &names));
        }
    }
    let unread: Vec<&String> = series
        .values()
        .map(|s| &s.family)
        .filter(|f| !read.contains(*f) && !NOT_ON_DASHBOARD.contains(&f.as_str()))
        .collect();
    assert!(unread.is_empty(), "no panel shows {unread:?}: add one, or list them in NOT_ON_DASHBOARD");
}

#[test]
fn queries_are_read_as_promql() {
    let q = parse(
        r#"histogram_quantile(0.99, sum by (endpoint, le) (rate(a_bucket{endpoint=~"$endpoint", x!="}"}[$__rate_interval]))) / on (endpoint) group_left b"#,
    );
    let found: Vec<(&str, Vec<&str>, Vec<&str>)> = q
        .selectors
        .iter()
        .map(|s| {
            (
                s.metric.as_str(),
                s.labels.iter().map(String::as_str).collect(),
                s.under.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [("a_bucket", vec!["endpoint", "x"], vec!["histogram_quantile", "", "rate"]), ("b", vec![], vec![])]
    );
    assert_eq!(q.grouping, BTreeSet::from(["endpoint".to_string(), "le".to_string()]));
    assert_eq!(q.variables, BTreeSet::from(["endpoint".to_string(), "__rate_interval".to_string()]));
    assert_eq!(label_names(r#"a="x\"y,z",b="2"} 1"#), ["a", "b"]);
}
