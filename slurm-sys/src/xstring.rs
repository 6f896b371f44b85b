//! Strings handed to Slurm. Slurm frees what it receives with its own
//! `xfree`, so anything placed in `err_msg` or a `job_desc` field must come
//! from Slurm's `xstrdup`; a Rust or malloc'd string crashes slurmctld
//! ("free(): invalid size").
//!
//! Tests stand libc's allocator in for Slurm's with
//! [`libc_allocator::LibcAllocator`] (feature `test-support`), on their own
//! thread only: nothing else ever picks it.

use std::ffi::{c_char, c_void, CStr};

use crate::entry::FromC;
use crate::host;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XstringError {
    /// The process that loaded us does not export Slurm's allocator.
    NoSlurmAllocator,
    /// Slurm's allocator returned NULL.
    AllocationFailed,
}

impl std::fmt::Display for XstringError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XstringError::NoSlurmAllocator => f.write_str("slurm_xstrdup is not available in this process"),
            XstringError::AllocationFailed => f.write_str("slurm_xstrdup returned NULL"),
        }
    }
}

impl std::error::Error for XstringError {}

/// Copies `s` into memory owned by Slurm's allocator. Interior NULs are
/// replaced (see [`crate::log::to_cstring_lossy`]).
pub fn xstrdup(s: &str) -> Result<*mut c_char, XstringError> {
    let f = strdup_fn().ok_or(XstringError::NoSlurmAllocator)?;
    let c = crate::log::to_cstring_lossy(s);
    // SAFETY: slurm_xstrdup copies a NUL-terminated string.
    let p = unsafe { f(c.as_ptr()) };
    if p.is_null() {
        Err(XstringError::AllocationFailed)
    } else {
        Ok(p)
    }
}

/// Replaces the string at `*slot` (freeing the old one with `xfree`) with an
/// `xstrdup` copy of `s`.
///
/// # Safety
/// `slot` must point to a `char *` that is NULL or was allocated by Slurm.
pub unsafe fn replace(slot: *mut *mut c_char, s: &str) -> Result<(), XstringError> {
    let new = xstrdup(s)?;
    // SAFETY: the caller vouches for `slot`; xfree leaves it NULL, and the
    // new string is Slurm's to free.
    unsafe {
        xfree(slot);
        *slot = new;
    }
    Ok(())
}

/// Frees `*slot` with Slurm's `xfree` and sets it to NULL.
///
/// # Safety
/// `slot` must point to a `char *` that is NULL or was allocated by Slurm.
pub unsafe fn xfree(slot: *mut *mut c_char) {
    // SAFETY: the caller vouches that a non-NULL `slot` points to a
    // `char *` that is NULL or Slurm's; `xfree(void **)` frees it and sets
    // it to NULL itself, which the last line repeats for a host without it.
    unsafe {
        if slot.is_null() || (*slot).is_null() {
            return;
        }
        if let Some(f) = free_fn() {
            f(slot.cast::<*mut c_void>());
        }
        *slot = std::ptr::null_mut();
    }
}

/// Slurm's `xstrdup`, or the test stand-in installed on this thread.
fn strdup_fn() -> Option<host::XstrdupFn> {
    #[cfg(any(test, feature = "test-support"))]
    if libc_allocator::installed() {
        return Some(libc_allocator::xstrdup);
    }
    host::slurm_xstrdup()
}

/// Slurm's `xfree`, or the test stand-in installed on this thread.
fn free_fn() -> Option<host::XfreeFn> {
    #[cfg(any(test, feature = "test-support"))]
    if libc_allocator::installed() {
        return Some(libc_allocator::xfree);
    }
    host::slurm_xfree()
}

/// The `char **err_msg` of a job_submit call: a message for the user
/// (sbatch prints it), which Slurm frees.
pub struct ErrMsg<'a> {
    slot: &'a mut *mut c_char,
}

impl ErrMsg<'_> {
    /// Replaces the message with an `xstrdup` copy of `msg`.
    pub fn set(&mut self, msg: &str) -> Result<(), XstringError> {
        // SAFETY: the slot holds NULL or a string of Slurm's (from_c).
        unsafe { replace(self.slot, msg) }
    }
}

impl<'a> FromC<*mut *mut c_char> for Option<ErrMsg<'a>> {
    /// `raw` is NULL or points to a `char *` that is NULL or from Slurm's
    /// allocator, valid for the call.
    unsafe fn from_c(raw: *mut *mut c_char) -> Self {
        // SAFETY: NULL or a valid `char **` by the caller's promise.
        unsafe { raw.as_mut() }.map(|slot| ErrMsg { slot })
    }
}

