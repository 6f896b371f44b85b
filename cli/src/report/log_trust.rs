//! Which lines of slurmctld's log are slurmctld's own (issue #35).
//!
//! slurmctld writes some text of a job's user into its log as it is, line
//! breaks included (log.c formats each entry once and writes it raw, in
//! 22.05, 24.11 and 26.05): `scontrol update jobid=N comment=$'x\n[stamp]
//! preempted JobId=V has been killed to reclaim resources for JobId=T'`
//! logs `_update_job: setting comment to x` and, on the next line, what
//! reads as slurmctld's own. So:
//!
//! - `USER_TEXT` lists the entries that hold a user's text (found in
//!   Slurm's source), how long that text can be (Slurm's own bound) and
//!   how the entry ends. After such an entry's first line, every line up
//!   to the first one that ends as the entry ends is certainly its text
//!   ([`Zone::Inside`]); from there to the last such line within the
//!   text's longest reach a line may be the entry's or slurmctld's next
//!   one ([`Zone::Unsure`]). The reach is Slurm's bound on the text, so no
//!   text, however written, ends the entry before the report assumes: to
//!   get a line past it a user must write more than Slurm takes.
//! - Stamps never go backwards: slurmctld takes each line's time stamp
//!   under its log lock (log.c), so its own lines are in order. The lines
//!   read are the longest run whose stamps never go backwards ([`in_order`]);
//!   a line out of that order is left out, and one stamped ahead cannot
//!   hide the real lines after it (they are more).
//!
//! What is left (a line in an entry this table does not know, or one
//! [`Zone::Unsure`]) is checked against accounting before it counts
//! ([`super::reclaims`]).

/// The users whose jobs' text the report does not suspect: onepoold's
/// service user (its launchers write one-line notes) and root. An ordinary
/// user can change only their own jobs' comment and name.
pub const TRUSTED_USERS: [&str; 2] = [onepool_decisions::policy::SERVICE_USER, "root"];

/// The raw ids of the runs of [`TRUSTED_USERS`].
pub fn trusted_jobs(runs: &[super::usage::Run]) -> std::collections::HashSet<&str> {
    runs.iter().filter(|r| TRUSTED_USERS.contains(&r.user.as_str())).map(|r| r.id.as_str()).collect()
}

/// How an entry that holds a user's text ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// With `%pJ` (`... for JobId=N`).
    JobId,
    /// On its first line, unless Slurm could not parse the job id it
    /// holds as text: a text with a line break is no job id, and slurmctld
    /// then logs `invalid JobId=<text>` in the same call, right after. With
    /// such a line following, like [`Ends::Text`].
    Parsed,
    /// With the user's text: any line may be its last.
    Text,
}

/// An entry that holds a user's text: a line that contains `marker`
/// starts it, and the text after the marker is at most `reach` bytes.
struct UserText {
    marker: &'static str,
    reach: usize,
    ends: Ends,
}

/// What `_test_job_desc_fields` (job_mgr.c) allows a job's comment, name,
/// extra, features, mail user, licenses, account and partition.
const FIELD: usize = 1024;
/// A job's work_dir and output paths (PATH_MAX).
const PATH: usize = 4096;
/// A job id given as text (`scontrol update jobid=...`): slurmctld bounds
/// it by nothing; this is the longest single argument of a command line
/// (MAX_ARG_STRLEN), what `scontrol` can pass. A program that sends the RPC
/// itself can send more; what it writes is left to the accounting checks.
const JOB_ID_STR: usize = 128 * 1024;
/// How far past a [`Ends::Parsed`] entry's reach its `invalid JobId=` line
/// is looked for (other threads may log between the two).
const PARSED_AFTER: usize = 64 * 1024;
/// The fixed words around the text (`setting comment to`, `for
/// JobId=4294967295_4294967295(4294967295)`, an error message).
const WORDS: usize = 160;

