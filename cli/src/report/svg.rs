//! The report as one chart a manager reads: per class, the GPU-hours it
//! used (the part on borrowed protected capacity marked), the pool's idle
//! GPU-hours, what the pool saved (the GPUs separate islands would have
//! needed beside the shared pool) and the reclaims with their time to
//! capacity underneath.

use super::usage::Report;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub fn chart(r: &Report) -> String {
    let capacity = f64::from(r.pool_gpus) * (r.to - r.from) / 3600.0;
    let mut bars: Vec<(String, f64, f64, &str)> = r
        .classes
        .iter()
        .map(|c| (c.class.clone(), c.gpu_hours, c.borrowed_gpu_hours, if c.protected { "#2b6cb0" } else { "#38a169" }))
        .collect();
    bars.push(("idle".into(), r.idle_gpu_hours, 0.0, "#a0aec0"));
    let top = bars.iter().map(|b| b.1).fold(capacity.max(1e-9) * 0.05, f64::max);
    let (left, width, row) = (190.0, 480.0, 30.0);
    let saved_rows = r.saved.as_ref().map_or(0.0, |s| 4.0 + reasons_height(saved_reasons(s).len()) / 24.0);
    let height = 90.0 + row * bars.len() as f64 + 24.0 * (r.reclaims.len().min(8) as f64 + 2.0 + saved_rows);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{height:.0}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"20\" y=\"28\" font-size=\"17\" font-weight=\"bold\">GPU-hours by class, {:.1} h, pool of {} GPUs ({capacity:.1} GPU-hours)</text>\n\
         <text x=\"20\" y=\"50\" fill=\"#4a5568\">blue: protected; green: flexible; striped: on protected capacity lent to it; grey: idle</text>\n\
         <defs><pattern id=\"lent\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#38a169\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#2b6cb0\" stroke-width=\"3\"/></pattern></defs>\n",
        (r.to - r.from) / 3600.0,
        r.pool_gpus
    );
    for (i, (name, used, borrowed, colour)) in bars.iter().enumerate() {
        let y = 70.0 + row * i as f64;
        let w = width * used / top;
        let b = width * borrowed / top;
        s.push_str(&format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\n<rect x=\"{left}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"20\" fill=\"{colour}\"/>\n",
            left - 8.0,
            y + 15.0,
            esc(name),
            y
        ));
        if b > 0.0 {
            s.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{y:.0}\" width=\"{b:.1}\" height=\"20\" fill=\"url(#lent)\"/>\n",
                left + w - b
            ));
        }
        s.push_str(&format!("<text x=\"{:.1}\" y=\"{:.0}\">{used:.1}</text>\n", left + w + 6.0, y + 15.0));
    }
    let mut y = 70.0 + row * bars.len() as f64 + 24.0;
    if let Some(saved) = &r.saved {
        y = saved_bars(&mut s, saved, y, left, width);
    }
    s.push_str(&format!("<text x=\"20\" y=\"{y:.0}\" font-weight=\"bold\">{} reclaim(s)</text>\n", r.reclaims.len()));
    for x in r.reclaims.iter().take(8) {
        y += 22.0;
        let ttc = x
            .time_to_capacity_s
            .map_or("no taker found".to_string(), |t| format!("its GPUs in use {t:.1} s after the taker's submission"));
        s.push_str(&format!(
            "<text x=\"30\" y=\"{y:.0}\">job {} ({}, {}): {} GPU-hours of run ended; {}</text>\n",
            esc(&x.job),
            esc(&x.class),
            x.mode,
            format_args!("{:.2}", x.run_gpu_hours),
            esc(&ttc)
        ));
    }
    s.push_str("</svg>\n");
    s
}

/// Why a figure is not a number and why there was no saving, in the
/// report's words, in lines that fit the chart: 90 characters at 13 px,
/// 0.6 em each (wide sans-serif), from x = 30 stay inside its 760.
fn saved_reasons(saved: &super::saved::Saved) -> Vec<String> {
    saved.reading.iter().skip(1).flat_map(|r| onepool_simulator::svg::wrap(r, 90)).collect()
}

/// A bar's label: its GPUs, or in a word what it is instead (the reasons
/// are printed under the bars).
fn figure(g: Option<u64>, unmet: Option<&onepool_simulator::compare::Unmet>) -> String {
    use onepool_simulator::compare::Unmet;
    match (g, unmet) {
        (Some(g), _) => format!("{g} GPUs"),
        (None, Some(Unmet::NoSizeMet { tried_gpus, .. })) => {
            format!("unmet up to {} GPUs (below)", tried_gpus.last().copied().unwrap_or(0))
        }
        (None, Some(Unmet::NotSearched { .. })) => "not searched (below)".into(),
        (None, Some(Unmet::NotSized)) => "not sized".into(),
        (None, None) => "unmet".into(),
    }
}

/// Two bars on one scale: the GPUs separate islands would have needed and
/// the shared pool's, with the pool's size for reference, then why a
/// figure is not a number or the islands needed no more.
fn saved_bars(s: &mut String, saved: &super::saved::Saved, mut y: f64, left: f64, width: f64) -> f64 {
    s.push_str(&format!(
        "<text x=\"20\" y=\"{y:.0}\" font-weight=\"bold\">What the pool saved: GPUs needed to meet every target (simulated on the period's {} jobs and {} requests)</text>\n",
        saved.jobs, saved.requests
    ));
    let top = [saved.separate_islands_gpus, saved.shared_pool_gpus, Some(saved.pool_gpus)]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    for (label, g, unmet, colour) in [
        ("separate islands", saved.separate_islands_gpus, saved.separate_islands_unmet.as_ref(), "#dd6b20"),
        ("one shared pool", saved.shared_pool_gpus, saved.shared_pool_unmet.as_ref(), "#38a169"),
    ] {
        y += 24.0;
        let w = g.map_or(0.0, |g| width * g as f64 / top);
        s.push_str(&format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{label}</text>\n<rect x=\"{left}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"18\" fill=\"{colour}\"/>\n<text x=\"{:.1}\" y=\"{:.0}\">{}</text>\n",
            left - 8.0,
            y + 14.0,
            y,
            left + w + 6.0,
            y + 14.0,
            esc(&figure(g, unmet))
        ));
    }
    y += 40.0;
    s.push_str(&format!(
        "<text x=\"30\" y=\"{:.0}\" fill=\"#4a5568\">this pool: {} GPUs; assumptions in onepool report's text</text>\n",
        y - 8.0,
        saved.pool_gpus
    ));
    let lines = saved_reasons(saved);
    for (i, line) in lines.iter().enumerate() {
        s.push_str(&format!("<text x=\"30\" y=\"{:.0}\">{}</text>\n", y + 10.0 + 18.0 * i as f64, esc(line)));
    }
    y + reasons_height(lines.len())
}

/// The height the reasons' lines take, with room under the last.
fn reasons_height(lines: usize) -> f64 {
    if lines == 0 {
        0.0
    } else {
        18.0 * lines as f64 + 20.0
    }
}
