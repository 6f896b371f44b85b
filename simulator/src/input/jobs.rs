//! Batch job history: what each job asked for and how long it ran. Three
//! formats, all giving [`JobRow`]s; the class is decided later by onepool's
//! own classifier from the fields Slurm would see (annotation, QOS,
//! partition, account).
//!
//! ## Simple CSV (`format = "csv"`)
//!
//! A header line naming the columns, in any order, then one job a line.
//! Empty cells are absent values; `#` starts a comment line.
//!
//! | column | required | meaning |
//! | --- | --- | --- |
//! | `submit` | yes | submission time: seconds, or `YYYY-MM-DD[T ]HH:MM:SS` (UTC) |
//! | `duration` | one of the two | run time: seconds or `2h`, `1d12h`, `1-12:00:00` |
//! | `end` | one of the two | end time; run time = end - start (or - submit without `start`) |
//! | `start` | no | start time (only used with `end`) |
//! | `gpus` | yes | GPUs the job holds in all |
//! | `gpus_per_node` | no | GPUs on each node (default: all on one node) |
//! | `gpu_type` | no | GPU type the job needs (`a100`) |
//! | `class` | no | workload class, as `--workload=` would say it |
//! | `account`, `partition`, `qos` | no | as given to sbatch |
//!
//! ## `sacct -P` (`format = "sacct"`)
//!
//! `sacct -P -X --format=JobID,Submit,Start,End,AllocTRES,QOS,Account,Partition`
//! (header included). GPUs come from `gres/gpu=N` (the type from
//! `gres/gpu:TYPE=N`) in AllocTRES. Job steps (`123.batch`), jobs that
//! never started and jobs without GPUs are counted as ignored.
//!
//! ## `sacct --json` (`format = "sacct-json"`, Slurm 22.05 shape)
//!
//! `jobs[].time.{submission,start,end}` (epoch seconds), GPUs from
//! `tres.allocated[]` entries with `type` "gres" and `name` "gpu"
//! (`count`), and `qos`, `account`, `partition`. Errors name the line
//! where the job's object starts.

use onepool_decisions::duration::parse_seconds;
use serde_json::Value;

use super::{parse_time, BadRow, OnBadRow, Rows};

/// One job of the history.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobRow {
    /// `file:line` it came from.
    pub source: String,
    pub submit: f64,
    pub duration: f64,
    pub gpus: u32,
    pub gpus_per_node: Option<u32>,
    pub gpu_type: Option<String>,
    pub class: Option<String>,
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
}

fn opt(s: Option<&str>) -> Option<String> {
    s.map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

/// The simple CSV format (see the module docs).
pub fn read_csv(file: &str, text: &str, on_bad: OnBadRow) -> Result<Rows<JobRow>, BadRow> {
    let mut out = Rows::new();
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let Some((hline, header)) = lines.next() else { return Ok(out) };
    let cols: Vec<String> = header.split(',').map(|c| c.trim().to_ascii_lowercase()).collect();
    let col = |name: &str| cols.iter().position(|c| c == name);
    const KNOWN: [&str; 11] = [
        "submit",
        "start",
        "end",
        "duration",
        "gpus",
        "gpus_per_node",
        "gpu_type",
        "class",
        "account",
        "partition",
        "qos",
    ];
    let header_err = |what: String| Err(BadRow { file: file.into(), line: hline + 1, what });
    if let Some(c) = cols.iter().find(|c| !KNOWN.contains(&c.as_str())) {
        return header_err(format!("unknown column {c:?}; the columns are {}", KNOWN.join(", ")));
    }
    let (Some(submit), Some(gpus)) = (col("submit"), col("gpus")) else {
        return header_err("the header needs the columns submit and gpus".into());
    };
    if col("duration").is_none() && col("end").is_none() {
        return header_err("the header needs a duration or an end column".into());
    }
    for (i, line) in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let get = |c: Option<usize>| c.and_then(|c| cells.get(c).copied()).map(str::trim).filter(|s| !s.is_empty());
        match csv_row(&cells, &cols, &get, submit, gpus) {
            Ok(mut row) => {
                row.source = format!("{file}:{}", i + 1);
                if row.gpus == 0 {
                    out.ignore("no GPUs");
                } else {
                    out.rows.push(row);
                }
            }
            Err(what) => out.bad(file, i + 1, what, on_bad)?,
        }
    }
    Ok(out)
}

