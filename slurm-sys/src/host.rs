//! Slurm functions resolved from the host process at run time.
//!
//! Rust links cdylibs with immediate binding, so a direct reference to a
//! symbol that only some hosts export (e.g. `spank_job_control_setenv`)
//! would make `dlopen` fail in the others. Looking each symbol up with
//! `dlsym(RTLD_DEFAULT, ..)` the first time it is needed keeps the plugin
//! loadable everywhere and turns "this host has no such function" into a
//! value the caller handles.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One lazily resolved symbol. `0` = not looked up yet, `1` = looked up and
/// absent, anything else = the address.
pub struct HostSymbol {
    name: &'static CStr,
    addr: AtomicUsize,
}

const UNRESOLVED: usize = 0;
const ABSENT: usize = 1;

impl HostSymbol {
    pub const fn new(name: &'static CStr) -> Self {
        HostSymbol { name, addr: AtomicUsize::new(UNRESOLVED) }
    }

    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// The symbol's address, or `None` when the host does not export it.
    pub fn address(&self) -> Option<*mut c_void> {
        let mut a = self.addr.load(Ordering::Acquire);
        if a == UNRESOLVED {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no
            // preconditions; a racing second lookup returns the same address.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, self.name.as_ptr()) };
            a = if p.is_null() { ABSENT } else { p as usize };
            self.addr.store(a, Ordering::Release);
        }
        (a != ABSENT).then_some(a as *mut c_void)
    }

    pub fn is_present(&self) -> bool {
        self.address().is_some()
    }
}

