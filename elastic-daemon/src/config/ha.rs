//! `[ha]`: several onepoold instances with one configuration, exactly one
//! of which acts on Slurm (issue #37, docs/ha.md, [`crate::leader`]).
//! Without the table, or with `lock = "none"`, the instance is alone and
//! always acts, as before.

use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::check::Checker;
use super::file::HaFile;
use super::form::Raw;

/// `[ha]` as checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HaSettings {
    /// This instance's name in status, metrics and the decision log
    /// (default: the host name).
    pub instance: String,
    /// `None`: `lock = "none"`, a single instance that always acts.
    pub lock: Option<LockSettings>,
}

/// `lock = "mariadb"`: `GET_LOCK` on the accounting database server.
#[derive(Clone, Debug, PartialEq)]
pub struct LockSettings {
    /// The server's host name or address.
    pub host: String,
    pub port: u16,
    pub user: String,
    /// The password's file, readable by onepoold's user only.
    pub password_file: PathBuf,
    /// The CA (or the server's own self-signed certificate) that the
    /// server's certificate must chain to; `Some` makes TLS required.
    pub ca_file: Option<PathBuf>,
    /// `None`: `onepoold.<ClusterName>`, from slurm.conf at start.
    pub lock_name: Option<String>,
    /// Between two confirmations of the lock (acting) or two tries to take
    /// it (following).
    pub check_interval: Duration,
    /// The session's `wait_timeout`: how long the server keeps a silent
    /// connection, and so the lock of a holder that is paused or cut off.
    pub lost_after: Duration,
}

impl LockSettings {
    /// How long a confirmation lets this instance act: less than
    /// `lost_after` by a check interval, so it stops before the server
    /// could give the lock to another.
    pub fn fence(&self) -> Duration {
        self.lost_after.saturating_sub(self.check_interval)
    }
}

/// MariaDB's limit on a lock name.
const MAX_LOCK_NAME: usize = 64;

/// This host's name, the default instance name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "onepoold".to_string())
}

pub(super) fn ha(c: &mut Checker, raw: Option<&Spanned<HaFile<Raw>>>) -> HaSettings {
    let Some(table) = raw else { return HaSettings { instance: host_name(), lock: None } };
    let span = table.span();
    let h = table.get_ref();
    let instance = match &h.instance {
        None => host_name(),
        Some(v) => {
            let name = v.get_ref();
            if name.is_empty() || name.len() > 64 || !name.chars().all(|ch| ch.is_ascii_graphic()) {
                c.error(v.span(), format!("[ha] instance = {name:?}: give 1 to 64 printable characters without spaces (default: the host name)"));
            }
            name.clone()
        }
    };
    let kind = h.lock.as_ref().map(|v| (v.get_ref().as_str(), v.span()));
    let lock = match kind {
        None | Some(("none", _)) => {
            let given: Vec<&str> = [
                ("database", h.database.is_some()),
                ("user", h.user.is_some()),
                ("password_file", h.password_file.is_some()),
                ("ca_file", h.ca_file.is_some()),
                ("lock_name", h.lock_name.is_some()),
                ("check_interval", h.check_interval.is_some()),
                ("lost_after", h.lost_after.is_some()),
            ]
            .into_iter()
            .filter_map(|(k, set)| set.then_some(k))
            .collect();
            if !given.is_empty() {
                c.error(
                    span,
                    format!(
                        "[ha] sets {} but no lock: add lock = \"mariadb\" (lock = \"none\", the default, runs one instance that always acts)",
                        given.join(", ")
                    ),
                );
            }
            None
        }
        Some(("mariadb", _)) => Some(mariadb(c, h, span)),
        Some((other, at)) => {
            c.error(at, format!("[ha] lock = {other:?}: expected \"mariadb\" (GET_LOCK on the accounting database server) or \"none\""));
            None
        }
    };
    HaSettings { instance, lock }
}

fn mariadb(c: &mut Checker, h: &HaFile<Raw>, span: std::ops::Range<usize>) -> LockSettings {
    let missing = |c: &mut Checker, key: &str, example: &str| {
        c.error(span.clone(), format!("[ha] lock = \"mariadb\" needs {key} (like {key} = {example})"));
    };
    let (host, port) = match &h.database {
        None => {
            missing(c, "database", "\"dbhost:3306\"");
            (String::new(), 3306)
        }
        Some(v) => database(c, v),
    };
    let user = match &h.user {
        None => {
            missing(c, "user", "\"onepool\"");
            String::new()
        }
        Some(v) if v.get_ref().is_empty() => {
            c.error(v.span(), "[ha] user is empty".into());
            String::new()
        }
        Some(v) => v.get_ref().clone(),
    };
    let path = |c: &mut Checker, v: &Spanned<String>, key: &str| {
        let p = PathBuf::from(v.get_ref());
        if !p.is_absolute() {
            c.error(v.span(), format!("[ha] {key} {:?} must be an absolute path", v.get_ref()));
        }
        p
    };
    let password_file = match &h.password_file {
        None => {
            missing(c, "password_file", "\"/etc/onepool/ha-db.password\"");
            PathBuf::new()
        }
        Some(v) => path(c, v, "password_file"),
    };
    let ca_file = h.ca_file.as_ref().map(|v| path(c, v, "ca_file"));
    let lock_name = h.lock_name.as_ref().map(|v| {
        let n = v.get_ref();
        if n.is_empty() || n.len() > MAX_LOCK_NAME {
            c.error(v.span(), format!("[ha] lock_name {n:?}: give 1 to {MAX_LOCK_NAME} characters (MariaDB's limit)"));
        }
        n.clone()
    });
    let lost_after = c.duration(&h.lost_after, "[ha] lost_after", Duration::from_secs(3));
    if let Some(v) = &h.lost_after {
        if lost_after.subsec_nanos() != 0
            || lost_after < Duration::from_secs(2)
            || lost_after > Duration::from_secs(3600)
        {
            c.error(v.span(), format!("[ha] lost_after = {:?}: whole seconds from 2s to 3600s (the server's wait_timeout counts in seconds)", v.get_ref()));
        }
    }
    let check_interval = c.duration(&h.check_interval, "[ha] check_interval", Duration::from_secs(1));
    if check_interval * 2 > lost_after || check_interval < Duration::from_millis(100) {
        let at = h.check_interval.as_ref().map_or(span.clone(), |v| v.span());
        c.error(
            at,
            format!(
                "[ha] check_interval = {} ms must be from 100 ms to half of lost_after ({} ms), so a confirmation always comes before the fence",
                check_interval.as_millis(),
                lost_after.as_millis()
            ),
        );
    }
    LockSettings { host, port, user, password_file, ca_file, lock_name, check_interval, lost_after }
}

/// `HOST:PORT`, `HOST` (port 3306) or `[V6]:PORT`.
fn database(c: &mut Checker, v: &Spanned<String>) -> (String, u16) {
    let text = v.get_ref().trim();
    let bad = |c: &mut Checker| {
        c.error(v.span(), format!("[ha] database = {:?}: expected HOST:PORT, HOST or [IPV6]:PORT", v.get_ref()));
        (String::new(), 3306)
    };
    if let Ok(a) = text.parse::<std::net::SocketAddr>() {
        return (a.ip().to_string(), a.port());
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse::<u16>() {
            Ok(p) if p > 0 => (h, p),
            _ => return bad(c),
        },
        Some(_) => return bad(c),
        None => (text, 3306),
    };
    if host.is_empty() || !host.chars().all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch)) {
        return bad(c);
    }
    (host.to_string(), port)
}