fn csv_row<'a>(
    cells: &[&str],
    cols: &[String],
    get: &dyn Fn(Option<usize>) -> Option<&'a str>,
    submit: usize,
    gpus: usize,
) -> Result<JobRow, String> {
    if cells.len() != cols.len() {
        return Err(format!("{} cells, the header has {}", cells.len(), cols.len()));
    }
    let col = |name: &str| cols.iter().position(|c| c == name);
    let time = |name: &str| -> Result<Option<f64>, String> {
        get(col(name)).map(|v| parse_time(v).ok_or_else(|| format!("{name} {v:?} is not a time"))).transpose()
    };
    let s = time("submit")?.ok_or_else(|| "submit is empty".to_string())?;
    let _ = submit;
    let duration = match (get(col("duration")), time("end")?) {
        (Some(d), _) => parse_seconds(d).ok_or_else(|| format!("duration {d:?} is not a duration"))?,
        (None, Some(end)) => {
            let from = time("start")?.unwrap_or(s);
            if end < from {
                return Err(format!("end is before {}", if col("start").is_some() { "start" } else { "submit" }));
            }
            end - from
        }
        (None, None) => return Err("neither duration nor end is given".into()),
    };
    let n = |name: &str, c: Option<usize>| -> Result<Option<u32>, String> {
        get(c).map(|v| v.parse::<u32>().map_err(|_| format!("{name} {v:?} is not a whole number"))).transpose()
    };
    let g = n("gpus", Some(gpus))?.ok_or_else(|| "gpus is empty".to_string())?;
    let per = n("gpus_per_node", col("gpus_per_node"))?;
    if per == Some(0) || per.is_some_and(|p| g % p != 0) {
        return Err(format!("gpus_per_node {} does not divide gpus {g}", per.unwrap_or(0)));
    }
    Ok(JobRow {
        source: String::new(),
        submit: s,
        duration,
        gpus: g,
        gpus_per_node: per,
        gpu_type: opt(get(col("gpu_type"))),
        class: opt(get(col("class"))),
        account: opt(get(col("account"))),
        partition: opt(get(col("partition"))),
        qos: opt(get(col("qos"))),
    })
}

/// GPUs and their type from an AllocTRES string (`cpu=8,gres/gpu:a100=4,gres/gpu=4,node=1`).
pub fn gpus_from_tres(tres: &str) -> Result<(u32, Option<String>), String> {
    let (mut total, mut ty) = (None, None);
    for item in tres.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, v)) = item.split_once('=') else { return Err(format!("TRES item {item:?} has no '='")) };
        let Some(rest) = k.strip_prefix("gres/gpu") else { continue };
        let n: u32 = v.parse().map_err(|_| format!("GPU count {v:?} in {item:?} is not a whole number"))?;
        match rest.strip_prefix(':') {
            None if rest.is_empty() => total = Some(n),
            Some(t) if !t.is_empty() => ty = Some(t.to_string()),
            _ => return Err(format!("TRES item {item:?} is not gres/gpu or gres/gpu:TYPE")),
        }
    }
    Ok((total.unwrap_or(0), ty))
}

/// `sacct -P` output (see the module docs).
pub fn read_sacct(file: &str, text: &str, on_bad: OnBadRow) -> Result<Rows<JobRow>, BadRow> {
    let mut out = Rows::new();
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((hline, header)) = lines.next() else { return Ok(out) };
    let cols: Vec<&str> = header.split('|').map(str::trim).collect();
    let want = ["JobID", "Submit", "Start", "End", "AllocTRES", "QOS", "Account", "Partition"];
    let mut at = [0usize; 8];
    for (k, w) in want.iter().enumerate() {
        match cols.iter().position(|c| c.eq_ignore_ascii_case(w)) {
            Some(p) => at[k] = p,
            None => {
                return Err(BadRow {
                    file: file.into(),
                    line: hline + 1,
                    what: format!("the header has no {w} column; export with sacct -P -X --format={}", want.join(",")),
                })
            }
        }
    }
    for (i, line) in lines {
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() != cols.len() {
            out.bad(file, i + 1, format!("{} fields, the header has {}", cells.len(), cols.len()), on_bad)?;
            continue;
        }
        let f = |k: usize| cells[at[k]].trim();
        if f(0).contains('.') {
            out.ignore("job steps");
            continue;
        }
        let row = (|| -> Result<Option<JobRow>, String> {
            let submit = parse_time(f(1)).ok_or_else(|| format!("Submit {:?} is not a time", f(1)))?;
            let (Some(start), Some(end)) = (parse_time(f(2)), parse_time(f(3))) else {
                if matches!(f(2), "Unknown" | "None" | "") || matches!(f(3), "Unknown" | "None" | "") {
                    return Ok(None);
                }
                return Err(format!("Start {:?} or End {:?} is not a time", f(2), f(3)));
            };
            if end < start {
                return Err("End is before Start".into());
            }
            let (gpus, gpu_type) = gpus_from_tres(f(4))?;
            Ok(Some(JobRow {
                source: format!("{file}:{}", i + 1),
                submit,
                duration: end - start,
                gpus,
                gpus_per_node: None,
                gpu_type,
                class: None,
                qos: opt(Some(f(5))),
                account: opt(Some(f(6))),
                partition: opt(Some(f(7))),
            }))
        })();
        match row {
            Ok(None) => out.ignore("never started or still running"),
            Ok(Some(r)) if r.gpus == 0 => out.ignore("no GPUs"),
            Ok(Some(r)) => out.rows.push(r),
            Err(what) => out.bad(file, i + 1, format!("job {}: {what}", f(0)), on_bad)?,
        }
    }
    Ok(out)
}

