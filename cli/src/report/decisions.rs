//! The report's replica decisions (issue #28): what onepoold decided for
//! its endpoints over the period, from its decision log
//! (`[decision_log]` in onepoold.toml). For an advisory endpoint these are
//! what it would have done; an admin trialling the autoscaler reads here
//! how often it would have submitted, drained and released, and why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use onepool_decisions::decision_log::{DecisionAction, DecisionEntry, DecisionMode};
use serde::Serialize;

/// The decisions listed in text at most; the JSON has them all.
const LISTED: usize = 20;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Decisions {
    /// The decision log's file.
    pub file: String,
    /// (endpoint, mode, action) and how many.
    pub counts: Vec<(String, DecisionMode, DecisionAction, usize)>,
    /// Oldest first.
    pub entries: Vec<DecisionEntry>,
}

/// The period's decisions from the log's files (oldest first); `from` and
/// `to` are the cluster's local time, `utc_offset_s` its distance from the
/// log's UTC. A line that is not a decision is named on stderr and left out.
pub fn read(
    files: &[PathBuf],
    path: &std::path::Path,
    from: f64,
    to: f64,
    utc_offset_s: f64,
) -> Result<Decisions, String> {
    let mut entries = Vec::new();
    for (f, text) in super::rotated::texts(files, path, "decision log")? {
        entries.extend(within(&text, from, to, utc_offset_s, &f.display().to_string()));
    }
    Ok(Decisions { file: path.display().to_string(), counts: counts(&entries), entries })
}

/// The lines of one file within [from, to].
fn within(text: &str, from: f64, to: f64, utc_offset_s: f64, file: &str) -> Vec<DecisionEntry> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let e: DecisionEntry = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(err) => {
                eprintln!("onepool report: {file}:{}: not a decision log line: {err}", i + 1);
                continue;
            }
        };
        let Some(utc) = onepool_decisions::trace::parse_time(&e.time) else {
            eprintln!("onepool report: {file}:{}: time {:?} is not a time", i + 1, e.time);
            continue;
        };
        let local = utc + utc_offset_s;
        if local >= from && local <= to {
            out.push(e);
        }
    }
    out
}

fn counts(entries: &[DecisionEntry]) -> Vec<(String, DecisionMode, DecisionAction, usize)> {
    let mut by: BTreeMap<(String, &str, DecisionAction), (DecisionMode, usize)> = BTreeMap::new();
    for e in entries {
        by.entry((e.endpoint.clone(), e.mode.as_str(), e.action)).or_insert((e.mode, 0)).1 += 1;
    }
    by.into_iter().map(|((ep, _, a), (mode, n))| (ep, mode, a, n)).collect()
}

/// The text section: counts per endpoint and mode, then the last
/// decisions with why.
pub fn text(d: &Decisions) -> String {
    let mut out = format!("\nreplica decisions (onepoold's decision log {}):\n", d.file);
    if d.entries.is_empty() {
        out.push_str("  none in the period\n");
        return out;
    }
    for (ep, mode, action, n) in &d.counts {
        let (would, advisory) = match mode {
            DecisionMode::Advisory => ("would have ", " (advisory)"),
            DecisionMode::Act => ("", ""),
        };
        out.push_str(&format!("  {ep}: {would}{} {n} time(s){advisory}\n", action.past()));
    }
    let skip = d.entries.len().saturating_sub(LISTED);
    if skip > 0 {
        out.push_str(&format!("  the last {LISTED} of {} (--json has all):\n", d.entries.len()));
    }
    for e in &d.entries[skip..] {
        let what = match (&e.job, &e.replica) {
            (Some(j), _) => format!(" job {j}"),
            (None, Some(r)) => format!(" {r}"),
            (None, None) => String::new(),
        };
        let mode = if e.mode == DecisionMode::Advisory { "would " } else { "" };
        out.push_str(&format!(
            "    {} {} {mode}{} {}{what}: {}\n",
            e.time,
            e.endpoint,
            e.action.as_str(),
            e.kind,
            e.why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(time: &str, mode: &str, action: &str) -> String {
        format!(
            r#"{{"time":"{time}","endpoint":"chat","mode":"{mode}","action":"{action}","kind":"supplemental","why":"the load wants 3 replicas, 2 live (2 serving)","desired":3,"serving":2,"load":20.5}}"#
        )
    }

    #[test]
    fn the_period_s_decisions_are_counted_and_listed_with_why() {
        let dir = std::env::temp_dir().join(format!("onepool-report-decisions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("decisions.jsonl");
        let lines = [
            line("2026-12-05T09:59:00.000Z", "advisory", "submit"),
            line("2026-12-05T10:00:01.000Z", "advisory", "submit"),
            "garbage".to_string(),
            line("2026-12-05T10:00:02.500Z", "advisory", "drain"),
            line("2026-12-05T10:00:03.000Z", "act", "submit"),
        ]
        .join("\n");
        std::fs::write(&path, lines).unwrap();
        // The cluster's clock is an hour ahead of UTC: 11:00 local is 10:00 UTC.
        let t = |s: &str| onepool_decisions::trace::parse_time(s).unwrap();
        let d = read(std::slice::from_ref(&path), &path, t("2026-12-05T11:00:00"), t("2026-12-05T12:00:00"), 3600.0)
            .unwrap();
        assert_eq!(d.entries.len(), 3, "the first is before the period, the garbage line is left out");
        assert_eq!(
            d.counts,
            [
                ("chat".into(), DecisionMode::Act, DecisionAction::Submit, 1),
                ("chat".into(), DecisionMode::Advisory, DecisionAction::Submit, 1),
                ("chat".into(), DecisionMode::Advisory, DecisionAction::Drain, 1),
            ]
        );
        let out = text(&d);
        assert!(out.contains("  chat: would have submitted 1 time(s) (advisory)\n"), "{out}");
        assert!(out.contains("  chat: submitted 1 time(s)\n"), "{out}");
        assert!(
            out.contains(
                "    2026-12-05T10:00:02.500Z chat would drain supplemental: the load wants 3 replicas, 2 live (2 serving)\n"
            ),
            "{out}"
        );
        let missing = read(&[dir.join("nope")], &dir.join("nope"), 0.0, 1.0, 0.0).unwrap_err();
        assert!(missing.contains("does not exist"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
