//! The lock on the accounting database server: MariaDB's (and MySQL's)
//! `GET_LOCK`, which every Slurm site with accounting already runs. A
//! named lock belongs to the connection that took it and ends with it,
//! so the holder keeps one connection of its own, with a short session
//! `wait_timeout`: the server ends it, and frees the lock, as soon as the
//! holder has been silent that long (dead, paused, or cut off).
//!
//! `GET_LOCK` is not replicated by Galera: every instance must reach the
//! same server (one node, or the cluster's virtual address), as
//! docs/ha.md says.

use std::path::PathBuf;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, SslOpts};

use super::lock::{Holder, Lock, LockError};
use super::names::LockNames;
use crate::config::LockSettings;

/// `GET_LOCK(name)` on one connection of its own.
pub struct MariaDbLock {
    opts: Opts,
    names: LockNames,
    connect_within: Duration,
    conn: Option<Conn>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Password(#[from] super::PasswordError),
    #[error("[ha] ca_file {path}: {what}")]
    CaFile { path: PathBuf, what: String },
    #[error("[ha] lock_name is not set and {0}; set lock_name (the same on every instance)")]
    LockName(String),
}

/// The site's name for the lock when `lock_name` is not set:
/// `onepoold.<ClusterName>`, from `slurm_conf` (else `$SLURM_CONF`, else
/// /etc/slurm/slurm.conf). The lock's name on the server is made from it
/// and the replica key ([`LockNames`]).
pub fn default_lock_name(slurm_conf: Option<&std::path::Path>) -> Result<String, String> {
    let path = slurm_conf
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("SLURM_CONF").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{} cannot be read ({e})", path.display()))?;
    let name = text.lines().find_map(|l| {
        let (k, v) = l.split('#').next()?.split_once('=')?;
        k.trim().eq_ignore_ascii_case("ClusterName").then(|| v.trim().to_string())
    });
    match name {
        Some(n) if !n.is_empty() => Ok(format!("onepoold.{n}").chars().take(64).collect()),
        _ => Err(format!("{} names no ClusterName", path.display())),
    }
}

/// The CA file's certificates, refused when it holds none.
pub fn ca_pem(path: &std::path::Path) -> Result<Vec<u8>, SetupError> {
    let pem = std::fs::read(path).map_err(|e| SetupError::CaFile { path: path.to_path_buf(), what: e.to_string() })?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(SetupError::CaFile { path: path.to_path_buf(), what: "holds no PEM certificate".into() });
    }
    Ok(pem)
}

impl MariaDbLock {
    /// The lock `settings` describe, under `names`; reads the password and
    /// checks the CA file, but connects only when first used.
    pub fn new(settings: &LockSettings, names: LockNames) -> Result<MariaDbLock, SetupError> {
        let password = super::read_password(&settings.password_file)?;
        let ssl = match &settings.ca_file {
            None => None,
            // Only the named CA: a public one proves nothing about the
            // site's database server.
            Some(path) => {
                Some(SslOpts::default().with_root_certs(vec![ca_pem(path)?.into()]).with_disable_built_in_roots(true))
            }
        };
        let lost_after = settings.lost_after.as_secs().max(1) as usize;
        let opts = OptsBuilder::default()
            .ip_or_hostname(settings.host.clone())
            .tcp_port(settings.port)
            .user(Some(settings.user.clone()))
            .pass(Some(password))
            // The lock lives on this TCP connection: never switched to the
            // server's local socket behind our back.
            .prefer_socket(false)
            .ssl_opts(ssl)
            // The server ends the connection, and frees the lock, once the
            // holder has been silent this long. (The option alone only tells
            // the client what the server's timeout is; the SET sets it.)
            .wait_timeout(Some(lost_after))
            .setup(vec![format!("SET SESSION wait_timeout = {lost_after}")])
            .stmt_cache_size(0);
        Ok(MariaDbLock { opts: opts.into(), names, connect_within: settings.lost_after, conn: None })
    }

