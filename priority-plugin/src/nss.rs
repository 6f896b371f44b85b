//! User and group lookups (NSS: files, LDAP, SSSD...). These may block for
//! seconds, so they run only on the policy watcher thread, never on
//! slurmctld's submit path.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};

use onepool_decisions::classify::Directory;
use onepool_decisions::policy::Policy;

fn uid_of(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: reentrant lookup into our own buffers.
    let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
}

/// (gid, member names) of a group.
fn group(name: &str) -> Option<(u32, Vec<String>)> {
    let c = CString::new(name).ok()?;
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 256 * 1024];
    // SAFETY: reentrant lookup into our own buffers.
    let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return None;
    }
    let mut members = Vec::new();
    let mut p = gr.gr_mem;
    // SAFETY: gr_mem is a NULL-terminated array of C strings in `buf`.
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            members.push(CStr::from_ptr(*p).to_string_lossy().into_owned());
            p = p.add(1);
        }
    }
    Some((gr.gr_gid, members))
}

/// The users and groups the policy names, resolved once.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    names: HashMap<u32, String>,
    groups: HashMap<String, (u32, HashSet<u32>)>,
    /// Names that did not resolve, for the log.
    pub unresolved: Vec<String>,
}

impl Snapshot {
    pub fn resolve(policy: &Policy) -> Snapshot {
        let mut s = Snapshot::default();
        for class in &policy.classes {
            let Some(e) = &class.entitled else { continue };
            for u in &e.users {
                match uid_of(u) {
                    Some(uid) => {
                        s.names.insert(uid, u.clone());
                    }
                    None => s.unresolved.push(format!("user {u}")),
                }
            }
            for g in &e.groups {
                if s.groups.contains_key(g) {
                    continue;
                }
                match group(g) {
                    Some((gid, members)) => {
                        let uids = members.iter().filter_map(|m| uid_of(m)).collect();
                        s.groups.insert(g.clone(), (gid, uids));
                    }
                    None => s.unresolved.push(format!("group {g}")),
                }
            }
        }
        s
    }
}

impl Directory for Snapshot {
    fn user_name(&self, uid: u32) -> Option<&str> {
        self.names.get(&uid).map(String::as_str)
    }
    fn in_group(&self, uid: u32, gid: u32, group: &str) -> bool {
        self.groups.get(group).is_some_and(|(g, members)| *g == gid || members.contains(&uid))
    }
    /// root, SlurmUser and Slurm's operators and administrators, as
    /// slurmctld itself decides it (an in-memory lookup, no RPC).
    fn is_admin(&self, uid: u32) -> bool {
        uid == 0 || slurm_sys::host::is_operator(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves() {
        assert_eq!(uid_of("root"), Some(0));
        assert_eq!(group("root").map(|g| g.0), Some(0));
        assert_eq!(uid_of("no-such-user-onepool"), None);
    }
}
