//! The rules onepoold applies at start to the files it reads its secrets
//! and names from, for `onepoold --check` (and so `onepool doctor`) to
//! apply the same (issue #42: `--check` said "fits" for a password file of
//! mode 0644 that the start then refused). Reads, never makes: a missing
//! replica key is made at the first start and is no error here.

use crate::config::Config;

/// Whose files: the user onepoold runs as. `--check` run by root (as the
/// doctor runs it) checks for the service user the packaged unit runs
/// onepoold as, when it exists; `--user` names another.
pub fn owner(named: Option<&str>) -> Result<(u32, String), String> {
    if let Some(name) = named {
        return onepool_os::user_id(name)
            .map(|uid| (uid, name.to_string()))
            .ok_or_else(|| format!("--user {name}: no such user"));
    }
    let me = onepool_os::geteuid();
    let service = onepool_decisions::policy::SERVICE_USER;
    match (me, onepool_os::user_id(service)) {
        (0, Some(uid)) => Ok((uid, service.to_string())),
        (uid, _) => Ok((uid, format!("uid {uid} (the user running --check)"))),
    }
}

/// Every start rule a file breaks, each naming the file and the fix.
pub fn problems(config: &Config, owner: u32) -> Vec<String> {
    let mut out = Vec::new();
    if config.needs_replica_key() {
        if let Err(e) = crate::replica_key::check_as(&config.replica_key_file, owner) {
            out.push(e.to_string());
        }
    }
    if let Some(lock) = &config.ha.lock {
        if let Err(e) = crate::leader::read_password_as(&lock.password_file, owner) {
            out.push(e.to_string());
        }
        if let Some(ca) = &lock.ca_file {
            if let Err(e) = crate::leader::mariadb::ca_pem(ca) {
                out.push(e.to_string());
            }
        }
        if lock.lock_name.is_none() {
            if let Err(e) = crate::leader::mariadb::default_lock_name(config.slurm_conf.as_deref()) {
                out.push(crate::leader::mariadb::SetupError::LockName(e).to_string());
            }
        }
    }
    out
}
