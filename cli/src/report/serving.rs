//! The period's serving per endpoint and request class (issue #44), from
//! onepoold's access log: what each class asked, what it was refused
//! (shed with 429, or another error), what was cut, what moved to another
//! replica mid-answer, the tokens it got, and its time to first byte. The
//! router writes the class it served each request in, from the key's
//! tokens-file line: a client cannot name one it was not given. And how
//! much of each class's traffic could yield and move: the answers the
//! router followed, and why the others were not (issue #51 item 6).

use std::collections::BTreeMap;

use onepool_decisions::trace::{parse_time, AccessEntry};
use onepool_simulator::engine::quantile;
use serde::Serialize;

/// One endpoint's requests of one class in the period.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServingClass {
    pub endpoint: String,
    /// The request class; `None`: the endpoint has no classes.
    pub class: Option<String>,
    pub requests: u64,
    /// Answered 2xx and whole.
    pub answered: u64,
    /// Refused with 429 (a class below the endpoint's own past its bound).
    pub shed: u64,
    /// Any other answer than 2xx or 429.
    pub failed: u64,
    /// 2xx, then cut off or left by the client.
    pub cut: u64,
    /// Answers that moved to another replica mid-answer (issue #43).
    pub moved: u64,
    /// Answer tokens the model servers counted.
    pub completion_tokens: u64,
    /// Time to the first body byte of the answered requests (seconds).
    pub ttfb_p50_s: Option<f64>,
    pub ttfb_p99_s: Option<f64>,
    /// Generation requests whose answer the router followed (could yield
    /// and move), on endpoints with resumption.
    pub followed: u64,
    /// Moved only by being generated again (a grammar, several choices:
    /// they keep their slot).
    #[serde(default)]
    pub replayed: u64,
    /// The others, by why not (`several_choices`, `whole`, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub not_followed: BTreeMap<String, u64>,
}

/// The access log's entries inside `[from, to]` (the records' clock: the
/// log's UTC plus `utc_offset_s`), by endpoint, then class.
pub fn compute(entries: &[AccessEntry], from: f64, to: f64, utc_offset_s: f64) -> Vec<ServingClass> {
    let mut by: BTreeMap<(String, Option<String>), (ServingClass, Vec<f64>)> = BTreeMap::new();
    for a in entries {
        let Some(t) = parse_time(&a.time) else { continue };
        let t = t + utc_offset_s;
        if t < from || t > to {
            continue;
        }
        let key = (a.endpoint.clone(), a.class.clone());
        let (row, ttfb) = by.entry(key).or_insert_with(|| {
            let row = ServingClass { endpoint: a.endpoint.clone(), class: a.class.clone(), ..ServingClass::default() };
            (row, Vec::new())
        });
        row.requests += 1;
        row.moved += u64::from(a.moved.min(1));
        row.completion_tokens += a.completion_tokens.unwrap_or(0);
        match a.followed.as_deref() {
            Some("yes") => row.followed += 1,
            Some("replay") => row.replayed += 1,
            Some(why) => *row.not_followed.entry(why.to_string()).or_default() += 1,
            None => {}
        }
        match a.status {
            200..=299 if a.complete => {
                row.answered += 1;
                ttfb.extend(a.ttfb_s);
            }
            200..=299 => row.cut += 1,
            429 => row.shed += 1,
            _ => row.failed += 1,
        }
    }
    by.into_values()
        .map(|(mut row, mut ttfb)| {
            if !ttfb.is_empty() {
                row.ttfb_p50_s = Some(quantile(&mut ttfb, 0.5));
                row.ttfb_p99_s = Some(quantile(&mut ttfb, 0.99));
            }
            row
        })
        .collect()
}

