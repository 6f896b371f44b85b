//! onepoold's replica key (issue #25): every request onepoold sends a
//! replica carries it, and `onepool replica` answers nothing without it,
//! so a user who finds a replica's port (squeue shows the jobs, the node
//! shows the listeners) gets nothing from it. It travels to the replica
//! jobs in sbatch's environment (`ONEPOOL_REPLICA_KEY`), which only the
//! job's user and root can read.
//!
//! The key is kept in a file so that a restarted onepoold still reaches
//! the replicas it re-adopts: made at the first start, owned by onepoold's
//! user, readable by nobody else. A file anyone else could read or write
//! is refused, with the command that fixes it.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("replica_key_file {path}: {what}")]
    Unsafe { path: PathBuf, what: String },
    #[error("replica_key_file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("replica_key_file {path}: {what}; delete it and restart onepoold to make a new one (running replicas are then replaced)")]
    Bad { path: PathBuf, what: String },
}

/// The shortest key accepted from a file (onepoold writes 64 hex digits).
const MIN_LEN: usize = 32;

/// Reads the key at `path`, or makes one there when no file exists.
pub fn load_or_create(path: &Path) -> Result<String, KeyError> {
    let io = |source| KeyError::Io { path: path.to_path_buf(), source };
    match std::fs::symlink_metadata(path) {
        Ok(meta) => read(path, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.exists() {
                    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
                }
            }
            let key = onepool_launcher::access::random_key().map_err(io)?;
            // create_new: a file someone else placed meanwhile is not written into.
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
            f.write_all(format!("{key}\n").as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            tracing::info!(path = %path.display(), "made a new replica key");
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

fn read(path: &Path, meta: &std::fs::Metadata) -> Result<String, KeyError> {
    read_as(path, meta, onepool_os::geteuid())
}

/// The key at `path` as onepoold's user `owner` would read it at start:
/// `Ok(None)` when there is no file yet (the start makes one). Makes
/// nothing (`onepoold --check`).
pub fn check_as(path: &Path, owner: u32) -> Result<Option<String>, KeyError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => read_as(path, &meta, owner).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeyError::Io { path: path.to_path_buf(), source }),
    }
}

fn read_as(path: &Path, meta: &std::fs::Metadata, owner: u32) -> Result<String, KeyError> {
    let unsafe_file = |what: String| KeyError::Unsafe { path: path.to_path_buf(), what };
    crate::private_file::check_as(path, meta, "the key", owner).map_err(unsafe_file)?;
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
    let key = text.trim();
    if key.len() < MIN_LEN {
        return Err(KeyError::Bad {
            path: path.to_path_buf(),
            what: format!("{} characters, at least {MIN_LEN} expected", key.len()),
        });
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(KeyError::Bad {
            path: path.to_path_buf(),
            what: "holds characters other than printable ASCII".into(),
        });
    }
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onepool-key-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn made_once_private_and_read_back() {
        let d = dir("made");
        let p = d.join("sub/replica.key");
        let k = load_or_create(&p).unwrap();
        assert_eq!(k.len(), 64);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(p.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(load_or_create(&p).unwrap(), k, "the same key at the next start");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_others_can_read_or_a_short_one_is_refused_with_the_fix() {
        let d = dir("refused");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("replica.key");
        std::fs::write(&p, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_or_create(&p).unwrap(), "0123456789abcdef0123456789abcdef");
        std::fs::write(&p, "short\n").unwrap();
        let e = load_or_create(&p).unwrap_err().to_string();
        assert!(e.contains("5 characters"), "{e}");
        let link = d.join("link.key");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(load_or_create(&link).unwrap_err().to_string().contains("symbolic link"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
