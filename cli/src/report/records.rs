//! The records the report reads: Slurm's accounting (`sacct`), one record
//! per run of a job, whatever text its user gave it. Every other file of
//! the report reads [`Run`]; this one reads nothing of theirs.
//!
//! A job's user writes its name and comment (and more) freely: a line
//! break, sacct's delimiter, quotes or 100 KB of text. sacct prints them
//! as they are, so the output is split by a delimiter no user can know in
//! advance ([`delimiter`]), never by lines: a line break inside a field is
//! that field's (issue #42: a job named `v\nw` used to vanish from every
//! figure). A record that still cannot be read is kept as [`Unreadable`],
//! with its id, and the report says so: no job is lost silently.

use onepool_decisions::record::{AuditRecord, JobRecord};
use onepool_launcher::conventions::{DrainNote, ReplicaNote};
use serde::Serialize;

/// One run of a job as `sacct -X -D` lists it (a requeued job has one
/// per run).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: String,
    pub name: String,
    pub qos: String,
    /// Slurm's state word (`COMPLETED`, `PREEMPTED`, `REQUEUED`, ...).
    pub state: String,
    pub submit: f64,
    /// When Slurm let it start (`Eligible`): its submission, or later when
    /// a dependency, begin time or hold kept it. Its submission where
    /// accounting has none.
    pub eligible: f64,
    pub start: f64,
    pub end: f64,
    pub gpus: u32,
    pub nodes: Vec<String>,
    pub user: String,
    /// job_submit/onepool's record in the job's AdminComment (its class,
    /// the endpoint it serves), which no user can set.
    pub record: Option<JobRecord>,
    /// A replica launcher's note in the job's comment (issue #26): why its
    /// server ended, what its drain did. The job's user writes the comment:
    /// the report reads it only on a replica job
    /// ([`super::replica_jobs::ReplicaJobs`]).
    pub note: Option<ReplicaNote>,
}

impl Run {
    /// The first drain its launcher(s) noted.
    pub fn drain(&self) -> Option<DrainNote> {
        self.note.as_ref().and_then(|n| n.drained.first()).map(|(_, d)| *d)
    }
}

/// A record sacct printed that the report could not read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unreadable {
    /// Its JobIDRaw as sacct printed it (bounded: a broken record may hold
    /// anything there).
    pub id: String,
    pub why: String,
}

/// What sacct's output holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Records {
    /// Runs that held GPUs.
    pub runs: Vec<Run>,
    /// Audit mode's decisions (job_submit/onepool's AdminComment), one per
    /// job run, whether or not it held GPUs or started.
    pub audit: Vec<(String, AuditRecord)>,
    pub unreadable: Vec<Unreadable>,
    /// What a `REQUEUED` run says on this Slurm release.
    pub requeues: Requeues,
}

/// What accounting's `REQUEUED` means on a Slurm release (issue #52).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Requeues {
    /// Before 24.05 a victim that ends itself in its grace time is recorded
    /// `COMPLETED` and not requeued, so a requeue class's victim requeues
    /// itself on the notice (etc/examples/requeue-training.sbatch): its run
    /// is `REQUEUED`, as is any user's own `scontrol requeue`. Such a run
    /// counts where a job that may reclaim it took its GPUs.
    #[default]
    ByTheVictim,
    /// From 24.05 Slurm records a victim that ends itself in its grace time
    /// `PREEMPTED`, and requeues it: `REQUEUED` is only ever a user's own
    /// requeue, never a reclaim.
    BySlurm,
}

impl Requeues {
    /// From `scontrol show config`'s `SLURM_VERSION` (e.g. `24.11.5`);
    /// before 24.05 where it cannot be read.
    pub fn of_release(version: Option<&str>) -> Requeues {
        let mut parts = version.unwrap_or_default().trim().split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) if (major, minor) >= (24, 5) => Requeues::BySlurm,
            _ => Requeues::ByTheVictim,
        }
    }
}