/// Byte offsets where each element of the top-level `"jobs"` array starts
/// (for error lines; serde_json's values carry no positions).
fn job_offsets(text: &str) -> Vec<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let mut key_start = None;
    let mut jobs_depth = None;
    let mut out = Vec::new();
    for (i, c) in text.char_indices() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
                if depth == 1 && key_start.is_some_and(|s| &text[s..i] == "jobs") && jobs_depth.is_none() {
                    jobs_depth = Some(usize::MAX);
                }
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                key_start = Some(i + 1);
            }
            '[' | '{' => {
                depth += 1;
                if c == '[' && jobs_depth == Some(usize::MAX) {
                    jobs_depth = Some(depth);
                } else if c == '{' && jobs_depth.is_some_and(|d| d + 1 == depth) {
                    out.push(i);
                }
            }
            ']' | '}' => {
                if jobs_depth == Some(depth) && c == ']' {
                    jobs_depth = Some(0);
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
    }
    out
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

/// `sacct --json` output (see the module docs).
pub fn read_sacct_json(file: &str, text: &str, on_bad: OnBadRow) -> Result<Rows<JobRow>, BadRow> {
    let mut out = Rows::new();
    let doc: Value = serde_json::from_str(text).map_err(|e| BadRow {
        file: file.into(),
        line: e.line(),
        what: format!("not JSON: {e}"),
    })?;
    let Some(jobs) = doc.get("jobs").and_then(Value::as_array) else {
        return Err(BadRow { file: file.into(), line: 1, what: "no \"jobs\" array (is this sacct --json?)".into() });
    };
    let offsets = job_offsets(text);
    for (k, job) in jobs.iter().enumerate() {
        let line = offsets.get(k).map(|o| line_of(text, *o)).unwrap_or(1);
        let id = job.get("job_id").map(|v| v.to_string()).unwrap_or_else(|| format!("#{k}"));
        let row = (|| -> Result<Option<JobRow>, String> {
            let t = |name: &str| job.pointer(&format!("/time/{name}")).and_then(Value::as_f64);
            let submit = t("submission").ok_or("time.submission is missing or not a number")?;
            let (start, end) = (t("start").unwrap_or(0.0), t("end").unwrap_or(0.0));
            if start <= 0.0 || end <= 0.0 {
                return Ok(None);
            }
            if end < start {
                return Err("time.end is before time.start".into());
            }
            let mut gpus = 0u32;
            let mut gpu_type = None;
            if let Some(alloc) = job.pointer("/tres/allocated") {
                let alloc = alloc.as_array().ok_or("tres.allocated is not an array")?;
                for t in alloc {
                    if t.get("type").and_then(Value::as_str) == Some("gres") {
                        let name = t.get("name").and_then(Value::as_str).unwrap_or("");
                        let count = t.get("count").and_then(Value::as_u64).ok_or("a gres entry has no count")?;
                        let count = u32::try_from(count).map_err(|_| "GPU count too large")?;
                        if name == "gpu" {
                            gpus = count;
                        } else if let Some(ty) = name.strip_prefix("gpu:") {
                            gpu_type = Some(ty.to_string());
                        }
                    }
                }
            }
            let s = |name: &str| opt(job.get(name).and_then(Value::as_str));
            Ok(Some(JobRow {
                source: format!("{file}:{line}"),
                submit,
                duration: end - start,
                gpus,
                gpus_per_node: None,
                gpu_type,
                class: None,
                account: s("account"),
                partition: s("partition"),
                qos: s("qos"),
            }))
        })();
        match row {
            Ok(None) => out.ignore("never started or still running"),
            Ok(Some(r)) if r.gpus == 0 => out.ignore("no GPUs"),
            Ok(Some(r)) => out.rows.push(r),
            Err(what) => out.bad(file, line, format!("job {id}: {what}"), on_bad)?,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_reads_rows_and_reports_bad_ones_with_file_and_line() {
        let text = "submit,duration,gpus,gpus_per_node,class\n0,1h,8,4,training\n# comment\n10,2h,x,,agents\n20,,1,,\n30,60,2,,agents\n";
        let r = read_csv("h.csv", text, OnBadRow::Skip).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].duration, 3600.0);
        assert_eq!(r.rows[0].gpus_per_node, Some(4));
        assert_eq!(r.rows[1].source, "h.csv:6");
        let bad: Vec<String> = r.skipped.iter().map(|b| b.to_string()).collect();
        assert_eq!(bad, ["h.csv:4: gpus \"x\" is not a whole number", "h.csv:5: neither duration nor end is given"]);
        let e = read_csv("h.csv", text, OnBadRow::Abort).unwrap_err();
        assert_eq!(e.line, 4);
    }

    #[test]
    fn csv_end_column_and_bad_header() {
        let r = read_csv("a", "submit,start,end,gpus\n0,100,400,1\n", OnBadRow::Abort).unwrap();
        assert_eq!(r.rows[0].duration, 300.0);
        let e = read_csv("a", "submit,gpus,colour\n", OnBadRow::Skip).unwrap_err();
        assert!(e.to_string().starts_with("a:1: unknown column \"colour\""), "{e}");
    }

    #[test]
    fn tres() {
        assert_eq!(
            gpus_from_tres("billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,node=1").unwrap(),
            (4, Some("a100".into()))
        );
        assert_eq!(gpus_from_tres("cpu=1,mem=1G").unwrap(), (0, None));
        assert!(gpus_from_tres("gres/gpu=x").is_err());
    }

    #[test]
    fn sacct_pipe() {
        let text = "JobID|Submit|Start|End|AllocTRES|QOS|Account|Partition\n\
            7|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:01:00|cpu=4,gres/gpu=2|op-training|ml|gpu\n\
            7.batch|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:01:00|cpu=4,gres/gpu=2|||\n\
            8|2024-01-01T00:00:00|Unknown|Unknown||normal|ml|gpu\n\
            9|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T00:00:30|gres/gpu=1|normal|ml|gpu\n\
            10|yesterday|2024-01-01T00:01:00|2024-01-01T00:02:00|gres/gpu=1|normal|ml|gpu\n";
        let r = read_sacct("s.txt", text, OnBadRow::Skip).unwrap();
        assert_eq!(r.rows.len(), 1);
        assert_eq!((r.rows[0].gpus, r.rows[0].duration), (2, 3600.0));
        assert_eq!(r.rows[0].qos.as_deref(), Some("op-training"));
        assert_eq!(
            r.skipped.iter().map(|b| b.to_string()).collect::<Vec<_>>(),
            ["s.txt:5: job 9: End is before Start", "s.txt:6: job 10: Submit \"yesterday\" is not a time"]
        );
        assert_eq!(r.ignored, [("job steps".to_string(), 1), ("never started or still running".to_string(), 1)]);
    }

    #[test]
    fn sacct_json_22_05_shape() {
        let text = r#"{"meta": {},
 "jobs": [
  {"job_id": 1, "qos": "op-agents", "account": "ml", "partition": "gpu",
   "time": {"submission": 100, "start": 110, "end": 170},
   "tres": {"allocated": [{"type": "cpu", "name": null, "count": 2},
                          {"type": "gres", "name": "gpu", "count": 1}]}},
  {"job_id": 2, "qos": "op-agents",
   "time": {"start": 110, "end": 170}}
 ]}"#;
        let r = read_sacct_json("j.json", text, OnBadRow::Skip).unwrap();
        assert_eq!(r.rows.len(), 1);
        assert_eq!((r.rows[0].submit, r.rows[0].duration, r.rows[0].gpus), (100.0, 60.0, 1));
        assert_eq!(r.rows[0].source, "j.json:3");
        assert_eq!(r.skipped[0].to_string(), "j.json:7: job 2: time.submission is missing or not a number");
        assert!(read_sacct_json("j.json", "{\"jobs\": [", OnBadRow::Skip).is_err());
    }
}
