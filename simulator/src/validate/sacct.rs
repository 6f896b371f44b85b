//! The validation's own `sacct -P -n -X -D` listings: no header, the
//! fields its `--format=` names, times in epoch seconds
//! (`SLURM_TIME_FORMAT=%s`). A requeued job has one line per run.

use crate::input::parse_time;

/// What bench/validate-simulator.sh asks for the batch jobs.
pub const BATCH_FORMAT: &str = "JobID,JobName,QOS,Submit,Eligible,Start,End,State,NodeList";
/// What it asks for onepoold's replica jobs.
pub const REPLICA_FORMAT: &str = "JobID,JobName,QOS,Submit,Start,End,State,NodeList";

/// One run. A time sacct does not have (`Unknown`, `None`: the run never
/// started or has not ended) is `None`; a field the format does not name
/// is empty or `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SacctRun {
    pub id: String,
    pub name: String,
    pub qos: String,
    pub submit: Option<f64>,
    pub eligible: Option<f64>,
    pub start: Option<f64>,
    pub end: Option<f64>,
    /// Slurm's whole state (`CANCELLED by 0`).
    pub state: String,
    pub node: String,
}

impl SacctRun {
    /// Its state word, and where it ran when it started (`PREEMPTED@node3`).
    pub fn state_at(&self) -> String {
        let word = self.state.split_whitespace().next().unwrap_or("");
        match self.start {
            Some(_) => format!("{word}@{}", self.node),
            None => word.to_string(),
        }
    }
}

/// Every line of `text`, read with the fields of `format` (one of the
/// consts above, or any list of the same field names).
pub fn read(text: &str, format: &str) -> Result<Vec<SacctRun>, String> {
    let names: Vec<&str> = format.split(',').collect();
    let mut runs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line.split('|').collect();
        if cells.len() != names.len() {
            return Err(format!("sacct line {}: {} fields, expected {} ({format})", i + 1, cells.len(), names.len()));
        }
        let mut r = SacctRun::default();
        for (name, cell) in names.iter().zip(cells) {
            let (text, time) = (cell.to_string(), parse_time(cell));
            match *name {
                "JobID" => r.id = text,
                "JobName" => r.name = text,
                "QOS" => r.qos = text,
                "Submit" => r.submit = time,
                "Eligible" => r.eligible = time,
                "Start" => r.start = time,
                "End" => r.end = time,
                "State" => r.state = text,
                "NodeList" => r.node = text,
                other => return Err(format!("sacct field {other}: not one the validation reads")),
            }
        }
        runs.push(r);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_a_requeued_job_and_one_that_never_started() {
        let text = "43|v8|op-training|1000|1000|1001|1076|REQUEUED|node2\n\
                    43|v8|op-training|1076|1197|1201|1241|COMPLETED|node2\n\
                    50|v9|op-agents|1100|1100|Unknown|Unknown|CANCELLED by 0|None assigned\n";
        let runs = read(text, BATCH_FORMAT).unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!((runs[1].eligible, runs[1].start, runs[1].end), (Some(1197.0), Some(1201.0), Some(1241.0)));
        assert_eq!(runs[0].state_at(), "REQUEUED@node2");
        assert_eq!((runs[2].start, runs[2].state_at()), (None, "CANCELLED".to_string()));
    }

    #[test]
    fn replica_lines_have_no_eligible_time_and_a_short_line_is_an_error() {
        let r = read("61|onepool-chat|op-inference|1000|1001|1150|COMPLETED|node1\n", REPLICA_FORMAT).unwrap();
        assert_eq!((r[0].qos.as_str(), r[0].eligible, r[0].end), ("op-inference", None, Some(1150.0)));
        let e = read("61|onepool-chat|op-inference\n", REPLICA_FORMAT).unwrap_err();
        assert_eq!(e, format!("sacct line 1: 3 fields, expected 8 ({REPLICA_FORMAT})"));
    }
}