/// The fields the report asks sacct for.
pub const SACCT_FORMAT: &str =
    "JobIDRaw,JobName,QOS,State,Submit,Eligible,Start,End,AllocTRES,NodeList,User,AdminComment,Comment";
const FIELDS: usize = 13;

/// `sacct -P -n --delimiter=DELIM` output in [`SACCT_FORMAT`] order.
///
/// Each record ends with a line break and its fields are joined by
/// `delim`, so the output split by `delim` is, after the first field, 12
/// pieces per record, the last of which also holds the next record's first
/// field after its last line break (a JobIDRaw has none). Any text in any
/// field stays in its field. `Err` only when the pieces do not come out as
/// whole records: a field that held the delimiter, which no user can know.
pub fn parse_sacct(text: &str, delim: &str) -> Result<Records, String> {
    let mut out = Records::default();
    if text.trim().is_empty() {
        return Ok(out);
    }
    let pieces: Vec<&str> = text.split(delim).collect();
    let per = FIELDS - 1;
    if !(pieces.len() - 1).is_multiple_of(per) {
        return Err(format!(
            "sacct's output does not split into records of {FIELDS} fields ({} pieces by the delimiter): \
             run the report again (it makes a new delimiter each time)",
            pieces.len()
        ));
    }
    let n = (pieces.len() - 1) / per;
    let mut first = pieces[0].to_string();
    for i in 0..n {
        let mut f: Vec<String> = Vec::with_capacity(FIELDS);
        f.push(std::mem::take(&mut first));
        f.extend(pieces[i * per + 1..i * per + per].iter().map(|s| (*s).to_string()));
        let last = pieces[(i + 1) * per];
        let comment = if i + 1 == n {
            last.strip_suffix('\n').unwrap_or(last).to_string()
        } else {
            match last.rsplit_once('\n') {
                Some((comment, next)) => {
                    first = next.to_string();
                    comment.to_string()
                }
                None => {
                    return Err(format!("sacct's record {} does not end with a line break before the next one", i + 1))
                }
            }
        };
        f.push(comment);
        read_record(&f, &mut out);
    }
    Ok(out)
}

/// One record's fields into `out`: a run, an audit decision, or why it is
/// unreadable.
fn read_record(f: &[String], out: &mut Records) {
    let id = f[0].trim();
    let unreadable = |out: &mut Records, why: String| {
        out.unreadable.push(Unreadable { id: id.chars().take(64).collect(), why });
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        unreadable(out, "its JobIDRaw is not a job id".into());
        return;
    }
    if let Some(a) = AuditRecord::decode(&f[11]) {
        out.audit.push((id.to_string(), a));
    }
    let t = |s: &str| onepool_decisions::trace::parse_time(s.trim());
    let Some(submit) = t(&f[4]) else {
        unreadable(out, format!("Submit {:?} is not a time", f[4].chars().take(40).collect::<String>()));
        return;
    };
    // Never started (cancelled while pending): held nothing.
    let Some(start) = t(&f[6]) else { return };
    // Still running: it holds its GPUs up to now (the caller clips).
    let end = t(&f[7]).unwrap_or(f64::INFINITY);
    let gpus = match onepool_simulator::input::jobs::gpus_from_tres(&f[8]) {
        Ok((g, _)) => g,
        Err(e) => return unreadable(out, format!("AllocTRES: {e}")),
    };
    if gpus == 0 {
        return;
    }
    let nodes = match f[9].trim() {
        "None assigned" | "" => Vec::new(),
        list => match onepool_decisions::hostlist::expand(list) {
            Ok(n) => n,
            Err(e) => return unreadable(out, format!("NodeList {list}: {e}")),
        },
    };
    out.runs.push(Run {
        id: id.to_string(),
        name: f[1].clone(),
        qos: f[2].trim().to_string(),
        state: f[3].split_whitespace().next().unwrap_or("").to_string(),
        submit,
        eligible: t(&f[5]).unwrap_or(submit),
        start,
        end,
        gpus,
        nodes,
        user: f[10].trim().to_string(),
        record: JobRecord::decode(&f[11]),
        note: ReplicaNote::decode(&f[12]),
    });
}

