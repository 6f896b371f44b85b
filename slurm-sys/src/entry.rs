//! Plugin entry points, written once: [`entry_point!`](crate::entry_point)
//! emits the `extern "C"` function Slurm calls together with its panic
//! barrier ([`crate::guard::guard`]) and the conversion of its raw C
//! arguments into the safe values its body receives ([`FromC`]).
//!
//! The plugin crates carry `#![deny(unsafe_code)]`, which also refuses
//! `#[no_mangle]`: the only way they can export a function is this macro,
//! so no entry point can be written without the barrier. The macro allows
//! `unsafe_code` on the function it emits (for `#[no_mangle]` and the
//! argument conversions) and denies it again on the body the plugin wrote.
//!
//! The emitted function is a safe `extern "C" fn`, as the hand-written
//! exports were (the C ABI fixes its signature): Rust code may call it, and
//! the plugins' tests do, with NULL or valid arguments; what a raw argument
//! must be is the C API's promise, checked by nothing but Slurm.

/// How an entry point's raw C argument becomes the value its body
/// receives, e.g. `*mut job_desc_msg_t` as `Option<&mut JobDesc>`.
pub trait FromC<C>: Sized {
    /// # Safety
    /// `raw` is the argument Slurm passed to the entry point being called,
    /// and it meets what the C API promises for that parameter (each
    /// implementation says what that is); the value is used only during
    /// the call.
    unsafe fn from_c(raw: C) -> Self;
}

impl FromC<*const std::ffi::c_char> for Option<&std::ffi::CStr> {
    /// `raw` is NULL or a NUL-terminated string valid for the call.
    unsafe fn from_c(raw: *const std::ffi::c_char) -> Self {
        // SAFETY: not NULL, so a NUL-terminated string by the caller's promise.
        (!raw.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(raw) })
    }
}