    async fn conn(&mut self) -> Result<&mut Conn, LockError> {
        if self.conn.is_none() {
            let c = tokio::time::timeout(self.connect_within, Conn::new(self.opts.clone()))
                .await
                .map_err(|_| LockError::Answer(format!("no connection within {} ms", self.connect_within.as_millis())))?
                .map_err(|source| LockError::Database { what: "connecting".into(), source })?;
            self.conn = Some(c);
        }
        self.conn.as_mut().ok_or_else(|| LockError::Answer("no connection".into()))
    }

    async fn one<T: mysql_async::prelude::FromValue + Send + 'static, P: Into<mysql_async::Params> + Send>(
        &mut self,
        what: &str,
        sql: &str,
        params: P,
    ) -> Result<Option<T>, LockError> {
        let conn = self.conn().await?;
        let row: Option<Option<T>> = conn
            .exec_first(sql, params)
            .await
            .map_err(|source| LockError::Database { what: what.to_string(), source })?;
        Ok(row.flatten())
    }
}

impl Lock for MariaDbLock {
    async fn acquire(&mut self, wait: Duration) -> Result<bool, LockError> {
        // 1: taken; 0: still held by another after `wait`; NULL: an error.
        // Waiting queues this connection behind the holder: it is served
        // the moment the holder lets go, before anyone who asks later.
        let main = self.names.main.clone();
        let conn = self.conn().await?;
        let row: Option<(Option<i64>, u64)> = conn
            .exec_first("SELECT GET_LOCK(?, ?), CONNECTION_ID()", (main, wait.as_secs_f64()))
            .await
            .map_err(|source| LockError::Database { what: "GET_LOCK".into(), source })?;
        let id = match row {
            Some((Some(1), id)) => id,
            Some((Some(_), _)) => return Ok(false),
            _ => return Err(LockError::Answer("GET_LOCK answered NULL".into())),
        };
        let proof = self.names.proof(id);
        match self.one::<i64, _>("GET_LOCK (proof)", "SELECT GET_LOCK(?, 0)", (proof,)).await? {
            Some(1) => Ok(true),
            _ => Err(LockError::Answer(format!(
                "took the lock as database connection {id} but not its proof: another connection holds a name only \
                 the replica key makes"
            ))),
        }
    }

    async fn still_held(&mut self) -> Result<bool, LockError> {
        let main = self.names.main.clone();
        let held = self.one::<i64, _>("IS_USED_LOCK", "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (main,)).await?;
        Ok(held == Some(1))
    }

    async fn holder(&mut self) -> Result<Option<Holder>, LockError> {
        let main = self.names.main.clone();
        let Some(id) = self.one::<u64, _>("IS_USED_LOCK", "SELECT IS_USED_LOCK(?)", (main,)).await? else {
            return Ok(None);
        };
        let proof = self.names.proof(id);
        let conn = self.conn().await?;
        // The holder's client address: the lock's user sees its own
        // connections in the process list without the PROCESS privilege
        // (another account's, such as a squatter's, it does not).
        let row: Option<(Option<i64>, Option<String>)> = conn
            .exec_first(
                "SELECT IS_USED_LOCK(?) = ?, (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = ?)",
                (proof, id, id),
            )
            .await
            .map_err(|source| LockError::Database { what: "IS_USED_LOCK (proof)".into(), source })?;
        let (proven, host) = row.map_or((false, None), |(p, h)| (p == Some(1), h));
        let description = match host {
            Some(host) => format!("the connection from {host} (database connection {id})"),
            None => format!("database connection {id}"),
        };
        Ok(Some(Holder { description, proven }))
    }

    async fn close(&mut self) {
        if let Some(c) = self.conn.take() {
            // Polite when the link works; on a dead one, dropped (the
            // server frees the lock after wait_timeout anyway).
            let _ = tokio::time::timeout(Duration::from_millis(500), c.disconnect()).await;
        }
    }
}
