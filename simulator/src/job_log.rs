//! `onepool simulate --job-log`: every simulated run of a job as one
//! tab-separated line, for setting beside what sacct says the cluster did.
//! The writer and the reader live together so the validation
//! (bench/validate-simulator.sh, [`crate::validate`]) reads exactly what
//! the command writes.

use crate::engine::JobLogEntry;

/// The line before the runs.
pub const HEADER: &str = "job\tclass\tsubmit\tstart\tend\treclaimed";

/// One run: the job's index in the workload (its row in the job history,
/// in submission order), its class's name, submit, start and end to a
/// tenth of a second, and whether it ended by a reclaim.
pub fn line(e: &JobLogEntry, classes: &[String]) -> String {
    format!("{}\t{}\t{:.1}\t{:.1}\t{:.1}\t{}", e.job, classes[e.class], e.submit, e.start, e.end, e.reclaimed)
}

/// A run as [`read`] gives it back.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedRun {
    pub job: usize,
    pub class: String,
    pub submit: f64,
    pub start: f64,
    pub end: f64,
    pub reclaimed: bool,
}

/// The runs in a job log, in its order. The log shares stderr with the
/// command's other messages (skipped rows, plots written), so a line that
/// is not six fields starting with a job index is not a run and is passed
/// over; a run whose times do not read is an error.
pub fn read(text: &str) -> Result<Vec<LoggedRun>, String> {
    let mut runs = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let f: Vec<&str> = l.split('\t').collect();
        let [job, class, submit, start, end, reclaimed] = f.as_slice() else { continue };
        let Some(job) = job.bytes().all(|b| b.is_ascii_digit()).then(|| job.parse().ok()).flatten() else { continue };
        let time = |v: &str, what: &str| {
            v.parse::<f64>().map_err(|_| format!("job log line {}: {what} {v:?} is not a number", i + 1))
        };
        runs.push(LoggedRun {
            job,
            class: class.to_string(),
            submit: time(submit, "submit")?,
            start: time(start, "start")?,
            end: time(end, "end")?,
            reclaimed: *reclaimed == "true",
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_to_the_tenth_of_a_second() {
        let classes = ["agents".to_string(), "training".to_string()];
        let e = JobLogEntry { job: 3, class: 1, submit: 190.0, start: 190.04, end: 265.06, reclaimed: true };
        let text = format!("{HEADER}\nonepool: 1 malformed input rows were skipped\n{}\n", line(&e, &classes));
        assert_eq!(line(&e, &classes), "3\ttraining\t190.0\t190.0\t265.1\ttrue");
        assert_eq!(
            read(&text).unwrap(),
            [LoggedRun { job: 3, class: "training".into(), submit: 190.0, start: 190.0, end: 265.1, reclaimed: true }]
        );
    }

    #[test]
    fn a_run_with_a_time_that_does_not_read_is_an_error_with_its_line() {
        let e = read("job\tclass\tsubmit\tstart\tend\treclaimed\n0\tagents\t0.0\tsoon\t20.5\ttrue\n").unwrap_err();
        assert_eq!(e, "job log line 2: start \"soon\" is not a number");
    }
}
