//! Readers for the simulator's inputs. Every reader reports each malformed
//! row as `file:line: what is wrong`; with [`OnBadRow::Skip`] the row is
//! left out and counted, with [`OnBadRow::Abort`] the first one stops the
//! read. Nothing is dropped silently: the caller prints [`Rows::skipped`].

pub mod azure;
pub mod jobs;

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadRow {
    /// Report the row, leave it out, go on.
    #[default]
    Skip,
    /// Stop at the first malformed row.
    Abort,
}

/// One malformed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    pub file: String,
    pub line: usize,
    pub what: String,
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// What a reader kept, and what it left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows<T> {
    pub rows: Vec<T>,
    /// Malformed rows (reported as errors).
    pub skipped: Vec<BadRow>,
    /// Well-formed rows that are not simulated (job steps, jobs that never
    /// ran or hold no GPU), by reason, with their count.
    pub ignored: Vec<(String, usize)>,
}

impl<T> Rows<T> {
    fn new() -> Rows<T> {
        Rows { rows: Vec::new(), skipped: Vec::new(), ignored: Vec::new() }
    }
    fn ignore(&mut self, why: &str) {
        match self.ignored.iter_mut().find(|(w, _)| w == why) {
            Some((_, n)) => *n += 1,
            None => self.ignored.push((why.to_string(), 1)),
        }
    }
    /// Records a malformed row; `Err` when the caller asked to abort.
    fn bad(&mut self, file: &str, line: usize, what: impl Into<String>, on_bad: OnBadRow) -> Result<(), BadRow> {
        let b = BadRow { file: file.to_string(), line, what: what.into() };
        if on_bad == OnBadRow::Abort {
            return Err(b);
        }
        self.skipped.push(b);
        Ok(())
    }
}

pub use onepool_decisions::trace::parse_time;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("0"), Some(0.0));
        assert_eq!(parse_time("1970-01-02T00:00:01"), Some(86_401.0));
        assert_eq!(parse_time("2023-11-16 18:15:46.5"), Some(1_700_158_546.5));
        assert_eq!(parse_time("Unknown"), None);
        assert_eq!(parse_time("2023-13-01T00:00:00"), None);
    }
}