/// The report's lines: one per endpoint and class.
pub fn text(rows: &[ServingClass]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nServing by endpoint and request class (onepoold's access log):\n");
    for r in rows {
        let class = r.class.as_deref().map_or_else(|| "(no classes)".to_string(), |c| format!("class {c}"));
        let ttfb = match (r.ttfb_p50_s, r.ttfb_p99_s) {
            (Some(a), Some(b)) => format!("; first byte p50 {a:.3} s, p99 {b:.3} s"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "  {} {class}: {} requests, {} answered, {} shed (429), {} failed, {} cut, {} moved; {} answer tokens{ttfb}\n",
            r.endpoint, r.requests, r.answered, r.shed, r.failed, r.cut, r.moved, r.completion_tokens
        ));
        if r.followed > 0 || r.replayed > 0 || !r.not_followed.is_empty() {
            let why: Vec<String> = r.not_followed.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let not = if why.is_empty() { String::new() } else { format!("; not followed: {}", why.join(", ")) };
            let replayed = match r.replayed {
                0 => String::new(),
                n => format!("; {n} moved only by being generated again (kept their slot)"),
            };
            out.push_str(&format!("    {} answers followed (could yield and move){replayed}{not}\n", r.followed));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(time: &str, class: Option<&str>, status: u16, complete: bool, ttfb: f64, moved: u32) -> AccessEntry {
        let followed = match (class, moved) {
            (Some("agents"), _) if status == 200 && !complete => Some("tools".to_string()),
            (Some(_), _) if status == 200 => Some("yes".to_string()),
            _ => None,
        };
        AccessEntry {
            time: time.into(),
            endpoint: "chat".into(),
            model: None,
            status,
            stream: true,
            prompt_tokens: Some(10),
            completion_tokens: Some(if status == 200 { 32 } else { 0 }),
            ttfb_s: Some(ttfb),
            latency_s: 1.0,
            replica: None,
            complete,
            moved,
            class: class.map(str::to_string),
            reason: None,
            followed,
        }
    }

    #[test]
    fn each_class_is_counted_apart_within_the_period() {
        let t = |s: &str| parse_time(s).unwrap();
        let entries = [
            entry("2026-12-07T10:00:01.000Z", Some("inference"), 200, true, 0.05, 0),
            entry("2026-12-07T10:00:02.000Z", Some("inference"), 200, true, 0.10, 1),
            entry("2026-12-07T10:00:03.000Z", Some("agents"), 200, true, 3.0, 0),
            entry("2026-12-07T10:00:04.000Z", Some("agents"), 429, true, 0.0, 0),
            entry("2026-12-07T10:00:05.000Z", Some("agents"), 200, false, 2.0, 0),
            entry("2026-12-07T10:00:06.000Z", Some("agents"), 503, true, 0.0, 0),
            // Outside the period.
            entry("2026-12-07T11:00:00.000Z", Some("agents"), 200, true, 9.0, 0),
        ];
        let rows = compute(&entries, t("2026-12-07T10:00:00"), t("2026-12-07T10:30:00"), 0.0);
        assert_eq!(rows.len(), 2);
        let (agents, live) = (&rows[0], &rows[1]);
        assert_eq!(agents.class.as_deref(), Some("agents"));
        assert_eq!((agents.requests, agents.answered, agents.shed, agents.failed, agents.cut), (4, 1, 1, 1, 1));
        assert_eq!(agents.completion_tokens, 64);
        assert_eq!((agents.ttfb_p50_s, agents.ttfb_p99_s), (Some(3.0), Some(3.0)));
        assert_eq!((live.requests, live.answered, live.moved), (2, 2, 1));
        assert_eq!((live.ttfb_p50_s, live.ttfb_p99_s), (Some(0.05), Some(0.10)));
        let text = text(&rows);
        assert!(text.contains("chat class agents: 4 requests, 1 answered, 1 shed (429), 1 failed, 1 cut"), "{text}");
        // What could yield and move, and why the rest could not.
        assert_eq!((agents.followed, agents.not_followed.get("tools")), (1, Some(&1)));
        assert_eq!((live.followed, live.not_followed.len()), (2, 0));
        assert!(text.contains("    1 answers followed (could yield and move); not followed: tools 1"), "{text}");
        // The log's UTC shifted into the records' clock.
        let shifted = compute(&entries, t("2026-12-07T11:00:00"), t("2026-12-07T11:30:00"), 3600.0);
        assert_eq!(shifted.iter().map(|r| r.requests).sum::<u64>(), 6);
    }
}
