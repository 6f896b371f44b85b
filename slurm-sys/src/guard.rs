//! The panic barrier every plugin entry point goes through: a panic must
//! never unwind into Slurm's C frames (undefined behaviour, in practice a
//! crashed slurmctld). It is caught here, logged through Slurm's logger with
//! the entry point's name, and turned into the entry point's error value.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; on panic logs `"<plugin>: panic in <entry>: <message>"` at
/// error level and returns `on_panic`.
pub fn guard<R>(plugin: &str, entry: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            // Logging must not panic in turn: log() only formats and calls C.
            crate::log::error(&format!("{plugin}: panic in {entry}: {what}"));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_becomes_the_error_value() {
        let r = guard("test", "entry", -1, || -> i32 { panic!("boom") });
        assert_eq!(r, -1);
    }

    #[test]
    fn normal_value_passes_through() {
        assert_eq!(guard("test", "entry", -1, || 7), 7);
    }
}
