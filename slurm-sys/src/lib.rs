//! Types from the installed Slurm headers, and the few safe layers every
//! onepool plugin shares: Slurm's allocator, Slurm's logger, entry points
//! behind a panic barrier, run-time resolution of Slurm's functions from the
//! process that loaded the plugin, and safe wrappers over every Slurm (and
//! libc) call the plugins make. The plugin crates deny `unsafe_code`: their
//! whole FFI edge is here.
//!
//! Nothing here links against Slurm. The hosts that load plugins (slurmctld,
//! slurmd, slurmstepd, srun, sbatch, salloc) carry Slurm's symbols in
//! `libslurmfull.so`; plugins look them up there when first needed.

pub mod bindings;
pub mod compat;
pub mod entry;
pub mod guard;
pub mod host;
pub mod job_desc;
pub mod log;
pub mod node;
/// The libc calls besides Slurm's, behind safe functions (one crate for
/// the whole workspace).
pub use onepool_os as os;
pub mod release;
pub mod spank;
pub mod xstring;

pub use bindings::SLURM_VERSION_NUMBER;

/// `NODE_STATE_DRAIN` is `SLURM_BIT(9)` in slurm.h, a macro bindgen cannot
/// evaluate; the value is checked against the header by a test.
pub const NODE_STATE_DRAIN: u32 = 1 << 9;

/// `SLURM_VERSION_NUMBER` split into (major, minor, micro).
pub const fn version() -> (u32, u32, u32) {
    (SLURM_VERSION_NUMBER >> 16, (SLURM_VERSION_NUMBER >> 8) & 0xff, SLURM_VERSION_NUMBER & 0xff)
}

/// Exports `plugin_name`, `plugin_type` (NUL-terminated byte arrays, which is
/// what Slurm's `dlsym` lookups expect: a pointer variable would be read as
/// the string itself) and `plugin_version` (the Slurm release the plugin was
/// built against; Slurm refuses a mismatch).
///
/// `unsafe_code` flags `#[no_mangle]` and `#[link_section]`; the plugin
/// crates deny it, so it is allowed on these items alone.
#[macro_export]
macro_rules! export_plugin_identity {
    (name: $name:literal, type: $ty:literal) => {
        #[allow(unsafe_code)]
        #[no_mangle]
        #[used]
        pub static plugin_name: [u8; $name.len() + 1] = $crate::__nul_terminated($name);
        #[allow(unsafe_code)]
        #[no_mangle]
        #[used]
        pub static plugin_type: [u8; $ty.len() + 1] = $crate::__nul_terminated($ty);
        #[allow(unsafe_code)]
        #[no_mangle]
        #[used]
        pub static plugin_version: u32 = $crate::SLURM_VERSION_NUMBER;

        // Runs when the host dlopens the plugin, before Slurm compares
        // plugin_version and refuses a mismatch with a bare "Incompatible
        // Slurm plugin" line: says which release each side is and what to do.
        #[allow(unsafe_code)]
        #[used]
        #[link_section = ".init_array"]
        static ONEPOOL_RELEASE_CHECK: extern "C" fn() = {
            extern "C" fn check() {
                $crate::guard::guard($ty, "load", (), || $crate::release::check_host($ty));
            }
            check
        };
    };
}

#[doc(hidden)]
pub const fn __nul_terminated<const N: usize>(s: &str) -> [u8; N] {
    let bytes = s.as_bytes();
    assert!(bytes.len() + 1 == N, "array must be one byte longer than the string");
    let mut out = [0u8; N];
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i] != 0, "plugin identity must not contain NUL");
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// Picks code by Slurm release, for API differences (e.g. `job_modify`
/// gained `err_msg` in 23.02). The release is known only to this crate's
/// build script; a macro defined under its cfg carries the choice to the
/// crates that use it, without a build script of their own.
///
/// `slurm_sys::since_23_02! { { new-API items } else { old-API items } }`
#[cfg(slurm_ge_23_02)]
#[macro_export]
macro_rules! since_23_02 {
    ({ $($new:tt)* } else { $($old:tt)* }) => { $($new)* };
}

#[cfg(not(slurm_ge_23_02))]
#[macro_export]
macro_rules! since_23_02 {
    ({ $($new:tt)* } else { $($old:tt)* }) => { $($old)* };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_matches_installed_header() {
        let (major, minor, _) = version();
        assert!(major >= 22, "unexpected Slurm major {major}");
        assert!(minor <= 12);
    }

    #[test]
    fn hand_written_constants_match_the_header() {
        let h = std::fs::read_to_string(concat!(env!("SLURM_SYS_INCLUDE"), "/slurm/slurm.h")).unwrap();
        assert!(h.contains("#define NODE_STATE_DRAIN      SLURM_BIT(9)"), "NODE_STATE_DRAIN changed in slurm.h");
        assert_eq!(NODE_STATE_DRAIN, 0x200);
    }

    #[test]
    fn identity_arrays_are_nul_terminated() {
        const A: [u8; 6] = __nul_terminated("spank");
        assert_eq!(&A, b"spank\0");
    }
}