/// Reads a C string owned by Slurm into a Rust string, `None` for NULL.
/// Invalid UTF-8 is replaced rather than refused: it is still shown in
/// messages, and policy names are ASCII anyway.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub unsafe fn read(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: not NULL, so NUL-terminated by the caller's promise.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod libc_allocator {
    //! libc's allocator standing in for Slurm's in tests: `xstrdup` copies
    //! with `strdup`, `xfree` takes the address of the pointer, frees it
    //! and sets it to NULL, as Slurm's do. Installed on one thread, it
    //! counts what it hands out and takes back, frees only what it handed
    //! out (anything else is counted as a foreign free), and can be told
    //! to fail an allocation.

    use std::cell::RefCell;
    use std::collections::HashSet;
    use std::ffi::{c_char, c_void};
    use std::marker::PhantomData;

    #[derive(Default)]
    struct State {
        live: HashSet<usize>,
        allocated: usize,
        freed: usize,
        foreign: usize,
        fail_in: Option<usize>,
    }

    thread_local! {
        static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
    }

    fn with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
        STATE.with(|s| s.borrow_mut().as_mut().map(f))
    }

    pub(super) fn installed() -> bool {
        STATE.with(|s| s.borrow().is_some())
    }

    pub(super) unsafe extern "C" fn xstrdup(s: *const c_char) -> *mut c_char {
        let fail = with(|st| match st.fail_in {
            Some(0) => {
                st.fail_in = None;
                true
            }
            Some(n) => {
                st.fail_in = Some(n - 1);
                false
            }
            None => false,
        });
        if fail != Some(false) {
            return std::ptr::null_mut();
        }
        // SAFETY: `s` is NUL-terminated (xstrdup's contract).
        let p = unsafe { libc::strdup(s) };
        if !p.is_null() {
            with(|st| {
                st.live.insert(p as usize);
                st.allocated += 1;
            });
        }
        p
    }

    pub(super) unsafe extern "C" fn xfree(item: *mut *mut c_void) {
        // SAFETY: `item` points to a pointer (xfree's contract).
        let p = unsafe { *item };
        if p.is_null() {
            return;
        }
        let ours = with(|st| {
            let ours = st.live.remove(&(p as usize));
            if ours {
                st.freed += 1;
            } else {
                st.foreign += 1;
            }
            ours
        });
        if ours == Some(true) {
            // SAFETY: strdup'd above and not freed since (it was live).
            unsafe { libc::free(p) };
        }
        // SAFETY: as above, `item` points to a pointer.
        unsafe { *item = std::ptr::null_mut() };
    }

    /// The stand-in, installed on this thread until dropped.
    pub struct LibcAllocator {
        _this_thread: PhantomData<*const ()>,
    }

    impl LibcAllocator {
        /// # Panics
        /// When one is installed on this thread already.
        pub fn install() -> LibcAllocator {
            STATE.with(|s| {
                let mut s = s.borrow_mut();
                assert!(s.is_none(), "a LibcAllocator is installed on this thread already");
                *s = Some(State::default());
            });
            LibcAllocator { _this_thread: PhantomData }
        }

        fn read<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
            with(f).expect("installed while self lives")
        }

        /// Strings handed out so far.
        pub fn allocated(&self) -> usize {
            self.read(|s| s.allocated)
        }

        /// Strings taken back so far.
        pub fn freed(&self) -> usize {
            self.read(|s| s.freed)
        }

        /// Strings handed out and not taken back.
        pub fn live(&self) -> usize {
            self.read(|s| s.live.len())
        }

        /// Frees of pointers this allocator never handed out (or freed
        /// twice); they are counted, not freed.
        pub fn foreign_frees(&self) -> usize {
            self.read(|s| s.foreign)
        }

        /// Lets `n` more allocations succeed, then fails one (NULL).
        pub fn fail_after(&self, n: usize) {
            self.read(|s| s.fail_in = Some(n));
        }
    }

    impl Drop for LibcAllocator {
        fn drop(&mut self) {
            STATE.with(|s| s.borrow_mut().take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::libc_allocator::LibcAllocator;
    use super::*;

    #[test]
    fn without_slurm_the_allocator_is_refused_not_faked() {
        assert_eq!(xstrdup("x"), Err(XstringError::NoSlurmAllocator));
    }

    #[test]
    fn read_null_is_none() {
        // SAFETY: NULL, then a static NUL-terminated string.
        assert_eq!(unsafe { read(std::ptr::null()) }, None);
        // SAFETY: as above.
        assert_eq!(unsafe { read(c"abc".as_ptr()) }.as_deref(), Some("abc"));
    }

    #[test]
    fn the_stand_in_allocates_frees_and_fails_on_demand() {
        let alloc = LibcAllocator::install();
        let mut slot = xstrdup("one").unwrap();
        // SAFETY: `slot` holds a string of the installed allocator.
        unsafe { replace(&mut slot, "two") }.unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { read(slot) }.as_deref(), Some("two"));
        assert_eq!((alloc.allocated(), alloc.freed(), alloc.live()), (2, 1, 1));
        alloc.fail_after(0);
        // SAFETY: as above.
        assert_eq!(unsafe { replace(&mut slot, "three") }, Err(XstringError::AllocationFailed));
        // SAFETY: as above.
        assert_eq!(unsafe { read(slot) }.as_deref(), Some("two"), "a failed replace keeps the old string");
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: a valid `char **` holding NULL.
        let mut msg = unsafe { Option::<ErrMsg>::from_c(&mut err) }.unwrap();
        msg.set("refused").unwrap();
        msg.set("refused again").unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { read(err) }.as_deref(), Some("refused again"));
        // SAFETY: both hold strings of the installed allocator.
        unsafe {
            xfree(&mut slot);
            xfree(&mut err);
        }
        assert!(slot.is_null() && err.is_null());
        assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0));
        // SAFETY: NULL is no `char **`: no message slot.
        assert!(unsafe { Option::<ErrMsg>::from_c(std::ptr::null_mut()) }.is_none());
        drop(alloc);
        assert_eq!(xstrdup("x"), Err(XstringError::NoSlurmAllocator), "gone with its guard");
    }
}