/// Declares a typed accessor for a host symbol: `fn NAME() -> Option<Type>`.
macro_rules! host_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident: $ty:ty = $sym:literal;) => {
        $(#[$m])*
        $vis fn $name() -> Option<$ty> {
            static SYM: HostSymbol = HostSymbol::new($sym);
            // SAFETY: the address comes from dlsym for a symbol whose C
            // prototype is `$ty`, as declared in Slurm's headers.
            SYM.address().map(|p| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        }
    };
}

pub type LogFn = unsafe extern "C" fn(fmt: *const c_char, ...);
pub type XstrdupFn = unsafe extern "C" fn(s: *const c_char) -> *mut c_char;
pub type XfreeFn = unsafe extern "C" fn(item: *mut *mut c_void);
pub type SpankOptionRegisterFn =
    unsafe extern "C" fn(sp: crate::bindings::spank_t, opt: *mut crate::bindings::spank_option) -> c_int;
pub type SpankJobControlSetenvFn = unsafe extern "C" fn(
    sp: crate::bindings::spank_t,
    name: *const c_char,
    value: *const c_char,
    overwrite: c_int,
) -> c_int;
pub type SpankSetenvFn = SpankJobControlSetenvFn;
pub type SpankGetenvFn =
    unsafe extern "C" fn(sp: crate::bindings::spank_t, name: *const c_char, buf: *mut c_char, len: c_int) -> c_int;
pub type SpankGetItemFn =
    unsafe extern "C" fn(sp: crate::bindings::spank_t, item: crate::bindings::spank_item::Type, ...) -> c_int;
pub type SpankContextFn = unsafe extern "C" fn() -> crate::bindings::spank_context::Type;
pub type SpankOptionGetoptFn = unsafe extern "C" fn(
    sp: crate::bindings::spank_t,
    opt: *mut crate::bindings::spank_option,
    optarg: *mut *mut c_char,
) -> c_int;
pub type InitUpdateNodeMsgFn = unsafe extern "C" fn(msg: *mut crate::bindings::update_node_msg_t);
pub type UpdateNodeFn = unsafe extern "C" fn(msg: *mut crate::bindings::update_node_msg_t) -> c_int;

host_fn!(pub fn slurm_info: LogFn = c"slurm_info";);
host_fn!(pub fn slurm_error: LogFn = c"slurm_error";);
host_fn!(pub fn slurm_verbose: LogFn = c"slurm_verbose";);
host_fn!(pub fn slurm_debug: LogFn = c"slurm_debug";);
host_fn!(pub fn slurm_xstrdup: XstrdupFn = c"slurm_xstrdup";);
host_fn!(pub fn slurm_xfree: XfreeFn = c"slurm_xfree";);
host_fn!(pub fn spank_option_register: SpankOptionRegisterFn = c"spank_option_register";);
host_fn!(
    /// Exported by every host in Debian's build, but only meaningful in
    /// srun/sbatch/salloc; resolved lazily so its absence elsewhere is harmless.
    pub fn spank_job_control_setenv: SpankJobControlSetenvFn = c"spank_job_control_setenv";
);
host_fn!(pub fn spank_setenv: SpankSetenvFn = c"spank_setenv";);
host_fn!(pub fn spank_getenv: SpankGetenvFn = c"spank_getenv";);
host_fn!(pub fn spank_get_item: SpankGetItemFn = c"spank_get_item";);
host_fn!(pub fn spank_context: SpankContextFn = c"spank_context";);
host_fn!(pub fn spank_option_getopt: SpankOptionGetoptFn = c"spank_option_getopt";);
host_fn!(pub fn slurm_init_update_node_msg: InitUpdateNodeMsgFn = c"slurm_init_update_node_msg";);
host_fn!(pub fn slurm_update_node: UpdateNodeFn = c"slurm_update_node";);
pub type SlurmApiVersionFn = unsafe extern "C" fn() -> std::ffi::c_long;
host_fn!(pub fn slurm_api_version: SlurmApiVersionFn = c"slurm_api_version";);

pub type SlurmInitFn = unsafe extern "C" fn(conf: *const c_char);
host_fn!(pub fn slurm_init: SlurmInitFn = c"slurm_init";);

/// Readies libslurm for an API call in a process Slurm started without
/// doing so: since 23.11 the spank prolog/epilog process has no hash
/// plugin loaded, and `slurm_update_node` there is fatal ("No hash plugins
/// loaded. Was slurm_init() called", measured on 24.11). Once per process;
/// 22.05 needs none.
pub fn ensure_api_ready() {
    #[cfg(slurm_ge_23_11)]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if let Some(init) = slurm_init() {
                // SAFETY: NULL asks Slurm for its default configuration
                // ($SLURM_CONF); it initialises only what is not yet.
                unsafe { init(std::ptr::null()) };
            }
        });
    }
}

pub type ValidateOperatorFn = unsafe extern "C" fn(uid: libc::uid_t) -> bool;
host_fn!(
    /// slurmctld's own test for root, SlurmUser and accounts with
    /// AdminLevel Operator or Administrator; only slurmctld exports it.
    pub fn validate_operator: ValidateOperatorFn = c"validate_operator";
);

/// Whether slurmctld counts `uid` as an operator (root and SlurmUser
/// included); `false` in any other process, where there is no such list.
pub fn is_operator(uid: u32) -> bool {
    // SAFETY: slurmctld's `bool validate_operator(uid_t)` takes its own
    // assoc_mgr read locks, as it does inside slurmctld's update handler.
    validate_operator().is_some_and(|f| unsafe { f(uid) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_symbol_is_none_not_a_crash() {
        static S: HostSymbol = HostSymbol::new(c"onepool_no_such_symbol_anywhere");
        assert!(!S.is_present());
        assert!(S.address().is_none());
        assert_eq!(S.name(), "onepool_no_such_symbol_anywhere");
    }

    #[test]
    fn libc_symbol_resolves() {
        static S: HostSymbol = HostSymbol::new(c"getpid");
        assert!(S.is_present());
    }

    #[test]
    fn slurm_is_not_in_the_test_process() {
        // The unit-test binary links nothing of Slurm: every accessor says so.
        assert!(slurm_xstrdup().is_none());
        assert!(spank_job_control_setenv().is_none());
    }
}
