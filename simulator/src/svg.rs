//! Hand-written SVG plots: demand vs allocation over time per class, and
//! GPUs needed by separate islands vs one shared pool.

use std::fmt::Write;

use crate::compare::{ClassRow, Comparison};

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// A tick label without floating-point noise (0.30000000000000004 -> 0.3).
fn num(v: f64) -> String {
    format!("{}", (v * 1000.0).round() / 1000.0)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A "nice" axis step for `max` over about `n` ticks.
fn step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10.0 * p)
}

/// Width of `text` at `px` pixels, over-estimated (0.62 em a character,
/// wider than the average sans-serif letter) so that a box sized by it
/// holds the text whatever font the viewer picks.
fn text_width(text: &str, px: f64) -> f64 {
    text.chars().count() as f64 * px * 0.62
}

/// Width of the widest of `texts` at 12 px.
fn widest(texts: &[String]) -> f64 {
    texts.iter().map(|t| text_width(t, 12.0)).fold(0.0, f64::max)
}

/// Hours shown on every panel's time axis: the window, or longer when
/// work in the shared run went past it, so that the same hour is at the
/// same place in every panel.
fn time_span_h(c: &Comparison) -> f64 {
    let longest = c.classes.iter().map(|r| r.demand.len().max(r.alloc.len())).max().unwrap_or(0);
    (longest as f64 * c.bucket_s / 3600.0).max(c.window_hours).max(c.bucket_s / 3600.0)
}

fn separate_label(c: &Comparison, row: &ClassRow) -> String {
    match (row.own_island, row.separate_gpus_needed) {
        // Separately the endpoint's replicas all run in its own class.
        (false, _) => match row.baseline_of.first() {
            Some(b) => format!("separate: runs as {}", b.requests_counted_under),
            None => "separate: no work".into(),
        },
        (true, Some(g)) => format!("separate: {g} GPUs"),
        (true, None) if c.separate_sized => "separate: unmet".into(),
        (true, None) => "separate: not sized".into(),
    }
}

/// The texts beside a panel, top down: class (bold), separate size,
/// shared peak, then notes.
fn panel_labels(c: &Comparison, row: &ClassRow) -> Vec<String> {
    let mut out =
        vec![row.shared.class.clone(), separate_label(c, row), format!("shared peak: {}", row.shared.peak_gpus)];
    if let Some(cap) = row.shared.capacity_gpus {
        out.push(format!("capacity {cap} (dotted)"));
        out.push(format!("unused: {:.1} GPU-h", row.shared.unused_capacity_gpu_hours.unwrap_or(0.0)));
    }
    if row.shared.lost_gpu_hours > 0.0 {
        out.push(format!("lost: {:.1} GPU-h", row.shared.lost_gpu_hours));
    }
    out
}

