//! The options this plugin registers, and the values they received.
//!
//! Slurm keeps a pointer to each registered `struct spank_option`, so the
//! table is a static that lives as long as the process.

use std::ffi::{c_char, c_int, CStr};
use std::sync::{LazyLock, Mutex};

use onepool_decisions::annotation::{Annotation, Key};
use slurm_sys::spank::{SpankOption, SpankOptions};

use crate::args::PluginArgs;

pub const PLUGIN: &str = "spank/onepool";

/// What the callbacks and plugstack arguments have set in this process.
#[derive(Debug, Default)]
pub struct State {
    pub annotation: Annotation,
    pub args: PluginArgs,
}

pub static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

/// Locks the state, recovering it after a panic elsewhere: a poisoned lock
/// must not make every later callback fail.
pub fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

const fn opt(name: &'static CStr, arginfo: &'static CStr, usage: &'static CStr, val: c_int) -> SpankOption {
    SpankOption::new(name, arginfo, usage, true, val, option_callback)
}

/// Index = the option's `val`, which is how the callback tells them apart;
/// the names must equal `Key::option()` (checked by a test).
pub const KEYS: [Key; 4] = [Key::Workload, Key::Reclaim, Key::DrainTimeout, Key::Endpoint];

pub static TABLE: SpankOptions<4> = SpankOptions::new([
    opt(c"workload", c"CLASS", c"onepool workload class of this job (e.g. training, inference, agents)", 0),
    opt(
        c"reclaim",
        c"immediate|graceful|requeue",
        c"what happens when the GPUs are reclaimed: cancel, drain, or requeue",
        1,
    ),
    opt(c"drain-timeout", c"DURATION", c"how long a graceful reclaim may drain, e.g. 90s or 5m", 2),
    opt(c"endpoint", c"NAME", c"marks the job as a replica of this inference endpoint", 3),
]);

slurm_sys::entry_point! {
    #[guard(PLUGIN, on_panic = -1, entry = "option callback")]
    extern "C" fn option_callback(val: c_int, optarg: *const c_char as Option<&CStr>, _remote: c_int) -> c_int {
        let Some(key) = usize::try_from(val).ok().and_then(|i| KEYS.get(i).copied()) else {
            slurm_sys::log::error(&format!("{PLUGIN}: callback for unknown option value {val}"));
            return -1;
        };
        let value = optarg.map(|a| a.to_string_lossy().into_owned()).unwrap_or_default();
        match state().annotation.set(key, &value) {
            Ok(()) => 0,
            Err(e) => {
                slurm_sys::log::error(&e.to_string());
                -1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_match_the_shared_keys() {
        for (i, key) in KEYS.iter().enumerate() {
            let o = TABLE.get(i).unwrap();
            assert_eq!(o.name().to_str().ok(), Some(key.option()));
            assert_eq!(o.arginfo().to_str().ok(), Some(key.arginfo()));
            assert_eq!(o.val(), i as c_int);
        }
        assert!(TABLE.get(KEYS.len()).is_none());
    }

    #[test]
    fn callback_stores_valid_and_refuses_invalid_values() {
        assert_eq!(option_callback(0, c"agents".as_ptr(), 0), 0);
        assert_eq!(state().annotation.workload.as_deref(), Some("agents"));
        assert_eq!(option_callback(2, c"soon".as_ptr(), 0), -1);
        assert_eq!(option_callback(9, c"x".as_ptr(), 0), -1);
        assert_eq!(option_callback(1, std::ptr::null(), 0), -1, "a missing argument is refused");
    }
}
