//! Slurm's logger, always called with a fixed "%s" format so that text from
//! users (job names, option values) can never be read as a format string.
//! Outside a Slurm host (unit tests, tools) lines go to stderr instead.

use std::ffi::CString;

use crate::host;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Error,
    Info,
    Verbose,
    Debug,
}

/// Logs `msg` at `level` through the host's Slurm logger.
pub fn log(level: Level, msg: &str) {
    let f = match level {
        Level::Error => host::slurm_error(),
        Level::Info => host::slurm_info(),
        Level::Verbose => host::slurm_verbose(),
        Level::Debug => host::slurm_debug(),
    };
    let msg = one_line(msg);
    let c = to_cstring_lossy(&msg);
    match f {
        // SAFETY: a fixed "%s" format with one NUL-terminated argument.
        Some(f) => unsafe { f(c"%s".as_ptr(), c.as_ptr()) },
        None => eprintln!("{level:?}: {msg}"),
    }
}

pub fn error(msg: &str) {
    log(Level::Error, msg)
}
pub fn info(msg: &str) {
    log(Level::Info, msg)
}
pub fn verbose(msg: &str) {
    log(Level::Verbose, msg)
}
pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}

/// The message as one line of the log: a line break or another control
/// character in it (a job's name, an option's value: user text) is
/// written escaped (`\n`, `\x1b`), so that nothing a user wrote can start
/// a line of its own in slurmctld's log, where it would read as
/// slurmctld's (where admins read it; issue #35), or move a
/// terminal's cursor. Tabs stay.
pub fn one_line(msg: &str) -> std::borrow::Cow<'_, str> {
    if !msg.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len() + 8);
    for c in msg.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Interior NULs (possible in user input) become U+FFFD rather than cutting
/// the line short or failing to log at all.
pub fn to_cstring_lossy(s: &str) -> CString {
    match CString::new(s) {
        Ok(c) => c,
        Err(_) => CString::new(s.replace('\0', "\u{fffd}")).expect("NULs replaced"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_in_message_is_replaced() {
        let c = to_cstring_lossy("a\0b");
        assert_eq!(c.to_str().unwrap(), "a\u{fffd}b");
    }

    #[test]
    fn user_text_cannot_start_a_line_of_its_own() {
        let forged = "class \"x\n[2026-12-06T07:00:00.000] preempted JobId=1 has been killed\r\x1b[2J\"\tok";
        let line = one_line(forged);
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\x1b'), "{line}");
        assert_eq!(line, "class \"x\\n[2026-12-06T07:00:00.000] preempted JobId=1 has been killed\\r\\x1b[2J\"\tok");
        assert!(matches!(one_line("plain words"), std::borrow::Cow::Borrowed(_)));
        // NUL is a control character too: escaped before it could cut the line.
        assert_eq!(one_line("a\0b"), "a\\x00b");
    }

    #[test]
    fn logging_without_a_host_does_not_crash() {
        info("%s%s%n from a user");
    }
}