/// One panel per class with work: mean GPUs demanded (dashed) and held
/// (filled) in each time bucket of the shared run, on one time axis.
pub fn demand_vs_allocation(c: &Comparison) -> String {
    let panels: Vec<usize> = (0..c.classes.len()).filter(|&i| c.classes[i].shared.has_work).collect();
    let labels: Vec<Vec<String>> = panels.iter().map(|&i| panel_labels(c, &c.classes[i])).collect();
    let (ph, left, top, pw) = (180.0, 70.0, 50.0, 660.0);
    // Bold class names are wider: 10% on top of the estimate.
    let label_w = labels.iter().map(|l| widest(l) * 1.1).fold(0.0, f64::max);
    let w = (left + pw + 12.0 + label_w + 12.0).ceil();
    let h = top + panels.len() as f64 * (ph + 40.0) + 50.0;
    let span_h = time_span_h(c);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="16" text-anchor="middle">Shared pool: GPUs demanded vs held, per class</text>
"#,
        left + pw / 2.0
    );
    for (k, &ci) in panels.iter().enumerate() {
        let y0 = top + k as f64 * (ph + 40.0);
        panel(&mut s, c, &c.classes[ci], &labels[k], (left, y0, pw, ph), span_h, COLORS[k % COLORS.len()]);
    }
    // The axis title on its own line, the legend below it.
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">hours from the start of the window (first submission or request)</text>"#,
        left + pw / 2.0,
        h - 36.0
    );
    let ly = h - 12.0;
    let _ = writeln!(
        s,
        r##"<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#000" stroke-dasharray="5,3"/><text x="{}" y="{ly}">demanded</text>
<rect x="{}" y="{}" width="18" height="10" fill="#1f77b4" fill-opacity="0.35" stroke="#1f77b4"/><text x="{}" y="{ly}">held</text>"##,
        left + 24.0,
        ly - 4.0,
        ly - 4.0,
        left + 30.0,
        left + 110.0,
        ly - 10.0,
        left + 134.0
    );
    if span_h > c.window_hours + 1e-9 {
        let _ = writeln!(
            s,
            r##"<line x1="{xl}" x2="{xl}" y1="{}" y2="{}" stroke="#555" stroke-dasharray="1,2"/><text x="{}" y="{ly}">window end (work after it ran late)</text>"##,
            ly - 11.0,
            ly + 1.0,
            left + 186.0,
            xl = left + 180.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One class's panel in `(left, top, width, height)`, hours `0..span_h`.
#[allow(clippy::too_many_lines, reason = "a drawing: axes, bars and labels in the order they are painted")]
fn panel(
    s: &mut String,
    c: &Comparison,
    row: &ClassRow,
    labels: &[String],
    area: (f64, f64, f64, f64),
    span_h: f64,
    color: &str,
) {
    let (left, y0, pw, ph) = area;
    let cap = row.shared.capacity_gpus.map(f64::from);
    let ymax = row.demand.iter().chain(&row.alloc).chain(&cap).copied().fold(1.0, f64::max) * 1.1;
    let x = |i: f64| left + i * c.bucket_s / 3600.0 / span_h * pw;
    let y = |v: f64| y0 + ph - v / ymax * ph;
    let _ = writeln!(s, r##"<rect x="{left}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##);
    let ys = step(ymax, 4.0);
    let mut v = 0.0;
    while v <= ymax {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y(v) + 4.0,
            num(v),
            yy = y(v)
        );
        v += ys;
    }
    let xs = step(span_h, 8.0);
    let mut t = 0.0;
    while t <= span_h + 1e-9 {
        let xx = left + t / span_h * pw;
        let _ = writeln!(
            s,
            r##"<line x1="{xx}" x2="{xx}" y1="{}" y2="{}" stroke="#999"/><text x="{xx}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + ph,
            y0 + ph + 4.0,
            y0 + ph + 16.0,
            num(t)
        );
        t += xs;
    }
    if span_h > c.window_hours + 1e-9 {
        // Work past the window ran late because of the fleet: show where the window ends.
        let xw = left + c.window_hours / span_h * pw;
        let _ = writeln!(
            s,
            r##"<line x1="{xw}" x2="{xw}" y1="{y0}" y2="{}" stroke="#555" stroke-dasharray="1,2"/>"##,
            y0 + ph
        );
    }
    let mut area = format!("M{left},{}", y(0.0));
    for (i, a) in row.alloc.iter().enumerate() {
        let _ = write!(area, " L{:.1},{:.1} L{:.1},{:.1}", x(i as f64), y(*a), x(i as f64 + 1.0), y(*a));
    }
    let _ = write!(area, " L{:.1},{} Z", x(row.alloc.len() as f64), y(0.0));
    let _ = writeln!(s, r#"<path d="{area}" fill="{color}" fill-opacity="0.35" stroke="{color}"/>"#);
    let mut line = String::new();
    for (i, d) in row.demand.iter().enumerate() {
        let _ = write!(
            line,
            "{}{:.1},{:.1} L{:.1},{:.1}",
            if i == 0 { "M" } else { " L" },
            x(i as f64),
            y(*d),
            x(i as f64 + 1.0),
            y(*d)
        );
    }
    let _ = writeln!(s, r##"<path d="{line}" fill="none" stroke="#000" stroke-dasharray="5,3"/>"##);
    if let Some(cap) = cap {
        // A protected class's capacity: the gap down to what it held is its unused capacity.
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yc}" y2="{yc}" stroke="#d62728" stroke-dasharray="2,3"/>"##,
            left + pw,
            yc = y(cap)
        );
    }
    for (i, l) in labels.iter().enumerate() {
        let weight = if i == 0 { r#" font-weight="bold""# } else { "" };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}"{weight}>{}</text>"#,
            left + pw + 12.0,
            y0 + 14.0 + 16.0 * i as f64 + if i >= 3 { 2.0 } else { 0.0 },
            esc(l)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">GPUs</text>"#,
        y0 + ph / 2.0,
        y0 + ph / 2.0
    );
}

/// What each bar measured, or why it is missing, and why the islands
/// needed no more than the pool, in `onepool simulate`'s words
/// ([`crate::report::reasons`]), wrapped to the plot's width.
fn gpus_needed_caption(c: &Comparison) -> Vec<String> {
    let why = crate::report::reasons(c, &crate::report::SCENARIO_OPTIONS);
    let mut out = Vec::new();
    match &why.separate {
        Some(w) => out.extend(wrap(w, CAPTION_CHARS)),
        None => out.push("separate islands: each class alone on its smallest island meeting its target".to_string()),
    }
    match &why.shared {
        Some(w) => out.extend(wrap(w, CAPTION_CHARS)),
        None => out.push("one shared pool: the smallest found meeting every target under the policy".to_string()),
    }
    if let Some(w) = &why.no_saving {
        out.extend(wrap(w, CAPTION_CHARS));
    }
    out.push(format!("per-class figures of the report: the shared pool simulated on {} GPUs", c.shared_fleet_gpus));
    out
}

/// Characters in a caption line: about the plot's width at 12 px.
const CAPTION_CHARS: usize = 100;

/// `text` in lines of at most `width` characters, broken between words
/// (a longer word gets a line of its own); the lines after the first are
/// indented, so a reader sees where one sentence ends.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let indent = if lines.is_empty() { 0 } else { 2 };
        if !line.is_empty() && indent + line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines.iter().enumerate().map(|(i, l)| if i == 0 { l.clone() } else { format!("  {l}") }).collect()
}

/// Two bars: the separate islands stacked by class, and the shared pool.
#[allow(clippy::too_many_lines, reason = "a drawing: axes, bars and labels in the order they are painted")]
pub fn gpus_needed(c: &Comparison) -> String {
    let (left, top, ph) = (80.0, 50.0, 300.0);
    let sep: Vec<(usize, u64)> =
        c.classes.iter().enumerate().filter_map(|(i, r)| r.separate_gpus_needed.map(|g| (i, g))).collect();
    let legend: Vec<String> = sep.iter().map(|(i, g)| format!("{} ({g})", c.classes[*i].shared.class)).collect();
    let caption = gpus_needed_caption(c);
    let w = (left + 348.0 + widest(&legend) + 12.0).max(20.0 + widest(&caption) + 20.0).max(640.0).ceil();
    let h = top + ph + 36.0 + 18.0 * caption.len() as f64 + 10.0;
    let sep_total: u64 = sep.iter().map(|(_, g)| g).sum();
    let shared = c.shared_gpus_needed;
    let ymax = (sep_total.max(shared.unwrap_or(0)).max(c.shared_fleet_gpus) as f64 * 1.15).max(1.0);
    let y = |v: f64| top + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="16" text-anchor="middle">GPUs needed to meet every target</text>"#,
        w / 2.0
    );
    let ys = step(ymax, 6.0);
    let mut v = 0.0;
    while v <= ymax {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            left + 300.0,
            left - 6.0,
            y(v) + 4.0,
            num(v),
            yy = y(v)
        );
        v += ys;
    }
    let mut base = 0.0;
    for (k, (_, g)) in sep.iter().enumerate() {
        let top_v = base + *g as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{:.1}" width="100" height="{:.1}" fill="{}" stroke="white"/>"##,
            left + 30.0,
            y(top_v),
            y(base) - y(top_v),
            COLORS[k % COLORS.len()]
        );
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"##,
            left + 330.0,
            top + 20.0 * k as f64,
            COLORS[k % COLORS.len()],
            left + 348.0,
            top + 20.0 * k as f64 + 10.0,
            esc(&legend[k])
        );
        base = top_v;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">separate islands</text><text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        left + 80.0,
        top + ph + 18.0,
        left + 80.0,
        y(base) - 6.0,
        match (c.separate_sized, c.separate_gpus) {
            (false, _) => "not sized".to_string(),
            (true, Some(_)) => sep_total.to_string(),
            (true, None) => format!("{sep_total}+ (some unmet)"),
        }
    );
    match shared {
        Some(g) => {
            let _ = writeln!(
                s,
                r##"<rect x="{}" y="{:.1}" width="100" height="{:.1}" fill="#555"/><text x="{}" y="{}" text-anchor="middle" font-weight="bold">{g}</text>"##,
                left + 170.0,
                y(g as f64),
                y(0.0) - y(g as f64),
                left + 220.0,
                y(g as f64) - 6.0
            );
        }
        None => {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                left + 220.0,
                y(0.0) - 6.0,
                if c.shared_search.ran() { "unmet" } else { "not searched (below)" }
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">one shared pool</text>
<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#000"/>
<text x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">GPUs</text>"##,
        left + 220.0,
        top + ph + 18.0,
        left + 300.0,
        y(0.0),
        y(0.0),
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, line) in caption.iter().enumerate() {
        let _ = writeln!(s, r#"<text x="20" y="{}">{}</text>"#, top + ph + 46.0 + 18.0 * i as f64, esc(line));
    }
    s.push_str("</svg>\n");
    s
}

/// Writes both plots into `dir`; returns their paths.
pub fn write_all(dir: &std::path::Path, c: &Comparison) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let a = dir.join("demand-vs-allocation.svg");
    let b = dir.join("gpus-needed.svg");
    std::fs::write(&a, demand_vs_allocation(c))?;
    std::fs::write(&b, gpus_needed(c))?;
    Ok(vec![a, b])
}