/// Emits one `extern "C"` function Slurm calls, behind the panic barrier.
///
/// ```no_run
/// #![deny(unsafe_code)]
/// use std::ffi::{c_char, c_int};
///
/// use slurm_sys::bindings::job_desc_msg_t;
/// use slurm_sys::job_desc::{JobDesc, StrField};
/// use slurm_sys::xstring::ErrMsg;
///
/// const PLUGIN: &str = "job_submit/example";
/// const FAIL: c_int = -1;
///
/// slurm_sys::entry_point! {
///     /// Slurm calls this at submission.
///     #[guard(PLUGIN, on_panic = FAIL)]
///     pub extern "C" fn job_submit(
///         job_desc: *mut job_desc_msg_t as Option<&mut JobDesc>,
///         submit_uid: u32,
///         err_msg: *mut *mut c_char as Option<ErrMsg>,
///     ) -> c_int {
///         // Safe code only; `job_desc` is an `Option<&mut JobDesc>` here.
///         let (Some(job_desc), Some(mut err_msg)) = (job_desc, err_msg) else { return FAIL };
///         match job_desc.get(StrField::Qos) {
///             Some(_) => 0,
///             None => {
///                 let _ = err_msg.set(&format!("uid {submit_uid}: name a QOS"));
///                 FAIL
///             }
///         }
///     }
/// }
/// # fn main() {}
/// ```
///
/// - Doc comments come first, then `#[guard(PLUGIN, on_panic = VALUE)]`,
///   then any other attributes.
/// - `pub extern "C" fn` is exported under its own name (`#[no_mangle]`)
///   with the C parameter types written before `as`: the symbol and its C
///   signature are exactly what the plugin's source shows.
/// - `extern "C" fn` (not `pub`) is a callback Slurm gets by pointer (a
///   SPANK option callback): the same barrier, no symbol.
/// - `pub spank fn NAME(sp: Spank, args: SpankArgs) -> c_int` is a SPANK
///   callback, `int NAME(spank_t sp, int ac, char **av)` in C; the body
///   gets the handle and the plugstack.conf arguments.
/// - `PARAM: CTYPE as TYPE` hands the body `TYPE` made by
///   [`FromC`](crate::entry::FromC); a parameter without `as` is passed as
///   it is (plain numbers; a raw pointer passed on stays unusable in a
///   crate that denies `unsafe_code`).
/// - A panic in the body (or in a conversion) is logged as
///   `"<plugin>: panic in <entry>: <message>"` and becomes `on_panic`;
///   `<entry>` is the function's name unless `entry = "..."` says otherwise.
/// - The body is compiled under `deny(unsafe_code)`, and may `return`:
///
/// ```compile_fail
/// use std::ffi::{c_char, c_int, CStr};
///
/// slurm_sys::entry_point! {
///     #[guard("example", on_panic = -1)]
///     pub extern "C" fn peek(p: *const c_char) -> c_int {
///         // error: usage of an `unsafe` block
///         unsafe { CStr::from_ptr(p) }.to_bytes().len() as c_int
///     }
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! entry_point {
    (
        $(#[doc = $doc:expr])*
        #[guard($plugin:expr, on_panic = $on_panic:expr $(, entry = $entry:expr)? $(,)?)]
        $(#[$attr:meta])*
        pub spank fn $name:ident($sp:ident : Spank, $args:ident : SpankArgs $(,)?) -> c_int $body:block
    ) => {
        $(#[doc = $doc])*
        $(#[$attr])*
        // `#[no_mangle]` and the conversion of the raw arguments; the body
        // is denied unsafe code again below.
        #[allow(unsafe_code)]
        #[no_mangle]
        pub extern "C" fn $name(
            sp: $crate::bindings::spank_t,
            ac: ::std::ffi::c_int,
            av: *mut *mut ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            #[deny(unsafe_code)]
            fn __onepool_entry_body(
                $sp: $crate::spank::Spank<'_>,
                $args: $crate::spank::SpankArgs<'_>,
            ) -> ::std::ffi::c_int $body
            $crate::guard::guard($plugin, $crate::__entry_name!($name $(, $entry)?), $on_panic, || {
                // SAFETY: Slurm calls a SPANK callback with its handle and
                // the plugin's plugstack.conf arguments (`ac` strings in
                // `av`), both valid for the call.
                let (sp, args) =
                    unsafe { ($crate::spank::Spank::from_raw(sp), $crate::spank::SpankArgs::from_raw(ac, av)) };
                __onepool_entry_body(sp, args)
            })
        }
    };
    (
        $(#[doc = $doc:expr])*
        #[guard($plugin:expr, on_panic = $on_panic:expr $(, entry = $entry:expr)? $(,)?)]
        $(#[$attr:meta])*
        pub extern "C" fn $name:ident($($arg:ident : $cty:ty $(as $safe:ty)?),* $(,)?) -> $ret:ty $body:block
    ) => {
        $(#[doc = $doc])*
        $(#[$attr])*
        // `#[no_mangle]` and the conversion of the raw arguments; the body
        // is denied unsafe code again below.
        #[allow(unsafe_code)]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $cty),*) -> $ret {
            #[deny(unsafe_code)]
            fn __onepool_entry_body($($arg: $crate::__entry_arg_type!($cty $(as $safe)?)),*) -> $ret $body
            $crate::guard::guard($plugin, $crate::__entry_name!($name $(, $entry)?), $on_panic, || {
                __onepool_entry_body($($crate::__entry_arg!($arg $(as $safe)?)),*)
            })
        }
    };
    (
        $(#[doc = $doc:expr])*
        #[guard($plugin:expr, on_panic = $on_panic:expr $(, entry = $entry:expr)? $(,)?)]
        $(#[$attr:meta])*
        extern "C" fn $name:ident($($arg:ident : $cty:ty $(as $safe:ty)?),* $(,)?) -> $ret:ty $body:block
    ) => {
        $(#[doc = $doc])*
        $(#[$attr])*
        // The conversion of the raw arguments; the body is denied unsafe
        // code again below.
        #[allow(unsafe_code)]
        extern "C" fn $name($($arg: $cty),*) -> $ret {
            #[deny(unsafe_code)]
            fn __onepool_entry_body($($arg: $crate::__entry_arg_type!($cty $(as $safe)?)),*) -> $ret $body
            $crate::guard::guard($plugin, $crate::__entry_name!($name $(, $entry)?), $on_panic, || {
                __onepool_entry_body($($crate::__entry_arg!($arg $(as $safe)?)),*)
            })
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __entry_name {
    ($name:ident) => {
        ::std::stringify!($name)
    };
    ($name:ident, $entry:expr) => {
        $entry
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __entry_arg_type {
    ($cty:ty) => {
        $cty
    };
    ($cty:ty as $safe:ty) => {
        $safe
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __entry_arg {
    ($arg:ident) => {
        $arg
    };
    ($arg:ident as $safe:ty) => {
        // SAFETY: `$arg` is the argument Slurm passed to this entry point,
        // as its C API defines it (see the `FromC` implementation).
        unsafe { $crate::entry::FromC::from_c($arg) }
    };
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, c_int, CStr};

    crate::entry_point! {
        /// A callback as Slurm would get it by pointer.
        #[guard("test", on_panic = -1, entry = "test callback")]
        extern "C" fn callback(val: c_int, arg: *const c_char as Option<&CStr>) -> c_int {
            match arg.map(CStr::to_bytes) {
                Some(b"panic") => panic!("asked to"),
                Some(b) => val + b.len() as c_int,
                None => return 0,
            }
        }
    }

    #[test]
    fn the_body_gets_safe_arguments_and_may_return() {
        assert_eq!(callback(1, c"abc".as_ptr()), 4);
        assert_eq!(callback(1, std::ptr::null()), 0);
    }

    #[test]
    fn a_panic_in_the_body_becomes_on_panic() {
        assert_eq!(callback(1, c"panic".as_ptr()), -1);
    }
}