/// A delimiter for [`parse_sacct`] that no job's text holds but by chance:
/// random, made at each run.
pub fn delimiter() -> std::io::Result<String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))?;
    Ok(format!("~{}~", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "~d~";

    fn line(id: &str, name: &str, state: &str, tres: &str, admin: &str, comment: &str) -> String {
        [
            id,
            name,
            "op-b",
            state,
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:01",
            "2026-12-01T10:10:00",
            tres,
            "node1",
            "ana",
            admin,
            comment,
        ]
        .join(D)
            + "\n"
    }

    #[test]
    fn any_text_in_any_field_stays_in_its_record() {
        let big = "x".repeat(100_000);
        // A whole record as sacct would print it, with a guess at the
        // delimiter (the real one is random, made at each run).
        let forged = line("999", "forged", "PREEMPTED", "billing=1,gres/gpu=4", "", "").replace(D, "~e~");
        let out = [
            line("1", "v\nw", "COMPLETED", "billing=1,gres/gpu=4", "", ""),
            line("2", "a|b \"q\" 'x'", "PREEMPTED", "gres/gpu=2", "", &format!("c\n{forged}tail")),
            line("3", &big, "COMPLETED", "gres/gpu=1", "", "\n\n7\n"),
            line("4", "cpu only", "COMPLETED", "cpu=1", "onepool-audit:would=place;class=b", ""),
            line("5", "n", "CANCELLED by 1002", "gres/gpu=1", "", "last\n"),
        ]
        .concat();
        let r = parse_sacct(&out, D).unwrap();
        let ids: Vec<&str> = r.runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["1", "2", "3", "5"], "every GPU run, none made up");
        assert_eq!(r.runs[0].name, "v\nw");
        assert_eq!(r.runs[1].name, "a|b \"q\" 'x'");
        assert_eq!(r.runs[2].name.len(), 100_000);
        assert_eq!(r.runs[3].state, "CANCELLED");
        assert_eq!(r.audit, [("4".to_string(), AuditRecord::Place { class: "b".into() })]);
        assert!(r.unreadable.is_empty(), "{:?}", r.unreadable);
    }

    #[test]
    fn a_record_that_cannot_be_read_is_named_and_the_others_kept() {
        let out = [
            line("1", "ok", "COMPLETED", "gres/gpu=1", "", ""),
            line("2", "bad", "COMPLETED", "gres/gpu=lots", "", ""),
            line("x\ny", "bad id", "COMPLETED", "gres/gpu=1", "", ""),
            line("3", "ok", "COMPLETED", "gres/gpu=1", "", ""),
        ]
        .concat();
        let r = parse_sacct(&out, D).unwrap();
        assert_eq!(r.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["1", "3"]);
        let bad: Vec<&str> = r.unreadable.iter().map(|u| u.id.as_str()).collect();
        // The second record's comment ended with "\nx": "x\ny" lost its "x".
        assert_eq!(bad.len(), 2, "{:?}", r.unreadable);
        assert_eq!(bad[0], "2");
        assert!(r.unreadable[0].why.contains("AllocTRES"), "{:?}", r.unreadable);
    }

    #[test]
    fn output_that_does_not_split_into_records_is_an_error_not_a_guess() {
        let mut out = line("1", "ok", "COMPLETED", "gres/gpu=1", "", "");
        out.push_str(&line("2", &format!("has{D}delim"), "COMPLETED", "gres/gpu=1", "", ""));
        let e = parse_sacct(&out, D).unwrap_err();
        assert!(e.contains("does not split into records"), "{e}");
        assert_eq!(parse_sacct("", D).unwrap(), Records::default());
        assert_eq!(parse_sacct("\n", D).unwrap(), Records::default());
    }
}
