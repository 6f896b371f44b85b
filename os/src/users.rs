//! Users, groups and this process's credentials: NSS lookups (which may
//! block, so never on a Slurm daemon's hot path) and the uids.

use std::ffi::{c_int, CStr, CString};

use crate::buffer::{grow, Grow};

/// First buffer of an NSS lookup, and the bound it may grow to on ERANGE
/// (a group of tens of thousands of members needs a few MiB).
pub const NSS_FIRST: usize = 16 * 1024;
pub const NSS_MAX: usize = 64 << 20;

/// A group as NSS (files, LDAP, SSSD...) describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub gid: u32,
    /// Member names (`gr_mem`; users whose primary group it is are not
    /// listed there).
    pub members: Vec<String>,
}

/// The uid of user `name`; `None` when there is no such user or the
/// lookup fails. May block (NSS), so never on a Slurm daemon's hot path.
pub fn user_id(name: &str) -> Option<u32> {
    user_id_with(name, NSS_FIRST, NSS_MAX).ok().flatten()
}

/// Group `name`; `None` when there is no such group or the lookup fails
/// (a buffer of [`NSS_MAX`] still too small included). May block.
pub fn group(name: &str) -> Option<Group> {
    group_with(name, NSS_FIRST, NSS_MAX).ok().flatten()
}

fn nss_answer<T>(rc: c_int, found: impl FnOnce() -> Option<T>) -> Result<Option<T>, Grow<c_int>> {
    match rc {
        0 => Ok(found()),
        libc::ERANGE => Err(Grow::TooSmall(rc)),
        rc => Err(Grow::Failed(rc)),
    }
}

/// `getpwnam_r` with a buffer of `first` bytes grown up to `max`:
/// `Ok(None)` for no such user, `Err(errno)` for a failed lookup.
fn user_id_with(name: &str, first: usize, max: usize) -> Result<Option<u32>, c_int> {
    let Ok(c) = CString::new(name) else { return Ok(None) };
    grow(first, max, |buf| {
        // SAFETY: `passwd` is plain C data; all-zero is a valid value.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: reentrant lookup into our own buffers, `buf.len()` bytes.
        let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        nss_answer(rc, || (!out.is_null()).then_some(pw.pw_uid))
    })
}

/// `getgrnam_r` with a buffer of `first` bytes grown up to `max`:
/// `Ok(None)` for no such group, `Err(errno)` for a failed lookup.
fn group_with(name: &str, first: usize, max: usize) -> Result<Option<Group>, c_int> {
    let Ok(c) = CString::new(name) else { return Ok(None) };
    grow(first, max, |buf| {
        // SAFETY: `group` is plain C data; all-zero is a valid value.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: reentrant lookup into our own buffers, `buf.len()` bytes.
        let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        nss_answer(rc, || {
            if out.is_null() {
                return None;
            }
            let mut members = Vec::new();
            let mut p = gr.gr_mem;
            // SAFETY: on success gr_mem is a NULL-terminated array of C
            // strings in `buf`, which is alive here.
            unsafe {
                while !p.is_null() && !(*p).is_null() {
                    members.push(CStr::from_ptr(*p).to_string_lossy().into_owned());
                    p = p.add(1);
                }
            }
            Some(Group { gid: gr.gr_gid, members })
        })
    })
}

/// User `uid`'s name and primary group; `None` when there is no such user
/// or the lookup fails. May block (NSS), so never on a Slurm daemon's hot
/// path.
pub fn user(uid: u32) -> Option<(String, u32)> {
    user_with(uid, NSS_FIRST, NSS_MAX).ok().flatten()
}

/// `getpwuid_r` with a buffer of `first` bytes grown up to `max`: the
/// user's name and primary group.
fn user_with(uid: u32, first: usize, max: usize) -> Result<Option<(String, u32)>, c_int> {
    grow(first, max, |buf| {
        // SAFETY: `passwd` is plain C data; all-zero is a valid value.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: reentrant lookup into our own buffers, `buf.len()` bytes.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        nss_answer(rc, || {
            // SAFETY: on success pw_name is a C string in `buf`, alive here.
            (!out.is_null()).then(|| (unsafe { CStr::from_ptr(pw.pw_name) }.to_string_lossy().into_owned(), pw.pw_gid))
        })
    })
}

/// This process's effective uid.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// This process's real uid.
pub fn getuid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves() {
        assert_eq!(user_id("root"), Some(0));
        assert_eq!(group("root").map(|g| g.gid), Some(0));
        assert_eq!(user_id("no-such-user-onepool"), None);
        assert_eq!(group("no-such-group-onepool"), None);
        assert_eq!(user_id("nul\0inside"), None);
    }

    /// A one-byte first buffer cannot hold any entry: the answer comes
    /// only from the retries on ERANGE; a bound that small fails instead.
    #[test]
    fn lookups_grow_their_buffer_on_erange() {
        assert_eq!(group_with("root", 1, NSS_MAX).unwrap().map(|g| g.gid), Some(0));
        assert_eq!(group_with("root", 1, 1), Err(libc::ERANGE));
        assert_eq!(user_id_with("root", 1, NSS_MAX), Ok(Some(0)));
        assert_eq!(user_id_with("root", 1, 1), Err(libc::ERANGE));
        assert_eq!(group_with("no-such-group-onepool", 1, NSS_MAX), Ok(None));
    }

    /// Every group of this machine's /etc/group, members included, comes
    /// out the same from a tiny first buffer as from the usual one.
    #[test]
    fn members_survive_the_retries() {
        let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split(':').collect();
            let [name, _, gid, members] = f[..] else { continue };
            let Some(g) = group_with(name, 1, NSS_MAX).unwrap() else { continue };
            assert_eq!(g.gid.to_string(), gid, "{line}");
            let listed: Vec<&str> = members.split(',').filter(|m| !m.is_empty()).collect();
            assert_eq!(g.members, listed, "{line}");
            assert_eq!(Some(g), group(name));
        }
    }

    #[test]
    fn a_user_s_name_and_primary_group_resolve() {
        assert_eq!(user(0), Some(("root".into(), 0)));
        // From a one-byte buffer too.
        assert_eq!(user_with(0, 1, NSS_MAX), Ok(Some(("root".into(), 0))));
        assert_eq!(user(u32::MAX - 7), None);
    }

    #[test]
    fn credentials_are_this_process_s() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
        let uids: Vec<u32> = uids.split_whitespace().map(|u| u.parse().unwrap()).collect();
        assert_eq!((getuid(), geteuid()), (uids[0], uids[1]));
    }
}
