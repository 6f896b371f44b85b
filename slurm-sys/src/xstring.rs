//! Strings handed to Slurm. Slurm frees what it receives with its own
//! `xfree`, so anything placed in `err_msg` or a `job_desc` field must come
//! from Slurm's `xstrdup`; a Rust or malloc'd string crashes slurmctld
//! ("free(): invalid size").

use std::ffi::{c_char, c_void, CStr};

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
    let f = host::slurm_xstrdup().ok_or(XstringError::NoSlurmAllocator)?;
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
        if let Some(f) = host::slurm_xfree() {
            f(slot.cast::<*mut c_void>());
        }
        *slot = std::ptr::null_mut();
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

#[cfg(test)]
mod tests {
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
}