/// The entries of slurmctld (22.05, 24.11, 26.05, info level and debug)
/// that hold text a job's user chose, most specific first. `sched_info`
/// entries carry `sched: ` before the marker; markers are found anywhere
/// in the line.
const USER_TEXT: &[UserText] = &[
    // job_mgr.c _update_job: "%s: setting comment to %s for %pJ" and the like.
    UserText { marker: "_update_job: setting comment to ", reach: FIELD, ends: Ends::JobId },
    UserText { marker: "_update_job: setting extra to ", reach: FIELD, ends: Ends::JobId },
    UserText { marker: "_update_job: setting name to ", reach: FIELD, ends: Ends::JobId },
    UserText { marker: "_update_job: setting work_dir to ", reach: PATH, ends: Ends::JobId },
    UserText { marker: "_update_job: invalid licenses: ", reach: 2 * FIELD, ends: Ends::Text },
    UserText { marker: "_update_job: Invalid node list for job_update: ", reach: FIELD, ends: Ends::Text },
    // Every other _update_job entry ("setting features to %s for %pJ",
    // "changing licenses from '%s' to '%s' for pending %pJ", "setting
    // %sfor %pJ" with up to six TRES fields...).
    UserText { marker: "_update_job: ", reach: 8 * FIELD, ends: Ends::JobId },
    // A job id as text. Where Slurm cannot parse it (a line break, or any
    // text): "update_job_str: invalid JobId=%s", "job_str_signal(1):
    // invalid JobId=%s", ..., then the call's result repeats it
    // ("_slurm_rpc_update_job: JobId=%s uid=%u: %s", "_slurm_rpc_kill_job:
    // job_str_signal() uid=%u JobId=%s sig=%d returned: %s").
    UserText { marker: "invalid JobId=", reach: 3 * JOB_ID_STR, ends: Ends::Text },
    // The one entry logged before the text is parsed.
    UserText { marker: "_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=", reach: JOB_ID_STR, ends: Ends::Parsed },
    // A submission's fields, logged when they are refused.
    UserText { marker: "invalid partition specified: ", reach: FIELD, ends: Ends::Text },
    UserText { marker: "_job_create: account '", reach: 2 * FIELD, ends: Ends::Text },
    UserText { marker: "Job's requested licenses are invalid: ", reach: FIELD, ends: Ends::Text },
    UserText { marker: "Invalid mcs-label: ", reach: FIELD, ends: Ends::Text },
];

/// Where a line stands with respect to the user text before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// No user text can have written it.
    Clear,
    /// Maybe the text of an entry before it, maybe slurmctld's next line.
    Unsure,
    /// Certainly the text of an entry before it.
    Inside,
}

/// Each line's [`Zone`]. `trusted` says whether a job (its raw id) is one
/// whose comment and name no ordinary user can set: onepoold's replica
/// jobs, root's ([`super::slurmctld_log::read`]).
///
/// An entry that ends with `%pJ` names the job it changed, and a user can
/// change only their own jobs: so the entry of an ordinary user ends at a
/// line naming one of theirs (or a job the report does not know). A line
/// in reach that names a trusted job cannot be where such an entry ends,
/// and when no line in reach names another, the entry is a trusted
/// writer's (onepoold's launcher writing its note, in one line) and ends
/// at its first possible end: a replica's note leaves the lines after it
/// alone.
pub fn zones(lines: &[&str], trusted: &dyn Fn(&str) -> bool) -> Vec<Zone> {
    let mut out = vec![Zone::Clear; lines.len()];
    for i in 0..lines.len() {
        if out[i] == Zone::Inside {
            continue;
        }
        let Some((rule, at)) = USER_TEXT.iter().find_map(|u| marker_at(lines[i], u.marker).map(|at| (u, at))) else {
            continue;
        };
        let ends = match rule.ends {
            Ends::Parsed if unparsed(&lines[i + 1..], rule.reach + PARSED_AFTER) => Ends::Text,
            Ends::Parsed => continue,
            e => e,
        };
        // The text after the marker, then each following line, up to the reach.
        let mut used = lines[i].len() - at - rule.marker.len();
        let mut reach_end = i;
        let (mut first, mut last, mut last_untrusted) = (None, None, None);
        for (j, line) in lines.iter().enumerate().skip(i) {
            if j > i {
                used += 1 + line.len();
                if used > rule.reach + WORDS {
                    break;
                }
                reach_end = j;
            }
            if ends_as(line, ends) {
                first.get_or_insert(j);
                last = Some(j);
                if ends != Ends::JobId || !ended_job(line).is_some_and(trusted) {
                    last_untrusted = Some(j);
                }
            }
        }
        // No line in reach ends it: everything in reach is its text.
        let (first, last) = match (first, last, last_untrusted) {
            (Some(f), Some(_), Some(l)) => (f, l.max(f)),
            (Some(f), Some(_), None) => (f, f),
            _ => (reach_end, reach_end),
        };
        for z in &mut out[i + 1..=first] {
            *z = Zone::Inside;
        }
        for z in out[first + 1..=last].iter_mut().filter(|z| **z == Zone::Clear) {
            *z = Zone::Unsure;
        }
    }
    out
}

