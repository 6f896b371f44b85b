//! Hand-written SVG plots: demand vs allocation over time per class, and
//! GPUs needed by separate islands vs one shared pool.

use std::fmt::Write;

use crate::compare::Comparison;

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

/// One panel per class with work: mean GPUs demanded (dashed) and held
/// (filled) in each time bucket of the shared run.
pub fn demand_vs_allocation(c: &Comparison) -> String {
    let panels: Vec<usize> = (0..c.classes.len()).filter(|&i| c.classes[i].shared.has_work).collect();
    let (w, ph, left, top) = (900.0, 180.0, 70.0, 50.0);
    let pw = w - left - 170.0;
    let h = top + panels.len() as f64 * (ph + 40.0) + 40.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="16" text-anchor="middle">Shared pool: GPUs demanded vs held, per class</text>
"#,
        w / 2.0
    );
    let hours = c.window_hours.max(c.bucket_s / 3600.0);
    for (k, &ci) in panels.iter().enumerate() {
        let row = &c.classes[ci];
        let y0 = top + k as f64 * (ph + 40.0);
        let color = COLORS[k % COLORS.len()];
        let n = row.demand.len().max(row.alloc.len()).max(1);
        let span_h = (n as f64 * c.bucket_s / 3600.0).max(hours);
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
        let mut notes = Vec::new();
        if let Some(cap) = cap {
            // A protected class's capacity: the gap down to what it held is its unused capacity.
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{yc}" y2="{yc}" stroke="#d62728" stroke-dasharray="2,3"/>"##,
                left + pw,
                yc = y(cap)
            );
            notes.push(format!("capacity {cap} (dotted)"));
            notes.push(format!("unused: {:.1} GPU-h", row.shared.unused_capacity_gpu_hours.unwrap_or(0.0)));
        }
        if row.shared.lost_gpu_hours > 0.0 {
            notes.push(format!("lost: {:.1} GPU-h", row.shared.lost_gpu_hours));
        }
        for (i, n) in notes.iter().enumerate() {
            let _ =
                writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, left + pw + 12.0, y0 + 64.0 + 16.0 * i as f64, esc(n));
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-weight="bold">{}</text><text x="{}" y="{}">separate: {}</text><text x="{}" y="{}">shared peak: {}</text>"#,
            left + pw + 12.0,
            y0 + 14.0,
            esc(&row.shared.class),
            left + pw + 12.0,
            y0 + 32.0,
            match (row.own_island, row.separate_gpus_needed) {
                (false, _) => "in its endpoint's island".to_string(),
                (true, Some(g)) => format!("{g} GPUs"),
                (true, None) => "unmet".into(),
            },
            left + pw + 12.0,
            y0 + 48.0,
            row.shared.peak_gpus
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">GPUs</text>"#,
            y0 + ph / 2.0,
            y0 + ph / 2.0
        );
    }
    let ly = h - 14.0;
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{ly}" text-anchor="middle">hours from the start of the trace</text>
<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#000" stroke-dasharray="5,3"/><text x="{}" y="{ly}">demanded</text>
<rect x="{}" y="{}" width="18" height="10" fill="#1f77b4" fill-opacity="0.35" stroke="#1f77b4"/><text x="{}" y="{ly}">held</text>
</svg>"##,
        left + pw / 2.0,
        left + 24.0,
        ly - 4.0,
        ly - 4.0,
        left + 30.0,
        left + 110.0,
        ly - 10.0,
        left + 134.0
    );
    s
}

/// Two bars: the separate islands stacked by class, and the shared pool.
pub fn gpus_needed(c: &Comparison) -> String {
    let (w, h, left, top, ph) = (640.0, 420.0, 80.0, 50.0, 300.0);
    let sep: Vec<(usize, u64)> =
        c.classes.iter().enumerate().filter_map(|(i, r)| r.separate_gpus_needed.map(|g| (i, g))).collect();
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
    for (k, (i, g)) in sep.iter().enumerate() {
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
            r##"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{} ({g})</text>"##,
            left + 330.0,
            top + 20.0 * k as f64,
            COLORS[k % COLORS.len()],
            left + 348.0,
            top + 20.0 * k as f64 + 10.0,
            esc(&c.classes[*i].shared.class)
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
        if c.separate_gpus.is_some() { sep_total.to_string() } else { format!("{sep_total}+ (some unmet)") }
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
                if c.shared_searched { "unmet" } else { "not searched" }
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">one shared pool</text>
<line x1="{left}" x2="{}" y1="{}" y2="{}" stroke="#000"/>
<text x="20" y="{}" transform="rotate(-90 20 {})" text-anchor="middle">GPUs</text>
</svg>"##,
        left + 220.0,
        top + ph + 18.0,
        left + 300.0,
        y(0.0),
        y(0.0),
        top + ph / 2.0,
        top + ph / 2.0
    );
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
