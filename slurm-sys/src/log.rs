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
    let c = to_cstring_lossy(msg);
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
    fn logging_without_a_host_does_not_crash() {
        info("%s%s%n from a user");
    }
}