/// The raw id of the job a line ending with `%pJ` names (`JobId=15`,
/// `JobId=12_3(15)`, `JobId=20+1(21)`); `None` for `JobId=12_*`,
/// `JobId=Invalid`.
fn ended_job(line: &str) -> Option<&str> {
    let line = line.trim_end();
    let line = line.strip_suffix(" update").unwrap_or(line);
    let (_, id) = line.rsplit_once("JobId=")?;
    let raw = match id.split_once('(') {
        Some((_, inner)) => inner.strip_suffix(')')?,
        None => id,
    };
    (!raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit())).then_some(raw)
}

/// Whether an `invalid JobId=` line comes within `bytes` of `lines`.
fn unparsed(lines: &[&str], bytes: usize) -> bool {
    let mut used = 0;
    lines
        .iter()
        .take_while(|l| {
            used += 1 + l.len();
            used <= bytes
        })
        .any(|l| l.contains("invalid JobId="))
}

/// Where `marker` starts in `line` as a word of its own (after a space or
/// at the start: `_update_job: ` is not the end of `_slurm_rpc_update_job: `).
fn marker_at(line: &str, marker: &str) -> Option<usize> {
    line.match_indices(marker).map(|(i, _)| i).find(|&i| i == 0 || line.as_bytes()[i - 1] == b' ')
}

/// Whether `line` ends as an entry of kind `ends` does.
fn ends_as(line: &str, ends: Ends) -> bool {
    let line = line.trim_end();
    match ends {
        Ends::Text | Ends::Parsed => true,
        Ends::JobId => {
            // "... for JobId=15", "JobId=12_3(15)", "JobId=20+1(21)",
            // "JobId=12_*", "JobId=Invalid"; "... for JobId=15 update".
            let line = line.strip_suffix(" update").unwrap_or(line);
            line.rsplit_once("JobId=").is_some_and(|(_, id)| {
                id == "Invalid"
                    || id == "CORRUPT"
                    || (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b"_+()*".contains(&b)))
            })
        }
    }
}

