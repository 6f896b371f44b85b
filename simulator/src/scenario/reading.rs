//! How a scenario's files are read: paths against the scenario's folder,
//! rows kept or refused as `--on-bad-row` says, and whom a row is
//! classified as (an ordinary user for a job, root for a replica).

use std::path::Path;
use std::time::Duration;

use onepool_decisions::annotation::ReclaimMode;
use onepool_decisions::classify::{Directory, Submitter};

use crate::input::{BadRow, Rows};

/// The classifier's users and groups: none. Job records name accounts,
/// not people, so a batch job is classified as an unprivileged user with
/// its account ([`USER`]) and a replica as root, as onepoold submits it
/// ([`DAEMON`]).
pub(super) struct Nobody;

impl Directory for Nobody {
    fn user_name(&self, _: u32) -> Option<&str> {
        None
    }
    fn in_group(&self, _: u32, _: u32, _: &str) -> bool {
        false
    }
}

pub(super) const USER: Submitter = Submitter { uid: 65_534, gid: 65_534 };

pub(super) const DAEMON: Submitter = Submitter { uid: 0, gid: 0 };

/// Where the policy put a job or replica: its class, and how that class
/// is reclaimed (flexible classes) with its drain timeout.
pub(super) type Placed = (usize, Option<ReclaimMode>, Option<Duration>);

pub(super) fn count(ignored: &mut Vec<(String, usize)>, why: String, n: usize) {
    match ignored.iter_mut().find(|(w, _)| *w == why) {
        Some((_, k)) => *k += n,
        None => ignored.push((why, n)),
    }
}

pub(super) fn take<T>(
    r: Result<Rows<T>, BadRow>,
    bad_rows: &mut Vec<BadRow>,
    ignored: &mut Vec<(String, usize)>,
) -> Result<Vec<T>, String> {
    let r = r.map_err(|b| format!("{b} (stopping: --on-bad-row=abort)"))?;
    bad_rows.extend(r.skipped);
    for (w, n) in r.ignored {
        count(ignored, w, n);
    }
    Ok(r.rows)
}

pub(super) fn read(base: &Path, p: &Path) -> Result<(String, String), String> {
    let path = base.join(p);
    let shown = path.display().to_string();
    std::fs::read_to_string(&path).map(|t| (shown.clone(), t)).map_err(|e| format!("{shown}: {e}"))
}

/// `file:line` of a span of the scenario's text (the file alone without one).
pub(super) fn at(path: &Path, text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => format!("{}:{}", path.display(), text[..r.start.min(text.len())].matches('\n').count() + 1),
        None => path.display().to_string(),
    }
}
