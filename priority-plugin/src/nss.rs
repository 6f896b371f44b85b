//! User and group lookups (NSS: files, LDAP, SSSD...). These may block for
//! seconds, so they run only on the policy watcher thread, never on
//! slurmctld's submit path.

use std::collections::{HashMap, HashSet};

use onepool_decisions::classify::Directory;
use onepool_decisions::policy::Policy;
use slurm_sys::os;

fn uid_of(name: &str) -> Option<u32> {
    os::user_id(name)
}

/// (gid, member names) of a group. Its buffer grows on ERANGE, so a group
/// of any size resolves.
fn group(name: &str) -> Option<(u32, Vec<String>)> {
    os::group(name).map(|g| (g.gid, g.members))
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
