//! Diagnostics about a policy file: what is wrong, where (file:line:column),
//! and a sentence on how to fix it. All of them are collected before the
//! file is refused, so one run shows every problem.

use std::fmt;
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Byte range in the source, when the problem has a place.
    pub span: Option<Range<usize>>,
    pub message: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(span: Option<Range<usize>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Error, span, message: message.into(), help: None }
    }
    pub fn warning(span: Option<Range<usize>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, span, message: message.into(), help: None }
    }
    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `file:line:column: error: message (help)`.
    pub fn render(&self, file: &str, source: &str) -> String {
        let place = match &self.span {
            Some(s) => {
                let (line, col) = line_col(source, s.start);
                format!("{file}:{line}:{col}")
            }
            None => file.to_string(),
        };
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        match &self.help {
            Some(h) => format!("{place}: {sev}: {}; {h}", self.message),
            None => format!("{place}: {sev}: {}", self.message),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(h) = &self.help {
            write!(f, "; {h}")?;
        }
        Ok(())
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..source.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

trait FloorBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while i > 0 && !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column() {
        let src = "a = 1\nbb = 2\n";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 6), (2, 1));
        assert_eq!(line_col(src, 11), (2, 6));
        assert_eq!(line_col(src, 999), (3, 1));
    }

    #[test]
    fn rendering() {
        let d = Diagnostic::error(Some(6..8), "bad").help("fix it");
        assert_eq!(d.render("p.toml", "a = 1\nbb = 2\n"), "p.toml:2:1: error: bad; fix it");
    }
}
