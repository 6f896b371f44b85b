//! The options this plugin registers, and the values they received.
//!
//! Slurm keeps a pointer to each registered `struct spank_option`, so the
//! table is a static that lives as long as the process.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int};
use std::sync::{LazyLock, Mutex};

use onepool_decisions::annotation::{Annotation, Key};
use slurm_sys::bindings::spank_option;

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

pub struct OptionTable(UnsafeCell<[spank_option; 4]>);
// SAFETY: Slurm only reads the table; we never write to it after start-up.
unsafe impl Sync for OptionTable {}

const fn opt(
    name: &'static std::ffi::CStr,
    arginfo: &'static std::ffi::CStr,
    usage: &'static std::ffi::CStr,
    val: c_int,
) -> spank_option {
    spank_option {
        name: name.as_ptr() as *mut c_char,
        arginfo: arginfo.as_ptr() as *mut c_char,
        usage: usage.as_ptr() as *mut c_char,
        has_arg: 1,
        val,
        cb: Some(option_callback),
    }
}

/// Index = the option's `val`, which is how the callback tells them apart;
/// the names must equal `Key::option()` (checked by a test).
pub const KEYS: [Key; 4] = [Key::Workload, Key::Reclaim, Key::DrainTimeout, Key::Endpoint];

pub static TABLE: OptionTable = OptionTable(UnsafeCell::new([
    opt(c"workload", c"CLASS", c"onepool workload class of this job (e.g. training, inference, agents)", 0),
    opt(
        c"reclaim",
        c"immediate|graceful|requeue",
        c"what happens when the GPUs are reclaimed: cancel, drain, or requeue",
        1,
    ),
    opt(c"drain-timeout", c"DURATION", c"how long a graceful reclaim may drain, e.g. 90s or 5m", 2),
    opt(c"endpoint", c"NAME", c"marks the job as a replica of this inference endpoint", 3),
]));

impl OptionTable {
    pub fn entry(&self, i: usize) -> *mut spank_option {
        // SAFETY: in-bounds pointer into a static array.
        unsafe { (*self.0.get()).as_mut_ptr().add(i) }
    }
}

extern "C" fn option_callback(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    slurm_sys::guard::guard(PLUGIN, "option callback", -1, || {
        let Some(key) = usize::try_from(val).ok().and_then(|i| KEYS.get(i).copied()) else {
            slurm_sys::log::error(&format!("{PLUGIN}: callback for unknown option value {val}"));
            return -1;
        };
        // SAFETY: Slurm passes the option's argument as a C string (or NULL).
        let value = unsafe { slurm_sys::xstring::read(optarg) }.unwrap_or_default();
        match state().annotation.set(key, &value) {
            Ok(()) => 0,
            Err(e) => {
                slurm_sys::log::error(&e.to_string());
                -1
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_match_the_shared_keys() {
        for (i, key) in KEYS.iter().enumerate() {
            let o = unsafe { &*TABLE.entry(i) };
            assert_eq!(unsafe { slurm_sys::xstring::read(o.name) }.as_deref(), Some(key.option()));
            assert_eq!(unsafe { slurm_sys::xstring::read(o.arginfo) }.as_deref(), Some(key.arginfo()));
            assert_eq!(o.val, i as c_int);
        }
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