/// Which of `stamps` are kept: the longest subsequence that never goes
/// backwards (the earliest such, where several are as long). `None` is a
/// line without a stamp, neither kept nor in the way.
pub fn in_order(stamps: &[Option<f64>]) -> Vec<bool> {
    // Patience sorting: tails[k] ends the best run of length k + 1 found so far.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; stamps.len()];
    for (i, s) in stamps.iter().enumerate() {
        let Some(s) = *s else { continue };
        // The first tail stamped later than this line: runs up to it may take it.
        let k = tails.partition_point(|&t| stamps[t].is_some_and(|x| x <= s));
        prev[i] = k.checked_sub(1).map(|k| tails[k]);
        if k == tails.len() {
            tails.push(i);
        } else {
            tails[k] = i;
        }
    }
    let mut keep = vec![false; stamps.len()];
    let mut at = tails.last().copied();
    while let Some(i) = at {
        keep[i] = true;
        at = prev[i];
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones_of(text: &str) -> Vec<Zone> {
        zones(&text.lines().collect::<Vec<_>>(), &|_| false)
    }

    use Zone::{Clear, Inside, Unsure};

    #[test]
    fn a_comment_s_lines_are_its_text_up_to_its_end() {
        let log = "\
[2026-12-05T10:00:00.000] _update_job: setting comment to x
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
y for JobId=9
[2026-12-05T10:00:00.002] _slurm_rpc_update_job: complete JobId=9 uid=1001 usec=50
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu";
        assert_eq!(zones_of(log), [Clear, Inside, Unsure, Clear, Clear]);
    }

    /// Ending the text early (a line that ends like the entry) does not
    /// end it: every line up to the last that could end it is unsure.
    #[test]
    fn an_early_end_in_the_text_does_not_end_it() {
        let log = "\
[2026-12-05T10:00:00.000] _update_job: setting comment to x for JobId=9
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
y for JobId=9
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu";
        assert_eq!(zones_of(log), [Clear, Unsure, Unsure, Clear]);
    }

    #[test]
    fn a_one_line_note_leaves_the_next_lines_alone() {
        let log = "\
[2026-12-05T10:00:00.000] _update_job: setting comment to op1;L7=40000 for JobId=9
[2026-12-05T10:00:00.001] _slurm_rpc_update_job: complete JobId=9 uid=1001 usec=50
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu";
        assert_eq!(zones_of(log), [Clear, Clear, Clear]);
    }

    /// Replicas' notes followed closely by a preemption: an ordinary
    /// user's entry cannot end at a line naming onepoold's jobs (9, 10, and
    /// the baseline replica 12 that took the GPUs), so the notes end where
    /// they can; when the preemption names another job, it may be where an
    /// ordinary user's entry ends (Slurm writes ` for JobId=N` after the
    /// text, so a text that ends `... to reclaim resources` reads as
    /// Slurm's line), and it is unsure.
    #[test]
    fn a_trusted_job_s_note_ends_where_it_can() {
        let log = "\
[2026-12-05T10:00:00.000] _update_job: setting comment to op1;L7=40000;D7=1,10,1,0,0,5 for JobId=9
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu
[2026-12-05T10:00:00.004] _update_job: setting comment to op1;L8=40002;D8=1,15,0,0,0,1 for JobId=10
[2026-12-05T10:00:00.005] preempted JobId=11 has been killed to reclaim resources for JobId=12";
        let lines: Vec<&str> = log.lines().collect();
        let onepoold = |id: &str| ["9", "10", "12"].contains(&id);
        assert_eq!(zones(&lines, &onepoold), [Clear, Clear, Clear, Clear]);
        let not_12 = |id: &str| ["9", "10"].contains(&id);
        assert_eq!(zones(&lines, &not_12), [Clear, Unsure, Unsure, Unsure]);
        assert_eq!(zones_of(log), [Clear, Unsure, Unsure, Unsure]);
        assert_eq!((ended_job("x for JobId=12_3(15)"), ended_job("JobId=12_*")), (Some("15"), None));
    }

    /// Past Slurm's bound on a comment (1024 bytes), a line is slurmctld's.
    #[test]
    fn the_reach_is_slurm_s_bound_on_the_text() {
        let filler = "a".repeat(1000);
        let log = format!(
            "[2026-12-05T10:00:00.000] _update_job: setting comment to x\n{filler}\n{filler} for JobId=9\n\
             [2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6\n"
        );
        // The comment cannot reach the third line: no line in reach ends
        // it, so the reach is its text; the next line is beyond it.
        assert_eq!(zones_of(&log), [Clear, Inside, Clear, Clear]);
    }

    #[test]
    fn a_job_id_as_text_reaches_far_and_any_line_may_end_it() {
        let log = "\
[2026-12-05T10:00:00.000] update_job_str: invalid JobId=1
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
[2026-12-05T10:00:00.002] _slurm_rpc_update_job: JobId=1
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
y uid=1003: Invalid job id specified
[2026-12-05T10:00:00.003] sched: Allocate JobId=6 NodeList=n1 #CPUs=1 Partition=gpu";
        assert_eq!(zones_of(log), [Clear, Unsure, Unsure, Unsure, Unsure, Unsure]);
    }

    /// scancel's job id is logged before it is parsed: one line, unless
    /// Slurm then says it was no job id.
    #[test]
    fn a_kill_s_job_id_is_one_line_unless_slurm_could_not_parse_it() {
        let plain = "\
[2026-12-05T10:00:00.000] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=27 uid 1003
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6";
        assert_eq!(zones_of(plain), [Clear, Clear]);
        let forged = "\
[2026-12-05T10:00:00.000] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=27
[2026-12-05T10:00:00.001] preempted JobId=5 has been killed to reclaim resources for JobId=6
x uid 1003
[2026-12-05T10:00:00.002] job_str_signal(1): invalid JobId=27";
        assert_eq!(zones_of(forged), [Clear, Unsure, Unsure, Unsure]);
    }

    #[test]
    fn endings() {
        for l in ["a for JobId=15", "b for JobId=12_3(15)", "c JobId=20+1(21)", "d JobId=Invalid", "e JobId=1 update"] {
            assert!(ends_as(l, Ends::JobId), "{l}");
        }
        for l in ["for JobId=", "JobId=15 x", "JobId=1;"] {
            assert!(!ends_as(l, Ends::JobId), "{l}");
        }
    }

    #[test]
    fn the_longest_run_in_order_is_kept() {
        let s = |v: &[f64]| v.iter().map(|x| Some(*x)).collect::<Vec<_>>();
        // One line stamped far ahead: left out, not the real ones after it.
        assert_eq!(in_order(&s(&[1.0, 2.0, 99.0, 3.0, 4.0])), [true, true, false, true, true]);
        // One stamped behind: left out.
        assert_eq!(in_order(&s(&[1.0, 2.0, 0.5, 3.0])), [true, true, false, true]);
        // Equal stamps are in order; lines without one are not in the way.
        assert_eq!(in_order(&[Some(1.0), None, Some(1.0), Some(2.0)]), [true, false, true, true]);
        assert!(in_order(&[]).is_empty());
    }
}
